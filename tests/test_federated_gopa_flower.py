"""GOPA on a real Flower deployment: flower-superlink + K flower-supernode processes on
loopback, started and stopped by the test (``renyi.federated.gopa_flower``).

Each run starts about K + 2 Python processes per protocol round (Flower spawns one
ClientApp process per message), so these are the slowest tests of the federated suite:
one runs by default (K = 5, a supernode killed mid-protocol), the others are ``slow``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("flwr")

from renyi import noise
from renyi.errors import InsecureRandomnessWarning
from renyi.federated.channels import ChaCha20Source
from renyi.federated.gopa import GopaProtocol
from renyi.federated.gopa_flower import run_local_deployment, session_graph

K = 5
VALUES = [0.11, 0.42, 0.73, 0.25, 0.98]
KEYS = [bytes([i + 7]) * 32 for i in range(K)]
SIGMA_ETA, SIGMA_DELTA, PEERS = 0.3, 25.0, 2


def _expected(parties: list[int]) -> float:
    """Mean of the parties' values plus their independent noise (keyed normals), recomputed;
    the release is this on the lattice g = lattice_step(sigma_eta), each message rounded
    once (so within g / 2 of it)."""
    eta = [SIGMA_ETA * noise.standard_normal(1, rng=ChaCha20Source(KEYS[i]))[0] for i in parties]
    return float((np.asarray(VALUES)[parties].sum() + sum(eta)) / len(parties))


G = noise.lattice_step(SIGMA_ETA)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)


def test_deployment_survives_a_killed_supernode_exactly() -> None:
    """K = 5 supernodes; one is killed (SIGKILL, whole process group) right after pairing.

    Its neighbours reveal their terms within the budget; the release equals the fixed-point
    mean of the four survivors' values plus their own noise bit for bit, and equals the
    in-process reference simulation with the same dropout.
    """
    sid = bytes(range(16))
    edges = session_graph(sid, K, PEERS)
    victim = 3
    killed: list[int] = []

    def on_status(line: str, nodes: list[subprocess.Popen[bytes]]) -> None:
        if line.startswith("paired") and not killed:
            _kill(nodes[victim])
            killed.append(victim)

    res = run_local_deployment(
        VALUES,
        sigma_eta=SIGMA_ETA,
        sigma_delta=SIGMA_DELTA,
        peers=PEERS,
        reveal_budget=2,
        noise_keys=KEYS,
        session=sid,
        grace=20.0,
        notify=False,
        on_status=on_status,
    )
    assert killed == [victim]
    assert res.status == "released", res.reason
    assert res.dropped == (f"party-{victim:03d}",)
    survivors = [i for i in range(K) if i != victim]
    assert abs(res.estimate - _expected(survivors)) <= G / 2
    assert res.raw["revealed_edges"]  # the victim's edges were recovered by reveals
    assert res.bytes_per_party > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        ref = GopaProtocol(
            VALUES,
            sigma_eta=SIGMA_ETA,
            sigma_delta=SIGMA_DELTA,
            peers=PEERS,
            edges=edges,
            reveal_budget=2,
            noise_keys=KEYS,
        )
        ref.send_seeds()
        assert abs(ref.aggregate([victim]).estimate - res.estimate) <= G


_RELAY = textwrap.dedent(
    '''
    """A malicious relay: swaps one party's advertised key for its own signed one."""
    import json
    from pathlib import Path

    from flwr.serverapp import ServerApp

    from renyi.federated import gopa_flower
    from renyi.federated.channels import EphemeralSession, IdentityKey, Roster


    class SwappingGrid:
        def __init__(self, grid):
            self.grid = grid

        def __getattr__(self, name):
            return getattr(self.grid, name)

        def push_messages(self, messages):
            messages = list(messages)
            for m in messages:
                cfg = m.content["gopa"]
                if cfg["phase"] == "pair":
                    names = list(cfg["names"])
                    i = names.index("party-001")
                    mallory = IdentityKey("party-001")
                    fake = EphemeralSession(mallory, Roster.of([mallory]), bytes(cfg["session"]))
                    adverts = list(cfg["adverts"])
                    adverts[i] = fake.advertisement().to_bytes()
                    cfg["adverts"] = adverts
            return self.grid.push_messages(messages)


    app = ServerApp()


    @app.main()
    def main(grid, context):
        cfg = dict(context.run_config)
        out = gopa_flower.serve(SwappingGrid(grid), cfg)
        Path(cfg["result-file"]).write_text(json.dumps(out))
    '''
)


@pytest.mark.slow
def test_deployment_relay_key_substitution_aborts_before_masking() -> None:
    statuses: list[str] = []
    res = run_local_deployment(
        VALUES,
        sigma_eta=SIGMA_ETA,
        sigma_delta=SIGMA_DELTA,
        peers=PEERS,
        noise_keys=KEYS,
        notify=False,
        server_component="malicious_relay:app",
        app_files={"malicious_relay.py": _RELAY},
        on_status=lambda line, _: statuses.append(line.split()[0]),
    )
    assert res.status == "aborted"
    assert "not signed by its pinned identity key" in res.reason
    assert "masked" not in statuses and "paired" not in statuses  # no value left a party


@pytest.mark.slow
def test_deployment_matches_reference_and_cli_runs() -> None:
    res = run_local_deployment(
        VALUES, sigma_eta=SIGMA_ETA, sigma_delta=SIGMA_DELTA, peers=PEERS, noise_keys=KEYS
    )
    assert res.status == "released" and abs(res.estimate - _expected(list(range(K)))) <= G / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        ref = GopaProtocol(
            VALUES, sigma_eta=SIGMA_ETA, sigma_delta=SIGMA_DELTA, peers=PEERS, noise_keys=KEYS
        )
        assert abs(ref.run().estimate - res.estimate) <= G
    out = subprocess.run(
        [sys.executable, "-m", "renyi", "federated", "gopa-run", "--parties", "5", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    import json

    d = json.loads(out.stdout)
    assert d["status"] == "released" and d["parties"] == 5
    assert abs(d["estimate"] - d["true_mean"]) < 8 * d["output_std"]
    assert d["central_std"] < d["output_std"]
