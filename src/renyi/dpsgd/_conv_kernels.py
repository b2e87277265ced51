"""Compiled loops (numba) for the convolutions of the capture path.

:func:`col2im_nhwc` adds columns back into an image: ``dx[b, y, x, c] += cols[b, i, j, p, q,
c]`` for ``y = i sh + p dh``, ``x = j sw + q dw``, the scatter half of a convolution's input
gradient once its product ``g W`` has been formed (see :func:`renyi.dpsgd._onednn.conv2d`).
Channels-last on both sides, so the innermost loop adds ``C`` contiguous values. torch has no
CPU kernel for it in this layout (``F.fold`` works channels-first: 3.3 ms on the benchmark
CNN's second convolution against 0.27 ms here; ``kh kw`` strided ``add_`` calls 0.5 ms).

Additions only (no reassociation: ``fastmath`` off), in a fixed order: the same inputs give
the same bits; the result equals torch's input gradient up to the order of the additions.
"""

from __future__ import annotations

from typing import Any

from renyi.dpsgd._scan_kernels import _cached_jit

njit: Any
try:  # pragma: no cover - exercised when numba is installed
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None

__all__ = ["available", "col2im_nhwc"]


def available() -> bool:
    """Whether numba is installed (the kernels exist)."""
    return njit is not None


col2im_nhwc: Any = None

if njit is not None:  # pragma: no branch

    @_cached_jit(error_model="numpy", boundscheck=False)
    def col2im_nhwc(cols, dx, sh, sw, dh, dw):  # type: ignore[no-untyped-def]
        """``dx[b, i sh + p dh, j sw + q dw, :] += cols[b, i, j, p, q, :]`` (``cols``
        ``[B, Ho, Wo, kh, kw, C]``, ``dx`` ``[B, H, W, C]``, both C-contiguous, every
        target inside ``dx``)."""
        nb, oh, ow, kh, kw, nc = cols.shape
        for b in range(nb):
            for i in range(oh):
                for p in range(kh):
                    y = i * sh + p * dh
                    for j in range(ow):
                        for q in range(kw):
                            src = cols[b, i, j, p, q]
                            dst = dx[b, y, j * sw + q * dw]
                            for c in range(nc):
                                dst[c] += src[c]
