"""One rounding direction (pessimistic or optimistic) of a PLD on a uniform grid."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import fft as sfft

from renyi._validation import (
    fail,
)
from renyi.analysis.pld import _numerics as _num
from renyi.analysis.pld._fft import (
    _composed_inf,
    _ErrTerm,
    _fft_level_error,
    _fft_power,
    _merge,
    _Run,
    _spectral_error,
    _stitch,
    _term,
    _tilts,
)
from renyi.analysis.pld._numerics import (
    _ALIAS_TARGET,
    _ALT_TILTS,
    _EXT,
    _KAPPA,
    _S_ALL,
    _S_GRID,
    _U,
    _U_EXT,
    FloatArray,
    Tilt,
    _ctd_upper,
    _f64,
    _lse,
    _Plan,
)


def _regrid(side: _Side, h: float) -> _Side:
    """``side`` on the coarser grid ``h``: exact index arithmetic when ``h`` is an integer
    multiple of its own grid, the general (any ratio) re-gridding otherwise."""
    if side.h == h:
        return side
    ratio = h / side.h
    factor = round(ratio)
    if factor >= 1 and abs(ratio - factor) <= 1e-9 * ratio:
        return replace(side.coarsen(factor), h=h)
    return side.regrid_any(h)


# ---------------------------------------------------------------------------------------
# one rounding direction


@dataclass(frozen=True, eq=False)
class _Side:
    """One discretisation (pessimistic or optimistic) of a PLD on the grid ``k h``.

    ``probs[i]`` is the mass at loss ``(offset + i) h``; ``finite_mass`` is the exact-arithmetic
    total of those masses (tracked analytically, never re-summed from noisy FFT output),
    ``inf_mass`` the mass at ``+inf``. ``errors`` bound ``computed - exact`` in weighted norms;
    ``support`` contains the support of the exact masses.
    """

    pessimistic: bool
    h: float
    offset: int
    probs: FloatArray
    finite_mass: float
    inf_mass: float
    errors: tuple[_ErrTerm, ...] = ()
    support: tuple[float, float] = (0.0, 0.0)
    hoeffding_var: float = 0.0  # lower side: sum of squared widths of the random roundings
    shift: float = 0.0  # lower side: bound on the total bias of those roundings
    fft_len: int = 0  # the longest FFT that produced it (the cost of redoing it)

    # -- basic views --------------------------------------------------------------------
    @property
    def size(self) -> int:
        return int(self.probs.size)

    @cached_property
    def losses(self) -> FloatArray:
        return (self.offset + np.arange(self.size, dtype=np.float64)) * self.h

    @cached_property
    def log_probs(self) -> FloatArray:
        with np.errstate(divide="ignore"):
            return np.log(self.probs)

    def log_mgf(self, s: ArrayLike) -> FloatArray:
        """``log sum_i p_i exp(s L_i)`` for each ``s`` (plus a 1e-12 margin: an upper bound).

        Exact and fast: chunks of ``c`` consecutive grid points share the factor
        ``exp(s L_chunk)``, so the sums become one matrix product with ``exp(s r h)``.
        """
        s = np.atleast_1d(np.asarray(s, dtype=np.float64))
        # orders of similar size share a chunk length (a power of two, e^(s c h) <= e^40)
        with np.errstate(divide="ignore"):
            raw = np.floor(40.0 / (np.abs(s) * self.h))
        c_of = np.exp2(np.floor(np.log2(np.clip(raw, 1, 128)))).astype(np.int64)
        if self.size < 16384:  # small grids: one group (call overhead dominates)
            c_of[:] = np.min(c_of)
        out = np.empty(s.shape)
        for c in np.unique(c_of).tolist():  # a few groups
            sel = c_of == c
            out[sel] = self._log_mgf_chunked(s[sel], int(c))
        return out + 1e-12

    def _log_mgf_chunked(self, s: FloatArray, c: int) -> FloatArray:
        n_chunks = -(-self.size // c)
        pad = np.zeros(n_chunks * c)
        pad[: self.size] = self.probs
        e = np.exp(np.outer(np.arange(c) * self.h, s))
        # einsum rather than BLAS: no thread start-up, which dominates at these sizes
        sums = np.einsum("ij,jk->ik", pad.reshape(n_chunks, c), e)
        start = (self.offset + np.arange(n_chunks) * c) * self.h
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(sums) + start[:, None] * s[None, :]
            top = np.max(logs, axis=0)
            safe = np.where(np.isfinite(top), top, 0.0)
            total = np.sum(np.exp(logs - safe), axis=0)
        return np.where(np.isfinite(top), safe + np.log(total), top)

    def grid_range(self) -> tuple[float, float]:
        return float(self.losses[0]), float(self.losses[-1])

    # -- delta queries --------------------------------------------------------------------
    @cached_property
    def _gd(self) -> tuple[FloatArray, FloatArray]:
        """``G[j] = sum_{i>=j} p_i e^{-(i-j)h}`` and ``D[j] = sum_{i>j} p_i (1 - e^{-(i-j)h})``.

        Both are sums of non-negative terms (a stable first-order recursion and a cumulative
        sum), so no cancellation occurs however small ``delta`` is.
        """
        from scipy.signal import lfilter  # here: scipy.signal costs ~0.3 s at `import renyi`

        a = math.exp(-self.h)
        g = lfilter([1.0], [1.0, -a], self.probs[::-1])[::-1]
        rp = np.empty_like(g)
        rp[:-1] = g[1:]
        rp[-1] = 0.0
        # (e^h - 1) sum a g = (1 - e^-h) sum g: no overflow on huge grids (h ~ 1e50)
        d = -math.expm1(-self.h) * np.cumsum(rp[::-1])[::-1]
        return np.asarray(g), np.asarray(d)

    def delta_raw(self, eps: FloatArray) -> FloatArray:
        """``sum_i p_i (1 - e^{eps - L_i})_+`` for each ``eps`` (not including ``+inf``)."""
        g, d = self._gd
        losses = self.losses
        j = np.searchsorted(losses, eps, side="right")
        inside = j < self.size
        jj = np.minimum(j, self.size - 1)
        with np.errstate(invalid="ignore", over="ignore"):
            t = losses[jj] - eps
            val = d[jj] - np.expm1(-t) * g[jj]
        return np.where(inside, val, 0.0)

    def error_at(self, eps: FloatArray) -> FloatArray:
        total = np.zeros_like(eps)
        for term in self.errors:
            total = total + term.delta_error(eps)
        return total

    def _plain_bound(self, eps: FloatArray) -> FloatArray:
        raw = self.delta_raw(eps) + self.inf_mass
        err = self.error_at(eps)
        if self.pessimistic:
            return (raw + err) * (1.0 + _KAPPA)
        return np.maximum(raw * (1.0 - _KAPPA) - err, 0.0)

    def delta_bound(self, eps: FloatArray) -> FloatArray:
        """Upper bound (pessimistic side) or lower bound (optimistic side) on the true delta.

        The optimistic side's losses were rounded at random with their mean preserved, so
        the rounded total ``S~`` and the (merged) true total ``S`` satisfy
        ``P[S~ - S > a + shift] <= exp(-2 a^2 / V)`` (Hoeffding 1963, Thm. 2, with ``V`` the
        sum of squared rounding widths); hence ``delta(eps) >= delta~(eps + a + shift) -
        exp(-2 a^2 / V)`` for every ``a >= 0``, maximised here over a grid of ``a``.
        """
        eps = np.asarray(eps, dtype=np.float64)
        if self.pessimistic or self.hoeffding_var == 0.0:
            return self._plain_bound(eps + (0.0 if self.pessimistic else self.shift))
        log_eta = -np.geomspace(1e-3, 92.0, 48)  # eta from ~1 down to 1e-40
        a = np.sqrt(self.hoeffding_var * (-log_eta) / 2.0)
        x = eps[..., None] + a + self.shift
        vals = self._plain_bound(x.ravel()).reshape(x.shape) - np.exp(log_eta)
        return np.maximum(np.max(vals, axis=-1), 0.0)

    def epsilon_bound(self, deltas: FloatArray) -> FloatArray:
        """Upper (pessimistic) or lower (optimistic) bound on eps(delta), vectorised.

        Pessimistic: the smallest ``eps >= 0`` found with ``delta_upper(eps) <= delta``
        (verified: the returned point satisfies it). Optimistic: a point ``eps`` with
        ``delta_lower(eps) > delta`` (so the true ``eps(delta)`` is at least that), using
        ``sup{eps: max_a [g(eps + a + shift) - eta(a)] > delta}
        = max_a [sup{x: g(x) > delta + eta(a)} - a - shift]`` with ``g`` the plain bound.
        """
        deltas = np.asarray(deltas, dtype=np.float64)
        if self.pessimistic:
            return self._invert(self._plain_bound, deltas, upper=True)
        if self.hoeffding_var == 0.0:
            e = self._invert(self._plain_bound, deltas, upper=False) - self.shift
            return np.maximum(e, 0.0)
        log_eta = -np.geomspace(1e-3, 92.0, 48)
        a = np.sqrt(self.hoeffding_var * (-log_eta) / 2.0)
        targets = deltas[:, None] + np.exp(log_eta)[None, :]
        ok = targets < 1.0
        e = np.full(targets.shape, -np.inf)
        e[ok] = self._invert(self._plain_bound, targets[ok], upper=False)
        e = e - a[None, :] - self.shift
        return np.maximum(np.max(e, axis=1), 0.0)

    def epsilon_raw(self, deltas: FloatArray) -> FloatArray:
        """eps(delta) of the stored masses alone (no error margins): a point estimate."""

        def raw(eps: FloatArray) -> FloatArray:
            return self.delta_raw(eps) + self.inf_mass

        return self._invert(raw, np.asarray(deltas, dtype=np.float64), upper=True)

    def _invert(
        self, f: Callable[[FloatArray], FloatArray], deltas: FloatArray, upper: bool
    ) -> FloatArray:
        """Invert a non-increasing ``f`` on ``[0, inf)``: the bracket comes from the grid,
        then bisection; ``upper`` returns the right end (``f <= delta`` there, verified),
        otherwise the left end (``f > delta`` there)."""
        grid = self.losses[self.losses > 0]
        grid = grid[:: max(1, grid.size // 1024)]  # any monotone bracket will do
        pts = np.concatenate(([0.0], grid))
        fp = np.minimum.accumulate(f(pts))
        # first index where f <= delta (the running minimum makes the search exact)
        idx = np.searchsorted(-fp, -deltas, side="left")
        lo = np.where(idx > 0, pts[np.maximum(idx - 1, 0)], 0.0)
        hi = np.where(idx < pts.size, pts[np.minimum(idx, pts.size - 1)], np.inf)
        beyond = idx >= pts.size
        if np.any(beyond):  # only +inf mass and error terms remain past the grid
            hi = hi.copy()
            hi[beyond] = self._beyond_grid_end(f, deltas[beyond], float(pts[-1]))
        at_zero = idx == 0
        finite = np.isfinite(hi) & ~at_zero
        lo_f, hi_f, d_f = lo[finite], hi[finite], deltas[finite]
        for _ in range(200):
            if np.all(hi_f - lo_f <= 1e-11 * (1.0 + hi_f)):
                break
            mid = 0.5 * (lo_f + hi_f)
            ok = f(mid) <= d_f
            hi_f = np.where(ok, mid, hi_f)
            lo_f = np.where(ok, lo_f, mid)
        out = np.empty_like(deltas)
        out[finite] = hi_f if upper else lo_f
        out[at_zero] = 0.0
        out[~finite & ~at_zero] = np.inf
        return out

    def _beyond_grid_end(
        self, f: Callable[[FloatArray], FloatArray], deltas: FloatArray, start: float
    ) -> FloatArray:
        """A point past the grid where ``f <= delta``, or ``+inf`` if no such point exists."""
        hi = np.full(deltas.shape, max(start, 1.0))
        for _ in range(12):  # grow geometrically: 2^(2^12) covers any float
            bad = f(hi) > deltas
            if not np.any(bad):
                break
            hi = np.where(bad, np.minimum(hi, 1e150) ** 2 + 1.0, hi)
            hi = np.minimum(hi, np.finfo(np.float64).max)
        return np.where(f(hi) <= deltas, hi, np.inf)

    # -- structural operations --------------------------------------------------------------
    def coarsen(self, factor: int) -> _Side:
        """Re-grid to ``factor h`` rounding up (pessimistic) or down (optimistic)."""
        if factor == 1:
            return self
        k = self.offset + np.arange(self.size)
        if self.pessimistic:  # connect the dots on the coarse grid (see _ctd_upper)
            base_k = k // factor
            d = (k - base_k * factor) * self.h
            off = int(base_k[0])
            n_new = int(base_k[-1]) - off + 2
            right = _ctd_upper(self.probs, self.probs * np.exp(-d) * (1 - 8 * _U), factor * self.h)
            probs = _f64(
                np.bincount(base_k - off, weights=self.probs - right, minlength=n_new)
                + np.bincount(base_k - off + 1, weights=right, minlength=n_new)
            )
        else:  # round at random to the two neighbours, preserving the mean
            base_k = k // factor
            frac = (k - base_k * factor) / factor
            off = int(base_k[0])
            n_new = int(base_k[-1]) - off + 2
            probs = _f64(
                np.bincount(base_k - off, weights=self.probs * (1 - frac), minlength=n_new)
                + np.bincount(base_k - off + 1, weights=self.probs * frac, minlength=n_new)
            )
        shift = factor * self.h
        up = self.pessimistic
        errs = tuple(
            _term(
                t.lams,
                [lw + (lt * shift if up else 0.0) for lt, lw in zip(t.lams, t.log_ws, strict=True)],
                t.lo - (0.0 if up else shift),
                t.hi + (shift if up else 0.0),
            )
            for t in self.errors
        )
        lo, hi = self.support
        return _Side(
            up,
            self.h * factor,
            off,
            probs,
            self.finite_mass,
            self.inf_mass,
            errs,
            (lo - (0.0 if up else shift), hi + (shift if up else 0.0)),
            0.0 if up else self.hoeffding_var + shift * shift,
            self.shift,
            self.fft_len,
        )

    def regrid_any(self, big_h: float) -> _Side:
        """Re-grid to ``{k H}`` for any ``H > h`` (not necessarily a multiple of ``h``).

        Each point's mass is split between the two coarse points around it: by
        connect-the-dots with the share sent up rounded up (pessimistic; the mean of
        ``e^-L`` is preserved, so by Jensen every ``delta(eps)`` can only grow), or at random
        with the mean preserved (optimistic; the width ``H`` enters the Hoeffding variance
        like any rounding). The float positions' round-off is absorbed conservatively.
        """
        if big_h <= self.h:
            raise fail("value_discretization_interval", big_h, f"a value > {self.h!r}")
        losses = self.losses
        base_k = np.floor(losses / big_h)
        base_k = np.where(base_k * big_h > losses, base_k - 1, base_k)
        base_k = np.where((base_k + 1) * big_h < losses, base_k + 1, base_k)
        d = losses - base_k * big_h
        slack = 8 * _U * (np.abs(losses) + big_h)
        off = int(base_k[0])
        idx = (base_k - off).astype(np.int64)
        n_new = int(idx[-1]) + 2
        up = self.pessimistic
        if up:  # the share sent up grows with d: use an upper bound on d
            d_hi = np.minimum(d + slack, big_h)
            right = _ctd_upper(self.probs, self.probs * np.exp(-d_hi) * (1 - 8 * _U), big_h)
            w_lo, w_hi = self.probs - right, right
        else:  # round at random, preserving the mean; the position error joins the shift
            frac = np.clip(d / big_h, 0.0, 1.0)
            w_lo, w_hi = self.probs * (1 - frac), self.probs * frac
        probs = _f64(
            np.bincount(idx, weights=w_lo, minlength=n_new)
            + np.bincount(idx + 1, weights=w_hi, minlength=n_new)
        )
        errs = tuple(
            _term(
                t.lams,
                [lw + (lt * big_h if up else 0.0) for lt, lw in zip(t.lams, t.log_ws, strict=True)],
                t.lo - (0.0 if up else big_h),
                t.hi + (big_h if up else 0.0),
            )
            for t in self.errors
        )
        lo, hi = self.support
        return _trim(
            _Side(
                up,
                big_h,
                off,
                probs,
                self.finite_mass,
                self.inf_mass,
                errs,
                (lo - (0.0 if up else big_h), hi + (big_h if up else 0.0)),
                0.0 if up else self.hoeffding_var + big_h * big_h,
                self.shift + (0.0 if up else float(np.max(slack))),
                self.fft_len,
            )
        )

    def _error_log_w(self, lam: float) -> float:
        vals = [t.at(lam) for t in self.errors]
        return _lse(vals)

    def _err_range(self) -> tuple[float, float]:
        glo, ghi = self.grid_range()
        los = [glo, self.support[0]] + [t.lo for t in self.errors]
        his = [ghi, self.support[1]] + [t.hi for t in self.errors]
        return min(los), max(his)

    @cached_property
    def mgf_table(self) -> FloatArray:
        """``log_mgf`` at ``_S_ALL``, the orders of every Chernoff bound (computed once)."""
        return self.log_mgf(_S_ALL)

    def tilted_rfft(
        self, lam: float, lm: float, n_fft: int, g: float, ext: bool = False
    ) -> tuple[Any, float]:
        """rfft of the masses tilted by ``exp(lam L - lm)`` (folded cyclically onto ``n_fft``
        points) and a bound on the absolute error of each coefficient; in extended precision
        if ``ext``.

        The error bound is the FFT's (``g`` per unit of input L1 norm, :func:`_fft_level_error`),
        the folding's, and the L1 norm of the tilting's own round-off: each tilted mass
        ``exp(log p + lam L - lm)`` has a relative error ``<= 16 u (|log p| + lam |L| + |lm| + 1)``
        (the exponent's absolute error, a few roundings of each part, plus ``exp``'s own).
        """
        u = _U_EXT if ext else _U
        with np.errstate(over="ignore", under="ignore", divide="ignore"):
            if ext:
                t = np.exp(np.log(self.probs.astype(_EXT)) + lam * self.losses.astype(_EXT) - lm)
            else:
                t = np.exp(self.log_probs + lam * self.losses - lm)
        folds = 1
        if self.size > n_fft:
            folds = -(-self.size // n_fft)
            pad = np.zeros(folds * n_fft, dtype=t.dtype)
            pad[: self.size] = t
            base = pad.reshape(folds, n_fft).sum(axis=0)
        else:
            base = t
        tot = float(np.sum(t))
        with np.errstate(invalid="ignore"):
            mag = np.abs(self.log_probs) + lam * np.abs(self.losses) + (abs(lm) + 1.0)
            tilt_err = 16.0 * u * float(np.sum(np.where(t > 0, t * mag, 0.0)))
        return sfft.rfft(base, n_fft), (g + (folds - 1) * u) * tot + tilt_err

    def self_compose(self, plan: _Plan, tail_mass: float, tilt: Tilt, ext: bool = False) -> _Side:
        """``self`` composed ``plan.total`` times, following ``plan`` (see :func:`_plan`).

        One FFT power ``self^t0`` on the grid ``h``; then every level coarsens by a power of
        two (if its window would exceed the cap) and raises to the ``plan.m``-th power, times
        ``self^digit`` (regridded) for the base-``m`` digits of the rest of the count.
        """
        count = plan.total
        if count == 1:
            return self
        if count == 0:
            return _identity_side(self.pessimistic, self.h)
        if not plan.levels:  # one FFT power on the fine grid
            return self._power_fitting(count, tail_mass, tilt, None, ext=ext)
        lm_pos = self.mgf_table[_S_GRID.size + 1 :]
        lam_max = _tilts(count * lm_pos, 1, tilt)[-1]  # one tilt target for every stage
        side = self
        if plan.t0 > 1:
            side = self._power_fitting(plan.t0, plan.taus[0], tilt, lam_max, ext=ext)
        powers: dict[int, _Side] = {1: self}
        for (digit, factor), tau in zip(plan.levels, plan.taus[1:], strict=True):
            side = side.coarsen(factor)
            extra = None
            if digit:
                if digit not in powers:
                    powers[digit] = self._power_fitting(
                        digit, plan.extra_tau, tilt, lam_max, ext=ext
                    )
                side, extra = _common_grid(side, powers[digit])
            side = side._power_fitting(plan.m, tau, tilt, lam_max, extra, ext=ext)
        return side

    def _power_fitting(
        self,
        count: int,
        tail_mass: float,
        tilt: Tilt,
        lam_max: float | None,
        extra: _Side | None = None,
        *,
        ext: bool = False,
    ) -> _Side:
        """:meth:`_power`, coarsening the inputs first if the window cannot fit in memory."""
        side = self
        for _ in range(64):
            result = side._power(count, tail_mass, tilt, lam_max, extra, ext=ext)
            if isinstance(result, _Side):
                return result
            side = side.coarsen(result)
            if extra is not None:
                side, extra = _common_grid(side, extra)
        raise fail("count", count, "a count whose composition fits in memory")  # pragma: no cover

    def _power(
        self,
        count: int,
        tail_mass: float,
        tilt: Tilt,
        lam_max: float | None,
        extra: _Side | None = None,
        *,
        ext: bool = False,
    ) -> _Side | int:
        """``self^count`` (convolved once with ``extra``, on the same grid, if given) by one
        FFT power over a Chernoff window; a power-of-two coarsening factor instead if that
        window would exceed ``_MAX_BINS``.

        Tilts: 0 and the largest useful one ``<= lam_max`` (default: the Chernoff-optimal
        order for ``delta = 1e-12`` of this composition) whose window stays affordable.
        """
        T = count
        h, k0 = self.h, self.offset
        n_g = _S_GRID.size
        lm_tab = self.mgf_table
        if extra is None:
            lm_all = T * lm_tab
            nat_lo, nat_hi = T * k0, T * (k0 + self.size - 1)
        else:
            lm_all = T * lm_tab + extra.mgf_table
            nat_lo = T * k0 + extra.offset
            nat_hi = T * (k0 + self.size - 1) + extra.offset + extra.size - 1
        lams = _tilts(lm_all[n_g + 1 :], 1, tilt)
        if tilt is None and lam_max is not None:
            lams = [0.0, float(lam_max)]
        log_tau = math.log(tail_mass)
        log_al = math.log(_ALIAS_TARGET)

        known: dict[float, tuple[float, float]] = {}
        for i, s in enumerate(_S_ALL):
            known[float(s)] = (
                float(lm_tab[i]),
                float(extra.mgf_table[i]) if extra is not None else 0.0,
            )

        def parts(lam: float) -> tuple[float, float]:
            """(log-MGF of self, of extra) at ``lam``: upper bounds within 1e-12."""
            if lam not in known:
                arr = np.array([lam])
                known[lam] = (
                    float(self.log_mgf(arr)[0]),
                    float(extra.log_mgf(arr)[0]) if extra is not None else 0.0,
                )
            return known[lam]

        def window(lam: float, log_target: float) -> tuple[int, int, FloatArray, FloatArray]:
            """Chernoff window of the tilt-``lam`` distribution: (k_lo, k_hi, up, down) with
            ``up``/``down`` the (order, log-MGF) rows bounding the mass beyond a point."""
            if lam:
                ls, le = parts(lam)
                lm_lam = T * (ls - 3e-12) + ((le - 3e-12) if extra is not None else 0.0)
            else:
                lm_lam = 0.0
            sp, lm_at = _S_ALL - lam, lm_all
            if lam > _S_ALL[-1]:  # a tilt beyond the grid (heavy-tail split): orders above it
                more = lam * np.array([1.1, 1.25, 1.5, 2.0, 3.0])
                vals = []
                for x in more.tolist():
                    ls_x, le_x = parts(x)
                    vals.append(T * ls_x + (le_x if extra is not None else 0.0))
                sp = np.concatenate((sp, more - lam))
                lm_at = np.concatenate((lm_all, vals))
            keep_up = sp > 0
            keep_dn = sp < 0
            up_s, up_v = sp[keep_up], lm_at[keep_up] - lm_lam
            dn_s, dn_v = -sp[keep_dn], lm_at[keep_dn] - lm_lam
            with np.errstate(invalid="ignore", divide="ignore"):
                hi_x = float(np.min((up_v - log_target) / up_s, initial=np.inf))
                lo_x = float(np.max(-(dn_v - log_target) / dn_s, initial=-np.inf))
            k_hi = min(nat_hi, _ceil_index(hi_x / h) - 1)
            k_lo = max(nat_lo, _floor_index(lo_x / h) + 1)
            return k_lo, max(k_hi, k_lo), np.stack((up_s, up_v)), np.stack((dn_s, dn_v))

        def outside(k_lo: int, k_hi: int, up: FloatArray, dn: FloatArray) -> float:
            a = 0.0 if k_hi >= nat_hi else _chernoff(up[1] - up[0] * ((k_hi + 1) * h))
            b = 0.0 if k_lo <= nat_lo else _chernoff(dn[1] + dn[0] * ((k_lo - 1) * h))
            return a + b

        out_lo, out_hi, out_up, out_dn = window(0.0, log_tau)
        width = out_hi - out_lo + 1
        if width > _num._MAX_BINS:
            return 1 << math.ceil(math.log2(width * 1.02 / _num._MAX_BINS))
        K = np.arange(out_lo, out_hi + 1)
        out_l = K * h
        # extended precision is the costly fallback for tiny deltas: afford wider windows
        afford = (2 * width if ext else width + width // 4) + 1024
        if tilt is None:  # the largest useful tilt whose window stays affordable
            cands = _S_GRID[_S_GRID <= lams[-1]][::-1]
            lams = [0.0]
            for lam_c in cands:
                c_lo, c_hi, _, _ = window(float(lam_c), log_al)
                if c_hi - c_lo + 1 <= afford:
                    lams.append(float(lam_c))
                    break
        runs = []
        longest = max(self.fft_len, extra.fft_len if extra is not None else 0)
        for lam in lams:  # a handful of tilts, each one FFT power
            w_lo, w_hi, up, dn = window(lam, log_al)
            if lam == 0.0:
                w_lo, w_hi = out_lo, out_hi
            elif w_hi < out_hi and out_hi - w_lo + 1 <= afford:
                w_hi = out_hi  # tilted accuracy up to the top of the window (later levels)
            if w_hi - w_lo + 1 > _num._MAX_BINS or w_hi < out_lo or w_lo > out_hi:
                continue  # this tilt would not help: the others cover the window
            n_need = w_hi - w_lo + 1
            if lam and ext:  # pad (up to 2x) so that little tilted mass wraps onto the window
                p_lo, p_hi, _, _ = window(lam, log_al + math.log(_U_EXT / _U))
                pad = max(p_hi - w_lo, w_hi - p_lo) + 1
                n_need = min(max(n_need, pad), 2 * n_need, _num._MAX_BINS)
            n_fft = sfft.next_fast_len(n_need, real=True)
            longest = max(longest, n_fft)
            ls, le = parts(lam) if lam else (float(lm_tab[n_g]), 0.0)
            if extra is not None and not lam:
                le = float(extra.mgf_table[n_g])
            u = _U_EXT if ext else _U
            g = _fft_level_error(n_fft, u)
            z, gz = self.tilted_rfft(lam, ls, n_fft, g, ext)
            w, err = _fft_power(z, gz, T, u)
            if extra is not None:
                ze, gze = extra.tilted_rfft(lam, le, n_fft, g, ext)
                err = err * (np.abs(ze) + gze) + np.abs(w) * gze
                w = w * ze
                err = err + 4.0 * u * np.abs(w)
            e_fft = _spectral_error(err, w, n_fft, g)
            r_cyc = sfft.irfft(w, n_fft)
            r = np.full(K.size, np.nan, dtype=r_cyc.dtype)
            a, b = max(w_lo, out_lo), min(w_hi, out_hi)
            start = (a - nat_lo) % n_fft  # cyclic position of the composed index a
            r[a - out_lo : b - out_lo + 1] = np.roll(r_cyc, -start)[: b - a + 1]
            log_z = T * ls + le

            def wrapped(
                i0: int, i1: int, up: FloatArray = up, dn: FloatArray = dn, n_fft: int = n_fft
            ) -> float:
                """Tilted mass wrapped into output bins [i0, i1): composed index k lands on
                k -+ n_fft, so only indices >= (first bin) + n_fft or <= (last) - n_fft."""
                k0, k1 = int(out_lo) + i0, int(out_lo) + i1 - 1
                return outside(k1 - n_fft + 1, k0 + n_fft - 1, up, dn)

            c0 = 1.0 + T * abs(ls) + abs(le)
            runs.append(_Run(lam, log_z, e_fft, r, c0, wrapped))
        with np.errstate(over="ignore", divide="ignore"):  # huge counts: stay finite
            log_fin = T * math.log(max(self.finite_mass, 1e-300))
            log_fin += math.log(max(extra.finite_mass, 1e-300)) if extra is not None else 0.0
            fin = math.exp(min(log_fin, 700.0))
        log_cap = min(log_fin, 700.0) + 1e-9
        probs, errs = _stitch(runs, np.asarray(out_l, dtype=np.float64), log_cap)
        # the inputs' own errors, propagated: for computed C = X + E (norms M, W at a tilt),
        # |C^T Ce - X^T Xe| <= T W (M + W)^(T-1) Me + (M + W)^T We, in each tilted norm
        elo, ehi = self._err_range()
        rng_lo, rng_hi = T * elo, T * ehi
        if extra is not None:
            xlo, xhi = extra._err_range()
            rng_lo, rng_hi = rng_lo + xlo, rng_hi + xhi
        # at every order of the Chernoff grid (their MGFs are known): later compositions
        # and queries then never re-express a bound across a wide range of losses
        prop_lams = sorted({0.0, *lams, *(float(s) for s in _S_GRID)})
        prop_l: list[float] = []
        prop_w: list[float] = []
        for lam in prop_lams:
            base_w = self._error_log_w(lam)
            ext_w = extra._error_log_w(lam) if extra is not None else -np.inf
            if base_w == -np.inf and ext_w == -np.inf:
                continue
            ls, le = parts(lam) if lam else (float(lm_tab[n_g]), 0.0)
            if extra is not None and not lam:
                le = float(extra.mgf_table[n_g])
            log_mw = float(np.logaddexp(ls, base_w))  # log (M + W)
            pieces = [math.log(T) + base_w + (T - 1) * log_mw + le]
            if ext_w > -np.inf:
                pieces.append(T * log_mw + ext_w)
            prop_l.append(lam)
            prop_w.append(_lse(pieces) + 1e-12)
        if prop_l:
            errs.append(_term(prop_l, prop_w, rng_lo, rng_hi))
        inf = _composed_inf(
            [(self.finite_mass, self.inf_mass, T)]
            + ([(extra.finite_mass, extra.inf_mass, 1)] if extra is not None else []),
            self.pessimistic,
        )
        if self.pessimistic:
            inf = inf + outside(out_lo, out_hi, out_up, out_dn) * (1 + 1e-9)
        x_sup = extra.support if extra is not None else (0.0, 0.0)
        return _trim(
            _Side(
                self.pessimistic,
                h,
                int(out_lo),
                probs,
                fin,
                inf,
                _merge(errs),
                (T * self.support[0] + x_sup[0], T * self.support[1] + x_sup[1]),
                T * self.hoeffding_var + (extra.hoeffding_var if extra is not None else 0.0),
                T * self.shift + (extra.shift if extra is not None else 0.0),
                longest,
            )
        )

    def compose(self, other: _Side, tail_mass: float, tilt: Tilt, ext: bool = False) -> _Side:
        a, b = _common_grid(self, other)
        lams = _tilts(a.log_mgf(_S_GRID) + b.log_mgf(_S_GRID), 1, tilt)
        lm_a = a.log_mgf(np.asarray(lams))
        lm_b = b.log_mgf(np.asarray(lams))
        n_out = a.size + b.size - 1
        n_fft = sfft.next_fast_len(n_out, real=True)
        off = a.offset + b.offset
        out_l = (off + np.arange(n_out)) * a.h
        u = _U_EXT if ext else _U
        g = _fft_level_error(n_fft, u)
        runs = []
        for lam, la, lb in zip(lams, lm_a, lm_b, strict=True):
            za, ga = a.tilted_rfft(lam, la, n_fft, g, ext)
            zb, gb = b.tilted_rfft(lam, lb, n_fft, g, ext)
            w = za * zb
            r = sfft.irfft(w, n_fft)[:n_out]
            dw = ga * np.abs(zb) + gb * np.abs(za) + ga * gb + 2 * u * np.abs(w)
            e = _spectral_error(dw, w, n_fft, g)
            runs.append(_Run(lam, float(la + lb), e, r, 1.0 + abs(float(la + lb))))
        fin = a.finite_mass * b.finite_mass
        log_cap = math.log(max(fin, 1e-300)) + 1e-9
        probs, errs = _stitch(runs, np.asarray(out_l, dtype=np.float64), log_cap)
        b_glo, b_ghi = b.grid_range()
        a_glo, a_ghi = a.grid_range()
        # Propagated errors (e_a * b, a * e_b, e_a * e_b), each bounded at a spread of tilts
        # (the term's own, the new ones, and a grid): which one is tight depends on the eps
        # queried and on how wide the other factor is; the queries take the minimum.
        alt = np.unique(np.concatenate((lams, _ALT_TILTS, *[t.lams for t in a.errors + b.errors])))
        mb, ma = b.log_mgf(alt), a.log_mgf(alt)
        for t in a.errors:  # e_a * b
            wa = np.array([t.at(float(x)) for x in alt])
            errs.append(_term(alt, wa + mb, t.lo + b_glo, t.hi + b_ghi))
            for v in b.errors:  # e_a * e_b
                wb = np.array([v.at(float(x)) for x in alt])
                errs.append(_term(alt, wa + wb, t.lo + v.lo, t.hi + v.hi))
        for v in b.errors:  # a * e_b
            wb = np.array([v.at(float(x)) for x in alt])
            errs.append(_term(alt, wb + ma, v.lo + a_glo, v.hi + a_ghi))
        if a.pessimistic:
            inf = _composed_inf(
                [(a.finite_mass, a.inf_mass, 1), (b.finite_mass, b.inf_mass, 1)], True
            )
        else:  # finite totals of the optimistic side may be slight overestimates
            fa, fb = a.finite_mass * (1 - 1e-9), b.finite_mass * (1 - 1e-9)
            inf = min(a.inf_mass * b.inf_mass + a.inf_mass * fb + fa * b.inf_mass, 1.0)
        side = _Side(
            a.pessimistic,
            a.h,
            off,
            probs,
            fin,
            inf,
            _merge(errs),
            (a.support[0] + b.support[0], a.support[1] + b.support[1]),
            a.hoeffding_var + b.hoeffding_var,
            a.shift + b.shift,
            max(a.fft_len, b.fft_len, n_fft),
        )
        return _truncate(side, tail_mass)


def _chernoff(log_bounds: FloatArray) -> float:
    """``exp(min log_bound)``, inflated slightly for the round-off of the MGF itself."""
    m = float(np.min(np.where(np.isnan(log_bounds), np.inf, log_bounds), initial=np.inf))
    return min(1.0, math.exp(min(m, 0.0)) * (1.0 + 1e-9))


def _ceil_index(x: float) -> int:
    if not math.isfinite(x):
        return (1 << 62) if x > 0 else -(1 << 62)
    return math.ceil(x)


def _floor_index(x: float) -> int:
    if not math.isfinite(x):
        return (1 << 62) if x > 0 else -(1 << 62)
    return math.floor(x)


def _common_grid(a: _Side, b: _Side) -> tuple[_Side, _Side]:
    h = max(a.h, b.h)
    return _regrid(a, h), _regrid(b, h)


def _trim(side: _Side) -> _Side:
    nz = np.flatnonzero(side.probs > 0)
    if nz.size == 0:
        return replace(side, probs=np.zeros(1))
    i, j = int(nz[0]), int(nz[-1])
    if i == 0 and j == side.size - 1:
        return side
    return replace(side, offset=side.offset + i, probs=np.ascontiguousarray(side.probs[i : j + 1]))


def _truncate(side: _Side, tail_mass: float) -> _Side:
    """Drop far tails after a convolution, conservatively for the side's direction.

    Pessimistic: upper-tail mass ``<= tail_mass / 2`` moves to ``+inf`` together with a bound on
    the error it carries. Optimistic: that upper tail moves down to the last kept bin and the
    lower tail (also ``<= tail_mass / 2``) is deleted; both only lower ``delta``.
    """
    side = _trim(side)
    p = side.probs
    top = np.cumsum(p[::-1])[::-1]  # mass at or above each bin
    cut = int(np.searchsorted(-top, -tail_mass / 2, side="left"))  # first bin with top <= tau/2
    probs = p
    inf = side.inf_mass
    fin = side.finite_mass
    offset = side.offset
    if 0 < cut < side.size:
        moved = float(top[cut])
        if side.pessimistic:
            charge = sum(
                float(t.delta_error(np.array([side.losses[cut] - side.h]))[0]) for t in side.errors
            )
            inf = inf + (moved + charge) * (1 + 1e-9)
            fin = max(fin - moved, 0.0)
            probs = p[:cut].copy()
        else:
            probs = p[:cut].copy()
            probs[-1] += moved
    if not side.pessimistic:
        bottom = np.cumsum(probs)
        drop = int(np.searchsorted(bottom, tail_mass / 2, side="right"))
        if 0 < drop < probs.size:
            fin = max(fin - float(bottom[drop - 1]), 0.0)
            probs = probs[drop:]
            offset += drop
    return _trim(replace(side, offset=offset, probs=probs, finite_mass=fin, inf_mass=inf))


def _identity_side(pessimistic: bool, h: float) -> _Side:
    return _Side(pessimistic, h, 0, np.ones(1), 1.0, 0.0, (), (0.0, 0.0))
