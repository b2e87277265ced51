"""Plain Linear layers' per-example squared gradient norms in one compiled pass (numba).

For ``nn.Linear`` on ``[B, d]`` inputs ``a`` with output gradients ``b`` ``[B, o]``, example
``i``'s squared gradient norm is ``|a_i|^2 |b_i|^2`` (weight) plus ``|b_i|^2`` (bias)
(Goodfellow 2015). :func:`linear_sq_add` adds these to ``out[i]``, the squares summed in
float64 from float32 entries: every float32 square is exact in float64 and no sum of them can
overflow or underflow there, so the result needs none of the range checks (and float64
recomputation) of torch's float32 norms in :func:`renyi.dpsgd.ghost._sq`, and replaces the
dozen small operations of :func:`renyi.dpsgd.ghost.linear_total_sq` (each several
microseconds of dispatch on a training step's critical path). NaN and infinities
propagate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from renyi.dpsgd._scan_kernels import _cached_jit, available

__all__ = ["ENABLED", "available", "linear_sq_add"]

#: Switch for tests and comparisons: ``False`` routes every layer through torch's ops.
ENABLED = True

linear_sq_add: Any = None

if available():  # pragma: no branch

    @_cached_jit(error_model="numpy", fastmath={"reassoc", "contract"})
    def _linear_sq_add(a, b, weight, bias, out):  # type: ignore[no-untyped-def]
        """``out[i] += weight |a_i|^2 |b_i|^2 + bias |b_i|^2`` in float64 (``a`` ``[B, d]``,
        ``b`` ``[B, o]`` float32, ``weight``/``bias`` whether the layer trains them)."""
        batch, d = a.shape
        o = b.shape[1]
        for i in range(batch):
            sa = 0.0
            for k in range(d):
                x = np.float64(a[i, k])
                sa += x * x
            sb = 0.0
            for k in range(o):
                y = np.float64(b[i, k])
                sb += y * y
            total = out[i]
            if weight:
                total += sa * sb
            if bias:
                total += sb
            out[i] = total

    linear_sq_add = _linear_sq_add
