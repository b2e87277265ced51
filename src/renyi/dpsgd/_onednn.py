"""Matrix products of the capture path through oneDNN on the CPU (float32).

Two products dominate a private step of a model made of affine maps: the maps themselves
(forward and input gradient, ``x W^T`` and ``g W``) and the clipped sums of their weights,
``b^T (w a)`` over the batch (the same product as a non-private weight gradient, with each
example's row scaled by its clipping weight). torch's CPU ``F.linear``/``torch.mm`` call MKL,
which takes its AVX2 path on AMD processors; oneDNN's fp32 matrix product (the kernel of
torch's own fused LSTM and of its compiled linear layers, ``torch.ops.mkldnn._linear_pointwise``)
uses AVX-512 where the processor has it. Both are IEEE float32 arithmetic with float32
accumulation; results differ by accumulation order only.

Measured on the benchmarks' shapes (one thread, AMD EPYC, medians of 50 thread-time
samples): ``[512, 512] x [512, 512]`` 2.45 ms (MKL) against 1.09 ms
(oneDNN) for the map, 2.51 ms against 1.20 ms for ``b^T a``; ``[2048, 64] x [64, 256]``
0.64 against 0.28 ms. On narrow outputs (two classes) MKL is faster, and is kept.

Everything else (other dtypes, autocast, other devices, code traced by ``torch.compile``,
oneDNN switched off or missing, an empty batch) takes torch's default kernels.
:data:`ENABLED` switches this module off (the tests compare both paths;
``benchmarks/dpsgd.py`` measures the step both ways).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from renyi.dpsgd.grad_sample import autocast_enabled

__all__ = ["ENABLED", "applies", "linear", "mm_t"]

#: Whether this module may use oneDNN (tests and the benchmark switch it off to compare).
ENABLED = True

#: The smallest output and inner dimensions routed to oneDNN by :func:`mm_t`: below them
#: MKL's call is cheaper than oneDNN's set-up (``[512, 512]^T x [512, 2]``: 0.025 ms by MKL,
#: 0.046 ms by oneDNN).
_MIN_DIM = 16

#: oneDNN's fp32 product, or None where this torch build lacks it (looked up once: whether
#: oneDNN is *enabled* can change at run time, ``torch.backends.mkldnn.flags``, and is read
#: at every call)
_OP: Any = (
    getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if torch.backends.mkldnn.is_available()
    else None
)


def _compiling() -> bool:
    """Whether dynamo is tracing (``torch.compile``): inductor lowers this oneDNN op only
    with a constant, pre-packed weight, so traced code takes ``F.linear``."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def applies(*tensors: Tensor | None) -> bool:
    """Whether the products of these tensors run through oneDNN: all float32 on the CPU,
    none empty, no CPU autocast, not traced by ``torch.compile``, oneDNN available and
    enabled in torch."""
    return (
        ENABLED
        and all(
            t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.numel() > 0)
            for t in tensors
        )
        and not autocast_enabled("cpu")
        and not _compiling()
        and _OP is not None
        and bool(torch.backends.mkldnn.enabled)
    )


def _product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x weight^T + bias`` by oneDNN (``weight`` ``[N, K]``, strided views accepted; the
    bias made contiguous: the op reads it as a dense vector whatever its strides, so a
    strided or expanded bias, e.g. a parametrization's, gave wrong sums)."""
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    out: Tensor = _OP(x, weight, bias, "none", [], "")
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` for parameters that need no gradient (detached): the
    gradient flows to ``x`` only, both products by oneDNN where :func:`applies`, else
    ``F.linear``."""
    if x.ndim >= 2 and applies(x, weight, bias):
        out: Tensor = _Linear.apply(x, weight, bias)
        return out
    return F.linear(x, weight, bias)


class _Linear(torch.autograd.Function):
    """``x W^T + b`` through oneDNN with ``W``, ``b`` detached: the backward returns the
    input gradient ``g W`` (also through oneDNN) and nothing for ``W``, ``b``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(weight)
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _product(g.contiguous(), weight.t(), None), None, None


def mm_t(b: Tensor, a: Tensor, out: Tensor | None = None) -> Tensor:
    """``b^T a`` for ``b`` ``[N, O]`` and ``a`` ``[N, D]`` (a weight gradient's product):
    by oneDNN where :func:`applies` and ``O``, ``D`` are at least 16, else ``torch.mm``;
    written into ``out`` when given (a contiguous ``[O, D]`` tensor), returned."""
    if b.shape[1] >= _MIN_DIM and a.shape[1] >= _MIN_DIM and applies(a, b):
        res = _product(b.t(), a.t(), None)
        if out is None:
            return res
        return out.copy_(res)
    return torch.mm(b.t(), a, out=out)
