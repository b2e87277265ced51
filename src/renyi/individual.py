"""Individual privacy accounting: a Rényi filter per record (Feldman & Zrnic 2021).

DP-SGD charges every record the worst case: a gradient of norm ``C`` at every step. Most
records have smaller clipped gradients, so the divergence their presence causes is smaller.
Feldman & Zrnic ("Individual privacy accounting via a Rényi filter", NeurIPS 2021) charge
each record its own Rényi divergence at each step and stop using a record once its total
would pass the budget; every record then enjoys the budget's guarantee, while the records
that cost less keep training for longer.

The filter here, for Poisson-subsampled Gaussian steps (sampling rate ``q``, noise
``N(0, σ²C²)`` on the sum of clipped gradients):

* at each step, record ``i`` with clipped gradient norm ``s_i C`` (``0 ≤ s_i ≤ 1``) costs
  the RDP of the Poisson-subsampled Gaussian with noise multiplier ``σ / s_i`` — its
  sensitivity is ``s_i C`` instead of ``C``; ``s_i`` is rounded **up** to a grid of
  ``levels`` values, so costs come from one table and are never under-charged;
* a record takes part in a step only if its spent curve plus that step's cost stays at or
  below the budget curve ``B(α)`` at **every** order; otherwise it is retired for good;
* the budget is the curve of a planned worst-case run (``planned_steps`` steps at ``C``),
  so every record's (ε, δ) is at most that run's: ε_i = min_α conv(α, spent_i(α)) ≤
  min_α conv(α, B(α)).

Validity (Feldman & Zrnic 2021, Theorem 3.3 with the per-step losses of their Section 5): the
filter is valid under adaptive composition when each step's individual cost is a function of
the earlier outputs and of the record itself only. Here ``s_i`` is computed from the current
model (a function of the released noisy updates) and record ``i``; it must be computed for
**every** active record at every step, sampled or not (whether a record was sampled is
secret). The spent curves are kept as integer counts per level, so "all norms equal C" is
exactly standard accounting (the same numbers, the same number of steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_delta, check_int, check_positive, check_probability, fail
from renyi.analysis.conversions import rdp_to_dp
from renyi.analysis.curves import DEFAULT_ORDERS
from renyi.analysis.subsampling import poisson_subsampled_gaussian_rdp

__all__ = ["IndividualRdpFilter"]


class IndividualRdpFilter:
    """Per-record Rényi filters for Poisson-subsampled Gaussian steps.

    Args:
        num_records: number of records ``n``.
        noise_multiplier: σ (noise std / C).
        sampling_rate: Poisson sampling rate ``q``.
        planned_steps: the budget is ``planned_steps`` worst-case steps: ``B(α) =
            planned_steps · RDP_q,σ(α)``.
        levels: sensitivities are rounded up to multiples of ``1 / levels``.
        orders: Rényi orders of the filter (any set gives a valid filter).

    Example:
        >>> import numpy as np
        >>> f = IndividualRdpFilter(3, noise_multiplier=1.0, sampling_rate=0.1, planned_steps=2)
        >>> [f.admit(np.array([1.0, 0.1, 0.0])).tolist() for _ in range(3)]
        [[True, True, True], [True, True, True], [False, True, True]]
        >>> f.steps_taken.tolist()
        [2, 3, 3]
    """

    def __init__(
        self,
        num_records: int,
        *,
        noise_multiplier: float,
        sampling_rate: float,
        planned_steps: int,
        levels: int = 64,
        orders: ArrayLike = DEFAULT_ORDERS,
    ) -> None:
        self.num_records = check_int("num_records", num_records, minimum=1)
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self.sampling_rate = check_probability("sampling_rate", sampling_rate)
        self.planned_steps = check_int("planned_steps", planned_steps, minimum=1)
        self.levels = check_int("levels", levels, minimum=1)
        self.orders = np.asarray(orders, dtype=np.float64)
        if self.orders.ndim != 1 or self.orders.size == 0 or not (self.orders > 1).all():
            raise fail("orders", orders, "a non-empty 1-D array of orders > 1")
        # table[l] = cost of one step at sensitivity l / levels (row 0: not in the data)
        table = np.zeros((self.levels + 1, self.orders.size))
        for lev in range(1, self.levels + 1):
            sigma = self.noise_multiplier * self.levels / lev
            table[lev] = poisson_subsampled_gaussian_rdp(self.sampling_rate, sigma, self.orders)
        self.table = table
        self.table.setflags(write=False)
        self.budget = self.planned_steps * table[self.levels]
        self.counts = np.zeros((self.num_records, self.levels + 1), dtype=np.int64)
        self.active = np.ones(self.num_records, dtype=bool)
        self.retired_at = np.full(self.num_records, -1, dtype=np.int64)
        self.step = 0

    def level(self, sensitivities: ArrayLike) -> NDArray[np.int64]:
        """Each ``s_i = clipped norm / C`` rounded up to the filter's grid (index 0..levels)."""
        s = np.asarray(sensitivities, dtype=np.float64)
        if s.shape != (self.num_records,):
            raise fail("sensitivities", f"shape {s.shape}", f"shape ({self.num_records},)")
        if np.isnan(s).any() or (s < 0).any() or (s > 1).any():
            raise fail("sensitivities", "values", "clipped norm / C in [0, 1], no NaN")
        lev = np.ceil(s * self.levels).astype(np.int64)
        # rounding must never go down: s * levels may round below the true product
        lev += (lev / self.levels < s).astype(np.int64)
        return np.minimum(lev, self.levels)

    def spent(self) -> NDArray[np.float64]:
        """Spent RDP curve of every record, ``[n, orders]`` (sum of its step costs)."""
        return self.counts @ self.table

    def admit(self, sensitivities: ArrayLike) -> NDArray[np.bool_]:
        """One step: which records may take part, charging them; the others are retired.

        ``sensitivities[i]`` is record ``i``'s clipped gradient norm over ``C`` at the current
        model (needed for every record, sampled or not; retired records are ignored).
        """
        lev = self.level(sensitivities)
        idx = np.flatnonzero(self.active)
        trial = self.counts[idx].copy()
        trial[np.arange(idx.size), lev[idx]] += 1
        fits = ((trial @ self.table) <= self.budget).all(axis=1)
        admitted = np.zeros(self.num_records, dtype=bool)
        admitted[idx[fits]] = True
        self.counts[idx[fits]] = trial[fits]
        newly = idx[~fits]
        self.active[newly] = False
        self.retired_at[newly] = self.step
        self.step += 1
        return admitted

    @property
    def steps_taken(self) -> NDArray[np.int64]:
        """Steps each record took part in (was eligible for sampling)."""
        return self.counts.sum(axis=1)

    @property
    def retired(self) -> int:
        """Number of records whose budget is spent."""
        return int((~self.active).sum())

    def budget_epsilon(self, delta: float) -> float:
        """ε of the budget curve at ``delta``: every record's guarantee is at least this good."""
        return float(rdp_to_dp(self.orders, self.budget, check_delta(delta))[0])

    def epsilons(self, delta: float) -> NDArray[np.float64]:
        """Each record's ε at ``delta`` from its spent curve (Balle et al. 2020 conversion)."""
        delta = check_delta(delta)
        spent = self.spent()
        out = np.empty(self.num_records)
        cache: dict[bytes, float] = {}
        for i in range(self.num_records):
            key = self.counts[i].tobytes()
            if key not in cache:
                eps = float(rdp_to_dp(self.orders, spent[i], delta)[0]) if spent[i].any() else 0.0
                cache[key] = eps
            out[i] = cache[key]
        return out

    def summary(self, delta: float) -> dict[str, Any]:
        """Percentiles of the per-record ε and how many records were retired."""
        eps = self.epsilons(delta)
        return {
            "min": float(eps.min()),
            "median": float(np.median(eps)),
            "p90": float(np.percentile(eps, 90)),
            "max": float(eps.max()),
            "budget": self.budget_epsilon(delta),
            "examples_retired": self.retired,
            "steps": self.step,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts.tolist(),
            "active": self.active.tolist(),
            "retired_at": self.retired_at.tolist(),
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        counts = np.asarray(state["counts"], dtype=np.int64)
        if counts.shape != self.counts.shape:
            raise fail("state", f"counts of shape {counts.shape}", f"{self.counts.shape}")
        self.counts = counts
        self.active = np.asarray(state["active"], dtype=bool)
        self.retired_at = np.asarray(state["retired_at"], dtype=np.int64)
        self.step = int(state["step"])

    def __repr__(self) -> str:
        return (
            f"IndividualRdpFilter(n={self.num_records}, σ={self.noise_multiplier:g}, "
            f"q={self.sampling_rate:g}, planned_steps={self.planned_steps}, step={self.step}, "
            f"retired={self.retired})"
        )
