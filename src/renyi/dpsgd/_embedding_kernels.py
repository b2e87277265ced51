"""An embedding's per-example squared gradient norms and clipped sum as compiled loops (numba).

Example ``i``'s gradient of an embedding's weight adds ``b_it`` (the output gradient at
position ``t``) into row ``idx_it``; the positions of one example that share a token add into
the same row. Its squared norm is ``sum_v |R_iv|^2`` with ``R_iv = sum_{t: idx_it = v} b_it``,
i.e. ``sum_t b_it . R_{i, idx_it}``. torch computes it by ``unique`` over ``(example, token)``
keys, two ``index_add_`` and a norm (about ten operator dispatches and a sort a step);
:func:`sq_norms` does it in one pass per example:

* each position's *slot*, the first position of the example holding the same token, is found
  by a select over the earlier positions (``T^2 / 2`` integer comparisons, no branch on the
  tokens);
* ``R`` is accumulated in float64 per slot (a ``[T, D]`` scratch block in L1) and
  ``sum_t b_it . R_slot(t)`` summed in float64. For float32 gradients the products are exact
  in float64, so the result is the exact squared norm to float64 rounding (torch's path sums
  the rows in float32 first); no float32 overflow.

:func:`weighted_sum` adds ``w_i b_it`` into row ``idx_it`` of the output, in the order of the
positions (torch's ``index_add_`` order), one fused multiply-add per entry.

The padding row (``padding_idx``) never receives a gradient: its positions enter with factor
``0`` (arithmetic, not a branch; an infinite output gradient there gives NaN, as torch's
``b * mask``). Indices are checked against ``[0, num_embeddings)`` before any row is touched
(:data:`BAD_INDEX` returned), since the loops do not check bounds.

Privacy does not depend on which path computes these: both are exact sums of the same
per-example gradients (tests/test_dpsgd_embedding_speed.py checks them in float64 against a
batch-of-one autograd loop).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from renyi.dpsgd._scan_kernels import _cached_jit, available

__all__ = ["BAD_INDEX", "ENABLED", "available", "sq_norms", "weighted_sum"]

#: Switch for tests and comparisons: ``False`` routes every embedding through torch's path.
ENABLED = True

#: Return value of the kernels when an index lies outside ``[0, num_embeddings)``.
BAD_INDEX = -1

sq_norms: Any = None
weighted_sum: Any = None

if available():  # pragma: no branch

    @_cached_jit(error_model="numpy")
    def _indices_ok(idx, num):  # type: ignore[no-untyped-def]
        bad = False
        for i in range(idx.shape[0]):
            for t in range(idx.shape[1]):
                v = idx[i, t]
                bad |= (v < 0) | (v >= num)
        return not bad

    @_cached_jit(error_model="numpy", fastmath={"reassoc", "contract"})
    def _sq_norms(idx, b, pad, num, out):  # type: ignore[no-untyped-def]
        """``out[i] = |sum_t b[i, t] e_{idx[i, t]}|^2`` in float64 (``idx`` ``[B, T]``
        integers, ``b`` ``[B, T, D]`` float32/float64 C-contiguous, positions holding ``pad``
        left out, ``pad = -1`` for none). Returns 0, or :data:`BAD_INDEX` (nothing written)
        when an index is outside ``[0, num)``."""
        if not _indices_ok(idx, num):
            return BAD_INDEX
        batch, steps, dim = b.shape
        slot = np.empty(steps, dtype=np.int64)
        keep = np.empty(steps, dtype=np.float64)
        rows = np.empty((steps, dim), dtype=np.float64)
        for i in range(batch):
            for t in range(steps):
                v = idx[i, t]
                s_t = t
                for s in range(t - 1, -1, -1):  # the first earlier position with token v
                    s_t = s if idx[i, s] == v else s_t
                slot[t] = s_t
                keep[t] = np.float64(v != pad)
            rows[:, :] = 0.0
            for t in range(steps):
                m, r = keep[t], slot[t]
                for k in range(dim):
                    rows[r, k] += m * np.float64(b[i, t, k])
            acc = 0.0
            for t in range(steps):
                m, r = keep[t], slot[t]
                part = 0.0
                for k in range(dim):
                    part += np.float64(b[i, t, k]) * rows[r, k]
                acc += m * part
            out[i] = acc
        return 0

    sq_norms = _sq_norms

    @_cached_jit(error_model="numpy", fastmath={"contract"})
    def _weighted_sum(idx, b, w, pad, num, out):  # type: ignore[no-untyped-def]
        """``out = sum_i w[i] sum_t b[i, t] e_{idx[i, t]}^T`` (``out`` ``[num, D]`` in ``b``'s
        dtype, overwritten; positions holding ``pad`` left out). Returns 0, or
        :data:`BAD_INDEX` (``out`` untouched) when an index is outside ``[0, num)``."""
        if not _indices_ok(idx, num):
            return BAD_INDEX
        batch, steps, dim = b.shape
        out[:, :] = 0
        for i in range(batch):
            for t in range(steps):
                v = idx[i, t]
                s = w[i] * b.dtype.type(v != pad)
                for k in range(dim):
                    out[v, k] += s * b[i, t, k]
        return 0

    weighted_sum = _weighted_sum
