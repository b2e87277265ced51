"""The prefix-sum error table of the strategies (``renyi correlated``, benchmarks).

One row per (strategy, T): sensitivity under the participation pattern (and whether it is
exact), RMSE and max error of the workload estimate at noise σ = 1 per unit sensitivity
(every strategy at the same Gaussian privacy), the vectors the streaming noise keeps, and
the time spent optimising the strategy.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from renyi._validation import check_int, check_range, fail
from renyi.correlated.optimize import optimize_banded, optimize_blt, optimize_dense
from renyi.correlated.strategies import (
    HonakerTreeStrategy,
    Strategy,
    TreeStrategy,
    error_summary,
    identity,
)
from renyi.correlated.streaming import streaming_noise
from renyi.correlated.workload import prefix_coefs, prefix_workload

__all__ = ["DENSE_LIMIT", "STRATEGY_NAMES", "ErrorRow", "build_strategy", "error_table"]

STRATEGY_NAMES = ("dpsgd", "tree", "honaker", "banded", "blt", "dense")
DENSE_LIMIT = {"honaker": 1024, "dense": 512}  # largest T of the O(T³) strategies


@dataclass(frozen=True)
class ErrorRow:
    strategy: str
    steps: int
    bands: int | None
    buffers: int | None
    sensitivity: float
    sensitivity_exact: bool
    rmse: float
    max_error: float
    optimise_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_strategy(
    name: str,
    steps: int,
    *,
    bands: int = 8,
    buffers: int = 3,
    min_sep: int | None = None,
    max_participations: int | None = None,
    momentum: float = 0.0,
    loss: Literal["total", "max"] = "total",
) -> Strategy:
    """The strategy ``name`` for ``steps`` steps, optimised for the pattern where it applies."""
    t = check_int("steps", steps, 1)
    b = t if min_sep is None else check_int("min_sep", min_sep, 1)
    k = max_participations if max_participations is not None else -(-t // b)
    if name == "dpsgd":
        return identity()
    if name == "tree":
        return TreeStrategy()
    if name == "honaker":
        return HonakerTreeStrategy()
    if name == "banded":
        return optimize_banded(
            t,
            bands,
            loss=loss,
            min_sep=b,
            max_participations=k,
            workload=prefix_coefs(t, momentum),
        )
    if name == "blt":
        return optimize_blt(
            t,
            buffers,
            loss=loss,
            min_sep=b,
            max_participations=k,
            workload=prefix_coefs(t, momentum),
        )
    if name == "dense":
        return optimize_dense(t, workload=prefix_workload(t, momentum))
    raise fail("strategy", name, f"one of {STRATEGY_NAMES}")


def error_table(
    steps: list[int],
    strategies: list[str],
    *,
    bands: int = 8,
    buffers: int = 3,
    min_sep: int | None = None,
    max_participations: int | None = None,
    momentum: float = 0.0,
    loss: Literal["total", "max"] = "total",
) -> list[ErrorRow]:
    """Rows of the error table; O(T³) strategies are skipped above their :data:`DENSE_LIMIT`."""
    check_range("momentum", momentum, 0.0, 1.0, high_open=True)
    for name in strategies:
        if name not in STRATEGY_NAMES:
            raise fail("strategy", name, f"one of {STRATEGY_NAMES}")
    rows = []
    for t in steps:
        t = check_int("steps", t, 1)
        sep = t if min_sep is None else min(check_int("min_sep", min_sep, 1), t)
        for name in strategies:
            if t > DENSE_LIMIT.get(name, t):
                continue
            start = time.perf_counter()
            s = build_strategy(
                name,
                t,
                bands=bands,
                buffers=buffers,
                min_sep=sep,
                max_participations=max_participations,
                momentum=momentum,
                loss=loss,
            )
            seconds = time.perf_counter() - start if name in ("banded", "blt", "dense") else 0.0
            e = error_summary(
                s,
                t,
                min_sep=sep,
                max_participations=max_participations,
                workload=None if momentum == 0 else prefix_coefs(t, momentum),
            )
            kept = streaming_noise(s).buffers if s.streamable else None
            if name == "tree":
                kept = math.ceil(math.log2(t)) + 1
            rows.append(
                ErrorRow(
                    name,
                    t,
                    s.bands,
                    kept,
                    e.sensitivity,
                    e.sensitivity_exact,
                    e.rmse,
                    e.max_error,
                    seconds,
                )
            )
    return rows
