"""Held-out review of the compiled release (issue 23): inputs the authors' tests did not use.

Subnormal inputs whose ``x / g`` underflows: the ideal index of a value ``x`` with
``|x| <= g/2`` is ``round(x/g + s Z)``, so its release is a function of that index alone —
on the lattice ``g Z`` (``0.0`` when the index is 0), and equal to the release of ``0.0``
with the same counters except when ``s Z`` lies within ``|x/g| < 2**-1070`` of a rounding
boundary (probability below ``2**-1000``: these equalities cannot fail by chance).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from renyi import noise

torch = pytest.importorskip("torch")


def _on_lattice(y, g: float) -> bool:
    vals = np.asarray(y, dtype=np.float64).ravel().tolist()
    return all(Fraction(v) % Fraction(g) == 0 for v in vals)


# (dtype, smallest subnormal, sigma): x / g underflows in the compute precision
_TINY = [
    ("np64", 5e-324, 16.0),
    ("np64", -(2.0**-1070), 2.0**20),
    ("np32", float(np.float32(2.0**-149)), 16.0),
    ("np32", float(np.float32((1 + 2.0**-23) * 2.0**-126)), 2.0**15),  # inexact, not 0
    ("t32", float(np.float32(2.0**-149)), 64.0),
    ("t64", 5e-324, 64.0),
    ("tbf16", 2.0**-133, 2.0**40),
]


def _make(kind: str, v: float, n: int):
    if kind == "np64":
        return np.full(n, v)
    if kind == "np32":
        return np.full(n, v, dtype=np.float32)
    dt = {"t32": torch.float32, "t64": torch.float64, "tbf16": torch.bfloat16}[kind]
    return torch.full((n,), v, dtype=dt)


def _as64(y) -> np.ndarray:
    return y.double().numpy() if hasattr(y, "double") else np.asarray(y, dtype=np.float64)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("mech", ["gaussian", "laplace"])
@pytest.mark.parametrize(("kind", "tiny", "sigma"), _TINY)
def test_underflowing_inputs_release_their_index_only(monkeypatch, fused, mech, kind, tiny, sigma):
    """On main the release was ``(x - f g) + J g`` with ``f = fl(x/g)`` underflowed, so ``x``
    itself (or its lost low bits) came out whenever ``J = 0``: an off-lattice output that only
    that input can give (infinite privacy loss). Checked on the compiled pass and the array
    kernels, keyed and secure-default."""
    monkeypatch.setattr(noise, "_USE_FUSED", fused)
    cn = noise.CounterNoise(bytes(range(32)))
    g = noise.lattice_step(sigma)
    x, zero = _make(kind, tiny, 600), _make(kind, 0.0, 600)
    for sign in (1.0, -1.0):
        xs = x * sign
        a = getattr(cn, mech)(xs, sigma, stream=5, step=9)
        b = getattr(cn, mech)(zero, sigma, stream=5, step=9)
        assert _on_lattice(_as64(a), g)
        assert np.array_equal(_as64(a), _as64(b))
        assert not np.signbit(_as64(a)[_as64(a) == 0]).any()
    y = getattr(noise, mech)(x, sigma)  # the secure default (fresh key)
    assert _on_lattice(_as64(y), g)


def test_underflowing_python_float_and_snap():
    """The scalar path and :func:`noise.snap` (caller's normals) take the same release."""
    g = noise.lattice_step(16.0)
    outs = {noise.gaussian(5e-324, 16.0) for _ in range(200)}
    assert all(Fraction(v) % Fraction(g) == 0 for v in outs)
    z = np.linspace(-0.02, 0.02, 101)  # s z within (-1/2, 1/2): every index 0
    got = noise.snap(np.full(101, 5e-324), z, 16.0)
    assert np.array_equal(got, np.zeros(101)) and not np.signbit(got).any()
