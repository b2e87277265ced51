"""The protocol-agnostic relay (renyi.federated.relay) and GOPA's endpoint/driver on it,
in one process: the same messages the Flower deployment carries, with direct calls."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("flwr")

from renyi import noise
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError
from renyi.federated.channels import ChaCha20Source, Roster
from renyi.federated.gopa import GopaProtocol
from renyi.federated.gopa_flower import (
    GopaDriver,
    GopaPartyEndpoint,
    deployment_files,
    session_graph,
)
from renyi.federated.relay import Outcome, Round, ScriptedDriver, run_in_process

K = 5
VALUES = [0.11, 0.42, 0.73, 0.25, 0.98]
KEYS = [bytes([i + 7]) * 32 for i in range(K)]
SID = bytes(range(16))


G = noise.lattice_step(0.3)


def _expected(parties: list[int]) -> float:
    """Mean of values plus keyed noise; the release is within g/2 of it (lattice g)."""
    eta = [0.3 * noise.standard_normal(1, rng=ChaCha20Source(KEYS[i]))[0] for i in parties]
    return float((np.asarray(VALUES)[parties].sum() + sum(eta)) / len(parties))


def _setup(tmp: Path, budget: int = 0) -> tuple[GopaDriver, dict[str, GopaPartyEndpoint], Roster]:
    roster, _, configs = deployment_files(tmp, VALUES, noise_keys=KEYS)
    params: dict[str, Any] = {
        "session": SID,
        "peers": 2,
        "sigma-eta": 0.3,
        "sigma-delta": 25.0,
        "reveal-budget": budget,
        "rejection-probability": 1e-9,
    }
    nodes = {f"node{i}": GopaPartyEndpoint(c) for i, c in enumerate(configs)}
    return GopaDriver(roster, params), nodes, roster


def test_gopa_over_the_relay_equals_the_reference(tmp_path: Path) -> None:
    """All five parties: the release is within g/2 of the mean of values plus their own
    noise and within g of GopaProtocol on the same graph and noise keys."""
    driver, nodes, _ = _setup(tmp_path)
    out = run_in_process(driver, nodes)
    assert out.status == "released", out.detail
    assert abs(out.detail["estimate"] - _expected(list(range(K)))) <= G / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        ref = GopaProtocol(
            VALUES,
            sigma_eta=0.3,
            sigma_delta=25.0,
            peers=2,
            edges=session_graph(SID, K, 2),
            noise_keys=KEYS,
        )
        assert abs(ref.run().estimate - out.detail["estimate"]) <= G


def test_dropout_after_pairing_is_recovered_within_the_budget(tmp_path: Path) -> None:
    driver, nodes, _ = _setup(tmp_path, budget=2)
    out = run_in_process(
        driver, nodes, absent=lambda node, phase: node == "node3" and phase == "mask"
    )
    assert out.status == "released", out.detail
    assert out.detail["dropped"] == ["party-003"]
    assert abs(out.detail["estimate"] - _expected([0, 1, 2, 4])) <= G / 2


def test_dropout_without_budget_aborts(tmp_path: Path) -> None:
    driver, nodes, _ = _setup(tmp_path, budget=0)
    out = run_in_process(
        driver, nodes, absent=lambda node, phase: node == "node3" and phase == "mask"
    )
    assert out.status == "aborted"
    assert "reveal budget" in out.detail["reason"]


def test_roster_mismatch_refused_at_join(tmp_path: Path) -> None:
    driver, nodes, _ = _setup(tmp_path)
    (tmp_path / "other").mkdir()
    other, _, _ = deployment_files(tmp_path / "other", VALUES)
    out = run_in_process(
        driver,
        nodes,
        opening_payload=lambda node: {**driver.opening()[1], "roster": other.fingerprint()},
    )
    assert out.status == "aborted" and "refused to join" in out.detail["reason"]
    assert "pinned" in out.detail["reason"]


def test_a_node_that_is_not_in_the_roster_is_ignored(tmp_path: Path) -> None:
    driver, nodes, _ = _setup(tmp_path)

    class Stranger:
        def respond(self, phase: str, payload: Any) -> dict[str, Any]:
            return {"advertisement": b"\x00" * 40}

    out = run_in_process(driver, {**nodes, "intruder": Stranger()})
    assert out.status == "released" and len(out.detail["included"]) == K


def test_scripted_driver_turns_errors_into_aborts() -> None:
    class Broken(ScriptedDriver):
        def opening(self) -> tuple[str, dict[str, Any]]:
            return "hello", {}

        def admit(self, reply: Any) -> str | None:
            return str(reply["name"])

        def script(self, joined: Any) -> Any:
            yield Round("x", {p: {} for p in joined})
            raise PrivacyParameterError("sigma: expected > 0")

    class Party:
        def __init__(self, name: str) -> None:
            self.name = name

        def respond(self, phase: str, payload: Any) -> dict[str, Any]:
            return {"name": self.name}

    out = run_in_process(Broken(), {"a": Party("a"), "b": Party("b")})
    assert out == Outcome("aborted", {"reason": "PrivacyParameterError: sigma: expected > 0"})
    with pytest.raises(PrivacyParameterError, match="phase"):
        Round("", {})


def test_toml_values_of_node_configs() -> None:
    """numpy scalars are written as plain TOML numbers (repr gave "np.float64(1.2)", which
    Flower's --node-config parser refused, so every node of a deployment died at start)."""
    from flwr.common.config import parse_config_args

    from renyi.federated.flower_deploy import toml_value

    cfg = {"a": np.float64(1.2), "b": np.int64(3), "c": np.bool_(True), "d": 1e-5}
    cfg |= {"e": 'x "y"', "f": "/tmp/a b\\c"}
    line = " ".join(f"{k}={toml_value(v)}" for k, v in cfg.items())
    assert parse_config_args([line]) == {
        k: (v.item() if hasattr(v, "item") else v) for k, v in cfg.items()
    }
    with pytest.raises(PrivacyParameterError, match="finite"):
        toml_value(float("inf"))
    with pytest.raises(PrivacyParameterError, match="quote"):
        toml_value('it\'s "quoted"')


# --------------------------------------------------------------------------- simulation


def test_the_library_uses_no_deprecated_flower_simulation_api() -> None:
    """flwr 1.42 deprecates ``flwr.simulation.run_simulation``: renyi's simulations go
    through ``flwr run`` on a SuperLink in simulation mode (LocalDeployment(simulation=True))."""
    import ast

    def uses(path: Path) -> bool:
        text = path.read_text()
        if "run_simulation" not in text:
            return False
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if (
                "run_simulation" in names
                or (isinstance(node, ast.Name) and node.id == "run_simulation")
                or (isinstance(node, ast.Attribute) and node.attr == "run_simulation")
            ):
                return True
        return False

    src = Path(__file__).resolve().parents[1] / "src" / "renyi"
    assert [p.name for p in src.rglob("*.py") if uses(p)] == []


def test_a_simulation_client_app_never_takes_its_config_from_a_real_servers_run(
    tmp_path: Path,
) -> None:
    """The simulation ClientApp reads its party's config (key file, value, pins) from a
    file the run config names: on a real node -- whose run config the server writes -- it
    refuses; in the simulation engine it finds entry ``partition-id``."""
    from renyi.federated.flower_deploy import SIMULATED_NODES_KEY
    from renyi.federated.flower_relay import simulated_node_config

    configs = [{"name": f"p{i}", "value": i / 10} for i in range(3)]
    path = tmp_path / "nodes.json"
    path.write_text(__import__("json").dumps(configs))
    run = {SIMULATED_NODES_KEY: str(path)}
    assert simulated_node_config({"partition-id": 2, "num-partitions": 3}, run) == configs[2]
    for node in (
        {"name": "party-001", "key-file": "/home/p/key"},  # a real party's own config
        {"partition-id": 0, "num-partitions": 3, "key-file": "/x"},
        {},
    ):
        with pytest.raises(PrivacyParameterError, match="simulated node"):
            simulated_node_config(node, run)
    with pytest.raises(PrivacyParameterError, match="partition-id"):
        simulated_node_config({"partition-id": 3, "num-partitions": 3}, run)
    with pytest.raises(PrivacyParameterError, match="partition-id"):
        simulated_node_config({"partition-id": 0, "num-partitions": 4}, run)


@pytest.mark.slow
def test_gopa_and_secagg_on_the_simulation_engine_through_flwr_run() -> None:
    """K = 5 on Flower's simulation engine, submitted with ``flwr run`` (no deprecated
    API): GOPA releases the mean of the values plus the keyed noise; double-masked GOPA
    releases with every party's verified epsilon."""
    pytest.importorskip("ray")
    from renyi.federated.gopa_flower import run_simulated_session
    from renyi.federated.secagg import PartyPolicy
    from renyi.federated.secagg_flower import run_secagg_simulation

    res = run_simulated_session(
        VALUES, sigma_eta=0.3, sigma_delta=25.0, peers=2, noise_keys=KEYS, session=SID
    )
    assert res.status == "released", res.reason
    assert abs(res.estimate - _expected(list(range(K)))) <= G / 2
    policy = PartyPolicy(
        epsilon=2.0, delta=1e-5, min_sigma_eta=2.0, min_cohort=4, min_peers=4, max_corrupt=1
    )
    run = run_secagg_simulation(
        VALUES,
        policy,
        {"sigma-eta": 2.0, "sigma-delta": 10.0, "peers": 4, "threshold": 3, "min-survivors": 4},
        budget_epsilon=10.0,
        budget_delta=1e-5,
    )
    (s,) = run.sessions
    assert s["status"] == "released" and len(s["included"]) == K
    assert max(s["party_epsilon"].values()) <= 2.0
