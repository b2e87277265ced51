"""The one noise primitive of renyi: Gaussian and Laplace releases on a fixed lattice.

Every continuous-valued release of the package (DP-SGD's noisy gradient, the federated
means, DP-FedAvg, GOPA's independent noise) goes through two functions:

* ``gaussian(value, sigma, *, rng=None, allow_predictable_noise=False)``
* ``laplace(value, scale, *, rng=None, allow_predictable_noise=False)``

``value`` is a Python float, a numpy array (any real dtype) or a torch tensor (CPU or CUDA,
any floating dtype); the result has the same kind, shape, dtype and device. ``sigma`` /
``scale`` is the noise scale in the value's units (``0`` releases the value on the lattice
without noise, which is only ever post-processing of public data). ``gaussian_noise(shape,
sigma, ...)`` is ``gaussian(zeros(shape), sigma, ...)`` (a released pure-noise vector).
``lattice_step(scale)`` is the lattice step ``g`` and ``implementation_slack(n)`` the
documented cost of the floating-point implementation for ``n`` released values.

Construction (snapping; Mironov 2012 for Laplace, here for both): with
``g = lattice_step(sigma)`` (the largest power of two ``<= sigma / 8``, so ``s = sigma / g`` is
in ``[8, 16)``), the released value is ::

    g * (a + round(f + s * Z))      a = round(value / g),  f = value / g - a  (both exact)

with ``Z`` a standard normal (or standard Laplace) drawn from the CSPRNG. The output lies on
``g Z`` whatever the data or the noise drawn, so no low-order bit, exponent or precision of
the output carries information that the lattice index does not (the floating-point attack of
Mironov 2012 on ``value + numpy.random.normal()``). With real arithmetic this is exactly
``g * round((value + sigma Z) / g)``: a post-processing of the textbook Gaussian (Laplace)
mechanism, so **every guarantee of the continuous mechanism holds unchanged** (RDP, the
privacy-loss distribution, subsampling, composition; no sensitivity inflation: the lattice
costs nothing in epsilon). The floating-point implementation differs from that ideal in two
ways, bounded in ``docs/noise.md`` and returned by :func:`implementation_slack`: the radius
of the normal (the exponential of the Laplace) is capped where the uniform runs out of bits
(mass ``<= 2**-64`` per value, into delta), and rounding errors of ``log``/``sqrt``/``cos``
(at most ``2**-41`` lattice units) can move ``f + s Z`` across a rounding boundary, which
changes each lattice point's probability by a factor within ``exp(+-2**-37)`` (into epsilon).

Randomness: ``rng=None`` is the secure OS source (:class:`renyi.random.SecureSource`).
Reproducible runs pass a seeded ``numpy.random.Generator`` or one of renyi's seeded sources;
every such use warns (:class:`~renyi.errors.InsecureRandomnessWarning`). Any other object is
refused unless ``allow_predictable_noise=True`` says the caller accepts noise that renyi cannot
vouch for (it then warns too).

Example
-------
>>> import numpy as np
>>> from renyi import noise
>>> y = noise.gaussian(np.array([0.0, 1.0, 2.5]), 1.0)
>>> g = noise.lattice_step(1.0)
>>> g, bool(np.all(y / g == np.round(y / g)))
(0.125, True)
>>> isinstance(noise.laplace(3.0, 2.0), float)
True
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

from renyi._validation import check_int, check_nonnegative, fail
from renyi.random import (
    RandomSource,
    _warn_insecure,
    get_source,
    is_trusted_source,
)

__all__ = [
    "GRID_BITS",
    "ROUNDING_SLACK",
    "TAIL_MASS",
    "gaussian",
    "gaussian_noise",
    "implementation_slack",
    "laplace",
    "lattice_step",
    "resolve_source",
    "snap",
    "standard_normal",
]

#: ``sigma / g`` is in ``[2**GRID_BITS, 2**(GRID_BITS + 1))``: the rounding to the lattice adds
#: at most ``g**2 / 12 <= sigma**2 / 768`` of variance (0.07 % of the standard deviation).
GRID_BITS = 3
#: Probability mass per value beyond the sampler's cap (uniforms below 2**-64: radius
#: sqrt(128 ln 2) ~ 9.42 for the normal, 44.4 scales for the Laplace).
TAIL_MASS = 2.0**-64
#: Bound on |log P_impl(k) - log P_ideal(k)| per released value and lattice point (see
#: docs/noise.md): floating-point rounding moves a rounding boundary by < 2**-41 lattice units.
ROUNDING_SLACK = 2.0**-37
_MAX_INDEX = 2.0**52  # |value / g| above this would make a + J inexact in float64
_TWO_PI = 2.0 * math.pi


def lattice_step(scale: float) -> float:
    """The lattice step ``g`` for noise scale ``scale``: the largest power of two
    ``<= scale * 2**-GRID_BITS`` (at least ``2**-970``, so the multiples stay normal floats).
    ``scale = 0`` (no noise, no privacy: the value itself is returned) gives ``2**-970``.

    >>> lattice_step(1.0), lattice_step(0.3), lattice_step(1000.0)
    (0.125, 0.03125, 64.0)
    """
    s = check_nonnegative("scale", scale)
    if s == 0.0:
        return 2.0**-970
    if not math.isfinite(s):
        raise fail("scale", scale, "a finite noise scale >= 0")
    _, e = math.frexp(s)  # s = m 2**e, m in [1/2, 1)
    return math.ldexp(1.0, max(e - 1 - GRID_BITS, -970))


def implementation_slack(n_values: int, epsilon: float = 1.0) -> tuple[float, float]:
    """``(epsilon_slack, delta_slack)`` of releasing ``n_values`` values with this module.

    Against the ideal (real-arithmetic) snapped mechanism, whose guarantee is the continuous
    mechanism's: each value's lattice probabilities are within ``exp(+-ROUNDING_SLACK)``
    except on the capped tail of mass ``TAIL_MASS``, so an ``(epsilon, delta)`` guarantee of
    the ideal release becomes ``(epsilon + 2 n ROUNDING_SLACK, delta + n TAIL_MASS (1 +
    e^epsilon))`` for the implementation (pointwise likelihood ratios multiply over values;
    the tail is a total-variation term).

    >>> e, d = implementation_slack(10**9)
    >>> e < 2e-2, d < 1e-9
    (True, True)
    """
    n = int(n_values)
    if n < 0:
        raise fail("n_values", n_values, "an integer >= 0")
    eps = check_nonnegative("epsilon", epsilon)
    return 2.0 * n * ROUNDING_SLACK, n * TAIL_MASS * (1.0 + math.exp(min(eps, 700.0)))


# ------------------------------------------------------------------------- randomness
def _torch_source_words(rng: Any) -> Any:
    """A words(n) callable for renyi's own torch sources, else None (exact type checks)."""
    mod = sys.modules.get("renyi.dpsgd.sampler")
    if mod is None:
        return None
    if type(rng) is mod.SecureRandomSource:
        src = rng.source
        if not is_trusted_source(src) or not src.secure:
            raise fail("random_source", rng, "a SecureRandomSource backed by renyi's OS source")
        return src.words
    if type(rng) is mod.SeededRandomSource:
        return rng.words
    return None


def resolve_source(rng: Any = None, *, allow_predictable_noise: bool = False) -> Any:
    """``words(n)``, the 64-bit word supply for ``rng``; refuses sources renyi cannot vouch for.

    ``None``: the secure OS source. A ``numpy.random.Generator``: reproducible, warns. One of
    renyi's sources (:class:`renyi.random.SecureSource`, ``GeneratorSource``, the DP-SGD
    torch sources, the keyed ``ChaCha20Source``): accepted by exact type, so a subclass that
    merely claims ``secure = True`` (or returns zeros) is not. Anything else is refused with
    :class:`~renyi.errors.PrivacyParameterError`, unless ``allow_predictable_noise=True``: the
    caller then takes responsibility for its randomness, and a warning says so.
    """
    words = _torch_source_words(rng)
    if words is not None:
        return words
    if rng is None or isinstance(rng, np.random.Generator):
        return get_source(rng).words
    if isinstance(rng, RandomSource) and is_trusted_source(rng):
        if not rng.secure:
            _warn_insecure(f"a seeded {type(rng).__name__}")
        return rng.words
    if allow_predictable_noise and callable(getattr(rng, "words", None)):
        _warn_insecure(
            f"a caller-supplied {type(rng).__name__} (allow_predictable_noise=True)",
            "renyi cannot vouch for its randomness; pass rng=None for the secure OS source",
        )
        return rng.words
    raise fail(
        "rng",
        rng,
        "None (the secure OS source), a numpy.random.Generator (reproducible, insecure) or one "
        "of renyi's random sources; other objects need allow_predictable_noise=True",
    )


# ------------------------------------------------------------------------- sampling
# The samplers run the same operations on numpy arrays and on torch tensors (``xp``), on
# int64 views of the words (shift, then mask: >> is arithmetic on signed integers).
def _field(w: Any, shift: int, bits: int) -> Any:
    return (w >> shift) & ((1 << bits) - 1)


def _to_float(x: Any, xp: Any) -> Any:
    return x.astype(np.float64) if xp is np else x.to(xp.float64)


def _bits(x: Any, xp: Any) -> Any:
    return x.view(np.int64) if xp is np else x.view(xp.int64)


def _from_bits(b: Any, xp: Any) -> Any:
    return b.view(np.float64) if xp is np else b.view(xp.float64)


def _full_unit(w_exp: Any, w_man: Any, xp: Any) -> Any:
    """Uniforms on (0, 1) with full relative precision: ``u = (1 + m 2**-52) 2**-(c + 1)`` with
    ``c`` the number of leading zeros of ``w_exp`` (so ``P(c = k) = 2**-(k+1)``: the binade
    ``[2**-(k+1), 2**-k)`` of a uniform) and ``m`` the top 52 bits of ``w_man`` (uniform
    within the binade). Every cell has relative width 2**-52, down to ``u = 2**-65``; the mass
    below (``w_exp = 0``, probability 2**-64) is the documented cap ``TAIL_MASS``. Exponents
    are read from and written into the float64 bit fields (exact, and much faster than
    ``frexp``/``ldexp``)."""
    hi = _to_float(_field(w_exp, 11, 53), xp)  # exact: below 2**53
    lo = _to_float(w_exp & 2047, xp)
    # biased exponent of a positive double = floor(log2 x) + 1023; 0 maps to 0
    lead_hi = 52 - ((_bits(hi, xp) >> 52) - 1023)  # leading zeros of the 64-bit word, hi > 0
    lead_lo = 63 - ((_bits(lo, xp) >> 52) - 1023)  # ... when hi = 0 (lo > 0)
    lead = xp.where(hi > 0, lead_hi, lead_lo.clip(max=64))  # w_exp = 0: 64 (the cap)
    mant = _from_bits(_field(w_man, 12, 52) | (1023 << 52), xp)  # 1 + m 2**-52, exact
    return mant * _from_bits((1022 - lead) << 52, xp)  # times 2**-(lead + 1), exact


def _standard(kind: str, n: int, words: Any, xp: Any, device: Any = None) -> Any:
    """``n`` standard normals (Box & Muller 1958) or standard Laplace draws, float64."""
    m = (n + 1) // 2 if kind == "gaussian" else n
    w_np = np.asarray(words(3 * m if kind == "gaussian" else 2 * m), dtype=np.uint64)
    w: Any = w_np.view(np.int64)
    if xp is not np:
        w = xp.from_numpy(w).to(device)
    if kind == "gaussian":
        r = xp.sqrt(-2.0 * xp.log(_full_unit(w[:m], w[m : 2 * m], xp)))
        theta = (_to_float(_field(w[2 * m :], 11, 53), xp) + 0.5) * (_TWO_PI * 2.0**-53)
        return xp.concatenate([r * xp.cos(theta), r * xp.sin(theta)])[:n]
    e = -xp.log(_full_unit(w[:m], w[m:], xp))
    return xp.where((w[m:] & 1) == 1, -e, e)  # sign: the lowest bit, unused by the mantissa


def _check_index(biggest: float, g: float) -> None:
    if not biggest <= _MAX_INDEX:
        raise fail(
            "value",
            "an entry too large for the lattice",
            f"finite values with |value| <= 2**52 * lattice step = {_MAX_INDEX * g:g}",
        )


def _release_numpy(
    kind: str, x: NDArray[Any], scale: float, words: Any, given: Any
) -> NDArray[Any]:
    out_dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    g = lattice_step(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        t = np.asarray(x, dtype=np.float64) / g  # exact: g is a power of two
    if t.size:
        _check_index(float(np.max(np.abs(t))), g)
    a = np.rint(t)
    f = t - a  # exact, in [-1/2, 1/2]
    if t.size:
        if given is None:
            z = _standard(kind, t.size, words, np).reshape(t.shape)
        else:
            z = np.array(given, dtype=np.float64).reshape(t.shape)
        z *= scale / g  # a power of two times scale: exact
        z += f
        np.rint(z, out=z)
        a += z
    a *= g
    return a.astype(out_dtype, copy=False)


def _release_torch(kind: str, x: Any, scale: float, words: Any, given: Any) -> Any:
    import torch

    out_dtype = x.dtype if x.is_floating_point() else torch.float64
    g = lattice_step(scale)
    t = x.detach().to(torch.float64).mul_(1.0 / g)  # exact: g is a power of two
    if t.numel():
        lo, hi = torch.aminmax(t)
        _check_index(max(-float(lo), float(hi)), g)
    a = torch.round(t)  # half to even, like numpy.rint
    f = t.sub_(a)  # exact, in [-1/2, 1/2] (t is ours)
    if t.numel():
        if given is None:
            z = _standard(kind, t.numel(), words, torch, t.device).reshape(t.shape)
        else:
            z = torch.as_tensor(given).to(device=t.device, dtype=torch.float64).reshape(t.shape)
        v = torch.add(f, z, alpha=scale / g)  # f + s z, a fresh tensor (z may be the caller's)
        a.add_(v.round_())
    return a.mul_(g).to(out_dtype)


def _release(kind: str, value: Any, scale: Any, rng: Any, allow: bool, given: Any = None) -> Any:
    name = "sigma" if kind == "gaussian" else "scale"
    s = check_nonnegative(name, scale)
    if not math.isfinite(s):
        raise fail(name, scale, "a finite noise scale >= 0")
    words = None if given is not None else resolve_source(rng, allow_predictable_noise=allow)
    if s == 0.0:  # no noise: the value itself (a non-private release, as the caller asked)
        return _as_output(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise fail("value", value.dtype, "a real-valued tensor")
        if value.numel() and not bool(torch.isfinite(value).all()):
            raise fail("value", "a non-finite entry", "finite values (NaN/inf are refused)")
        return _release_torch(kind, value, s, words, given)
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise fail("value", value, "a finite real number, array or tensor")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise fail("value", value, "a finite real number, array or tensor") from None
    if arr.dtype.kind not in "iuf":
        raise fail("value", value, "a finite real number, array or tensor")
    if arr.size and not np.isfinite(arr).all():
        raise fail("value", "a non-finite entry", "finite values (NaN/inf are refused)")
    out = _release_numpy(kind, arr, s, words, given)
    if arr.ndim == 0 and not isinstance(value, np.ndarray):
        return float(out)
    return out


def _as_output(value: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().clone() if value.is_floating_point() else value.double()
    arr = np.asarray(value)
    if arr.dtype.kind not in "iuf" or isinstance(value, bool | np.bool_):
        raise fail("value", value, "a finite real number, array or tensor")
    if arr.ndim == 0 and not isinstance(value, np.ndarray):
        return float(arr)
    return arr.astype(arr.dtype if arr.dtype.kind == "f" else np.float64, copy=True)


def gaussian(
    value: Any, sigma: float, *, rng: Any = None, allow_predictable_noise: bool = False
) -> Any:
    """``value + N(0, sigma**2)`` per entry, snapped to the lattice ``lattice_step(sigma) Z``.

    Same kind, shape, dtype (floats; integers give float64) and device as ``value``. Privacy:
    the Gaussian mechanism's, exactly (post-processing), up to :func:`implementation_slack`.

    >>> import numpy as np
    >>> y = gaussian(np.zeros(4, dtype=np.float32), 2.0)
    >>> y.dtype, bool(np.all(np.mod(y, 0.25) == 0))
    (dtype('float32'), True)
    """
    return _release("gaussian", value, sigma, rng, allow_predictable_noise)


def laplace(
    value: Any, scale: float, *, rng: Any = None, allow_predictable_noise: bool = False
) -> Any:
    """``value + Laplace(scale)`` per entry, snapped to the lattice ``lattice_step(scale) Z``.

    Privacy: the Laplace mechanism's (``Delta_1 / scale``-DP), up to
    :func:`implementation_slack` (the capped tail makes it ``(eps, n 2**-63)``-DP).

    >>> laplace(0.0, 1.0) % 0.125
    0.0
    """
    return _release("laplace", value, scale, rng, allow_predictable_noise)


def standard_normal(
    n: int, *, rng: Any = None, allow_predictable_noise: bool = False, torch_kernel: bool = False
) -> Any:
    """``n`` raw standard normals (float64), the sampler of :func:`gaussian`: NOT for release
    on their own (their low bits leak); pass them, shaped as needed, to :func:`snap`.
    ``torch_kernel=True`` evaluates the same transform with torch's CPU kernels and returns a
    tensor (faster single-threaded; equal to the numpy kernel up to the last ulps).

    >>> standard_normal(3).shape
    (3,)
    """
    n = check_int("n", n, 0)
    words = resolve_source(rng, allow_predictable_noise=allow_predictable_noise)
    if torch_kernel:
        import torch

        return _standard("gaussian", n, words, torch, "cpu")
    return np.asarray(_standard("gaussian", n, words, np), dtype=np.float64)


def snap(value: Any, standard_noise: Any, sigma: float) -> Any:
    """``value + sigma * standard_noise`` released on the lattice ``lattice_step(sigma) Z``,
    for noise the caller has shaped itself (e.g. the correlated noise rows of
    :mod:`renyi.dpsgd.correlated`, linear combinations of fresh normals).

    The same arithmetic as :func:`gaussian` (``g (a + round(f + (sigma/g) z))``): the ideal
    release is a post-processing of ``value + sigma z``, so the lattice adds no cost; the
    randomness and the privacy of ``z`` are the caller's. ``standard_noise`` has ``value``'s
    number of entries.

    >>> snap(1.0, 0.3, 1.0)
    1.25
    """
    torch = sys.modules.get("torch")
    n_value = value.numel() if torch is not None and isinstance(value, torch.Tensor) else None
    if n_value is None:
        n_value = np.asarray(value).size
    n_noise = (
        standard_noise.numel()
        if torch is not None and isinstance(standard_noise, torch.Tensor)
        else np.asarray(standard_noise).size
    )
    if n_noise != n_value:
        raise fail("standard_noise", f"{n_noise} entries", f"{n_value} entries, one per value")
    return _release("gaussian", value, sigma, None, False, given=standard_noise)


def gaussian_noise(
    shape: int | tuple[int, ...],
    sigma: float,
    *,
    rng: Any = None,
    like: Any = None,
    allow_predictable_noise: bool = False,
) -> Any:
    """A released pure-noise array: :func:`gaussian` of zeros of ``shape`` (numpy float64,
    or a tensor with ``like``'s dtype and device when ``like`` is a torch tensor).

    >>> gaussian_noise((2, 3), 1.0).shape
    (2, 3)
    """
    shp = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if any(int(n) < 0 for n in shp):
        raise fail("shape", shape, "non-negative dimensions")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        zeros: Any = torch.zeros(shp, dtype=like.dtype, device=like.device)
    else:
        zeros = np.zeros(shp, dtype=np.float64)
    return gaussian(zeros, sigma, rng=rng, allow_predictable_noise=allow_predictable_noise)
