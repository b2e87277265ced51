"""Client-level DP-FedAvg under double-masked secure aggregation on Flower
(renyi.federated.secure_fedavg): clients clip their own updates, add their own noise, pin
their own privacy; the server sees only the survivors' noisy sum.

In-process, on a small Grid that calls the parties' real ClientApp (the relay's Flower
messages, no processes): a client lost mid-training, ε against an independent accountant,
a budget that stops training, a server below the clients' pins. On a real deployment
(flower-superlink + 5 long-lived nodes, ~40 s of CPU: slow): a malicious run refused, then
three rounds with one client killed (SIGKILL) in the second.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("flwr")

from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from renyi import noise
from renyi.accountants import RdpAccountant
from renyi.analysis.closed_forms import gaussian_epsilon
from renyi.analysis.events import GaussianEvent, Neighbouring
from renyi.budget import Budget
from renyi.federated.channels import ChaCha20Source, Roster
from renyi.federated.flower_deploy import LocalDeployment
from renyi.federated.secagg import PartyPolicy
from renyi.federated.secagg_accounting import worst_case_mu
from renyi.federated.secagg_flower import pinned_node_configs
from renyi.federated.secure_fedavg import SecureDpFedAvg, clip_scale, example_client_app

K, D, C = 5, 4, 1.0
KEYS = [bytes([i + 51]) * 32 for i in range(K)]
TARGETS = np.array(
    [
        [0.3, -0.2, 0.1, 0.0],
        [0.1, 0.1, 0.1, 0.1],
        [-0.4, 0.2, 0.0, 0.3],
        [0.2, 0.0, -0.1, 0.2],
        [3.0, 4.0, 0.0, 0.0],
    ]
)  # fmt: skip  (the last one is clipped: norm 5 > C)
# the clients' own pins: worst case eps <= 2 at 1e-5 per round against one colluding client
POLICY = PartyPolicy(
    epsilon=2.0, delta=1e-5, min_sigma_eta=0.5, min_cohort=4, min_peers=4, max_corrupt=1
)
SESSION = dict(sigma_eta=1.5, sigma_delta=10.0, peers=4, threshold=3, min_survivors=4)
MU = worst_case_mu(1.5, 10.0, 3, 1)  # 0.388: eps 1.50 per round


def _configs(tmp: Path, budget: float = 50.0) -> tuple[Roster, list[dict[str, Any]]]:
    roster_file, cfgs = pinned_node_configs(
        tmp, [0.0] * K, POLICY, budget_epsilon=budget, budget_delta=1e-5, noise_keys=KEYS
    )
    for cfg, target in zip(cfgs, TARGETS, strict=True):
        cfg["target"] = json.dumps(target.tolist())
    return Roster.from_json(roster_file.read_text()), cfgs


@pytest.fixture(autouse=True)
def _server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a ServerApp process has set when it builds messages (Flower's TaskIdentity)."""
    for attr, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


class _Grid:
    """A Grid that delivers each message to a node's ClientApp at once (in this process);
    ``kill = (node, phase, n)``: the node stops answering at the n-th ``phase`` message."""

    def __init__(self, configs: list[dict[str, Any]], kill: tuple[int, str, int] | None = None):
        self.contexts = {
            i + 1: Context(
                run_id=1, node_id=i + 1, node_config=c, state=RecordDict(), run_config={}
            )
            for i, c in enumerate(configs)
        }
        self.replies: dict[str, Message] = {}
        self.kill = kill
        self.count = 0
        self.down: set[int] = set()

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.down]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id
            ids.append(m.object_id)
            node = m.metadata.dst_node_id
            if self.kill and (node, m.content["renyi-relay"]["relay.phase"]) == self.kill[:2]:
                self.count += 1
                if self.count == self.kill[2]:
                    self.down.add(node)
            if node not in self.down:
                self.replies[m.object_id] = example_client_app(m, self.contexts[node])
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def _workflow(roster: Roster, **kw: Any) -> SecureDpFedAvg:
    base: dict[str, Any] = dict(clip_norm=C, max_corrupt=1, delta=1e-5, grace=0.2, **SESSION)
    base.update(kw)
    return SecureDpFedAvg(roster, **base)


def _eta(i: int) -> np.ndarray:
    return np.asarray(SESSION["sigma_eta"] * noise.standard_normal(D, rng=ChaCha20Source(KEYS[i])))


def _step(model: np.ndarray, parties: list[int]) -> np.ndarray:
    """The expected update: 2C times the mean of the clipped, scaled updates plus each
    party's keyed noise (the release is this up to the lattice rounding)."""
    xs = [clip_scale(TARGETS[i] - model, C) + _eta(i) for i in parties]
    return model + 2.0 * C * np.mean(xs, axis=0)


def test_training_survives_a_lost_client_and_accounts_every_round(tmp_path: Path) -> None:
    """Three rounds; party 2 stops answering at round 2's ``shares`` (after its shares went
    out, before its masked update): rounds 2 and 3 are released over the four others,
    nobody is unmasked, the model follows the survivors' clipped noisy mean, and ε is three
    Gaussian rounds of noise multiplier 1/mu (the clients' own worst-case bound)."""
    roster, cfgs = _configs(tmp_path)
    grid = _Grid(cfgs, kill=(3, "shares", 2))  # node 3 is party-002
    wf = _workflow(roster)
    model = np.zeros(D)
    out = wf.run(grid, [model], 3)  # type: ignore[arg-type]
    assert [r.round for r in wf.history] == [1, 2, 3]
    assert [r.status for r in wf.history] == ["released"] * 3
    assert wf.history[0].dropped == () and wf.history[1].dropped == ("party-002",)
    assert wf.history[2].included == ("party-000", "party-001", "party-003", "party-004")
    g = noise.lattice_step(SESSION["sigma_eta"])
    m1 = _step(model, list(range(K)))
    m2 = _step(m1, [0, 1, 3, 4])
    m3 = _step(m2, [0, 1, 3, 4])
    tol = 2.0 * C * g * 3  # a lattice step per round on the mean, three rounds
    assert np.max(np.abs(out[0] - m3)) <= tol
    mu = MU
    assert wf.mu == mu
    ref = RdpAccountant().compose(GaussianEvent(1 / mu, neighbouring=Neighbouring.REPLACE_ONE), 3)
    assert wf.history[-1].epsilon == ref.epsilon(1e-5).epsilon
    # a proven upper bound: at least the exact GDP composition sqrt(3) mu
    assert wf.history[-1].epsilon >= gaussian_epsilon(math.sqrt(3) * mu, 1e-5)
    dp_accounting = pytest.importorskip("dp_accounting")
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(1 / mu), 3)
    assert wf.history[-1].epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=0.02)


def test_the_server_budget_stops_training(tmp_path: Path) -> None:
    roster, cfgs = _configs(tmp_path)
    one = gaussian_epsilon(MU, 1e-5)
    wf = _workflow(roster, budget=Budget(epsilon=1.5 * one, delta=1e-5))
    wf.run(_Grid(cfgs), [np.zeros(D)], 3)  # type: ignore[arg-type]
    assert [r.status for r in wf.history] == ["released", "budget-exhausted"]


@pytest.mark.filterwarnings("ignore::renyi.errors.OrderAtGridEdgeWarning")
def test_a_server_below_the_clients_pins_gets_nothing(tmp_path: Path) -> None:
    """sigma_eta ~ 0, sigma_delta = 0 proposed: every client refuses before anything of its
    update leaves it; every round aborts and the model does not move."""
    roster, cfgs = _configs(tmp_path)
    wf = SecureDpFedAvg(
        roster, clip_norm=C, max_corrupt=1, delta=1e-5, grace=0.2,
        sigma_eta=1e-9, sigma_delta=0.0, peers=4, threshold=3, min_survivors=4,
    )  # fmt: skip
    out = wf.run(_Grid(cfgs), [np.full(D, 0.5)], 2)  # type: ignore[arg-type]
    assert [r.status for r in wf.history] == ["aborted", "aborted"]
    assert wf.history[0].reason.count("< its minimum 0.5") == K
    assert np.array_equal(out[0], np.full(D, 0.5))


def test_clip_scale_bounds_any_update() -> None:
    """Never above 1/2 as numpy measures it (the party's own check refused 0.5 + 1 ulp)."""
    rng = np.random.default_rng(3)
    cases = [np.array([1e300, -1e300, 0.0]), np.array([1e-300, 0.0]), np.zeros(3)]
    cases += [rng.normal(size=d) * 10.0 ** rng.uniform(-3, 3) for d in rng.integers(1, 50, 300)]
    for u in cases:
        assert np.linalg.norm(clip_scale(u, 0.7)) <= 0.5
    with pytest.raises(ValueError, match="update"):
        clip_scale(np.array([np.nan]), 1.0)


@pytest.mark.slow
def test_deployment_malicious_run_refused_then_training_survives_a_killed_client(
    tmp_path: Path,
) -> None:
    """Real flower-superlink + 5 long-lived nodes. Run 1: a server proposing sigma_eta =
    1e-9, sigma_delta = 0 (the issue's first row): every client refuses every round, the
    model does not move. Run 2 on the same nodes: three rounds; node 2 is killed (SIGKILL of
    its process group) during round 2 after the shares were distributed; rounds 2 and 3 are
    released over the four others and ε is reported per round."""
    dep = LocalDeployment([{}] * K, "renyi.federated.secure_fedavg:example_client_app")
    try:
        roster_file, cfgs = pinned_node_configs(
            dep.workdir, [0.0] * K, POLICY, budget_epsilon=50.0, budget_delta=1e-5, noise_keys=KEYS
        )
        for cfg, target in zip(cfgs, TARGETS, strict=True):
            cfg["target"] = json.dumps(target.tolist())
        dep.node_configs = cfgs
    except BaseException:
        dep.close()
        raise
    run = {
        "roster-file": str(roster_file), "initial": json.dumps([0.0] * D), "rounds": 3,
        "clip-norm": C, "sigma-delta": 10.0, "peers": 4, "threshold": 3, "min-survivors": 4,
        "max-corrupt": 1, "delta": 1e-5, "grace": 3.0, "timeout": 120.0,
    }  # fmt: skip
    seen: list[str] = []

    def on_status(line: str, nodes: list[subprocess.Popen[bytes]]) -> None:
        seen.append(line)
        if line == "openings 5" and seen.count("openings 5") == 2:  # round 2, shares sent
            os.killpg(nodes[2].pid, signal.SIGKILL)
            seen.append("killed")

    with dep:
        bad = dep.run(
            "renyi.federated.secure_fedavg:server_app",
            {**run, "sigma-eta": 1e-9, "rounds": 2},
            timeout=300,
        )
        good = dep.run(
            "renyi.federated.secure_fedavg:server_app",
            {**run, "sigma-eta": 1.5},
            timeout=300,
            on_status=on_status,
        )
    assert [h["status"] for h in bad["history"]] == ["aborted", "aborted"]
    assert bad["history"][0]["reason"].count("< its minimum 0.5") == K
    assert bad["model"] == [[0.0] * D]
    assert "killed" in seen
    hist = good["history"]
    assert [h["status"] for h in hist] == ["released"] * 3, hist
    assert hist[0]["dropped"] == [] and hist[1]["dropped"] == ["party-002"]
    assert hist[2]["included"] == ["party-000", "party-001", "party-003", "party-004"]
    assert hist[0]["epsilon"] < hist[1]["epsilon"] < hist[2]["epsilon"]
    m1 = _step(np.zeros(D), list(range(K)))
    m3 = _step(_step(m1, [0, 1, 3, 4]), [0, 1, 3, 4])
    g = noise.lattice_step(1.5)
    assert np.max(np.abs(np.asarray(good["model"][0]) - m3)) <= 2.0 * C * g * 3
