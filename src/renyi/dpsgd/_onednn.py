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
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from renyi.dpsgd import _conv_kernels
from renyi.dpsgd.grad_sample import autocast_enabled

__all__ = ["ENABLED", "applies", "conv2d", "conv2d_input_grad", "linear", "mm_t"]

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


def _zero_pads(module: nn.Conv2d) -> tuple[int, int, int, int]:
    """The zeros added around the input by ``module`` (top, bottom, left, right): integer
    padding on both sides, ``"valid"`` none, ``"same"`` ``d (k - 1)`` in all with the odd one
    at the bottom/right, as torch pads it."""
    if isinstance(module.padding, str):
        if module.padding == "valid":
            return 0, 0, 0, 0
        pads: list[int] = []
        for k, dil in zip(module.kernel_size, module.dilation, strict=True):
            total = dil * (k - 1)
            pads += [total // 2, total - total // 2]
        return pads[0], pads[1], pads[2], pads[3]
    ph, pw = (int(v) for v in module.padding)
    return ph, ph, pw, pw


def conv2d(module: nn.Conv2d, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``module``'s convolution of ``x`` with ``weight``, ``bias`` detached (no gradient to
    them; the capture path forms the weight's per-example gradients from the layer's input
    and output gradient). The forward is torch's own convolution; the input gradient is
    :func:`conv2d_input_grad` where it applies (float32 as :func:`applies`, numba installed,
    a batched ``[B, C, H, W]`` input that needs a gradient, one group, zero padding, the
    layer's own ``_conv_forward``), else torch's convolution backward.

    Why: torch's CPU input gradient of the benchmark CNN's second convolution (``[256, 32, 5,
    5]`` output gradients, 16 -> 32 channels, 4 x 4, stride 2) takes ~1.55 ms, one oneDNN
    product ``[6400, 32] x [32, 256]`` (~0.45 ms) and the scatter of its columns (~0.3 ms)
    plus the layout change to NCHW (~0.25 ms) about 1.1 ms (one thread, AVX-512 EPYC).
    """
    if (
        x.ndim == 4
        and x.requires_grad
        and torch.is_grad_enabled()
        and module.groups == 1
        and module.padding_mode == "zeros"
        and type(module)._conv_forward is nn.Conv2d._conv_forward
        and _conv_kernels.available()
        and applies(x, weight, bias)
    ):
        out: Tensor = _Conv2d.apply(x, weight, bias, module)
        return out
    return module._conv_forward(x, weight, bias)


def conv2d_input_grad(
    g: Tensor,
    weight: Tensor,
    size: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
    pads: tuple[int, int, int, int],
) -> Tensor:
    """The input gradient of a one-group convolution with zero padding ``pads`` (top,
    bottom, left, right) of an input of spatial ``size``, from its output gradient ``g``
    ``[B, O, Ho, Wo]``: the columns ``g W`` (``[B Ho Wo, kh kw C]``: by oneDNN where
    :func:`applies`, else ``torch.mm``) added back into a channels-last image
    (:func:`renyi.dpsgd._conv_kernels.col2im_nhwc`), its padding cut off. Returned as a
    ``[B, C, H, W]`` view of channels-last memory. Needs numba (any floating dtype)."""
    b, o, ho, wo = g.shape
    _, c, kh, kw = weight.shape
    gt = g.permute(0, 2, 3, 1).reshape(b * ho * wo, o)
    wt = weight.permute(2, 3, 1, 0).reshape(kh * kw * c, o)  # rows (kh, kw, C)
    cols = _product(gt, wt, None) if applies(gt, wt) else torch.mm(gt, wt.t())
    top, bottom, left, right = pads
    h, w = size
    dx = g.new_zeros(b, h + top + bottom, w + left + right, c)
    _conv_kernels.col2im_nhwc(
        cols.view(b, ho, wo, kh, kw, c).numpy(), dx.numpy(), *stride, *dilation
    )
    return dx[:, top : top + h, left : left + w].permute(0, 3, 1, 2)


class _Conv2d(torch.autograd.Function):
    """torch's ``conv2d`` of ``x`` with ``weight``, ``bias`` detached; the backward returns
    the input gradient by :func:`conv2d_input_grad`, contiguous in ``x``'s memory format
    (handing the next backward a channels-last gradient of an NCHW tensor made the
    benchmark CNN's max-pooling backward slower than the layout change saves), and nothing
    for the parameters. Not differentiable twice."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, module: nn.Conv2d
    ) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(weight)
        ctx.size = (int(x.shape[2]), int(x.shape[3]))
        ctx.channels_last = not x.is_contiguous() and x.is_contiguous(
            memory_format=torch.channels_last
        )
        ctx.geometry = (tuple(module.stride), tuple(module.dilation), _zero_pads(module))
        return module._conv_forward(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        (weight,) = ctx.saved_tensors
        stride, dilation, pads = ctx.geometry
        dx = conv2d_input_grad(g, weight, ctx.size, stride, dilation, pads)
        fmt = torch.channels_last if ctx.channels_last else torch.contiguous_format
        return dx.contiguous(memory_format=fmt), None, None, None
