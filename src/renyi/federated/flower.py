"""Client-level DP-FedAvg as a Flower strategy (optional extra ``flower``: ``flwr[simulation]``).

:class:`DpFedAvgStrategy` is a :class:`flwr.serverapp.strategy.Strategy` (Flower's Message
API, tested with flwr 1.41) whose privacy-relevant steps all come from
:mod:`renyi.federated.fedavg`, the single source of truth for the DP-FedAvg mathematics
(McMahan et al. 2018, "Learning differentially private recurrent language models", ICLR,
arXiv:1710.06963; adaptive clipping of Andrew et al. 2021, "Differentially private learning
with adaptive clipping", NeurIPS, arXiv:1905.03871):

1. **Sampling** (``configure_train``): the strategy does *not* use Flower's node sampler
   (``random.sample``: fixed size, non-cryptographic). It draws the round's clients with
   :meth:`DpFedAvg.sample_clients` from the secure source of :mod:`renyi.random`:

   * ``sampling="poisson"``: every connected node joins independently with probability
     ``q = clients_per_round / population`` (add/remove neighbours; the number of
     participants is random and is never reported);
   * ``sampling="fixed"``: exactly ``clients_per_round`` of exactly ``population`` connected
     nodes, without replacement (replace-one neighbours).

2. **Release** (``aggregate_train``): each reply's model minus the global model is one
   client's update (all arrays flattened into one vector, whole-model L2 norm);
   :meth:`DpFedAvg.round` clips each update to ``C``, sums, adds ``N(0, (z C)²)`` per
   coordinate, divides by ``clients_per_round`` (fixed denominator) and, with
   :class:`AdaptiveClipping`, releases the noisy unclipped fraction and moves ``C``. The new
   global model is ``global + server_learning_rate * noisy_average``.

3. **Accounting**: the round's event (:func:`fedavg_event`: ``PoissonSampledEvent`` or
   ``SampledWithoutReplacementEvent`` of a ``GaussianEvent``) is charged to the optional
   :class:`~renyi.budget.Budget` (which refuses a round past the limit *before* any client is
   contacted) and composed into an accountant (:class:`~renyi.accountants.RdpAccountant` by
   default) when the round is committed, i.e. before its release; the fit metrics of every
   round report the cumulative ``epsilon`` at ``delta``.

Failed or malformed replies (error, wrong keys or shapes, non-finite values) count as a
client that sent nothing: with Poisson sampling the client is simply absent; with fixed-size
sampling its row is a zero update (a legal contribution of norm 0 <= C, so the replace-one
sensitivity ``2C`` is unchanged). Client-side training metrics and federated evaluation
results are **not** protected by this guarantee, so training metrics are dropped and
federated evaluation is off unless ``federated_evaluation=True``.

Accountant support: the round's event must be one the accountant can price. The RDP
accountant analyses the Poisson-subsampled Gaussian; for ``sampling="fixed"`` (sampling
without replacement) use an accountant that supports it, e.g. ``DpFedAvg(...,
accountant="zcdp")`` (no amplification credited: valid, looser). The strategy checks this,
and that the optional budget can price the event, when it is built.

Example (a real multi-process run: see ``docs/flower.md``)::

    from flwr.serverapp import Grid, ServerApp
    from renyi.federated.fedavg import DpFedAvg
    from renyi.federated.flower import DpFedAvgStrategy

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context) -> None:
        server = DpFedAvg(population=100, clients_per_round=10, noise_multiplier=1.0,
                          clip_norm=0.5)
        strategy = DpFedAvgStrategy(server, delta=1e-5)
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=20)
        print(result.train_metrics_clientapp[20]["epsilon"])
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

# Nothing leaves the machine: Flower telemetry and Ray usage statistics off before import.
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

try:
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )
    from flwr.common.logger import log
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import Strategy
except ImportError as exc:  # pragma: no cover - exercised only without flwr
    raise ImportError(
        "renyi.federated.flower needs Flower: pip install 'renyi[flower]' "
        "(or pip install 'flwr[simulation]')"
    ) from exc

from renyi._validation import check_delta, check_int, check_positive, fail
from renyi.accountants import Accountant, EpsilonResult, make_accountant
from renyi.analysis.events import Event
from renyi.budget import Budget
from renyi.errors import BudgetExceededError, UnsupportedEventError
from renyi.federated.fedavg import DpFedAvg, fedavg_event, row_norms
from renyi.random import get_source

__all__ = ["DpFedAvgStrategy", "RoundMetrics"]

OnExhausted = Literal["stop", "raise"]


@dataclass(frozen=True)
class RoundMetrics:
    """What the strategy reports for one committed round (also its fit ``MetricRecord``)."""

    round: int
    epsilon: float
    delta: float
    noise_multiplier: float
    clip_norm: float
    noise_std_on_average: float
    unclipped_fraction: float | None

    def to_metric_record(self) -> MetricRecord:
        """The Flower ``MetricRecord`` of these values (``unclipped-fraction`` if adaptive)."""
        values: dict[str, int | float | list[int] | list[float]] = {
            "server-round": self.round,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "noise-multiplier": self.noise_multiplier,
            "clip-norm": self.clip_norm,
            "noise-std": self.noise_std_on_average,
        }
        if self.unclipped_fraction is not None:
            values["unclipped-fraction"] = self.unclipped_fraction
        return MetricRecord(values)


@dataclass(frozen=True)
class _Layout:
    """Keys, shapes and dtypes of the global model and its flattened float64 values."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype[Any], ...]
    flat: NDArray[np.float64]

    @classmethod
    def of(cls, arrays: ArrayRecord) -> _Layout:
        keys = tuple(str(k) for k in arrays.keys())
        nds = [np.asarray(arrays[k].numpy()) for k in keys]
        for k, a in zip(keys, nds, strict=True):
            if not np.issubdtype(a.dtype, np.floating):
                raise fail(
                    "initial_arrays",
                    f"{k}: {a.dtype}",
                    "floating-point arrays only (DP noise is added to every array)",
                )
        flat = (
            np.concatenate([a.ravel().astype(np.float64) for a in nds])
            if nds
            else np.zeros(0, dtype=np.float64)
        )
        if not np.isfinite(flat).all():
            raise fail("arrays", "non-finite values", "a finite global model")
        return cls(keys, tuple(a.shape for a in nds), tuple(a.dtype for a in nds), flat)

    def flatten(self, arrays: ArrayRecord) -> NDArray[np.float64] | None:
        """The reply's arrays flattened like the global model, or None if they do not fit."""
        if tuple(str(k) for k in arrays.keys()) != self.keys:
            return None
        parts = []
        for k, shape in zip(self.keys, self.shapes, strict=True):
            a = np.asarray(arrays[k].numpy())
            if a.shape != shape or not np.issubdtype(a.dtype, np.number):
                return None
            parts.append(a.ravel().astype(np.float64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)

    def unflatten(self, flat: NDArray[np.float64]) -> ArrayRecord:
        out: dict[str, Array] = {}
        start = 0
        for k, shape, dtype in zip(self.keys, self.shapes, self.dtypes, strict=True):
            size = math.prod(shape)
            part = flat[start : start + size].reshape(shape).astype(dtype)
            out[k] = Array(np.ascontiguousarray(part))
            start += size
        return ArrayRecord(out)


class DpFedAvgStrategy(Strategy):  # type: ignore[misc]
    """Flower strategy running client-level DP-FedAvg with our sampling, noise and accounting.

    Args:
        server: the :class:`~renyi.federated.fedavg.DpFedAvg` holding population, clients per
            round, noise multiplier ``z``, clip norm or :class:`AdaptiveClipping`, sampling
            scheme, accountant name and ``rng`` (``None``: OS-entropy source).
        delta: the δ at which ε is reported each round, in (0, 1).
        budget: optional :class:`~renyi.budget.Budget`; each round's event is spent before
            any client is contacted, and a round that does not fit is refused.
        on_budget_exhausted: ``"stop"`` (default) skips the refused round and all later ones,
            keeping the last model and reporting ``budget-exhausted = 1``; ``"raise"``
            propagates :class:`~renyi.errors.BudgetExceededError` out of ``start``.
        server_learning_rate: step applied to the noisy average update (McMahan et al. 2018
            use 1.0); positive.
        min_available_nodes: how many connected nodes to wait for before sampling
            (default ``population``; fixed-size sampling needs exactly ``population``).
        node_wait_timeout: seconds to wait for them before raising.
        federated_evaluation: send the global model to every node for evaluation and report
            the unweighted mean of numeric metrics (**not** differentially private).
        accountant: the accountant to compose into (default: a fresh one named by
            ``server.accountant``, the RDP accountant unless configured otherwise).

    The guarantee is client-level (neighbouring federations differ in one client's data),
    with the neighbouring relation of ``server.sampling`` (module docstring).
    """

    def __init__(
        self,
        server: DpFedAvg,
        *,
        delta: float,
        budget: Budget | None = None,
        on_budget_exhausted: OnExhausted = "stop",
        server_learning_rate: float = 1.0,
        min_available_nodes: int | None = None,
        node_wait_timeout: float = 600.0,
        federated_evaluation: bool = False,
        accountant: Accountant | None = None,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        if not isinstance(server, DpFedAvg):
            raise fail("server", type(server).__name__, "a renyi.federated.fedavg.DpFedAvg")
        self.delta = check_delta(delta)
        if budget is not None and not isinstance(budget, Budget):
            raise fail("budget", type(budget).__name__, "a renyi.budget.Budget or None")
        if on_budget_exhausted not in ("stop", "raise"):
            raise fail("on_budget_exhausted", on_budget_exhausted, "'stop' or 'raise'")
        self.server_learning_rate = check_positive("server_learning_rate", server_learning_rate)
        population = int(server.population)
        if min_available_nodes is None:
            min_available_nodes = population
        self.min_available_nodes = check_int("min_available_nodes", min_available_nodes, 1)
        if self.min_available_nodes > population or (
            server.sampling == "fixed" and self.min_available_nodes != population
        ):
            expected = (
                f"= population={population} for fixed-size sampling"
                if server.sampling == "fixed"
                else f"an integer in [1, population={population}]"
            )
            raise fail("min_available_nodes", min_available_nodes, expected)
        self.node_wait_timeout = check_positive("node_wait_timeout", node_wait_timeout)
        if accountant is not None and not isinstance(accountant, Accountant):
            raise fail("accountant", type(accountant).__name__, "a renyi Accountant or None")
        self.server = server
        self.budget = budget
        self.on_budget_exhausted: OnExhausted = on_budget_exhausted
        self.federated_evaluation = bool(federated_evaluation)
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key
        self.event: Event = fedavg_event(
            server.noise_multiplier,
            population=population,
            clients_per_round=int(server.clients_per_round),
            sampling=server.sampling,
        )
        if accountant is None:
            accountant = make_accountant(server.accountant)
        if not accountant.supports(self.event):
            raise fail(
                "accountant",
                accountant.name,
                f"an accountant that supports {type(self.event).__name__} "
                "(sampling='fixed': e.g. DpFedAvg(..., accountant='zcdp'))",
            )
        if budget is not None:
            try:
                budget.cost(self.event)
            except UnsupportedEventError as exc:
                raise fail(
                    "budget", budget.kind, f"a budget that can price this round ({exc})"
                ) from exc
        self.accountant: Accountant = accountant
        self.rounds_committed = 0
        self.exhausted = False
        self.history: list[RoundMetrics] = []
        self._pending: dict[int, tuple[_Layout, frozenset[int]]] = {}

    # ------------------------------------------------------------------ privacy state
    def epsilon(self, delta: float | None = None) -> EpsilonResult:
        """Client-level ε of everything in the accountant (0 while it is empty).

        A caller-supplied ``accountant`` keeps what it held before (e.g. earlier training).
        """
        d = self.delta if delta is None else check_delta(delta)
        if self.accountant.is_empty:
            return EpsilonResult(0.0, d, self.accountant.name)
        return self.accountant.epsilon(d)

    def _commit_round(self, server_round: int, event: Event | None = None) -> bool:
        """Spend the round's event from the budget and compose it; False if refused."""
        if self.exhausted:
            return False
        event = self.event if event is None else event
        if self.budget is not None:
            try:
                self.budget.spend(event, label=f"flower DP-FedAvg round {server_round}")
            except BudgetExceededError:
                if self.on_budget_exhausted == "raise":
                    raise
                self.exhausted = True
                log(WARNING, "DP-FedAvg round %s refused: privacy budget exhausted", server_round)
                return False
        self.accountant = self.accountant.compose(event)
        self.rounds_committed += 1
        return True

    # ------------------------------------------------------------------ sampling
    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        deadline = time.monotonic() + self.node_wait_timeout
        while True:
            nodes = sorted(int(n) for n in grid.get_node_ids())
            if len(nodes) >= self.min_available_nodes:
                break
            if time.monotonic() > deadline:
                if not nodes:
                    raise fail(
                        "connected nodes",
                        0,
                        f">= 1 within node_wait_timeout={self.node_wait_timeout:g} s",
                    )
                # lost nodes: go on with those available; the round is accounted for them
                log(
                    WARNING,
                    "DP-FedAvg: %d of min_available_nodes=%d nodes connected after %g s;"
                    " proceeding with those (accounted for what is actually sampled)",
                    len(nodes),
                    self.min_available_nodes,
                    self.node_wait_timeout,
                )
                break
            time.sleep(0.5)
        if len(nodes) > self.server.population:
            raise fail(
                "connected nodes",
                len(nodes),
                f"<= population={self.server.population} (the accounting assumes it)",
            )
        return nodes

    def _event_for(self, available: int) -> Event:
        """The round's event given how many nodes are connected.

        Poisson: each connected node joins with probability ``q`` whatever their number, so
        the event is unchanged. Fixed size with ``n < population`` connected nodes: the
        round samples ``min(m, n)`` of those ``n``, i.e. the event of population ``n``.
        """
        s = self.server
        if s.sampling == "poisson" or available >= s.population:
            return self.event
        return fedavg_event(
            s.noise_multiplier,
            population=available,
            clients_per_round=min(int(s.clients_per_round), available),
            sampling="fixed",
        )

    def _sample(self, nodes: list[int]) -> list[int]:
        """This round's node ids (secure sampling of :meth:`DpFedAvg.sample_clients`)."""
        s = self.server
        if s.sampling == "fixed" and len(nodes) < s.population:
            keys = get_source(s.rng).words(len(nodes)).astype(np.float64)
            pick = np.argsort(keys, kind="stable")[: min(int(s.clients_per_round), len(nodes))]
            return [nodes[i] for i in sorted(pick.tolist())]
        idx = self.server.sample_clients()
        # Poisson: indices past the connected nodes are absent clients (each connected node
        # still joins with probability q); fixed: len(nodes) == population.
        return [nodes[i] for i in idx.tolist() if i < len(nodes)]

    # ------------------------------------------------------------------ Strategy API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Commit the round (budget, accountant), sample clients, send them the model."""
        layout = _Layout.of(arrays)
        nodes = self._wait_for_nodes(grid)
        if not self._commit_round(server_round, self._event_for(len(nodes))):
            return []
        sampled = self._sample(nodes)
        self._pending[server_round] = (layout, frozenset(sampled))
        log(INFO, "configure_train: DP-FedAvg round %s committed", server_round)
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [
            Message(content=record, message_type=MessageType.TRAIN, dst_node_id=node)
            for node in sampled
        ]

    def _update_of(self, reply: Message, layout: _Layout) -> NDArray[np.float64] | str:
        """The reply's update, or why it is refused (the caller logs it)."""
        if reply.has_error():
            return f"error reply ({reply.error.reason})"
        content = reply.content
        if self.arrayrecord_key in content.array_records:
            record = content.array_records[self.arrayrecord_key]
        elif len(content.array_records) == 1:
            record = next(iter(content.array_records.values()))
        else:
            return f"no array record {self.arrayrecord_key!r}"
        flat = layout.flatten(record)
        if flat is None:
            return "arrays do not match the model's keys, shapes or numeric dtypes"
        if not np.isfinite(flat).all():
            return "non-finite values (NaN or inf) in the returned model"
        with np.errstate(over="ignore"):
            update = flat - layout.flat
        if not np.isfinite(update).all() or not np.isfinite(row_norms(update[None, :])).all():
            return "update overflows float64 (model minus global model is not finite)"
        return update

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Clip, sum, add noise and average with :meth:`DpFedAvg.round`; report ε."""
        pending = self._pending.pop(server_round, None)
        if pending is None:  # refused round: nothing released
            eps = self.epsilon().epsilon
            return None, MetricRecord({"budget-exhausted": 1, "epsilon": eps})
        layout, sampled = pending
        rows: list[NDArray[np.float64]] = []
        seen: set[int] = set()
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            if node not in sampled or node in seen:  # one contribution per sampled client
                continue
            seen.add(node)
            update = self._update_of(reply, layout)
            if isinstance(update, str):
                log(
                    WARNING,
                    "DP-FedAvg round %s: update of node %s refused (%s); counted as sending"
                    " nothing",
                    server_round,
                    node,
                    update,
                )
            else:
                rows.append(update)
        m = int(self.server.clients_per_round)
        if self.server.sampling == "fixed":
            rows = rows[:m] + [np.zeros_like(layout.flat)] * max(0, m - len(rows))
        updates = np.stack(rows) if rows else np.zeros((0, layout.flat.shape[0]))
        noisy_average = self.server.round(updates)
        released = self.server.history[-1]
        new_arrays = layout.unflatten(layout.flat + self.server_learning_rate * noisy_average)
        metrics = RoundMetrics(
            round=server_round,
            epsilon=float(self.epsilon().epsilon),
            delta=self.delta,
            noise_multiplier=float(self.server.noise_multiplier),
            clip_norm=float(released.clip_norm),
            noise_std_on_average=float(released.noise_std_on_average),
            unclipped_fraction=released.unclipped_fraction,
        )
        self.history.append(metrics)
        log(
            INFO,
            "aggregate_train: DP-FedAvg round %s, epsilon = %.6g at delta = %g",
            server_round,
            metrics.epsilon,
            self.delta,
        )
        return new_arrays, metrics.to_metric_record()

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation on every node if enabled (not covered by the guarantee)."""
        if not self.federated_evaluation:
            return []
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        nodes = sorted(int(n) for n in grid.get_node_ids())
        return [
            Message(content=record, message_type=MessageType.EVALUATE, dst_node_id=node)
            for node in nodes
        ]

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Unweighted mean of each numeric scalar metric over the successful replies."""
        sums: dict[str, list[float]] = {}
        for reply in replies:
            if reply.has_error():
                continue
            for record in reply.content.metric_records.values():
                for key, value in record.items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        sums.setdefault(str(key), []).append(float(value))
        if not sums:
            return None
        return MetricRecord({k: float(np.mean(v)) for k, v in sums.items()})

    def summary(self) -> None:
        """Log the DP configuration."""
        s = self.server
        log(INFO, "\t├──> DP-FedAvg (renyi): client-level, %s sampling", s.sampling)
        log(
            INFO,
            "\t│\t├── population %d, clients per round %d, noise multiplier %g",
            s.population,
            s.clients_per_round,
            s.noise_multiplier,
        )
        clip = "adaptive" if s.adaptive is not None else f"fixed C = {s.clip_norm:g}"
        log(INFO, "\t│\t├── clipping: %s", clip)
        log(INFO, "\t│\t└── accountant %s, epsilon at delta = %g", self.accountant.name, self.delta)
