"""The public :class:`PrivacyLossDistribution` and its bounds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import logsumexp, ndtri

from renyi._validation import (
    as_real,
    check_delta,
    check_int,
    check_positive,
    check_probability,
    check_range,
    fail,
)
from renyi.analysis.pld import _numerics as _num
from renyi.analysis.pld._discretise import (
    _discretise,
    _from_atoms,
    _gaussian_cdf,
    _laplace_cdf,
    _sub_gaussian_cdf,
)
from renyi.analysis.pld._errors import _grid_error, _NumericGuard
from renyi.analysis.pld._heavy import _large_tilt, _split_index, _split_self_compose
from renyi.analysis.pld._numerics import (
    _EXT_MAX_POINTS,
    _EXT_USEFUL,
    _MAX_COUNT,
    _NOISE_RATIO,
    _STEP_TAIL_FACTOR,
    _U,
    DEFAULT_MAX_BINS,
    Direction,
    FloatArray,
    Tilt,
)
from renyi.analysis.pld._plan import _plan
from renyi.analysis.pld._side import _identity_side, _Side


class PldBounds(NamedTuple):
    """A privacy quantity bracketed by rigorous bounds: ``lower <= truth <= upper``.

    ``estimate`` is the connect-the-dots value (Doroshenko et al. 2022) of the stored masses
    without the error margins, clipped into the bracket: the usual point estimate, within
    ``O(h^2)`` per composed step of the truth.
    """

    lower: Any
    estimate: Any
    upper: Any


# ---------------------------------------------------------------------------------------
# validation helpers


def _check_h(h: Any) -> float:
    return check_positive("value_discretization_interval", h)


def _check_tail(t: Any) -> float:
    return check_range("tail_mass", t, 0.0, 1e-3, low_open=True)


def _check_tilt(t: Any) -> float | None:
    if t is None:
        return None
    return check_range("tilt", t, 0.0, 1e4)


def _as_eps_array(eps: ArrayLike) -> tuple[FloatArray, bool]:
    scalar = np.ndim(eps) == 0
    if scalar:
        as_real("epsilon", eps, allow_inf=True)
    try:
        arr = np.atleast_1d(np.asarray(eps, dtype=np.float64))
    except (TypeError, ValueError):
        raise fail("epsilon", eps, "real numbers >= 0") from None
    if arr.ndim != 1:
        raise fail("epsilon", eps, "a scalar or a 1-D array of real numbers >= 0")
    bad = np.isnan(arr) | (arr < 0)
    if np.any(bad):
        raise fail("epsilon", float(arr[bad][0]), "a real number >= 0 (NaN is not allowed)")
    return arr, scalar


def _as_delta_array(delta: ArrayLike) -> tuple[FloatArray, bool]:
    scalar = np.ndim(delta) == 0
    if scalar:
        check_delta(delta)
    try:
        arr = np.atleast_1d(np.asarray(delta, dtype=np.float64))
    except (TypeError, ValueError):
        raise fail("delta", delta, "real numbers in (0, 1)") from None
    if arr.ndim != 1:
        raise fail("delta", delta, "a scalar or a 1-D array of numbers in (0, 1)")
    bad = ~((arr > 0) & (arr < 1))
    if np.any(bad):
        raise fail("delta", float(arr[bad][0]), "a number in (0, 1)")
    return arr, scalar


def _finish(lo: FloatArray, est: FloatArray, up: FloatArray, scalar: bool) -> PldBounds:
    est = np.clip(est, lo, up)
    if scalar:
        return PldBounds(float(lo[0]), float(est[0]), float(up[0]))
    return PldBounds(lo, est, up)


# ---------------------------------------------------------------------------------------
# public class


@dataclass(frozen=True, eq=False)
class PrivacyLossDistribution:
    """A discretised privacy loss distribution with rigorous upper and lower bounds.

    Immutable. Holds a pessimistic discretisation (losses rounded up, truncated tails at
    ``+inf``: its ``delta(eps)`` is an upper bound) and an optimistic one (losses rounded
    down, truncated mass deleted: a lower bound) on the grid ``k * h`` with
    ``h = value_discretization_interval``. Build one with a class-method constructor, compose
    with :meth:`compose` / :meth:`self_compose`, and query :meth:`delta_for_epsilon` /
    :meth:`epsilon_for_delta`, which return ``PldBounds(lower, estimate, upper)`` with
    ``lower <= truth <= upper``.

    The PLD is that of one ordered pair ``(P, Q)`` (see each constructor for which); the
    theory is Koskela, Jälkö & Honkela (2020), Gopi, Lee & Wutschitz (2021) and Doroshenko
    et al. (2022, "Connect the dots", Sec. 3 for pessimistic rounding).

    Example
    -------
    >>> rem = PrivacyLossDistribution.subsampled_gaussian(0.01, 1.0, direction="remove")
    >>> add = PrivacyLossDistribution.subsampled_gaussian(0.01, 1.0, direction="add")
    >>> eps = max(p.self_compose(1000).epsilon_for_delta(1e-5).upper for p in (rem, add))
    >>> 0.5 < eps < 2.0
    True
    """

    upper_side: _Side = field(repr=False)
    lower_side: _Side = field(repr=False)
    tail_mass: float = 1e-15
    description: str = ""
    # how to recompute both sides in extended precision (None: exact inputs or too large)
    _refine: Callable[[], tuple[_Side, _Side]] | None = field(
        default=None, repr=False, compare=False
    )
    _cache: dict[str, tuple[_Side, _Side]] = field(default_factory=dict, repr=False, compare=False)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def _build(
        cls, sides: tuple[_Side, _Side], tail_mass: float, desc: str
    ) -> PrivacyLossDistribution:
        return cls(sides[0], sides[1], tail_mass, desc)

    @classmethod
    def identity(
        cls, *, value_discretization_interval: float = 1e-4, tail_mass: float = 1e-15
    ) -> PrivacyLossDistribution:
        """The PLD of a mechanism that reveals nothing (all mass at loss 0)."""
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        return cls._build(
            (_identity_side(True, h), _identity_side(False, h)), tail_mass, "identity"
        )

    @classmethod
    def gaussian(
        cls,
        noise_multiplier: float,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Gaussian mechanism with sensitivity 1 and standard deviation ``noise_multiplier``.

        The pair is ``(N(0, s^2), N(1, s^2))`` (symmetric, so add and remove coincide); the
        loss is exactly ``N(mu^2/2, mu^2)`` with ``mu = 1/s`` (Balle & Wang 2018, Lemma 3;
        Dong, Roth & Su 2022, Gaussian DP). Both tails beyond ``tail_mass / 2`` are truncated
        (to ``+inf`` in the upper bound).

        Example
        -------
        >>> PrivacyLossDistribution.gaussian(2.0).delta_for_epsilon(1.0).upper < 0.02
        True
        """
        sigma = check_positive("noise_multiplier", noise_multiplier)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        mu = 1.0 / sigma
        z = float(-ndtri(tail_mass * _STEP_TAIL_FACTOR / 2))
        mean, sd = 0.5 * mu * mu, mu
        tails = _gaussian_cdf(mu)
        lo, hi = mean - z * sd, mean + z * sd
        if not math.isfinite(hi - lo):
            raise _grid_error("noise_multiplier", sigma, math.inf, "a value")
        with _NumericGuard("noise_multiplier", sigma):
            sides = _discretise(tails, lo, hi, h, 0.0)
        return cls._build(
            sides,
            tail_mass,
            f"gaussian(noise_multiplier={sigma:g})",
        )

    @classmethod
    def subsampled_gaussian(
        cls,
        sampling_rate: float,
        noise_multiplier: float,
        *,
        direction: Direction = "remove",
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Poisson-subsampled Gaussian (rate ``q``, noise multiplier ``s``, sensitivity 1).

        Add/remove-one neighbours give two different ordered pairs; build both:

        * ``"remove"`` (the record is removed from the dataset that contains it):
          ``P = (1-q) N(0, s^2) + q N(1, s^2)``, ``Q = N(0, s^2)``;
        * ``"add"``: ``P = N(0, s^2)``, ``Q = (1-q) N(0, s^2) + q N(1, s^2)``.

        (dp_accounting's REMOVE / ADD, up to the reflection ``x -> -x``; Zhu, Dong & Wang
        2022, "Optimal accounting of DP via characteristic functions", Sec. 5, show both
        are needed.) The loss is monotone in ``x`` so each bin's mass is an exact mixture-CDF
        difference. ``q = 1`` gives :meth:`gaussian`, ``q = 0`` :meth:`identity`.

        Example
        -------
        >>> pld = PrivacyLossDistribution.subsampled_gaussian(0.1, 1.0, direction="add")
        >>> pld.delta_for_epsilon(0.5).upper < 1e-3
        True
        """
        q = check_probability("sampling_rate", sampling_rate)
        sigma = check_positive("noise_multiplier", noise_multiplier)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        if direction not in ("remove", "add"):
            raise fail("direction", direction, "'remove' or 'add'")
        if q == 1.0:
            return cls.gaussian(sigma, value_discretization_interval=h, tail_mass=tail_mass)
        if q == 0.0:
            return cls.identity(value_discretization_interval=h, tail_mass=tail_mass)
        z = float(-ndtri(tail_mass * _STEP_TAIL_FACTOR / 2))
        tails = _sub_gaussian_cdf(q, sigma, direction)

        def loss_remove(x: float) -> float:  # increasing in x
            with np.errstate(over="ignore"):
                return float(
                    np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * sigma**2))
                )

        with _NumericGuard("noise_multiplier", sigma):
            # P-quantiles of x in both directions
            if direction == "remove":
                lo, hi = loss_remove(-sigma * z), loss_remove(1.0 + sigma * z)
            else:
                lo, hi = -loss_remove(sigma * z), -loss_remove(-sigma * z)
            sides = _discretise(tails, lo, hi, h, 0.0)
        return cls._build(
            sides,
            tail_mass,
            f"subsampled_gaussian(q={q:g}, noise_multiplier={sigma:g}, {direction})",
        )

    @classmethod
    def laplace(
        cls, scale: float, *, value_discretization_interval: float = 1e-4, tail_mass: float = 1e-15
    ) -> PrivacyLossDistribution:
        """Laplace mechanism, ``scale = b / Delta_1``: the pair ``(Lap(0, b), Lap(1, b))``.

        The loss lies in ``[-1/b, 1/b]`` with atoms at both ends (Koskela et al. 2020,
        Sec. 6.1); symmetric, so add and remove coincide.
        """
        b = check_positive("scale", scale)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        tails = _laplace_cdf(b)
        return cls._build(
            _discretise(tails, -1.0 / b, 1.0 / b, h, 0.0),
            tail_mass,
            f"laplace(scale={b:g})",
        )

    @classmethod
    def randomized_response(
        cls, p: float, *, value_discretization_interval: float = 1e-4, tail_mass: float = 1e-15
    ) -> PrivacyLossDistribution:
        """Binary randomized response reporting the truth with probability ``p >= 1/2``.

        Loss ``log(p/(1-p))`` with probability ``p`` and its negative otherwise (Mironov 2017,
        Table II's mechanism). ``p = 1`` puts all mass at ``+inf``.
        """
        pr = check_range("p", p, 0.5, 1.0)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        if pr == 1.0:
            losses, probs, inf = np.zeros(0), np.zeros(0), 1.0
        else:
            ll = math.log(pr) - math.log1p(-pr)
            losses, probs, inf = np.array([ll, -ll]), np.array([pr, 1.0 - pr]), 0.0
        tol = 4 * _U * (np.abs(losses) + 1.0)
        return cls._build(
            _from_atoms(losses, probs, inf, h, tol),
            tail_mass,
            f"randomized_response(p={pr:g})",
        )

    @classmethod
    def approx_dp(
        cls,
        epsilon: float,
        delta: float = 0.0,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Any ``(epsilon, delta)``-DP mechanism, through its tight dominating pair.

        The four-point pair of Kairouz, Oh & Viswanath (2015, Thm. 2.1 / Eq. (3)): loss
        ``+inf`` w.p. ``delta``, ``epsilon`` w.p. ``(1-delta) e^eps/(1+e^eps)``, ``-epsilon``
        w.p. ``(1-delta)/(1+e^eps)``. Every ``(eps, delta)``-DP mechanism is
        post-processing of it, so its composition bounds theirs (Murtagh & Vadhan 2016).
        """
        eps = check_range("epsilon", epsilon, 0.0, math.inf)
        dlt = check_range("delta", delta, 0.0, 1.0)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        if math.isinf(eps) or dlt == 1.0:
            losses, probs, inf = np.zeros(0), np.zeros(0), 1.0
        else:
            p_hi = (1.0 - dlt) / (1.0 + math.exp(-eps))
            p_lo = (1.0 - dlt) / (1.0 + math.exp(eps))
            losses, probs, inf = np.array([eps, -eps]), np.array([p_hi, p_lo]), dlt
        tol = 4 * _U * (np.abs(losses) + 1.0)
        return cls._build(
            _from_atoms(losses, probs, inf, h, tol),
            tail_mass,
            f"approx_dp(epsilon={eps:g}, delta={dlt:g})",
        )

    @classmethod
    def discrete_laplace(
        cls,
        scale: float,
        sensitivity: int = 1,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Discrete Laplace ``P(k) ~ exp(-|k|/t)`` on the integers, integer sensitivity.

        Pair ``(DLap(0, t), DLap(Delta, t))``: the loss is ``(|k - Delta| - |k|)/t`` taking
        ``2 Delta + 1`` values in ``[-Delta/t, Delta/t]`` (Canonne, Kamath & Steinke 2020).
        """
        t = check_positive("scale", scale)
        d = check_int("sensitivity", sensitivity, 1)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        # P[k <= 0] = 1/(1 + e^{-1/t}), P[k >= d] = e^{-d/t}/(1 + e^{-1/t}),
        # P[k] = tanh(1/(2t)) e^{-|k|/t} for 0 < k < d
        log_norm = -float(np.logaddexp(0.0, -1.0 / t))
        ks = np.arange(1, d, dtype=np.float64)
        log_mid = math.log(math.tanh(0.5 / t)) - ks / t
        losses = np.concatenate(([d / t], (d - 2 * ks) / t, [-d / t]))
        probs = np.exp(np.concatenate(([log_norm], log_mid, [log_norm - d / t])))
        tol = 4 * _U * (np.abs(losses) + 1.0)
        return cls._build(
            _from_atoms(losses, probs, 0.0, h, tol),
            tail_mass,
            f"discrete_laplace(scale={t:g}, sensitivity={d})",
        )

    @classmethod
    def discrete_gaussian(
        cls,
        sigma: float,
        sensitivity: int = 1,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Discrete Gaussian ``P(k) ~ exp(-k^2 / (2 sigma^2))`` on the integers.

        Pair ``(DG(0, s), DG(Delta, s))`` with integer sensitivity ``Delta``: the loss at ``k``
        is ``(Delta^2 - 2 k Delta) / (2 sigma^2)`` (Canonne, Kamath & Steinke 2020, Sec. 4;
        symmetric, so add and remove coincide). The support is enumerated on
        ``|k| <= 40 sigma + 10 + Delta``; the mass beyond (below ``e^-800``, bounded by a
        geometric series) goes to ``+inf`` in the upper bound and is dropped in the lower.
        """
        s = check_positive("sigma", sigma)
        d = check_int("sensitivity", sensitivity, 1)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        big_k = math.ceil(40.0 * s + 10.0) + d
        if 2 * big_k + 1 > _num._MAX_BINS:
            raise fail("sigma", s, f"a value <= {(_num._MAX_BINS / 2 - 10 - d) / 40:.4g}")
        k = np.arange(-big_k, big_k + 1, dtype=np.float64)
        log_w = -(k * k) / (2.0 * s * s)
        log_p = log_w - float(logsumexp(log_w))
        losses = (d * d - 2.0 * k * d) / (2.0 * s * s)
        # mass beyond |k| > K: 2 sum_{j>K} e^{-j^2/2s^2} <= 2 e^{-(K+1)^2/2s^2}/(1 - e^{-(K+1)/s^2})
        log_tail = (
            math.log(2.0)
            - (big_k + 1) ** 2 / (2.0 * s * s)
            - math.log(-math.expm1(-(big_k + 1) / (s * s)))
        )
        tail = math.exp(log_tail - float(logsumexp(log_w)))
        tol = 8 * _U * (np.abs(losses) + 1.0)
        upper, lower = _from_atoms(losses, np.exp(log_p), 0.0, h, tol)
        upper = replace(upper, inf_mass=upper.inf_mass + tail * (1 + 1e-6))
        return cls._build(
            (upper, lower), tail_mass, f"discrete_gaussian(sigma={s:g}, sensitivity={d})"
        )

    @classmethod
    def from_distributions(
        cls,
        p: ArrayLike,
        q: ArrayLike,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """The PLD of an explicit pair of discrete distributions ``(P, Q)`` on one support.

        ``p`` and ``q`` are probability vectors (non-negative, each summing to 1 within 1e-9).
        Outcomes with ``q = 0 < p`` have loss ``+inf``.
        """
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        pa = np.asarray(p, dtype=np.float64)
        qa = np.asarray(q, dtype=np.float64)
        for name, arr in (("p", pa), ("q", qa)):
            if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise fail(name, p if name == "p" else q, "a 1-D vector of probabilities")
            if abs(math.fsum(arr.tolist()) - 1.0) > 1e-9:
                raise fail(name, p if name == "p" else q, "probabilities summing to 1")
        if pa.shape != qa.shape:
            raise fail("q", q, f"a vector of the same length as p ({pa.size})")
        pos = pa > 0
        inf = math.fsum(pa[pos & (qa == 0)].tolist())
        both = pos & (qa > 0)
        with np.errstate(divide="ignore"):
            losses = np.log(pa[both]) - np.log(qa[both])
        probs = pa[both]
        tol = 4 * _U * (np.abs(np.log(pa[both])) + np.abs(np.log(qa[both])) + 1.0)
        return cls._build(_from_atoms(losses, probs, inf, h, tol), tail_mass, "from_distributions")

    # -- properties -----------------------------------------------------------------------
    @property
    def value_discretization_interval(self) -> float:
        """Grid spacing of the losses: the step's ``h``, or a power-of-two multiple of it
        after a self-composition wider than ``max_bins`` points (see :meth:`self_compose`)."""
        return self.upper_side.h

    @property
    def infinity_mass(self) -> float:
        """Mass at ``+inf`` in the pessimistic discretisation (true mass plus truncation)."""
        return self.upper_side.inf_mass

    @property
    def support_size(self) -> int:
        """Number of grid points stored by the pessimistic discretisation."""
        return self.upper_side.size

    def pmf(self, side: Literal["upper", "lower"] = "upper") -> tuple[FloatArray, FloatArray]:
        """``(losses, masses)`` of one discretisation (read-only copies)."""
        if side not in ("upper", "lower"):
            raise fail("side", side, "'upper' or 'lower'")
        s = self.upper_side if side == "upper" else self.lower_side
        return s.losses.copy(), s.probs.copy()

    # -- composition ----------------------------------------------------------------------
    def compose(
        self, other: PrivacyLossDistribution, *, tilt: float | None = None
    ) -> PrivacyLossDistribution:
        """PLD of running ``self`` and ``other`` independently (losses add; FFT convolution).

        Both must use the same grid spacing (or one an integer multiple of the other, in
        which case the finer one is coarsened conservatively).
        """
        if not isinstance(other, PrivacyLossDistribution):
            raise fail("other", other, "a PrivacyLossDistribution")
        tl = _check_tilt(tilt)
        tm = min(self.tail_mass, other.tail_mass)
        with _NumericGuard("other", other):
            up = self.upper_side.compose(other.upper_side, tm, tl)
            lo = self.lower_side.compose(other.lower_side, tm, tl)

        def refine() -> tuple[_Side, _Side]:
            (au, al), (bu, bl) = self._precise_sides(), other._precise_sides()
            return au.compose(bu, tm, tl, True), al.compose(bl, tm, tl, True)

        small = max(up.fft_len, lo.fft_len) <= _EXT_MAX_POINTS
        return PrivacyLossDistribution(
            up,
            lo,
            tm,
            f"({self.description}) + ({other.description})",
            refine if small and _EXT_USEFUL else None,
        )

    def self_compose(
        self, count: int, *, tilt: float | None = None, max_bins: int = DEFAULT_MAX_BINS
    ) -> PrivacyLossDistribution:
        """PLD of ``count`` independent runs, by FFT powers: cost ``O(log count)`` FFTs.

        If the composed distribution fits in ``max_bins`` grid points (Chernoff window: at
        most ``tail_mass`` escapes it, charged to ``+inf`` in the upper bound), it is one FFT
        raised to the power ``count`` on this PLD's grid, as in earlier versions. Otherwise a
        ladder: one FFT power ``step^t0`` on the step's grid (the largest ``t0`` whose window
        fits ``max(max_bins, 2 * support_size)`` points), then for each base-``m`` digit
        ``d`` of the rest of the count (``m <= 16``), ``A <- coarsen(A)^m * step^d``,
        coarsening by powers of two so that the level windows stay within ``max_bins / 4``
        points. The spread of the composed loss grows like ``sqrt(count)``, so the grid
        grows with it (the result's :attr:`value_discretization_interval`) and the number of
        grid points per standard deviation stays roughly constant. Coarsening is rigorous
        (connect-the-dots above, mean-preserving rounding below) and happens only once the
        inputs hold enough steps that it adds at most ~1/8 of the fine grid's own
        discretisation error (which grows like ``count * h^2``). ``max_bins`` (an integer in
        ``[1024, 2**22]``, default ``2**17``) trades time for accuracy; ``2**22`` switches the
        ladder off. ``tilt`` fixes the exponential tilt of the round-off control (default:
        chosen automatically). See docs/pld.md, "Large counts".

        Example
        -------
        >>> step = PrivacyLossDistribution.subsampled_gaussian(256 / 60000, 1.1)
        >>> big = step.self_compose(10**6)  # a few FFTs of <= 2**17 points
        >>> big.value_discretization_interval > 1e-4 and big.support_size <= 2**17
        True
        """
        n = check_int("count", count, 0)
        tl = _check_tilt(tilt)
        mb = check_int("max_bins", max_bins, 1024)
        if mb > 1 << 22:
            raise fail("max_bins", max_bins, f"an integer in [1024, {1 << 22}]")
        if n > _MAX_COUNT:
            raise _grid_error("count", count, math.inf, f"a count <= {_MAX_COUNT:.0e}")
        with _NumericGuard("count", count):
            return self._self_compose(n, tl, mb)

    def _self_compose(self, n: int, tl: float | None, mb: int) -> PrivacyLossDistribution:
        plan = _plan(self.upper_side, n, self.tail_mass, mb)
        tm = self.tail_mass
        up = self.upper_side.self_compose(plan, tm, tl)
        lo = self.lower_side.self_compose(plan, tm, tl)
        small = 0 < max(up.fft_len, lo.fft_len) <= _EXT_MAX_POINTS  # affordable to redo
        ext = _EXT_USEFUL and small
        split = self._refine is None and any(
            _split_index(s, n, tm) is not None for s in (self.upper_side, self.lower_side)
        )

        def redo(side: _Side) -> _Side:
            heavy = _split_self_compose(side, n, tm, tl, ext, mb) if split else None
            if heavy is not None:
                return heavy
            lam: Tilt = tl
            if tl is None and self._refine is None:
                lam = _large_tilt(side, n)
            return side.self_compose(plan, tm, lam, ext)

        def refine() -> tuple[_Side, _Side]:
            """Extended-precision FFTs (where they help) and, for a heavy-tailed step, the
            binomial split, for a step with a short support a tilt beyond the default grid
            (:mod:`renyi.analysis.pld._heavy`)."""
            u, low = self._precise_sides()
            return redo(u), redo(low)

        own = tl is None and self._refine is None  # a large tilt may help (checked lazily)
        useful = small and (ext or split or (own and _large_tilt(self.upper_side, n) is not None))
        return PrivacyLossDistribution(
            up, lo, tm, f"{n} x ({self.description})", refine if useful else None
        )

    def _precise_sides(self) -> tuple[_Side, _Side]:
        """Both sides recomputed with extended-precision FFTs and, for self-compositions of
        heavy-tailed or short steps, the binomial split or a larger tilt (cached); the
        stored ones when they came from exact inputs or nothing would help."""
        if self._refine is None:
            return self.upper_side, self.lower_side
        if "ext" not in self._cache:
            self._cache["ext"] = self._refine()
        return self._cache["ext"]

    def _noisy(self, eps_up: FloatArray, eps_lo: FloatArray, delta: FloatArray) -> FloatArray:
        """Queries whose tracked float64 round-off exceeds ``_NOISE_RATIO`` of their delta
        (at the reported upper / lower epsilon): their answer is recomputed with
        extended-precision FFTs (the heavy-tailed compositions of tiny sampling rates put
        small deltas where the loss distribution holds little mass and no exponential tilt
        helps, so the FFT's round-off, relative to the total mass, would set the bound)."""
        if self._refine is None:
            return np.zeros(delta.shape, dtype=bool)
        fu = np.isfinite(eps_up)
        fl = np.isfinite(eps_lo)
        bad = np.zeros(delta.shape, dtype=bool)
        if np.any(fu):
            bad[fu] |= self.upper_side.error_at(eps_up[fu]) > _NOISE_RATIO * delta[fu]
        if np.any(fl):
            bad[fl] |= self.lower_side.error_at(eps_lo[fl]) > _NOISE_RATIO * delta[fl]
        return bad

    # -- queries --------------------------------------------------------------------------
    def delta_for_epsilon(self, epsilon: ArrayLike) -> PldBounds:
        """Hockey-stick divergence ``delta(eps) = E[(1 - e^(eps - L))_+] + P[L = inf]``.

        Vectorised over ``epsilon >= 0``. Returns ``PldBounds(lower, estimate, upper)``: the
        optimistic and pessimistic discretisations' deltas with all tracked numerical error
        subtracted / added, and their midpoint. Scalars in, floats out.
        """
        eps, scalar = _as_eps_array(epsilon)
        up = self.upper_side.delta_bound(eps)
        lo = self.lower_side.delta_bound(eps)
        est = self.upper_side.delta_raw(eps) + self.upper_side.inf_mass
        bad = self._noisy(eps, eps, np.maximum(up, 1e-300))
        if np.any(bad):
            pu, pl = self._precise_sides()
            up[bad] = np.minimum(up[bad], pu.delta_bound(eps[bad]))
            lo[bad] = np.maximum(lo[bad], pl.delta_bound(eps[bad]))
        lo = np.minimum(lo, up)
        return _finish(lo, est, np.minimum(up, 1.0), scalar)

    def epsilon_for_delta(self, delta: ArrayLike) -> PldBounds:
        """The smallest ``eps >= 0`` with ``delta(eps) <= delta``, bracketed rigorously.

        ``upper`` is a point where the pessimistic bound is verified to be ``<= delta``
        (exact search over the grid, then bisection of the closed form inside the cell,
        ending on the conservative side); ``lower`` a point where the optimistic bound is
        still ``> delta``. ``+inf`` when no finite ``eps`` achieves ``delta``.
        """
        d, scalar = _as_delta_array(delta)
        up = self.upper_side.epsilon_bound(d)
        lo = self.lower_side.epsilon_bound(d)
        bad = self._noisy(up, lo, d)
        if np.any(bad):
            pu, pl = self._precise_sides()
            up[bad] = np.minimum(up[bad], pu.epsilon_bound(d[bad]))
            lo[bad] = np.maximum(lo[bad], pl.epsilon_bound(d[bad]))
        lo = np.minimum(lo, up)
        return _finish(lo, self.upper_side.epsilon_raw(d), up, scalar)

    def __repr__(self) -> str:
        return (
            f"PrivacyLossDistribution({self.description}, h={self.value_discretization_interval:g},"
            f" points={self.support_size}, infinity_mass={self.infinity_mass:.3g})"
        )
