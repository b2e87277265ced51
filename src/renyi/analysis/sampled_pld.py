"""Pessimistic PLDs of mixtures of Poisson-subsampled Gaussian pairs, built from the public
:meth:`renyi.analysis.pld.PrivacyLossDistribution.from_distributions`.

A *branch* ``(w, r, d, s)`` is the pair ``P_b = (1 - r) N(0, s²) + r N(d, s²)`` against
``Q_b = N(0, s²)``, taken with probability ``w``; the branch is a latent variable with the
same law in both worlds, so revealing it can only help an adversary: the pair
``(⊕ w P_b, ⊕ w Q_b)`` on disjoint supports dominates the mechanism (joint convexity), and
its PLD is the ``w``-weighted union of the branches' PLDs. This is how truncated Poisson
sampling is priced (:class:`renyi.analysis.events.TruncatedPoissonSampledEvent`; dp_accounting
mixes PLDs in the same way).

Each branch's loss ``ℓ(y) = log(1 - r + r exp((2 y d - d²)/(2 s²)))`` is increasing in the
output ``y``, with the closed-form inverse ``y = s²/d · log((e^ℓ - 1 + r)/r) + d/2``. The
output line is cut where the loss crosses the grid ``k h``; every bin's mass is an exact
CDF difference (both sides) and is split between its two edge losses keeping both masses
(connect the dots, Doroshenko et al. 2022: a mean-preserving spread of the likelihood
ratio, so the new pair dominates); the mass above ``d + 12 s`` goes to ``+inf`` (remove) or
is charged the largest loss of its bin (add). Partner mass freed by these steps goes to an
atom of zero mass on the first side (loss ``-inf``, no effect on ``δ``), so the atoms form
a valid input of ``from_distributions``, whose own discretisation is pessimistic too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray
from scipy.special import log_ndtr, ndtr

if TYPE_CHECKING:
    from renyi.analysis.pld import PrivacyLossDistribution

__all__ = ["Branch", "mixture_pld", "symmetrised_sampled_gaussian_pld"]

FloatArray = NDArray[np.float64]
Branch = tuple[float, float, float, float]  # (weight, rate r, shift d, noise s)


def _branch_atoms(
    r: float, d: float, s: float, h: float, direction: str
) -> tuple[FloatArray, FloatArray, float]:
    """(first-side masses, partner masses, +inf mass) of one branch; the partner masses sum
    to at most 1. A loss range that no grid of ``h`` holds (extreme ``s``) raises
    :class:`~renyi.analysis.pld.PldGridError` naming the smallest interval that would."""
    from renyi.analysis.pld._errors import _grid_error
    from renyi.analysis.pld._numerics import _MAX_BINS

    two_var = 2.0 * s * s
    if two_var == 0.0:  # s below 1e-162: the loss overflows every float grid
        raise _grid_error("noise_multiplier", s, math.inf, "a value")
    c = 1.0 / two_var  # 0 for s above 1e154: the loss is 0 (below any grid step)

    def loss(y: FloatArray) -> FloatArray:
        out: FloatArray = np.logaddexp(math.log1p(-r), math.log(r) + (2.0 * y * d - d * d) * c)
        return out

    y_lo, y_hi = -12.0 * s, d + 12.0 * s
    l_lo, l_hi = float(loss(np.array([y_lo]))[0]), float(loss(np.array([y_hi]))[0])
    points = (l_hi - l_lo) / h + 2.0
    if not points <= _MAX_BINS:
        needed = (l_hi - l_lo) / (_MAX_BINS - 2)
        needed = needed if math.isfinite(needed) else math.inf
        raise _grid_error("value_discretization_interval", h, needed, f"noise_multiplier={s!r}")
    ks = np.arange(math.ceil(l_lo / h), math.floor(l_hi / h) + 1)
    ell = ks * h
    inner = np.expm1(ell) + r  # e^ell - 1 + r > 0 for ell > log(1 - r)
    ok = inner > 0
    ell = ell[ok]
    y = s * (s / d * np.log(inner[ok] / r)) + d / 2.0  # not s*s: 0 * inf at huge s
    edges = np.concatenate(([-np.inf], y, [np.inf]))
    # bin j is (edges[j], edges[j+1]]; its loss lies in [loss(edges[j]), loss(edges[j+1])]
    q_cdf = ndtr(edges / s)
    p_cdf = (1.0 - r) * q_cdf + r * ndtr((edges - d) / s)
    qm = np.maximum(np.diff(q_cdf), 0.0)
    pm = np.maximum(np.diff(p_cdf), 0.0)
    # upper-tail masses directly (no cancellation in 1 - cdf)
    q_top = math.exp(float(log_ndtr(-y[-1] / s)))
    p_top = (1.0 - r) * q_top + r * math.exp(float(log_ndtr(-(y[-1] - d) / s)))
    qm[-1], pm[-1] = q_top, p_top
    lo_edge = np.concatenate(([math.log1p(-r)], ell))  # loss at each bin's lower edge
    if direction == "remove":
        # first side P (loss ℓ in [lo, hi]); top bin to +inf, its Q-mass to the deficit
        f, g = _ctd(pm[:-1], qm[:-1], lo_edge[:-1], lo_edge[1:])
        return f, g, float(pm[-1])
    # add: first side Q, loss -ℓ in [-hi, -lo]; top bin (loss unbounded below) rounded up
    f, g = _ctd(qm[:-1], pm[:-1], -lo_edge[1:], -lo_edge[:-1])
    top_f = np.array([qm[-1]])
    # partner mass Q e^ell; capping the exponent lowers it, which only raises the loss
    top_g = top_f * math.exp(min(float(lo_edge[-1]), 700.0))
    return np.concatenate((f, top_f)), np.concatenate((g, top_g)), 0.0


def _ctd(
    f: FloatArray, g: FloatArray, lo: FloatArray, hi: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Connect the dots (Doroshenko et al. 2022): a bin with first-side mass ``f``, partner
    mass ``g`` and losses in ``[lo, hi]`` becomes two atoms at ``lo`` and ``hi`` with the
    same two masses (a mean-preserving spread of the likelihood ratio: it dominates).
    Returns the first-side and partner masses of the atoms, interleaved (lo, hi, lo, ...)."""
    elo, ehi = np.exp(-lo), np.exp(-hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = (g - f * ehi) / (elo * -np.expm1(lo - hi))
    a = np.clip(np.nan_to_num(a), 0.0, f)
    b = f - a
    first = np.stack((a, b), axis=1).ravel()
    partner = np.stack((a * elo, b * ehi), axis=1).ravel()
    return first, partner


def mixture_pld(
    branches: Sequence[Branch],
    direction: str,
    *,
    value_discretization_interval: float = 1e-4,
    tail_mass: float = 1e-15,
) -> PrivacyLossDistribution:
    """Pessimistic PLD (``direction`` ``"remove"`` or ``"add"``) of the branch-revealed
    mixture of Poisson-subsampled Gaussian pairs ``(weight, r, d, s)`` (weights sum to 1)."""
    from renyi._validation import fail
    from renyi.analysis.pld import PrivacyLossDistribution as PLD

    if direction not in ("remove", "add"):
        raise fail("direction", direction, "'remove' or 'add'")
    h = float(value_discretization_interval)
    firsts, partners, inf_mass = [], [], 0.0
    for w, r, d, s in branches:
        if w == 0.0:
            continue
        if r == 0.0:
            firsts.append(np.array([w]))
            partners.append(np.array([w]))
            continue
        f, p, inf = _branch_atoms(r, d, s, h, direction)
        firsts.append(w * f)
        partners.append(w * p)
        inf_mass += w * inf
    first = np.concatenate([*firsts, [inf_mass, 0.0]])
    partner = np.concatenate([*partners, [0.0, 0.0]])
    first /= math.fsum(first.tolist())  # exact CDF telescoping: a renormalisation by ~1e-16
    deficit = max(1.0 - math.fsum(partner.tolist()), 0.0)
    partner[-1] = deficit
    partner /= math.fsum(partner.tolist())
    return PLD.from_distributions(
        first, partner, value_discretization_interval=h, tail_mass=tail_mass
    )


def symmetrised_sampled_gaussian_pld(
    rate: float,
    noise_multiplier: float,
    *,
    value_discretization_interval: float = 1e-4,
    tail_mass: float = 1e-15,
) -> PrivacyLossDistribution:
    """Pessimistic PLD of the *symmetrised* Poisson-subsampled Gaussian pair: the pair whose
    hockey-stick curve ``H(γ) = E_Q[(dP/dQ - γ)+]`` is that of ``R = ((1 - r) N(0, s²) +
    r N(1, s²), N(0, s²))`` for ``γ >= 1`` and that of the reversed pair ``(Q_R, P_R)`` for
    ``γ <= 1``. Its loss distribution under the first side is ``R``'s positive losses, their
    mirror image (mass ``Q_R`` at ``-ℓ``) and an atom at 0 with the rest, so it is one
    symmetric PLD used for both directions.

    This dominates a mechanism whose every ordered neighbouring pair has ``H(γ) <= H_R(γ)``
    for ``γ >= 1``: for ``γ < 1``, ``H_γ(P||Q) = 1 - γ + γ H_{1/γ}(Q||P)`` and the reversed
    pair is neighbouring too. Sampling ``b`` of ``n`` without replacement under replace-one
    is such a mechanism with ``r = b/n`` (see
    :meth:`renyi.analysis.events.SampledWithoutReplacementEvent.pld_pair`). Built from ``R``'s
    connect-the-dots atoms (:func:`_branch_atoms`, which dominate ``R``: then the mirrored
    pair dominates the symmetrised one on both sides of ``γ = 1``)."""
    from renyi._validation import check_positive, check_probability, fail
    from renyi.analysis.pld import PrivacyLossDistribution as PLD

    r = check_probability("rate", rate)
    s = check_positive("noise_multiplier", noise_multiplier)
    if r == 0.0:
        raise fail("rate", rate, "a probability in (0, 1]")
    h = float(value_discretization_interval)
    if r == 1.0:
        return PLD.gaussian(s, value_discretization_interval=h, tail_mass=tail_mass)
    f, g, inf_mass = _branch_atoms(r, 1.0, s, h, "remove")
    keep = f > g  # positive losses (atoms at loss 0 join the central atom)
    f, g = f[keep], g[keep]
    used = math.fsum(f.tolist()) + math.fsum(g.tolist()) + inf_mass
    # P_R(ℓ >= 0) + Q_R(ℓ >= 0) = 2 (1 - r) Φ(-1/(2s)) + r <= 1: the centre is not negative
    if used > 1.0 + 1e-12:  # pragma: no cover - excluded by the bound above
        raise ArithmeticError(f"symmetrised PLD: masses sum to {used!r} > 1")
    centre = max(1.0 - used, 0.0)
    first = np.concatenate((f, g, [inf_mass, 0.0, centre]))
    partner = np.concatenate((g, f, [0.0, inf_mass, centre]))
    # both sides sum to 1 up to rounding (mirror images); no renormalisation, which could
    # shrink the positive losses' masses
    return PLD.from_distributions(
        first, partner, value_discretization_interval=h, tail_mass=tail_mass
    )
