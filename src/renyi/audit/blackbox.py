"""Black-box auditing of a mechanism: attack it on a neighbouring pair, bound its epsilon below.

:func:`audit_mechanism` runs ``mechanism(x0, size, rng)`` and ``mechanism(x1, size, rng)``
``trials`` times each, and for each built-in attack:

1. splits the runs in half; on the first half it picks the output set ``S`` (a threshold
   set ``{y > t}`` / ``{y <= t}``, or a union of output cells ordered by their empirical
   likelihood ratio) that maximises the Clopper-Pearson epsilon lower bound;
2. counts, on the held-out half, how often ``S`` fires under each input and converts the
   counts into a lower bound on epsilon at ``delta`` with :func:`~renyi.audit.stats.
   epsilon_lower_bound` (Jagielski, Ullman & Oprea 2020, Alg. 2; Nasr et al. 2021, Sec. 3).

The confidence is split evenly over the attacks (Bonferroni), so the reported maximum holds
with probability ``>= confidence`` over the audit's randomness. ``passed`` is ``lower bound
<= claimed epsilon``: a failure means the claim is false with that confidence (or the
mechanism is not what it says). A Rényi lower bound at chosen orders comes from the same
held-out counts (:func:`~renyi.audit.stats.renyi_lower_bound`).

Attacks:

* ``"threshold"``: sets ``{y > t}`` and their complements over a grid of pooled quantiles
  (dense in both tails, where pure-DP ratios show).
* ``"histogram"``: output cells (each distinct value when there are at most 4096, else
  quantile bins), sets are the top cells by likelihood ratio: the "set distinguisher".
* ``"features"``: a trained set distinguisher on the floating-point features of each output
  (:func:`float_features`: lowest set bit, exponent, precision): the cells are the distinct
  feature triples, the set is chosen on the training half by likelihood ratio and bounded
  on the held-out half, like ``"histogram"``.
* ``"bytes"``: cells are the outputs' exact 8-byte patterns (IEEE bits, so ``-0.0`` and
  ``+0.0`` are different cells; when more than 4096 patterns occur, the cell is the
  pattern's sign bit, zero flag, exponent and lowest set bit), sets by likelihood ratio. A
  release whose bytes are a function of its lattice index alone gives it nothing beyond the
  histogram; one that shows the sign of a zero (``-0.0`` only for inputs just below 0)
  does.
* ``"signzero"``: two cells, ``y`` is ``-0.0`` or not. Without the choice among many
  cells of ``"bytes"`` (whose selection can overfit rare patterns), it is the sharp test of
  the sign of a zero.
* ``"residue"`` (only with ``residue=(multiplier, modulus)``): two cells, whether
  ``(multiplier * y) mod modulus`` is 0 (within ``2**-16`` of the modulus) or not. A sum
  released as ``sum(x) + g K`` (noise on a lattice ``g`` but the values not) keeps
  ``sum(x) mod g``: with ``multiplier`` the number of parties (a mean times ``K`` is the
  sum) and ``modulus`` the noise lattice, this attack reads it.
* ``"lowbits"``: Mironov's (2012) floating-point attack. The cell of ``y`` is the exponent
  ``j`` of its lowest set bit (``y`` is an odd multiple of ``2**j``). Textbook
  ``x + numpy.random.laplace(b)`` produces outputs whose finest bit depends on ``x``
  (``0 + L`` near zero has bits below ``2**-53``, ``1 + L`` never does), so some cells are
  (nearly) impossible under one input: a huge epsilon. A mechanism whose outputs lie on a
  data-independent lattice (as :mod:`renyi.mechanisms` does) gives this attack nothing.

Example:
    >>> import numpy as np
    >>> def rr(x, size, rng):  # randomized response, truth w.p. 3/4: epsilon = log 3
    ...     return np.where(rng.random(size) < 0.75, x, 1 - x)
    >>> r = audit_mechanism(rr, 0, 1, trials=20000, claimed_epsilon=float(np.log(3)),
    ...                     rng=np.random.default_rng(0))
    >>> r.passed, 0.9 < r.epsilon_lower < float(np.log(3))
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, check_orders, check_range, fail
from renyi.audit.stats import (
    clopper_pearson,
    epsilon_from_rates,
    epsilon_lower_bound,
    renyi_lower_bound,
)

__all__ = [
    "ATTACKS",
    "EXTRA_ATTACKS",
    "AttackResult",
    "AuditResult",
    "MechanismFn",
    "audit_mechanism",
    "audit_samples",
    "byte_pattern",
    "float_features",
    "lowest_bit_exponent",
    "vectorised",
]

#: ``mechanism(x, size, rng) -> outputs``: ``size`` independent releases on input ``x``.
MechanismFn = Callable[[Any, int, Any], ArrayLike]
FloatArray = NDArray[np.float64]
ATTACKS = ("threshold", "histogram", "lowbits", "features", "signzero")
#: attacks run only when asked for (``"residue"`` needs ``residue=``)
EXTRA_ATTACKS = ("bytes", "residue")
_MAX_DISTINCT = 4096
_ZERO_CELL = -1_200  # lowest-bit exponent given to y == 0 (below every double's)


@dataclass(frozen=True)
class AttackResult:
    """One attack's held-out result.

    Attributes:
        attack: the attack's name.
        epsilon: its lower bound on epsilon at the audit's delta (confidence: the audit's,
            Bonferroni-split over attacks).
        set_description: the output set ``S`` chosen on the first half.
        fires_on: which input the set ``S`` points to (the test says that input on ``S``).
        fpr, fnr: held-out error rates of the test; fpr_upper, fnr_upper: their
            Clopper-Pearson upper bounds.
        k0, k1, n0, n1: held-out counts of ``S`` under ``x0`` and ``x1``.
        roc_fpr, roc_tpr: the held-out ROC curve of the attack's family of sets.
    """

    attack: str
    epsilon: float
    set_description: str
    fires_on: str
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float
    k0: int
    k1: int
    n0: int
    n1: int
    roc_fpr: FloatArray = field(repr=False)
    roc_tpr: FloatArray = field(repr=False)


@dataclass(frozen=True)
class AuditResult:
    """A black-box audit: the lower bound, the claim and the verdict.

    Attributes:
        epsilon_lower: the largest attack's lower bound on epsilon at ``delta``; the true
            epsilon is at least this with probability ``>= confidence``.
        delta, confidence: as requested.
        claimed_epsilon: the claim checked (``None``: none given).
        passed: ``epsilon_lower <= claimed_epsilon`` (``None`` without a claim).
        best: the attack that gave ``epsilon_lower``.
        attacks: every attack's :class:`AttackResult`.
        trials: runs per input (half choose the set, half evaluate it).
        orders, rdp_lower: Rényi lower bounds (best attack's held-out counts) at ``orders``.
        claimed_rdp: the claimed RDP epsilons at ``orders`` (``None`` if not given).
        rdp_passed: ``rdp_lower <= claimed_rdp`` at every order (``None`` if not checked).
    """

    epsilon_lower: float
    delta: float
    confidence: float
    claimed_epsilon: float | None
    passed: bool | None
    best: AttackResult
    attacks: tuple[AttackResult, ...]
    trials: int
    orders: FloatArray | None = None
    rdp_lower: FloatArray | None = None
    claimed_rdp: FloatArray | None = None
    rdp_passed: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary (no ROC arrays)."""
        return {
            "epsilon_lower": self.epsilon_lower,
            "delta": self.delta,
            "confidence": self.confidence,
            "claimed_epsilon": self.claimed_epsilon,
            "passed": self.passed,
            "best_attack": self.best.attack,
            "trials": self.trials,
            "attacks": [
                {
                    "attack": a.attack,
                    "epsilon_lower": a.epsilon,
                    "set": a.set_description,
                    "fires_on": a.fires_on,
                    "fpr": a.fpr,
                    "fnr": a.fnr,
                    "fpr_upper": a.fpr_upper,
                    "fnr_upper": a.fnr_upper,
                }
                for a in self.attacks
            ],
            "orders": None if self.orders is None else self.orders.tolist(),
            "rdp_lower": None if self.rdp_lower is None else self.rdp_lower.tolist(),
            "claimed_rdp": None if self.claimed_rdp is None else self.claimed_rdp.tolist(),
            "rdp_passed": self.rdp_passed,
        }


def lowest_bit_exponent(y: ArrayLike) -> NDArray[np.int64]:
    """Exponent ``j`` with ``y`` an odd multiple of ``2**j`` (finite doubles; 0 -> -1200).

    Example:
        >>> lowest_bit_exponent([1.0, 0.75, 3 * 2.0**-60, 0.0]).tolist()
        [0, -2, -60, -1200]
    """
    arr = np.asarray(y, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise fail("y", "<array with NaN or inf>", "finite outputs")
    m, e = np.frexp(np.abs(arr))  # |y| = m 2**e, m in [1/2, 1) (exact)
    mant = np.ldexp(m, 53).astype(np.int64)  # 53-bit integer significand (exact)
    low = mant & (-mant)  # lowest set bit as a power of two
    _, tz1 = np.frexp(low.astype(np.float64))  # low = 2**(tz1 - 1)
    j = e.astype(np.int64) - 53 + (tz1.astype(np.int64) - 1)
    return np.where(arr == 0, _ZERO_CELL, j).astype(np.int64)


# --------------------------------------------------------------------------- cells
@dataclass(frozen=True)
class _Cells:
    """Outputs mapped to integer cells 0..k-1; ``ordered``: sets are prefixes of cell order."""

    train0: NDArray[np.int64]
    train1: NDArray[np.int64]
    test0: NDArray[np.int64]
    test1: NDArray[np.int64]
    k: int
    ordered: bool
    labels: Callable[[NDArray[np.int64]], str]


def _quantile_edges(pooled: FloatArray, n: int, dense: int) -> FloatArray:
    tail = np.geomspace(1.0 / (2.0 * n), 0.5, dense)
    levels = np.unique(np.concatenate([tail, 1.0 - tail, np.linspace(0.0, 1.0, dense)]))
    return np.unique(np.quantile(pooled, levels, method="lower"))


def _threshold_cells(tr0: FloatArray, tr1: FloatArray, te0: FloatArray, te1: FloatArray) -> _Cells:
    pooled = np.concatenate([tr0, tr1])
    edges = _quantile_edges(pooled, pooled.size, 200)

    def cells(y: FloatArray) -> NDArray[np.int64]:
        return np.searchsorted(edges, y, side="right").astype(np.int64)

    def label(chosen: NDArray[np.int64]) -> str:
        top = int(chosen.max())  # prefix sets: cells 0..top, i.e. y < edges[top]
        return f"y < {edges[top]:.6g}" if top < edges.size else "all outputs"

    return _Cells(cells(tr0), cells(tr1), cells(te0), cells(te1), edges.size + 1, True, label)


def _histogram_cells(tr0: FloatArray, tr1: FloatArray, te0: FloatArray, te1: FloatArray) -> _Cells:
    pooled = np.concatenate([tr0, tr1])
    values = np.unique(pooled)
    if values.size <= _MAX_DISTINCT:
        other = values.size  # test values never seen in training share one cell

        def cells(y: FloatArray) -> NDArray[np.int64]:
            idx = np.searchsorted(values, y).clip(0, values.size - 1)
            return np.where(values[idx] == y, idx, other).astype(np.int64)

        def label(chosen: NDArray[np.int64]) -> str:
            shown = [f"{values[c]:.6g}" if c < other else "unseen" for c in chosen[:8]]
            more = f", ... ({chosen.size} values)" if chosen.size > 8 else ""
            return "y in {" + ", ".join(shown) + more + "}"

        return _Cells(cells(tr0), cells(tr1), cells(te0), cells(te1), other + 1, False, label)
    edges = _quantile_edges(pooled, pooled.size, 400)

    def bins(y: FloatArray) -> NDArray[np.int64]:
        return np.searchsorted(edges, y, side="right").astype(np.int64)

    def blabel(chosen: NDArray[np.int64]) -> str:
        return f"union of {chosen.size} quantile bins"

    return _Cells(bins(tr0), bins(tr1), bins(te0), bins(te1), edges.size + 1, False, blabel)


def _lowbits_cells(tr0: FloatArray, tr1: FloatArray, te0: FloatArray, te1: FloatArray) -> _Cells:
    lo = _ZERO_CELL

    def cells(y: FloatArray) -> NDArray[np.int64]:
        return (lowest_bit_exponent(y) - lo).astype(np.int64)

    def label(chosen: NDArray[np.int64]) -> str:
        js = sorted(int(c) + lo for c in chosen)
        shown = ", ".join(str(j) for j in js[:8]) + (", ..." if len(js) > 8 else "")
        return f"lowest set bit 2**j with j in {{{shown}}}"

    k = 2 * abs(lo) + 1
    return _Cells(cells(tr0), cells(tr1), cells(te0), cells(te1), k, False, label)


def float_features(y: ArrayLike) -> NDArray[np.int64]:
    """The floating-point features of each output: ``(lowest set bit j, exponent e,
    precision e - j)`` as rows of an int64 array (``y = m 2**e`` with ``m`` in [1/2, 1); the
    output is an odd multiple of ``2**j``; 0 gets ``j = -1200, e = 0``).

    Example:
        >>> float_features([1.0, 0.75, 3 * 2.0**-60]).tolist()
        [[0, 1, 1], [-2, 0, 2], [-60, -58, 2]]
    """
    arr = np.asarray(y, dtype=np.float64)
    j = lowest_bit_exponent(arr)
    e = np.frexp(arr)[1].astype(np.int64)
    return np.stack([j, e, e - j], axis=-1)


def _features_cells(tr0: FloatArray, tr1: FloatArray, te0: FloatArray, te1: FloatArray) -> _Cells:
    parts = [tr0, tr1, te0, te1]
    keys, inverse = np.unique(
        np.concatenate([float_features(p) for p in parts]), axis=0, return_inverse=True
    )
    inverse = inverse.reshape(-1).astype(np.int64)
    bounds = np.cumsum([0] + [p.size for p in parts])
    split = [inverse[bounds[i] : bounds[i + 1]] for i in range(4)]

    def label(chosen: NDArray[np.int64]) -> str:
        shown = ", ".join(f"(j={k[0]}, e={k[1]}, p={k[2]})" for k in keys[chosen[:4]].tolist())
        more = f", ... ({chosen.size} cells)" if chosen.size > 4 else ""
        return "(lowest bit, exponent, precision) in {" + shown + more + "}"

    return _Cells(split[0], split[1], split[2], split[3], keys.shape[0], False, label)


def _keyed_cells(parts: list[NDArray[Any]], label: Callable[[NDArray[Any]], str]) -> _Cells:
    """Cells = distinct rows (or values) of the four keyed arrays, sets by likelihood ratio."""
    keys, inverse = np.unique(np.concatenate(parts), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1).astype(np.int64)
    bounds = np.cumsum([0] + [p.shape[0] for p in parts])
    split = [inverse[bounds[i] : bounds[i + 1]] for i in range(4)]

    def labels(chosen: NDArray[np.int64]) -> str:
        return label(keys[chosen])

    return _Cells(split[0], split[1], split[2], split[3], int(keys.shape[0]), False, labels)


def byte_pattern(y: ArrayLike) -> NDArray[np.uint64]:
    """The IEEE-754 bit pattern of each output as an unsigned integer (``-0.0`` differs
    from ``0.0``).

    Example:
        >>> [hex(int(b)) for b in byte_pattern([0.0, -0.0, 1.0])]
        ['0x0', '0x8000000000000000', '0x3ff0000000000000']
    """
    return np.ascontiguousarray(np.asarray(y, dtype=np.float64)).view(np.uint64).copy()


def _bytes_cells(tr0: FloatArray, tr1: FloatArray, te0: FloatArray, te1: FloatArray) -> _Cells:
    parts = [byte_pattern(p) for p in (tr0, tr1, te0, te1)]
    if np.unique(np.concatenate(parts[:2])).size <= _MAX_DISTINCT:

        def label(keys: NDArray[Any]) -> str:
            shown = ", ".join(
                repr(float(v)) for v in keys[:6].astype(np.uint64).view(np.float64).tolist()
            )
            return "bytes of y in {" + shown + (", ..." if keys.size > 6 else "") + "}"

        return _keyed_cells(parts, label)
    feats = [
        np.stack(
            [
                np.signbit(p).astype(np.int64),
                (p == 0).astype(np.int64),
                np.frexp(p)[1].astype(np.int64),
                lowest_bit_exponent(p),
            ],
            axis=1,
        )
        for p in (tr0, tr1, te0, te1)
    ]

    def flabel(keys: NDArray[Any]) -> str:
        shown = ", ".join(f"(sign={k[0]}, zero={k[1]}, e={k[2]}, j={k[3]})" for k in keys[:3])
        return "(sign, zero, exponent, lowest bit) in {" + shown + "}"

    return _keyed_cells(feats, flabel)


def _two_cells(flag: Callable[[FloatArray], NDArray[np.bool_]], what: str) -> Callable[..., _Cells]:
    """Two cells: ``flag(y)`` true (cell 1) or false (cell 0)."""

    def make(tr0: FloatArray, tr1: FloatArray, te0: FloatArray, te1: FloatArray) -> _Cells:
        def cells(y: FloatArray) -> NDArray[np.int64]:
            return flag(y).astype(np.int64)

        def label(chosen: NDArray[np.int64]) -> str:
            if chosen.size == 2:
                return "all outputs"
            return what if int(chosen[0]) == 1 else f"not ({what})"

        return _Cells(cells(tr0), cells(tr1), cells(te0), cells(te1), 2, False, label)

    return make


def _is_negative_zero(y: FloatArray) -> NDArray[np.bool_]:
    return np.asarray((y == 0) & np.signbit(y))


def _residue_cells(multiplier: float, modulus: float) -> Callable[..., _Cells]:
    def off_lattice(y: FloatArray) -> NDArray[np.bool_]:
        r = np.mod(multiplier * y, modulus) / modulus  # in [0, 1)
        return np.asarray(np.minimum(r, 1.0 - r) > 2.0**-16)

    return _two_cells(off_lattice, f"{multiplier:g} y is off the lattice {modulus:g} Z")


_CELLS: dict[str, Callable[..., _Cells]] = {
    "threshold": _threshold_cells,
    "histogram": _histogram_cells,
    "lowbits": _lowbits_cells,
    "features": _features_cells,
    "bytes": _bytes_cells,
    "signzero": _two_cells(_is_negative_zero, "y is -0.0"),
}


# --------------------------------------------------------------------------- selection
def _prefix_bounds(
    a0: NDArray[np.int64], n0: int, a1: NDArray[np.int64], n1: int, delta: float, conf: float
) -> tuple[FloatArray, FloatArray]:
    """Epsilon bounds of each set (counts a0, a1) used as "fires on x1" and as "fires on x0"."""
    each = 1.0 - (1.0 - conf) / 2.0
    _, fp_s = clopper_pearson(a0, n0, each, side="upper")  # test = S fires on x1: FPR=P0(S)
    _, fn_s = clopper_pearson(n1 - a1, n1, each, side="upper")
    _, fp_c = clopper_pearson(n0 - a0, n0, each, side="upper")  # test = S^c fires on x0
    _, fn_c = clopper_pearson(a1, n1, each, side="upper")
    return epsilon_from_rates(fp_s, fn_s, delta), epsilon_from_rates(fp_c, fn_c, delta)


def _run_attack(name: str, cells: _Cells, delta: float, conf: float) -> AttackResult:
    k = cells.k
    c0 = np.bincount(cells.train0, minlength=k)
    c1 = np.bincount(cells.train1, minlength=k)
    n0, n1 = int(cells.train0.size), int(cells.train1.size)
    if cells.ordered:
        order = np.arange(k)
    else:  # descending empirical likelihood ratio P1/P0 (smoothed), only occupied cells
        occupied = np.nonzero((c0 + c1) > 0)[0]
        ratio = np.log((c1[occupied] + 0.5) / n1) - np.log((c0[occupied] + 0.5) / n0)
        order = occupied[np.argsort(-ratio, kind="stable")]
    a0 = np.cumsum(c0[order])
    a1 = np.cumsum(c1[order])
    e_s, e_c = _prefix_bounds(a0, n0, a1, n1, delta, conf)
    i_s, i_c = int(np.argmax(e_s)), int(np.argmax(e_c))
    use_complement = e_c[i_c] > e_s[i_s]
    cut = i_c if use_complement else i_s
    chosen = order[: cut + 1]
    in_set = np.zeros(k + 1, dtype=bool)
    in_set[chosen] = True
    t0, t1 = cells.test0, cells.test1
    m0, m1 = int(t0.size), int(t1.size)
    k0 = int(in_set[t0].sum())
    k1 = int(in_set[t1].sum())
    if use_complement:  # test says "x0" on S: errors P0(not S) and P1(S)
        bound = epsilon_lower_bound(m0 - k0, m0, k1, m1, delta, conf)
        fires = "x0"
    else:  # test says "x1" on S: errors P0(S) and P1(not S)
        bound = epsilon_lower_bound(k0, m0, m1 - k1, m1, delta, conf)
        fires = "x1"
    # held-out ROC of the family of prefix sets (oriented so the curve lies above chance)
    h0 = np.bincount(t0, minlength=k + 1)[order]
    h1 = np.bincount(t1, minlength=k + 1)[order]
    fpr = np.concatenate([[0.0], np.cumsum(h0) / m0])
    tpr = np.concatenate([[0.0], np.cumsum(h1) / m1])
    if np.trapezoid(tpr, fpr) < 0.5:
        fpr, tpr = 1.0 - fpr[::-1], 1.0 - tpr[::-1]
    description = cells.labels(np.sort(chosen))
    return AttackResult(
        name,
        bound.epsilon,
        description,
        fires,
        bound.fpr,
        bound.fnr,
        bound.fpr_upper,
        bound.fnr_upper,
        k0,
        k1,
        m0,
        m1,
        fpr,
        tpr,
    )


def _as_outputs(y: Any, size: int, name: str) -> FloatArray:
    arr = np.asarray(y)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.float64)
    if arr.dtype.kind not in "iuf" or arr.shape != (size,):
        raise fail(name, f"<{arr.dtype} array of shape {arr.shape}>", f"{size} real outputs")
    out = arr.astype(np.float64)
    if not np.isfinite(out).all():
        raise fail(name, "<outputs with NaN or inf>", "finite outputs")
    return out


def audit_samples(
    y0: ArrayLike,
    y1: ArrayLike,
    *,
    claimed_epsilon: float | None = None,
    delta: float = 0.0,
    confidence: float = 0.95,
    attacks: Sequence[str] = ATTACKS,
    orders: ArrayLike | None = None,
    claimed_rdp: ArrayLike | None = None,
    residue: tuple[float, float] | None = None,
) -> AuditResult:
    """Audit from given outputs: ``y0`` (runs on ``x0``) and ``y1`` (runs on ``x1``).

    Same analysis as :func:`audit_mechanism` (which draws the outputs); the runs must be
    independent. Each array is split in half: the first half chooses each attack's set, the
    second evaluates it. See the module docstring for the attacks and the guarantee.
    ``residue=(multiplier, modulus)`` adds the ``"residue"`` attack.

    Example:
        >>> rng = np.random.default_rng(1)
        >>> y0, y1 = rng.laplace(0, 1, 20000), 1 + rng.laplace(0, 1, 20000)
        >>> r = audit_samples(y0, y1, claimed_epsilon=1.0, attacks=["threshold"])
        >>> r.passed
        True
    """
    conf = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    d = check_range("delta", delta, 0.0, 1.0, high_open=True)
    claim = (
        None
        if claimed_epsilon is None
        else check_range("claimed_epsilon", claimed_epsilon, 0.0, math.inf)
    )
    names = list(attacks)
    cells = dict(_CELLS)
    if residue is not None:
        try:
            mult, modulus = (float(v) for v in residue)
        except (TypeError, ValueError):
            raise fail("residue", residue, "a pair (multiplier, modulus)") from None
        if not (math.isfinite(mult) and mult != 0 and math.isfinite(modulus) and modulus > 0):
            raise fail("residue", residue, "a finite multiplier != 0 and a modulus > 0")
        cells["residue"] = _residue_cells(mult, modulus)
        if "residue" not in names:
            names.append("residue")
    elif "residue" in names:
        raise fail("attacks", attacks, "'residue' only with residue=(multiplier, modulus)")
    if not names or any(a not in cells for a in names) or len(set(names)) != len(names):
        raise fail(
            "attacks", attacks, f"a non-empty list of distinct names from {ATTACKS + EXTRA_ATTACKS}"
        )
    a0 = np.asarray(y0)
    a1 = np.asarray(y1)
    n = min(a0.shape[0] if a0.ndim == 1 else 0, a1.shape[0] if a1.ndim == 1 else 0)
    if n < 4:
        raise fail("y0/y1", f"<arrays of shapes {a0.shape}, {a1.shape}>", "1-D, >= 4 outputs each")
    f0 = _as_outputs(a0, a0.shape[0], "y0")
    f1 = _as_outputs(a1, a1.shape[0], "y1")
    h0, h1 = f0.size // 2, f1.size // 2
    per_attack = 1.0 - (1.0 - conf) / len(names)  # Bonferroni over attacks
    results = [
        _run_attack(a, cells[a](f0[:h0], f1[:h1], f0[h0:], f1[h1:]), d, per_attack) for a in names
    ]
    best = max(results, key=lambda r: r.epsilon)
    passed = None if claim is None else bool(best.epsilon <= claim)
    out_orders = rdp_lo = rdp_claim = None
    rdp_ok: bool | None = None
    if orders is not None:
        out_orders = check_orders(orders)
        rdp_lo = renyi_lower_bound(best.k0, best.n0, best.k1, best.n1, out_orders, conf)
        if claimed_rdp is not None:
            rdp_claim = np.broadcast_to(
                np.asarray(claimed_rdp, dtype=np.float64), out_orders.shape
            ).copy()
            if np.isnan(rdp_claim).any() or (rdp_claim < 0).any():
                raise fail("claimed_rdp", claimed_rdp, "non-negative RDP epsilons, one per order")
            rdp_ok = bool((rdp_lo <= rdp_claim).all())
    elif claimed_rdp is not None:
        raise fail("claimed_rdp", "<given>", "orders as well (one claimed value per order)")
    return AuditResult(
        best.epsilon,
        d,
        conf,
        claim,
        passed,
        best,
        tuple(results),
        int(min(f0.size, f1.size)),
        out_orders,
        rdp_lo,
        rdp_claim,
        rdp_ok,
    )


def audit_mechanism(
    mechanism: MechanismFn,
    x0: Any,
    x1: Any,
    *,
    trials: int = 100_000,
    claimed_epsilon: float | None = None,
    delta: float = 0.0,
    confidence: float = 0.95,
    attacks: Sequence[str] = ATTACKS,
    orders: ArrayLike | None = None,
    claimed_rdp: ArrayLike | None = None,
    statistic: Callable[[Any], ArrayLike] | None = None,
    rng: Any = None,
    residue: tuple[float, float] | None = None,
) -> AuditResult:
    """Lower-bound a mechanism's epsilon from ``trials`` runs on each of ``x0`` and ``x1``.

    ``mechanism(x, size, rng)`` returns ``size`` independent releases on input ``x`` (one
    real each, or anything ``statistic`` maps to one real each). ``x0`` and ``x1`` should be
    neighbouring inputs at the largest distance the claim covers (e.g. ``0`` and the
    sensitivity). The result's ``epsilon_lower`` is a lower bound on the true epsilon at
    ``delta`` with probability ``>= confidence`` over the runs (held-out Clopper-Pearson
    bounds, Bonferroni over attacks; Jagielski et al. 2020, Nasr et al. 2021); ``passed`` is
    ``epsilon_lower <= claimed_epsilon``. With ``orders`` (and optionally ``claimed_rdp``),
    Rényi lower bounds are reported and checked too. ``rng`` is passed to the mechanism
    (``None``: the mechanism's default, e.g. the secure source of :mod:`renyi.random`).

    Example: see the module docstring.
    """
    n = check_int("trials", trials, 4)
    y0 = mechanism(x0, n, rng)
    y1 = mechanism(x1, n, rng)
    if statistic is not None:
        y0, y1 = statistic(y0), statistic(y1)
    return audit_samples(
        _as_outputs(y0, n, "mechanism(x0)"),
        _as_outputs(y1, n, "mechanism(x1)"),
        claimed_epsilon=claimed_epsilon,
        delta=delta,
        confidence=confidence,
        attacks=attacks,
        orders=orders,
        claimed_rdp=claimed_rdp,
        residue=residue,
    )


def vectorised(factory: Callable[[int], Any]) -> MechanismFn:
    """Adapt a :mod:`renyi.mechanisms` class to ``mechanism(x, size, rng)``.

    ``factory(size)`` builds the mechanism with ``dimension=size``; one call releases
    ``numpy.full(size, x)``, i.e. ``size`` independent coordinates, each distributed as the
    scalar mechanism's release *on the size-dimensional mechanism's lattice* (a finer
    lattice step: the per-coordinate sensitivity after rounding, and so the per-coordinate
    epsilon, is at most the scalar mechanism's). Mechanisms are cached per size.

    Example:
        >>> from renyi.mechanisms import LaplaceMechanism
        >>> m = vectorised(lambda d: LaplaceMechanism(1.0, 1.0, dimension=d))
        >>> m(0.0, 5, None).shape
        (5,)
    """
    cache: dict[int, Any] = {}

    def run(x: Any, size: int, rng: Any) -> ArrayLike:
        if size not in cache:
            cache[size] = factory(size)
        value = np.full(size, x)
        return np.asarray(cache[size].release(value, rng=rng))

    return run
