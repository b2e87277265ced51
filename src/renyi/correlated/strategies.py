"""Strategy matrices ``C`` of the matrix factorization mechanism ``A = B C`` and their errors.

The mechanism releases ``C G + σ Z`` (``G``: the T clipped gradient sums, one row per step)
and reconstructs ``A G + σ B Z`` with ``B = A R`` where ``R C = I``. In training only the
*noising matrix* ``R`` matters: step ``t`` adds row ``t`` of ``R σZ`` to its gradient, and the
optimizer applies the workload. So every strategy here gives

* ``matrix(T)``: ``C`` (rows × T, lower triangular when square);
* ``noising_matrix(T)``: ``R`` (T × rows, ``R C = I``; lower triangular when streamable);
* ``sensitivity(T, min_sep, max_participations)``: see :mod:`renyi.correlated.sensitivity`;
* ``per_step_error(T, workload)``: the variance of each row of ``B Z`` (``σ = 1``,
  sensitivity 1 — multiply by ``sens²`` for the error at a fixed privacy level).

Strategies: :func:`identity` (DP-SGD, ``C = I``), :class:`TreeStrategy` (the online binary
tree of DP-FTRL, Kairouz et al. 2021, in its square "Fenwick" form: one node per step),
:class:`HonakerTreeStrategy` (the full binary tree with Honaker's least-squares decoder;
dense, not streamable), :class:`BandedToeplitzStrategy` (Choquette-Choo et al. 2023;
McKenna 2024), :class:`BltStrategy` (buffered linear Toeplitz, Dvijotham et al. 2024) and
:class:`DenseStrategy` (any lower-triangular ``C``, e.g. the optimum of
:func:`renyi.correlated.optimize.optimize_dense`).

Errors (:func:`error_summary`): RMSE = √(mean over steps of the per-step variance)·sens, max =
√(max per-step variance)·sens, in units of σ·(clipping norm) per coordinate.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
import scipy.signal
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, fail
from renyi.correlated.sensitivity import Sensitivity, dense_sensitivity, toeplitz_sensitivity

__all__ = [
    "BandedInverseStrategy",
    "BandedToeplitzStrategy",
    "BltStrategy",
    "DenseStrategy",
    "ErrorSummary",
    "HonakerTreeStrategy",
    "Strategy",
    "TreeStrategy",
    "bisr",
    "error_summary",
    "identity",
    "strategy_from_dict",
]

FloatArray = NDArray[np.float64]


def _workload(steps: int, workload: ArrayLike | None) -> tuple[FloatArray | None, FloatArray]:
    """(Toeplitz first column or None, dense A or an empty array) for ``workload``."""
    if workload is None:
        return np.ones(steps), np.empty(0)
    a = np.asarray(workload, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise fail("workload", "array", "finite numbers")
    if a.ndim == 1:
        if a.size < steps:
            raise fail("workload", f"{a.size} coefficients", f"at least steps={steps}")
        return a[:steps], np.empty(0)
    if a.shape != (steps, steps):
        raise fail("workload", f"shape {a.shape}", f"({steps}, {steps}) or a 1-D first column")
    return None, a


class Strategy(ABC):
    """A factorization strategy (see the module docstring)."""

    name: str

    @abstractmethod
    def matrix(self, steps: int) -> FloatArray:
        """The strategy matrix ``C`` for ``steps`` steps."""

    def noising_matrix(self, steps: int) -> FloatArray:
        """``R`` with ``R C = I`` (default: ``C⁻¹`` of a square lower-triangular ``C``)."""
        c = self.matrix(steps)
        return np.asarray(scipy.linalg.solve_triangular(c, np.eye(steps), lower=True))

    @abstractmethod
    def sensitivity(
        self, steps: int, min_sep: int = 1, max_participations: int | None = 1
    ) -> Sensitivity:
        """L2 sensitivity of ``C`` under b-min-sep participation (``None``: ⌈T/b⌉)."""

    @property
    def bands(self) -> int | None:
        """Number of bands of ``C`` (None if not banded): amplification needs ≤ partitions."""
        return None

    @property
    def streamable(self) -> bool:
        """Whether :mod:`renyi.correlated.streaming` generates ``R z`` with bounded memory."""
        return True

    def per_step_error(self, steps: int, workload: ArrayLike | None = None) -> FloatArray:
        """Variance of each row of ``B Z`` with ``B = A R`` (dense default, O(T³))."""
        t = check_int("steps", steps, 1)
        coefs, dense = _workload(t, workload)
        a = scipy.linalg.toeplitz(coefs, np.zeros(t)) if coefs is not None else dense
        b = a @ self.noising_matrix(t)
        return np.asarray(np.einsum("ij,ij->i", b, b))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description; :func:`strategy_from_dict` rebuilds it."""
        return {"strategy": self.name}


class _Toeplitz(Strategy):
    """Lower-triangular Toeplitz ``C`` given by its first column (``c_0 = 1``)."""

    @abstractmethod
    def coefs(self, steps: int) -> FloatArray:
        """First column of ``C`` (length ≤ steps; zeros after)."""

    def _filter(self) -> tuple[FloatArray, FloatArray]:
        """(numerator, denominator) of the rational ``1 / c(x)`` (for ``scipy.signal.lfilter``)."""
        raise NotImplementedError

    def matrix(self, steps: int) -> FloatArray:
        t = check_int("steps", steps, 1)
        col = np.zeros(t)
        c = self.coefs(t)[:t]
        col[: c.size] = c
        return np.asarray(scipy.linalg.toeplitz(col, np.zeros(t)))

    def noising_coefs(self, steps: int) -> FloatArray:
        """First column of ``C⁻¹`` (also Toeplitz), length ``steps``."""
        t = check_int("steps", steps, 1)
        num, den = self._filter()
        impulse = np.zeros(t)
        impulse[0] = 1.0
        return np.asarray(scipy.signal.lfilter(num, den, impulse))

    def noising_matrix(self, steps: int) -> FloatArray:
        r = self.noising_coefs(steps)
        return np.asarray(scipy.linalg.toeplitz(r, np.zeros(r.size)))

    def sensitivity(
        self, steps: int, min_sep: int = 1, max_participations: int | None = 1
    ) -> Sensitivity:
        return toeplitz_sensitivity(self.coefs(steps), steps, min_sep, max_participations)

    def per_step_error(self, steps: int, workload: ArrayLike | None = None) -> FloatArray:
        t = check_int("steps", steps, 1)
        coefs, dense = _workload(t, workload)
        if coefs is None:
            return super().per_step_error(t, dense)
        num, den = self._filter()
        h = scipy.signal.lfilter(num, den, coefs)  # first column of B = A C⁻¹ (Toeplitz)
        return np.asarray(np.cumsum(h * h))


@dataclass(frozen=True)
class BandedToeplitzStrategy(_Toeplitz):
    """Banded lower-triangular Toeplitz ``C``: ``coefs = (1, c_1, …, c_{b-1})``, b bands.

    One band is DP-SGD (:func:`identity`). Streaming noise keeps the last ``b − 1`` noise
    vectors (``y_t = z_t − Σ_m c_m y_{t−m}``).
    """

    coefficients: tuple[float, ...]

    def __post_init__(self) -> None:
        c = np.asarray(self.coefficients, dtype=np.float64).reshape(-1)
        if c.size == 0 or not np.all(np.isfinite(c)) or c[0] != 1.0:
            raise fail(
                "coefs", self.coefficients, "finite Toeplitz coefficients with coefs[0] == 1"
            )
        object.__setattr__(self, "coefficients", tuple(float(x) for x in c))

    @property
    def name(self) -> str:  # type: ignore[override]
        return "dpsgd" if len(self.coefficients) == 1 else "banded"

    @property
    def bands(self) -> int:
        return len(self.coefficients)

    def coefs(self, steps: int) -> FloatArray:
        return np.asarray(self.coefficients, dtype=np.float64)[: check_int("steps", steps, 1)]

    def _filter(self) -> tuple[FloatArray, FloatArray]:
        return np.ones(1), np.asarray(self.coefficients, dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": "banded", "coefs": list(self.coefficients)}


def identity() -> BandedToeplitzStrategy:
    """``C = I``: independent noise at every step, i.e. DP-SGD."""
    return BandedToeplitzStrategy((1.0,))


@dataclass(frozen=True)
class BltStrategy(_Toeplitz):
    """Buffered linear Toeplitz ``C``: ``c_0 = 1``, ``c_j = Σ_i ω_i θ_i^{j−1}`` (j ≥ 1).

    Its generating function ``1 + Σ_i ω_i x / (1 − θ_i x)`` is rational, so ``C⁻¹ z`` needs
    one buffer per ``θ_i`` (Dvijotham et al. 2024): ``y_t = z_t − Σ_i ω_i S_i``,
    ``S_i ← θ_i S_i + y_t``. ``thetas`` in [0, 1), ``omegas`` ≥ 0.
    """

    thetas: tuple[float, ...]
    omegas: tuple[float, ...]
    name = "blt"

    def __post_init__(self) -> None:
        th = np.asarray(self.thetas, dtype=np.float64).reshape(-1)
        om = np.asarray(self.omegas, dtype=np.float64).reshape(-1)
        if th.size == 0 or th.size != om.size:
            raise fail("thetas/omegas", (self.thetas, self.omegas), "equal non-zero lengths")
        if not np.all((th >= 0) & (th < 1)):
            raise fail("thetas", self.thetas, "numbers in [0, 1)")
        if not np.all(np.isfinite(om) & (om >= 0)):
            raise fail("omegas", self.omegas, "finite numbers >= 0")
        object.__setattr__(self, "thetas", tuple(float(x) for x in th))
        object.__setattr__(self, "omegas", tuple(float(x) for x in om))

    @property
    def buffers(self) -> int:
        return len(self.thetas)

    def coefs(self, steps: int) -> FloatArray:
        t = check_int("steps", steps, 1)
        th = np.asarray(self.thetas)
        om = np.asarray(self.omegas)
        out = np.ones(t)
        if t > 1:
            with np.errstate(under="ignore"):
                powers = th[None, :] ** np.arange(t - 1, dtype=np.float64)[:, None]
            out[1:] = powers @ om
        return out

    def _filter(self) -> tuple[FloatArray, FloatArray]:
        # 1/c(x) = Q(x) / P(x): Q = Π (1 − θ_i x), P = Q + x Σ_i ω_i Π_{k≠i} (1 − θ_k x)
        q = np.ones(1)
        for th in self.thetas:
            q = np.convolve(q, [1.0, -th])
        p = np.concatenate([q, [0.0]])
        for i, om in enumerate(self.omegas):
            rest = np.ones(1)
            for k, th in enumerate(self.thetas):
                if k != i:
                    rest = np.convolve(rest, [1.0, -th])
            p[1 : 1 + rest.size] += om * rest
        return q, p

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": "blt", "thetas": list(self.thetas), "omegas": list(self.omegas)}


@dataclass(frozen=True)
class BandedInverseStrategy(_Toeplitz):
    """Toeplitz ``C`` whose *inverse* is banded: ``C⁻¹`` has first column
    ``r = (1, r_1, …, r_{b−1})`` (Kalinin et al. 2025, "banded inverse square root", BISR).

    The noise is a finite filter of the fresh normals, ``y_t = Σ_{j<b} r_j z_{t−j}``, so with
    counter-regenerated noise (:class:`renyi.noise.CounterNoise`) the optimiser keeps no past
    noise at all: ``z_{t−j}`` is drawn again from its counter (O(parameters) state whatever
    b, b draws per step). ``C = R⁻¹`` itself is not banded (``bands`` is None): it is
    accounted by b-min-sep, like BLT, never amplified.
    """

    inverse_coefficients: tuple[float, ...]
    name = "banded_inverse"

    def __post_init__(self) -> None:
        r = np.asarray(self.inverse_coefficients, dtype=np.float64).reshape(-1)
        if r.size == 0 or not np.all(np.isfinite(r)) or r[0] != 1.0:
            raise fail(
                "inverse_coefficients",
                self.inverse_coefficients,
                "finite coefficients of C⁻¹ with r[0] == 1",
            )
        object.__setattr__(self, "inverse_coefficients", tuple(float(x) for x in r))

    @property
    def noise_bands(self) -> int:
        """b: the fresh normal vectors each step's noise combines."""
        return len(self.inverse_coefficients)

    def coefs(self, steps: int) -> FloatArray:
        t = check_int("steps", steps, 1)
        impulse = np.zeros(t)
        impulse[0] = 1.0
        return np.asarray(scipy.signal.lfilter([1.0], self.inverse_coefficients, impulse))

    def _filter(self) -> tuple[FloatArray, FloatArray]:
        return np.asarray(self.inverse_coefficients, dtype=np.float64), np.ones(1)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": "banded_inverse", "inverse_coefs": list(self.inverse_coefficients)}


def bisr(bands: int, momentum: float = 0.0) -> BandedInverseStrategy:
    """The banded inverse square root (BISR, Kalinin et al. 2025) of the prefix-sum workload
    with heavy-ball ``momentum`` β: the first ``bands`` coefficients of the power series
    ``a(x)^{−1/2} = (1 − x)^{1/2} (1 − βx)^{1/2}`` (``a`` the workload's generating function).

    >>> bisr(3).inverse_coefficients
    (1.0, -0.5, -0.125)
    """
    from renyi._validation import check_range

    b = check_int("bands", bands, 1)
    beta = check_range("momentum", momentum, 0.0, 1.0, high_open=True)
    j = np.arange(1, b)
    half = np.concatenate([[1.0], np.cumprod((j - 1.5) / j)])  # (1 − x)^{1/2}
    mom = np.concatenate([[1.0], np.cumprod((j - 1.5) / j * beta)])  # (1 − βx)^{1/2}
    r = np.convolve(half, mom)[:b]
    return BandedInverseStrategy(tuple(float(x) for x in r))


def _lowbit(n: NDArray[np.int64]) -> NDArray[np.int64]:
    return n & -n


@dataclass(frozen=True)
class TreeStrategy(Strategy):
    """Online binary-tree aggregation (DP-FTRL) in square form: node ``n`` sums steps
    ``(n − lowbit(n), n]`` (1-based), one node per step, so ``C`` is T × T lower triangular.

    The prefix sum to step n is the sum of the nodes of n's binary decomposition (the online
    estimator of Kairouz et al. 2021); ``C⁻¹ z`` keeps one noise vector per tree level
    (⌈log₂ T⌉ + 1 buffers). Single-participation sensitivity: the most nodes covering a step.
    """

    name = "tree"

    def matrix(self, steps: int) -> FloatArray:
        t = check_int("steps", steps, 1)
        node = np.arange(1, t + 1)[:, None]
        step = np.arange(1, t + 1)[None, :]
        return ((step <= node) & (step > node - _lowbit(node))).astype(np.float64)

    def sensitivity(
        self, steps: int, min_sep: int = 1, max_participations: int | None = 1
    ) -> Sensitivity:
        return dense_sensitivity(self.matrix(steps), min_sep, max_participations)

    def per_step_error(self, steps: int, workload: ArrayLike | None = None) -> FloatArray:
        t = check_int("steps", steps, 1)
        if workload is None:  # B = L C⁻¹ selects the nodes of t + 1's binary decomposition
            n = np.arange(1, t + 1)
            return np.asarray([bin(int(x)).count("1") for x in n], dtype=np.float64)
        return super().per_step_error(t, workload)


@dataclass(frozen=True)
class HonakerTreeStrategy(Strategy):
    """The full binary tree over ``2^⌈log₂T⌉`` leaves (all dyadic intervals, truncated to T)
    with Honaker's decoder: the least-squares ``R = C⁺`` (Honaker 2015). Dense (T ≤ 4096);
    not streamable, so for error tables only.
    """

    name = "honaker"

    def matrix(self, steps: int) -> FloatArray:
        t = check_int("steps", steps, 1)
        depth = max(0, math.ceil(math.log2(t)))
        rows = []
        for level in range(depth + 1):
            width = 1 << level
            starts = np.arange(0, t, width)
            block = np.zeros((starts.size, t))
            for r, s in enumerate(starts):
                block[r, s : min(s + width, t)] = 1.0
            rows.append(block)
        return np.vstack(rows)

    def noising_matrix(self, steps: int) -> FloatArray:
        return np.asarray(np.linalg.pinv(self.matrix(steps)))

    @property
    def streamable(self) -> bool:
        return False

    def sensitivity(
        self, steps: int, min_sep: int = 1, max_participations: int | None = 1
    ) -> Sensitivity:
        return dense_sensitivity(self.matrix(steps), min_sep, max_participations)


@dataclass(frozen=True, eq=False)
class DenseStrategy(Strategy):
    """An explicit square lower-triangular ``C`` (fixed T); streaming is not bounded-memory."""

    c: FloatArray
    name = "dense"

    def __post_init__(self) -> None:
        c = np.array(self.c, dtype=np.float64)
        if c.ndim != 2 or c.shape[0] != c.shape[1] or not np.all(np.isfinite(c)):
            raise fail("c", "array", "a finite square matrix")
        if np.any(np.triu(c, 1) != 0) or np.any(np.diag(c) <= 0):
            raise fail("c", "array", "lower triangular with a positive diagonal")
        c.setflags(write=False)
        object.__setattr__(self, "c", c)

    def matrix(self, steps: int) -> FloatArray:
        if steps != self.c.shape[0]:
            raise fail("steps", steps, f"{self.c.shape[0]} (the size of this dense strategy)")
        return np.asarray(self.c)

    @property
    def streamable(self) -> bool:
        return False

    def sensitivity(
        self, steps: int, min_sep: int = 1, max_participations: int | None = 1
    ) -> Sensitivity:
        return dense_sensitivity(self.matrix(steps), min_sep, max_participations)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": "dense", "c": self.c.tolist()}


def strategy_from_dict(data: dict[str, Any]) -> Strategy:
    """Rebuild a strategy from :meth:`Strategy.to_dict`."""
    kind = data.get("strategy") if isinstance(data, dict) else None
    if kind == "banded":
        return BandedToeplitzStrategy(tuple(data["coefs"]))
    if kind == "dpsgd":
        return identity()
    if kind == "blt":
        return BltStrategy(tuple(data["thetas"]), tuple(data["omegas"]))
    if kind == "tree":
        return TreeStrategy()
    if kind == "banded_inverse":
        return BandedInverseStrategy(tuple(data["inverse_coefs"]))
    if kind == "honaker":
        return HonakerTreeStrategy()
    if kind == "dense":
        return DenseStrategy(np.asarray(data["c"]))
    raise fail(
        "strategy", kind, "'dpsgd', 'banded', 'blt', 'tree', 'banded_inverse', 'honaker' or 'dense'"
    )


@dataclass(frozen=True)
class ErrorSummary:
    """Prefix-sum error of a strategy at a fixed privacy level (σ = 1 per unit sensitivity)."""

    strategy: str
    steps: int
    sensitivity: float
    sensitivity_exact: bool
    rmse: float
    max_error: float


def error_summary(
    strategy: Strategy,
    steps: int,
    *,
    min_sep: int | None = None,
    max_participations: int | None = 1,
    workload: ArrayLike | None = None,
) -> ErrorSummary:
    """RMSE and max error of ``A G + B Z`` (``Z`` ~ N(0, sens(C)²)) for ``strategy``.

    ``min_sep`` defaults to T (single participation). The noise is scaled to the strategy's
    sensitivity, so all strategies are compared at the same privacy (the same Gaussian ε).
    """
    t = check_int("steps", steps, 1)
    sens = strategy.sensitivity(t, t if min_sep is None else min_sep, max_participations)
    var = strategy.per_step_error(t, workload)
    return ErrorSummary(
        strategy.name,
        t,
        sens.value,
        sens.exact,
        math.sqrt(float(np.mean(var))) * sens.value,
        math.sqrt(float(np.max(var))) * sens.value,
    )
