"""Does a release take longer for one input than for its neighbour? A rank test on pairs.

Work that depends on secret values shows in time (issue 22: the integer mechanisms took
11.6 µs for ``2**62 - 1`` and 8.8 µs for ``2**62``). :func:`audit_timing` times ``fn(x0)``
and ``fn(x1)`` back to back, ``pairs`` times, in a random order within each pair, and applies
the Wilcoxon signed-rank test to the differences ``t(x1) - t(x0)``.

Why this is robust on a loaded machine: if ``fn``'s time does not depend on its input, then
whatever the load, drift or caching does to the two calls of a pair, the order was a fair
coin independent of all of it, so each difference is as likely positive as negative given
its size. The signed-rank statistic then has its textbook null distribution exactly
(conditionally on the magnitudes), and the false-alarm rate is ``1 - confidence`` at load
average 20 as at load 0. Absolute times and between-pair comparisons are never used.

``auc`` is the within-pair probability that ``x1``'s call was the slower (0.5: no
difference), a scale-free effect size; ``median_ratio`` is the ratio of median times.

Example:
    >>> r = audit_timing(lambda x: sum(range(50)), 0, 1, pairs=200,
    ...                  rng=np.random.default_rng(0))
    >>> r.passed
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from renyi._validation import check_int, check_range

__all__ = ["TimingResult", "audit_timing"]


@dataclass(frozen=True)
class TimingResult:
    """The timing audit of one input pair.

    Attributes:
        pairs: timed pairs.
        p_value: two-sided Wilcoxon signed-rank p-value of the within-pair differences.
        auc: within-pair probability that ``x1`` was slower (ties count 1/2).
        median_ratio: median time on ``x1`` over median time on ``x0``.
        confidence: as asked; ``passed`` is ``p_value >= 1 - confidence``.
        passed: no timing difference detected at that confidence.
    """

    pairs: int
    p_value: float
    auc: float
    median_ratio: float
    confidence: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "p_value": self.p_value,
            "auc": self.auc,
            "median_ratio": self.median_ratio,
            "confidence": self.confidence,
            "passed": self.passed,
        }


def audit_timing(
    fn: Callable[[Any], Any],
    x0: Any,
    x1: Any,
    *,
    pairs: int = 2000,
    warmup: int = 20,
    confidence: float = 0.999,
    rng: np.random.Generator | None = None,
    timer: Callable[[], int] = time.perf_counter_ns,
) -> TimingResult:
    """Time ``fn(x0)`` and ``fn(x1)`` in ``pairs`` randomly ordered pairs; rank-test them.

    ``rng`` draws only the order within each pair (the audit's randomness, not the
    mechanism's). ``warmup`` calls of each input run first and are not timed.
    """
    n = check_int("pairs", pairs, 10)
    w = check_int("warmup", warmup, 0)
    conf = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    gen = rng if rng is not None else np.random.default_rng()
    for _ in range(w):
        fn(x0)
        fn(x1)
    first_is_x1 = gen.random(n) < 0.5
    t0 = np.empty(n)
    t1 = np.empty(n)
    for i in range(n):
        order = (x1, x0) if first_is_x1[i] else (x0, x1)
        times = []
        for x in order:
            start = timer()
            fn(x)
            times.append(timer() - start)
        if first_is_x1[i]:
            t1[i], t0[i] = times
        else:
            t0[i], t1[i] = times
    d = t1 - t0
    if np.all(d == 0):
        p = 1.0
    else:
        p = float(stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided").pvalue)
    auc = float(np.mean(d > 0) + 0.5 * np.mean(d == 0))
    m0 = float(np.median(t0))
    ratio = float(np.median(t1)) / m0 if m0 > 0 else math.inf
    return TimingResult(n, p, auc, ratio, conf, bool(p >= 1.0 - conf))
