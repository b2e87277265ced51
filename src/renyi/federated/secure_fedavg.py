"""Client-level DP-FedAvg under secure aggregation on Flower: the server never sees an update.

What Flower does not have: its SecAgg+ example adds the DP noise at the server (which then
must be trusted with it), ``DpFedAvgStrategy`` clips at the server (it sees every update),
and Flower's SecAgg+ trusts the server with the protocol's parameters and relays public
keys unsigned. Here each round is one session of double-masked GOPA
(:mod:`renyi.federated.secagg`) whose values are the clients' clipped updates:

1. **Server -> clients** (``propose``): the session proposal and the global model.
2. **Client** (:func:`secure_fedavg_client_app`, on a :mod:`~renyi.federated.flower_node`
   node): trains locally (your ``train(arrays, node_config) -> arrays``), takes the update
   ``u = new - global`` (all arrays flattened), **clips it to L2 norm C on the client**
   and scales it to ``x = u min(1, C/||u||) / (2C)`` (norm <= 1/2, so replacing one
   client moves the sum by at most 1); its own :class:`~renyi.federated.secagg.PartyPolicy`
   checks the proposal (least noise, cohort, peers, a safe threshold, its worst-case epsilon
   target) and its own budget is charged before anything leaves.
3. **Secure aggregation with dropout recovery**: the client sends
   ``x + eta + sum +-Y`` on the session's lattice (``renyi.noise.snap``: the rounding is
   post-processing of the continuous Gaussian message, so no discrete-Gaussian correction
   such as KLS 2021's ``tau`` is needed), double-masked with ``t``-of-``k`` Shamir shares;
   a client lost after the shares round is removed from the sum without anyone being
   unmasked.
4. **Server**: releases the mean of the survivors' ``x`` plus their independent noise
   ``eta ~ N(0, sigma_eta²)`` each; the new model is ``global + lr 2C mean``.

**Guarantee** (client-level, replace-one: one client's data, hence its update, changes).
Per round, against a server that colludes with up to ``max_corrupt`` clients and lies as it
likes: the star bound ``mu = worst_case_mu(sigma_eta, sigma_delta, t, c)``
(:mod:`renyi.federated.secagg_accounting`), the same ``mu`` every client checks itself; a
round is the Gaussian event with noise multiplier ``1/mu`` and rounds compose. Against the
released model alone the guarantee is at least as good (post-processing). The
:class:`SecureDpFedAvg` workflow charges each round to its accountant (RDP by default) and
optional :class:`~renyi.budget.Budget` before the round's first message; no amplification by
client sampling is credited (the server, who would sample, is not trusted).
"""

from __future__ import annotations

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

try:
    from flwr.app import Context
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - exercised only without flwr
    raise ImportError(
        "renyi.federated.secure_fedavg needs Flower: pip install 'renyi[flower]'"
    ) from exc

from renyi._validation import check_delta, check_int, check_nonnegative, check_positive, fail
from renyi.accountants import Accountant, EpsilonResult, make_accountant
from renyi.analysis.events import GaussianEvent, Neighbouring
from renyi.budget import Budget
from renyi.errors import BudgetExceededError
from renyi.federated.channels import Roster
from renyi.federated.fedavg import row_norms
from renyi.federated.flower_deploy import write_result
from renyi.federated.flower_relay import relay_client_app, relay_over_grid
from renyi.federated.relay import Payload
from renyi.federated.secagg import SessionProposal
from renyi.federated.secagg_accounting import worst_case_mu
from renyi.federated.secagg_flower import SecAggDriver, SecAggEndpoint

__all__ = [
    "PROTOCOL",
    "RoundRecord",
    "SecureDpFedAvg",
    "TrainFn",
    "clip_scale",
    "example_client_app",
    "secure_fedavg_client_app",
    "server_app",
]

PROTOCOL = "renyi-secure-fedavg"
TrainFn = Callable[[list[NDArray[np.float64]], Mapping[str, Any]], Sequence[Any]]


def _pack(arrays: Sequence[NDArray[np.float64]]) -> tuple[bytes, str]:
    flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
    return flat.astype("<f8").tobytes(), json.dumps([list(np.shape(a)) for a in arrays])


def _unpack(raw: bytes, shapes: str) -> list[NDArray[np.float64]]:
    flat = np.frombuffer(raw, dtype="<f8").astype(np.float64)
    out, pos = [], 0
    for shape in json.loads(shapes):
        n = math.prod(shape)
        out.append(flat[pos : pos + n].reshape(shape).copy())
        pos += n
    if pos != flat.size:
        raise fail("model", f"{flat.size} numbers", f"{pos} (the shapes sent with it)")
    return out


def clip_scale(update: NDArray[np.float64], clip_norm: float) -> NDArray[np.float64]:
    """``u min(1, C/||u||) / (2C)``: the clipped update on the L2 ball of radius 1/2
    (``numpy.linalg.norm`` of the result is at most 1/2, never a rounding above).

    >>> x = clip_scale(np.array([3.0, 4.0]), 1.0)
    >>> np.round(x, 12).tolist(), bool(np.linalg.norm(x) <= 0.5)
    ([0.3, 0.4], True)
    """
    c = check_positive("clip_norm", clip_norm)
    u = np.asarray(update, dtype=np.float64)
    if u.ndim != 1 or not np.isfinite(u).all():
        raise fail("update", "non-finite or not 1-D", "a finite flattened update")
    norm = float(row_norms(u[None])[0])
    x = u * (min(1.0, c / norm) if norm > 0 else 1.0) / (2.0 * c)
    for _ in range(4):  # rounding may leave the norm a few ulps above 1/2: step inside
        n = float(np.linalg.norm(x))
        if n <= 0.5:
            return x
        x = x * np.nextafter(0.5 / n, 0.0)
    raise fail("update", "norm above 1/2 after clipping", "a clippable update")  # pragma: no cover


def _make_party(train: TrainFn, node: Mapping[str, Any], opening: Payload) -> SecAggEndpoint:
    """The client's side of one round: train, clip on the client, join the session."""
    arrays = _unpack(bytes(opening["model"]), str(opening["shapes"]))
    new = [np.asarray(a, dtype=np.float64) for a in train([a.copy() for a in arrays], node)]
    if [a.shape for a in new] != [a.shape for a in arrays]:
        raise fail("train", [a.shape for a in new], "arrays shaped like the global model")
    update = np.concatenate([(n - g).ravel() for n, g in zip(new, arrays, strict=True)])
    x = clip_scale(update, float(opening["clip-norm"]))
    return SecAggEndpoint(node, x, vector=True)


def secure_fedavg_client_app(train: TrainFn) -> ClientApp:
    """The client's ClientApp; ``train(global_arrays, node_config) -> new_arrays`` is your
    local training (module-level function, so that the app can be shipped to simulation
    workers). The node config must hold the party's pins
    (:mod:`renyi.federated.secagg_flower`); ``value`` is not used."""
    return relay_client_app(PROTOCOL, partial(_make_party, train))


def example_train(arrays: list[NDArray[np.float64]], node: Mapping[str, Any]) -> list[Any]:
    """Toy local training for examples and tests: move the model to the node's ``target``
    (a JSON list in its config), i.e. federated estimation of the mean target."""
    target = np.asarray(json.loads(str(node["target"])), dtype=np.float64)
    flat = np.concatenate([a.ravel() for a in arrays])
    if target.shape != flat.shape:
        raise fail("target", target.shape, f"{flat.shape} numbers (the model's size)")
    out, pos = [], 0
    for a in arrays:
        out.append(target[pos : pos + a.size].reshape(a.shape))
        pos += a.size
    return out


example_client_app = secure_fedavg_client_app(example_train)


class _FedAvgDriver(SecAggDriver):
    def __init__(self, proposal: SessionProposal, roster: Roster, model: Payload) -> None:
        super().__init__(proposal, roster)
        self.model = dict(model)

    def opening(self) -> tuple[str, Payload]:
        phase, payload = super().opening()
        return phase, {**payload, **self.model}


@dataclass(frozen=True)
class RoundRecord:
    """One round: what was released (``status``), who, and ε so far at ``delta``."""

    round: int
    status: str
    included: tuple[str, ...]
    dropped: tuple[str, ...]
    epsilon: float
    reason: str = ""


class SecureDpFedAvg:
    """The server's workflow: one secure-aggregation session per round (module docstring).

    Args:
        roster: the parties (their pinned public keys); all are invited every round.
        clip_norm: ``C``, applied by each client to its own update.
        sigma_eta: independent noise of each client on its scaled update (norm <= 1/2);
            the released mean has noise std ``sigma_eta / sqrt(n)`` per coordinate, i.e.
            ``2 C sigma_eta / sqrt(n)`` on the average update.
        sigma_delta, peers, threshold, min_survivors: the secure-aggregation session
            (see :class:`~renyi.federated.secagg.SessionProposal`); clients refuse values
            below their own pins.
        max_corrupt: clients assumed to collude with the server, for the accountant.
        delta: δ at which ε is reported.
        budget: optional; each round's event is spent before the round starts (a refused
            round stops the training).
        server_learning_rate: the step on the averaged update.
    """

    def __init__(
        self,
        roster: Roster,
        *,
        clip_norm: float,
        sigma_eta: float,
        sigma_delta: float,
        peers: int,
        threshold: int,
        min_survivors: int,
        max_corrupt: int,
        delta: float,
        budget: Budget | None = None,
        accountant: str | Accountant = "rdp",
        server_learning_rate: float = 1.0,
        timeout: float = 120.0,
        grace: float = 5.0,
    ) -> None:
        if not isinstance(roster, Roster):
            raise fail("roster", type(roster).__name__, "a Roster")
        self.roster = roster
        self.clip_norm = check_positive("clip_norm", clip_norm)
        self.sigma_eta = check_positive("sigma_eta", sigma_eta)
        self.sigma_delta = check_nonnegative("sigma_delta", sigma_delta)
        self.peers = check_int("peers", peers, 2)
        self.threshold = check_int("threshold", threshold, 1)
        self.min_survivors = check_int("min_survivors", min_survivors, 1)
        self.max_corrupt = check_int("max_corrupt", max_corrupt, 0)
        self.delta = check_delta(delta)
        self.budget = budget
        self.accountant = make_accountant(accountant)
        self.lr = check_positive("server_learning_rate", server_learning_rate)
        self.timeout, self.grace = (
            check_positive("timeout", timeout),
            check_positive("grace", grace),
        )
        self.mu = worst_case_mu(self.sigma_eta, self.sigma_delta, self.threshold, self.max_corrupt)
        self.event = GaussianEvent(1.0 / self.mu, neighbouring=Neighbouring.REPLACE_ONE)
        if not self.accountant.supports(self.event):
            raise fail("accountant", accountant, "an accountant that prices a Gaussian event")
        self.history: list[RoundRecord] = []

    def epsilon(self) -> EpsilonResult:
        """ε of the rounds charged so far, at :attr:`delta`."""
        return self.accountant.epsilon(self.delta)

    def run(
        self,
        grid: Grid,
        initial: Sequence[Any],
        rounds: int,
        *,
        status_file: Path | None = None,
    ) -> list[NDArray[np.float64]]:
        """Train for ``rounds`` rounds from ``initial`` (a list of float arrays); returns
        the final model. A round that aborts leaves the model as it was (and stays
        charged); a round the budget refuses ends the training."""
        check_int("rounds", rounds, 1)
        model = [np.asarray(a, dtype=np.float64).copy() for a in initial]
        for r in range(1, rounds + 1):
            if self.budget is not None:
                try:
                    self.budget.spend(self.event, label=f"secure DP-FedAvg round {r}")
                except BudgetExceededError as exc:
                    self.history.append(
                        RoundRecord(r, "budget-exhausted", (), (), math.nan, str(exc))
                    )
                    break
            self.accountant.compose(self.event)
            eps = self.epsilon().epsilon
            raw, shapes = _pack(model)
            sid = os.urandom(16)
            proposal = SessionProposal(
                session=sid,
                names=tuple(self.roster),
                sigma_eta=self.sigma_eta,
                sigma_delta=self.sigma_delta,
                peers=self.peers,
                threshold=self.threshold,
                min_survivors=self.min_survivors,
                dimension=len(raw) // 8,
                vector=True,
            )
            driver = _FedAvgDriver(
                proposal,
                self.roster,
                {"model": raw, "shapes": shapes, "clip-norm": self.clip_norm, "round": r},
            )
            outcome, _ = relay_over_grid(
                grid,
                driver,
                protocol=PROTOCOL,
                session=sid,
                expected_nodes=len(self.roster),
                min_nodes=self.min_survivors,
                timeout=self.timeout,
                grace=self.grace,
                status_file=status_file,
            )
            d = outcome.detail
            if outcome.status == "released":
                step = 2.0 * self.clip_norm * np.asarray(d["estimate"], dtype=np.float64)
                flat = np.concatenate([a.ravel() for a in model]) + self.lr * step
                model = _unpack(flat.astype("<f8").tobytes(), shapes)
            self.history.append(
                RoundRecord(
                    r,
                    outcome.status,
                    tuple(d.get("included", ())),
                    tuple(d.get("dropped", ())),
                    eps,
                    str(d.get("reason", "")),
                )
            )
        return model


server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    """Run config: ``roster-file``, ``rounds``, ``initial`` (JSON list of numbers, one
    array), ``clip-norm``, ``sigma-eta``, ``sigma-delta``, ``peers``, ``threshold``,
    ``min-survivors``, ``max-corrupt``, ``delta``, optional ``grace``, ``timeout``,
    ``status-file``, ``result-file``; writes the final model and the history as JSON."""
    cfg = dict(context.run_config)
    out: dict[str, Any]
    try:
        wf = SecureDpFedAvg(
            Roster.from_json(Path(str(cfg["roster-file"])).read_text()),
            clip_norm=float(cfg["clip-norm"]),
            sigma_eta=float(cfg["sigma-eta"]),
            sigma_delta=float(cfg["sigma-delta"]),
            peers=int(cfg["peers"]),
            threshold=int(cfg["threshold"]),
            min_survivors=int(cfg["min-survivors"]),
            max_corrupt=int(cfg["max-corrupt"]),
            delta=float(cfg["delta"]),
            timeout=float(cfg.get("timeout", 120)),
            grace=float(cfg.get("grace", 5)),
        )
        status = Path(str(cfg["status-file"])) if cfg.get("status-file") else None
        model = wf.run(
            grid,
            [np.asarray(json.loads(str(cfg["initial"])), dtype=np.float64)],
            int(cfg["rounds"]),
            status_file=status,
        )
        out = {
            "status": "done",
            "model": [a.tolist() for a in model],
            "history": [asdict(r) for r in wf.history],
            "mu": wf.mu,
        }
    except (ValueError, KeyError, OSError) as exc:
        out = {"status": "aborted", "reason": f"{type(exc).__name__}: {exc}"}
    if cfg.get("result-file"):
        write_result(str(cfg["result-file"]), out)
