"""Per-example gradient norms without per-example gradients ("ghost clipping").

For a layer whose weight gradient is a sum of outer products, the norm of each example's
gradient can be read off the layer's input activations ``a`` and output gradients ``b``:

* ``nn.Linear`` on ``[B, d]`` inputs: example ``i``'s weight gradient is ``b_i a_i^T``, so
  ``||g_i||_F = ||a_i|| ||b_i||`` (Goodfellow 2015, "Efficient per-example gradient
  computations").
* ``nn.Linear`` on sequences ``[B, T, d]``: ``g_i = sum_t b_it a_it^T`` and
  ``||g_i||_F^2 = sum_{t,s} (a_it . a_is)(b_it . b_is)``, the inner product of two ``T x T``
  Gram matrices (Li et al. 2022, "Large language models can be strong differentially private
  learners", Sec. 4). Whether the Gram matrices (cost ``~T^2 (d + p)``) or the per-example
  gradient of this one layer (``~T d p``) is cheaper is decided per layer by the rule of Bu et
  al. 2023 ("Differentially private optimization on large model at small cost", mixed ghost
  norm): Gram matrices when ``2 T^2 < d p``.
* ``nn.Conv1d``/``nn.Conv2d``: unfolding the input (im2col) turns the convolution into the
  sequence case with ``T`` = number of output positions, per group; the per-example gradient
  of the layer can also be formed by one grouped convolution of the input with the output
  gradients, or on the CPU by a compiled kernel that reads the input windows in place
  (:mod:`renyi.dpsgd._conv_kernels`). Which exact method is fastest depends on the shape and
  the machine: it is timed once per shape (see ``_ConvGrads``).
* ``nn.Embedding``: example ``i``'s gradient adds ``b_it`` into row ``idx_it``; the rows of one
  example are accumulated sparsely (no ``[B, vocab, dim]`` tensor).
* ``nn.LayerNorm``/``nn.GroupNorm``: the per-example gradients of the affine parameters are as
  small as one activation vector and are formed directly.

Once the clipping weights ``w_i`` are known, the clipped sum ``sum_i w_i g_i`` is computed from
the same ``a`` and ``b`` in one matrix product per layer, without a second backward pass
("book-keeping", Bu et al. 2023).

Every rule returns a :class:`LayerGrads`: ``sq_norms()`` gives each parameter's per-example
squared gradient norm (float64), ``weighted_sum(w)`` the sum of the weighted per-example
gradients. Both are exact (up to rounding) when no layer mixes examples.

Example:
    >>> import torch
    >>> from torch import nn
    >>> layer = nn.Linear(4, 3)
    >>> a, b = torch.randn(5, 4), torch.randn(5, 3)  # input and dL_i/d(output) per example
    >>> grads = ghost_layer_grads(layer, [((a,), {}, [b])], ["weight", "bias"], 5)
    >>> sq = grads.sq_norms()["weight"]
    >>> bool(torch.allclose(sq, (a.double().norm(dim=1) * b.double().norm(dim=1)) ** 2))
    True
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.grad import conv2d_weight

from renyi._validation import fail
from renyi.dpsgd import (
    _conv_kernels,
    _embedding_kernels,
    _linear_kernels,
    _onednn,
    _scan_kernels,
)
from renyi.dpsgd.decomposed import step_sums
from renyi.dpsgd.grad_sample import UnsupportedModelError, autocast_enabled

__all__ = [
    "GHOST_LAYER_TYPES",
    "REDUCED_DTYPES",
    "Call",
    "LayerGrads",
    "LinearMapGrads",
    "PerExampleGrads",
    "TiedGrads",
    "anchored",
    "compute_dtype",
    "detached_forward",
    "ghost_layer_grads",
    "supports_ghost",
    "upcast",
]

#: One recorded call of a layer: (positional args, keyword args, dL/d(output) per tensor output).
Call = tuple[Sequence[Any], Mapping[str, Any], Sequence[Tensor | None]]

#: Layer types with a ghost-norm rule.
GHOST_LAYER_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Embedding,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
)


def hf_conv1d() -> type[nn.Module] | None:
    """Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2's projections: an affine
    map ``x W + b`` with ``W`` stored ``[in, out]``), if ``transformers`` is loaded; it has
    the ghost rule of ``nn.Linear`` with the weight transposed."""
    mod = sys.modules.get("transformers.pytorch_utils")
    cls = getattr(mod, "Conv1D", None) if mod is not None else None
    return cls if isinstance(cls, type) else None


class LayerGrads(Protocol):
    """Per-example gradient information of one layer's parameters (names local to the layer)."""

    def sq_norms(self) -> dict[str, Tensor]:
        """Per-example squared gradient norm of each parameter, shape ``[B]``, float64."""
        ...

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """``sum_i weights[name][i] * g_i`` for each parameter (``weights[name]`` is ``[B]``)."""
        ...


def supports_ghost(module: nn.Module) -> bool:
    """Whether ``module`` has a ghost-norm rule (exact type match of the supported layers, or a
    subclass that does not override ``forward``)."""
    for kind in (*GHOST_LAYER_TYPES, *filter(None, [hf_conv1d()])):
        if isinstance(module, kind):
            return type(module).forward is kind.forward
    return False


def detached_forward(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """The forward of a ghost layer (:func:`supports_ghost`) with its parameters detached.

    Same values as ``module(x)`` up to rounding (autocast included; a float32 ``Linear`` on
    the CPU multiplies through oneDNN, :mod:`renyi.dpsgd._onednn`), but autograd computes no
    gradient for the parameters: on the backward-capture path their per-example gradients
    come from the layer's input and output gradient, so the weight gradient of the user's
    backward would be thrown away (Bu et al. 2023's book-keeping needs only the output
    gradients). Only the input gradient is back-propagated.
    """

    def d(p: Tensor | None) -> Tensor | None:
        return None if p is None else p.detach()

    if isinstance(module, nn.Linear):
        return lambda x: _onednn.linear(x, d(module.weight), d(module.bias))  # type: ignore[arg-type]
    if isinstance(module, nn.Conv2d):
        return lambda x: _onednn.conv2d(module, x, d(module.weight), d(module.bias))  # type: ignore[arg-type]
    if isinstance(module, nn.Conv1d):
        return lambda x: module._conv_forward(x, d(module.weight), d(module.bias))  # type: ignore[arg-type]
    if isinstance(module, nn.Embedding):
        return lambda x: F.embedding(
            x,
            d(module.weight),  # type: ignore[arg-type]
            module.padding_idx,
            module.max_norm,
            module.norm_type,
            module.scale_grad_by_freq,
            module.sparse,
        )
    if isinstance(module, nn.LayerNorm):
        return lambda x: F.layer_norm(
            x, module.normalized_shape, d(module.weight), d(module.bias), module.eps
        )
    if isinstance(module, nn.GroupNorm):
        return lambda x: F.group_norm(
            x, module.num_groups, d(module.weight), d(module.bias), module.eps
        )
    if isinstance(module, nn.RMSNorm):
        return lambda x: F.rms_norm(
            x,
            module.normalized_shape,  # type: ignore[arg-type]
            d(module.weight),
            module.eps,
        )
    conv1d = hf_conv1d()
    if conv1d is not None and isinstance(module, conv1d):
        w: Tensor = module.weight  # type: ignore[assignment]
        b: Tensor = module.bias  # type: ignore[assignment]
        nf = int(w.shape[1])

        def affine(x: Tensor) -> Tensor:
            out = torch.addmm(d(b), x.reshape(-1, x.shape[-1]), d(w))  # type: ignore[arg-type]
            return out.view(*x.shape[:-1], nf)

        return affine
    raise UnsupportedModelError(f"layer {type(module).__name__} has no ghost-norm rule")


class _Anchored(torch.autograd.Function):
    """A layer output computed from inputs that need no gradient and detached parameters,
    attached to the graph through a trainable ``anchor`` (so that the gradient at the output
    is computed and delivered to the hooks on it); nothing flows back from it."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, fn: Callable[..., Tensor], *args: Any) -> Tensor:  # type: ignore[override]
        ctx.count = len(args)
        return fn(*args)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[None, ...]:  # type: ignore[override]
        return (None,) * (2 + ctx.count)


def anchored(fn: Callable[..., Tensor], anchor: Tensor, *args: Any) -> Tensor:
    """``fn(*args)``, part of the autograd graph through ``anchor`` when no argument requires
    grad (see :class:`_Anchored`), else ``fn(*args)`` as is."""
    if any(isinstance(a, Tensor) and a.requires_grad for a in args) or not torch.is_grad_enabled():
        return fn(*args)
    out: Tensor = _Anchored.apply(anchor, fn, *args)
    return out


#: Below this a float32 norm may have lost digits to underflow: recomputed in float64.
_TINY_NORM = 1e-15


def _sq(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Sum of squares over ``dims`` (the trailing dimensions of ``x``) as float64.

    The norm is computed in ``x``'s dtype without temporaries (fast); the rare rows whose norm
    overflowed (float32 squares overflow above 1.8e19), underflowed, or is not finite are
    recomputed in float64, so the result is never an underestimate from overflow/underflow.
    """
    return _squared(torch.linalg.vector_norm(x, dim=dims), x)


def _squared(norms: Tensor, x: Tensor) -> Tensor:
    """:func:`_sq` from ``norms``, the ``vector_norm`` of each row of ``x`` over all its
    trailing dimensions (computed by the caller, e.g. chunk by chunk while in cache)."""
    if norms.dtype == torch.float64:
        return norms * norms
    out = norms.double().square_()
    if norms.numel() == 0:
        return out
    # one reduction decides whether any row needs float64 (NaN fails both comparisons)
    lo, hi = torch.aminmax(norms)
    if float(lo) >= _TINY_NORM and float(hi) < math.inf:
        return out
    redo = ~(norms >= _TINY_NORM) | torch.isinf(norms)
    if bool(redo.any()):  # ``dims`` are the trailing dimensions: those of the selected rows
        sub = x[redo]
        exact = torch.linalg.vector_norm(sub, dim=tuple(range(1, sub.ndim)), dtype=torch.float64)
        out[redo] = exact * exact
    return out


def _sq_pair(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_sq` of two ``[B, n]`` tensors of one dtype over dimension 1, with one check of
    both norms' range (the common Linear layer: its input and output gradient)."""
    if x.dtype != y.dtype or x.dtype == torch.float64 or x.shape[0] != y.shape[0]:
        return _sq(x, (1,)), _sq(y, (1,))
    norms = torch.stack((torch.linalg.vector_norm(x, dim=1), torch.linalg.vector_norm(y, dim=1)))
    out = norms.double().square_()
    if norms.numel() == 0:
        return out[0], out[1]
    lo, hi = torch.aminmax(norms)
    if float(lo) >= _TINY_NORM and float(hi) < math.inf:
        return out[0], out[1]
    return _sq(x, (1,)), _sq(y, (1,))  # some row needs float64: each redone as _sq does


class PerExampleGrads:
    """Materialised per-example gradients ``{name: [B, *param.shape]}`` of one layer."""

    def __init__(self, grads: Mapping[str, Tensor]) -> None:
        self.grads = {n: upcast(g) for n, g in grads.items()}

    def sq_norms(self) -> dict[str, Tensor]:
        return {n: _sq(g.reshape(g.shape[0], -1), (1,)) for n, g in self.grads.items()}

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {
            n: torch.tensordot(weights[n].to(g.dtype), g, dims=([0], [0]))
            for n, g in self.grads.items()
        }


class _OuterProductGrads:
    """Layers whose weight gradient is ``sum_t b_t a_t^T`` per group (Linear, Conv).

    ``a`` is ``[B, G, K, T]`` (inputs or unfolded patches, feature-major), ``b`` is
    ``[B, G, O, T]`` (output gradients), G groups, T positions. The weight gradient of group g
    is ``b_g a_g^T`` (``[O, K]``), laid out as ``weight_shape``; the bias gradient is
    ``sum_t b_t``.
    """

    def __init__(
        self,
        a: Tensor,
        b: Tensor,
        weight_shape: torch.Size,
        names: Sequence[str],
    ) -> None:
        self.a, self.b = a, b
        self.weight_shape = weight_shape
        self.names = tuple(names)
        k, length, out = a.shape[2], a.shape[3], b.shape[2]
        self.per_example: Tensor | None = None
        self.use_gram = length > 1 and 2 * length * length < k * out

    def _weight_per_example(self) -> Tensor:
        if self.per_example is None:
            self.per_example = torch.matmul(self.b, self.a.transpose(-1, -2))  # [B, G, O, K]
        return self.per_example

    def sq_norms(self) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        a, b = self.a, self.b
        if "weight" in self.names:
            if a.shape[3] == 1:  # one position: ||b a^T|| = ||a|| ||b|| per group
                res["weight"] = (_sq(a, (2, 3)) * _sq(b, (2, 3))).sum(dim=1)
            elif self.use_gram:
                ga = torch.matmul(a.transpose(-1, -2), a)  # [B, G, T, T]
                gb = torch.matmul(b.transpose(-1, -2), b)
                # float64 products: (a.a)(b.b) may exceed the float32 range
                prod = ga.double() * gb.double()
                res["weight"] = prod.sum(dim=(1, 2, 3)).clamp_min(0.0)
            else:
                res["weight"] = _sq(self._weight_per_example(), (1, 2, 3))
        if "bias" in self.names:
            res["bias"] = _sq(b.sum(dim=3), (1, 2))
        return res

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        a, b = self.a, self.b
        if "weight" in self.names:
            w = weights["weight"].to(b.dtype)
            if self.per_example is not None:
                g = torch.tensordot(w, self.per_example, dims=([0], [0]))
            elif a.shape[1] == 1:  # one group (Linear): one [O, N] x [N, K] product, N = B T
                bw = (b * w[:, None, None, None]).transpose(2, 3).reshape(-1, b.shape[2])
                g = torch.mm(bw.t(), a.transpose(2, 3).reshape(-1, a.shape[2]))
            else:
                g = torch.einsum("bgot,bgkt->gok", b * w[:, None, None, None], a)
            res["weight"] = g.reshape(self.weight_shape)
        if "bias" in self.names:
            w = weights["bias"].to(b.dtype)
            res["bias"] = torch.tensordot(w, b.sum(dim=3), dims=([0], [0])).reshape(-1)
        return res


def _cat(parts: list[Tensor], dim: int) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _sum(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum(dim=0)


def _input_of(call: Call) -> Tensor:
    args, kwargs, _ = call
    x = args[0] if len(args) > 0 else kwargs.get("input")
    if not isinstance(x, Tensor):
        raise UnsupportedModelError(f"layer input {type(x).__name__} is not a tensor")
    return x


#: Dtypes too coarse to compute norms or clipped sums in: float16/bfloat16 activations and
#: gradients are converted to float32 first (mixed precision, autocast), so the clipping
#: weights and the clipped sums are computed with float32 rounding, which the clipping margin
#: covers; the clipped sums stay in float32 until noise has been added.
REDUCED_DTYPES = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype norms and clipped sums are computed in for data of ``dtype``."""
    return torch.float32 if dtype in REDUCED_DTYPES else dtype


def upcast(t: Tensor) -> Tensor:
    """``t`` in :func:`compute_dtype` (unchanged unless float16/bfloat16)."""
    return t.float() if t.dtype in REDUCED_DTYPES else t


def _used_calls(calls: Sequence[Call]) -> list[tuple[Tensor, Tensor]]:
    """(input, output gradient) of the calls whose output reached the loss, reduced-precision
    floating tensors converted to float32."""
    return [
        (upcast(_input_of(c).detach()), upcast(c[2][0]))
        for c in calls
        if c[2] and c[2][0] is not None
    ]


class _LinearGrads:
    """``nn.Linear`` called once on a ``[B, d]`` input: the common case, in plain 2-D tensors.

    Example ``i``'s weight gradient is ``b_i a_i^T`` and its bias gradient ``b_i``, so
    ``||g_i||^2 = ||a_i||^2 ||b_i||^2 + ||b_i||^2`` (Goodfellow 2015), and the clipped sums are
    ``(w * b)^T a`` (one matrix product, as the layer's ordinary weight gradient) and
    ``w^T b``. The same algebra as :class:`_OuterProductGrads` with one position, without the
    4-D views (which made torch take slow strided paths for the sums and the scaling).
    """

    def __init__(self, a: Tensor, b: Tensor, names: Sequence[str]) -> None:
        self.a, self.b = a, b  # [B, d], [B, o]
        self.names = tuple(names)

    def sq_norms(self) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        if "weight" in self.names:
            sq_a, sq_b = _sq_pair(self.a, self.b)
            res["weight"] = sq_a * sq_b
        else:
            sq_b = _sq(self.b, (1,))
        if "bias" in self.names:
            res["bias"] = sq_b
        return res

    def weighted_sum(
        self, weights: Mapping[str, Tensor], out: Mapping[str, Tensor] | None = None
    ) -> dict[str, Tensor]:
        """The clipped sums; ``out``: contiguous tensors of the parameters' shapes (and of
        ``b``'s dtype) to write them into (a flat buffer's slices), returned."""
        res: dict[str, Tensor] = {}
        a, b = self.a, self.b
        into = out or {}
        wb = weights["bias"] if "bias" in self.names else None
        if "weight" in self.names:
            ww = weights["weight"]
            w = ww.to(b.dtype).unsqueeze(1)
            dest = into.get("weight")
            # scale the narrower of the two factors (fewer multiplications, same product)
            if a.shape[1] < b.shape[1]:
                res["weight"] = _onednn.mm_t(b, a * w, out=dest)
            else:
                bw = b * w
                res["weight"] = _onednn.mm_t(bw, a, out=dest)
                if wb is ww:  # flat clipping: one weight per example for the whole layer
                    # = b^T w, from the product already formed
                    res["bias"] = torch.sum(bw, dim=0, out=into.get("bias"))
                    return res
        if wb is not None:
            res["bias"] = torch.mv(b.t(), wb.to(b.dtype), out=into.get("bias"))
        return res


def _linear_kernels_apply(layers: Sequence[_LinearGrads]) -> bool:
    """Whether :func:`linear_total_sq` takes :func:`renyi.dpsgd._linear_kernels.linear_sq_add`:
    numba present and the kernel enabled, every ``a``/``b`` a plain contiguous 2-D float32
    CPU tensor without autograd history, not traced by ``torch.compile``."""
    return (
        _linear_kernels.ENABLED
        and _linear_kernels.available()
        and not _onednn._compiling()
        and all(
            type(x) is Tensor
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and x.ndim == 2
            and x.is_contiguous()
            and not x.requires_grad
            for g in layers
            for x in (g.a, g.b)
        )
    )


def linear_total_sq(layers: Sequence[_LinearGrads]) -> Tensor:
    """``sum_l ||g_il||^2`` over plain Linear layers (:class:`_LinearGrads`), float64 ``[B]``.

    The same squares as their :meth:`~_LinearGrads.sq_norms` (``||a_i||^2 ||b_i||^2`` and
    ``||b_i||^2``), with the layers' norms taken together: one stack, one range check for all
    of them, one float64 conversion, instead of a handful of small operations per layer (each
    costs several microseconds between the large products of a training step). A norm out of
    the float32 range sends every layer through :meth:`~_LinearGrads.sq_norms` (float64 where
    needed), as before.
    """
    batch = int(layers[0].b.shape[0])
    dtype = layers[0].b.dtype
    if any(x.dtype != dtype or int(x.shape[0]) != batch for g in layers for x in (g.a, g.b)):
        return _sum([v for g in layers for v in g.sq_norms().values()])
    if _linear_kernels_apply(layers):
        # float32 entries squared and summed in float64 in one compiled pass per layer:
        # exact range, no check needed (benchmark LSTM's head: ~100 us of small ops -> one
        # call, thread time in the step)
        out = torch.zeros(batch, dtype=torch.float64)
        for g in layers:
            _linear_kernels.linear_sq_add(
                g.a.numpy(), g.b.numpy(), "weight" in g.names, "bias" in g.names, out.numpy()
            )
        return out
    norms = torch.stack([torch.linalg.vector_norm(x, dim=1) for g in layers for x in (g.a, g.b)])
    if dtype == torch.float64:
        sq = norms.square_()
    else:
        lo, hi = torch.aminmax(norms)
        if not (float(lo) >= _TINY_NORM and float(hi) < math.inf):
            return _sum([v for g in layers for v in g.sq_norms().values()])
        sq = norms.double().square_()
    sq = sq.view(len(layers), 2, batch)  # [layer, (input, output gradient), example]
    if all(g.names == ("weight", "bias") for g in layers):
        return (sq[:, 0] * sq[:, 1] + sq[:, 1]).sum(dim=0)
    parts = []
    for i, g in enumerate(layers):
        if "weight" in g.names:
            parts.append(sq[i, 0] * sq[i, 1])
        if "bias" in g.names:
            parts.append(sq[i, 1])
    return _sum(parts) if parts else torch.zeros(batch, dtype=torch.float64, device=sq.device)


def _linear_from(
    used: Sequence[tuple[Tensor, Tensor]],
    d: int,
    o: int,
    names: Sequence[str],
    batch: int,
    shared: SharedOutputGrads | None = None,
) -> _OuterProductGrads | _LinearGrads | _SeqLinearGrads:
    """An affine map ``y = x W^T + b`` (``W``: ``[o, d]``) from its calls' inputs and output
    gradients, batch-first; several calls are concatenated along the position axis.
    ``shared``: the output gradients, concatenated, when another map has the same."""
    if len(used) == 1 and shared is None:
        x, g = used[0]
        if x.ndim == 2 and g.ndim == 2 and x.shape[0] == batch == g.shape[0]:
            return _LinearGrads(x, g, names)
    if all(x.shape[0] == batch and g.shape[0] == batch for x, g in used):
        a3 = _cat([x.reshape(batch, -1, d) for x, _ in used], dim=1)
        if shared is not None and shared.b.shape[1] == a3.shape[1]:
            return _SeqLinearGrads(a3.contiguous(), shared.b, names, shared)
        b3 = _cat([g.reshape(batch, -1, o) for _, g in used], dim=1)
        # one call whose output gradients came from a compiled scan: their sums over the
        # positions (the bias gradients) and squared norms come with them
        sums = step_sums(used[0][1]) if len(used) == 1 and shared is None else None
        return _SeqLinearGrads(a3.contiguous(), b3.contiguous(), names, sums=sums)
    a = _cat([x.reshape(batch, 1, -1, d).transpose(2, 3) for x, _ in used], dim=3)
    b = _cat([g.reshape(batch, 1, -1, o).transpose(2, 3) for _, g in used], dim=3)
    return _OuterProductGrads(a, b, torch.Size([o, d]), names)


def _per_example_fits(t: int, d: int, o: int) -> bool:
    """Whether a sequence map's per-example weight gradients (``B d o`` numbers) are at most
    twice the size of its inputs and output gradients (``B T (d + o)``), which the engine
    holds anyway: then they are formed, once (one batched product, as many multiply-adds as
    the clipped sum's ``[o, BT] x [BT, d]`` product), and give both the norms and the clipped
    sum (a ``B``-term weighted sum). Else Gram matrices (Li et al. 2022) give the norms in
    ``B T^2 (d + o)`` and the clipped sum is the full product: less memory, more work."""
    return d * o <= 2 * t * (d + o)


def _own_kernels_apply(*tensors: Tensor) -> bool:
    """Whether the scans' float32 tiles (:mod:`renyi.dpsgd._scan_kernels`) may take these
    tensors: a CPU with AVX-512 (``_scan_kernels.OWN_PRODUCTS``), contiguous float32 CPU
    tensors without autograd history, no autocast, not traced by ``torch.compile``."""
    return (
        _scan_kernels.OWN_PRODUCTS
        and all(
            type(t) is Tensor
            and t.device.type == "cpu"
            and t.dtype == torch.float32
            and t.is_contiguous()
            and not t.requires_grad
            for t in tensors
        )
        and not autocast_enabled("cpu")
        and not _onednn._compiling()
    )


def _grams(x: Tensor) -> Tensor:
    """``x_i x_i^T`` ``[B, T, T]`` for ``x`` ``[B, T, K]`` in ``x``'s dtype: by
    :func:`renyi.dpsgd._scan_kernels.grams32` (the upper triangle, tiles of 4 x 4 dot
    products) where :func:`_own_kernels_apply` and one torch thread, else ``torch.bmm``.
    One thread, AMD EPYC Zen 5, medians of 60 thread-time samples (load 2.1): ``[64, 32,
    256]`` (an LSTM's gate gradients) 128 us against 368 us by ``torch.bmm``, ``[64, 32,
    64]`` 69 against 98."""
    if x.ndim == 3 and torch.get_num_threads() == 1 and _own_kernels_apply(x):
        out = torch.empty(x.shape[0], x.shape[1], x.shape[1], dtype=torch.float32)
        _scan_kernels.grams32(x.numpy(), out.numpy())
        return out
    return torch.bmm(x, x.transpose(1, 2))


def _own_tn_applies(b: Tensor, a: Tensor) -> bool:
    """Whether :func:`_weight_sum` computes ``b^T a`` (``b`` ``[N, o]``, ``a`` ``[N, d]``) by
    :func:`renyi.dpsgd._scan_kernels.matmul_tn32`: the scans' float32 tiles on a CPU with
    AVX-512 (``_scan_kernels.OWN_PRODUCTS``), both operands contiguous float32 CPU tensors,
    ``o`` a multiple of 4 and ``d`` of 16 (whole tiles) and at most 128, one torch thread or
    a product below 2**23 multiply-adds (the kernel runs on one thread), no autocast, not
    traced by ``torch.compile``.

    Why: oneDNN's product (:func:`renyi.dpsgd._onednn.mm_t`) takes both operands
    transposed and copies them first. One thread, AMD EPYC Zen 5, thread-time medians (load
    1.2-1.7), ``[N, o]^T x [N, d]``, own against oneDNN: ``[2048, 256]^T x [2048, 64]`` (an
    LSTM's gates, B = 64, T = 32, H = 64) 274 us against 496 us, ``[2048, 192]^T x [2048,
    64]`` (a GRU's) 209 against 380, ``[2048, 64]^T x [2048, 64]`` 72 against 145,
    ``[1024, 3072]^T x [1024, 64]`` 2.2 against 4.3 ms, ``[512, 512]^T x [512, 128]`` 332
    against 407 us. Wider ``d`` (the kernel's 128-row passes of ``a`` then exceed the L1
    cache) lose or tie: ``[512, 512]^T x [512, 256]`` 810 against 669 us, ``[1024, 768]^T x
    [1024, 768]`` 6.7 against 5.5 ms, ``[1024, 3072]^T x [1024, 768]`` 38 against 22 ms."""
    n, o, d = int(b.shape[0]), int(b.shape[1]), int(a.shape[1])
    return (
        o % 4 == 0
        and d % 16 == 0
        and d <= 128
        and n > 0
        and (torch.get_num_threads() == 1 or n * o * d < 1 << 23)
        and _own_kernels_apply(a, b)
    )


def _weight_sum(b: Tensor, a: Tensor, w: Tensor) -> Tensor:
    """``sum_i w_i b_i^T a_i`` for ``b`` ``[B, T, o]``, ``a`` ``[B, T, d]`` and the clipping
    weights ``w`` ``[B]`` (a sequence map's clipped sum): by the scans' float32 tiles where
    :func:`_own_tn_applies` (``b``'s entries scaled by their example's weight inside the
    kernel), else ``b^T (w a)`` (or ``(w b)^T a`` when ``d >= o``) by
    :func:`renyi.dpsgd._onednn.mm_t`."""
    o, d = int(b.shape[2]), int(a.shape[2])
    b2, a2 = b.reshape(-1, o), a.reshape(-1, d)
    w = w.to(b.dtype)
    if _own_tn_applies(b2, a2) and w.is_contiguous() and w.dtype == torch.float32:
        out = torch.empty(o, d, dtype=torch.float32)
        _scan_kernels.matmul_tn32(b2.numpy(), a2.numpy(), out.numpy(), w.numpy())
        return out
    w3 = w[:, None, None]
    if d < o:
        return _onednn.mm_t(b2, (a * w3).reshape(-1, d))
    return _onednn.mm_t((b * w3).reshape(-1, o), a2)


class _SeqLinearGrads:
    """An affine map on sequences, batch-first ``a``: ``[B, T, d]``, ``b``: ``[B, T, o]``
    (contiguous): example ``i``'s weight gradient is ``b_i^T a_i``, its bias gradient
    ``sum_t b_it``. Per-example gradients when they are small enough (``_per_example_fits``),
    else Gram matrices, in the layout the layer produced, so that the clipped sum is one
    ``[o, BT] x [BT, d]`` product without copies. ``sums``: the bias gradients and their
    squared norms as the compiled scan that wrote ``b`` formed them
    (:func:`renyi.dpsgd.decomposed.step_sums`: a GRU's two maps)."""

    def __init__(
        self,
        a: Tensor,
        b: Tensor,
        names: Sequence[str],
        shared: SharedOutputGrads | None = None,
        sums: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        self.a, self.b = a, b
        self.names = tuple(names)
        t, d, o = a.shape[1], a.shape[2], b.shape[2]
        # output gradients shared with another map: their Gram matrix is computed once
        self.use_gram = shared is not None or not _per_example_fits(t, d, o)
        if shared is None and sums is not None:  # the bias sums a compiled scan formed
            shared = SharedOutputGrads(b, sums)
        self.shared = shared
        self.per_example: Tensor | None = None

    def sq_norms(self) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        a, b = self.a, self.b
        if "weight" in self.names:
            if self.use_gram:
                ga = _grams(a)  # [B, T, T]
                gb = self.shared.gram() if self.shared is not None else _grams(b)
                # float64 products: (a.a)(b.b) may exceed the float32 range
                sq = _gram_dots(ga, gb).clamp_min(0.0)
                if a.dtype != torch.float64 and not math.isfinite(float(sq.sum())):
                    # a float32 Gram entry overflowed (inputs past 1e19: inf, or inf * 0 =
                    # NaN where the output gradients vanish): the examples' Grams in float64
                    # (NaN/inf in the data stay non-finite and are refused by the engine)
                    sq = (_gram64(a, exact=True) * _gram64(b, exact=True)).sum(dim=(1, 2))
                    sq = sq.clamp_min(0.0)
                res["weight"] = sq
            else:
                self.per_example = torch.bmm(b.transpose(1, 2), a)  # [B, o, d]
                res["weight"] = _sq(self.per_example, (1, 2))
        if "bias" in self.names:
            res["bias"] = (
                self.shared.bias_sq() if self.shared is not None else _sq(b.sum(dim=1), (1,))
            )
        return res

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        a, b = self.a, self.b
        if "weight" in self.names:
            w = weights["weight"].to(b.dtype)
            if self.per_example is not None:
                res["weight"] = torch.tensordot(w, self.per_example, dims=([0], [0]))
            else:
                res["weight"] = _weight_sum(b, a, w)
        if "bias" in self.names:
            sums = self.shared.bias_grads() if self.shared is not None else b.sum(dim=1)
            res["bias"] = torch.mv(sums.t(), weights["bias"].to(sums.dtype))
        return res


def _gram_dots(ga: Tensor, gb: Tensor) -> Tensor:
    """``sum_ij ga_i[i, j] gb_i[i, j]`` per example ``i`` in float64 (two ``[B, T, T]``
    Gram matrices: a map's per-example squared weight-gradient norms): one compiled pass
    (:func:`renyi.dpsgd._scan_kernels.gram_dots`) where :func:`_own_kernels_apply`, else
    torch's float64 product and sum."""
    if _own_kernels_apply(ga, gb):
        out = torch.empty(ga.shape[0], dtype=torch.float64)
        _scan_kernels.gram_dots(ga.numpy(), gb.numpy(), out.numpy())
        return out
    return (ga.double() * gb.double()).sum(dim=(1, 2))


def _gram64(b: Tensor, exact: bool = False) -> Tensor:
    """``[B, T, T]`` Gram matrices of ``b`` ``[B, T, o]`` over the positions, as float64
    (``exact``: the products in float64 too, no float32 overflow)."""
    if exact:
        b = b.double()
    return _grams(b).double()


class SharedOutputGrads:
    """Output gradients ``b`` ``[B, T, o]`` that several affine maps share (an LSTM's
    ``x W_ih^T`` and ``h W_hh^T`` are added into the same gates): the Gram matrices
    ``b_i b_i^T`` and the per-example bias gradients ``sum_t b_it`` are formed once.
    ``sums``: those bias gradients and their squared norms (float64) already formed by the
    kernel that wrote ``b`` (:func:`renyi.dpsgd.decomposed.step_sums`: the LSTM's compiled
    backward scan adds each row of gate gradients while it is in cache, instead of another
    pass over ``b`` and a range check here)."""

    def __init__(self, b: Tensor, sums: tuple[Tensor, Tensor] | None = None) -> None:
        self.b = b
        self._gram: Tensor | None = None
        self._bias: Tensor | None = None if sums is None else sums[0]
        self._bias_sq: Tensor | None = None if sums is None else sums[1]

    def gram(self) -> Tensor:
        """The per-example Gram matrices ``b_i b_i^T`` ``[B, T, T]`` in ``b``'s dtype."""
        if self._gram is None:
            self._gram = _grams(self.b)
        return self._gram

    def bias_grads(self) -> Tensor:
        """The per-example bias gradients ``sum_t b_it``, ``[B, o]`` (``b``'s dtype, or
        float64 when given by the kernel)."""
        if self._bias is None:
            self._bias = self.b.sum(dim=1)
        return self._bias

    def bias_sq(self) -> Tensor:
        if self._bias_sq is None:
            self._bias_sq = _sq(self.bias_grads(), (1,))
        return self._bias_sq


class LinearMapGrads:
    """Per-example gradients of a layer whose parameters enter only through affine maps.

    ``calls[key]`` lists ``(input, output gradient)`` of each call of the map ``key`` =
    ``(weight name, weight rows, bias name, bias rows)`` (see
    :class:`renyi.dpsgd.decomposed.Recorder`). Each map is the sequence rule of ``nn.Linear``
    (calls concatenated along positions); maps touching disjoint rows of one parameter add
    their squared norms and write their clipped sums into those rows.
    """

    def __init__(
        self,
        calls: Mapping[Any, Sequence[tuple[Tensor, Tensor | None]]],
        params: Mapping[str, Tensor],
        batch: int,
    ) -> None:
        self.params, self.batch = dict(params), batch
        self.parts: list[tuple[Any, LayerGrads]] = []
        spans: dict[str, list[tuple[int, int]]] = {}
        # maps fed the same output gradients (an LSTM's input and hidden maps both add into
        # the gates): their Gram matrix and bias gradients are computed once
        grads_of: dict[tuple[int, ...], list[Tensor]] = {}
        for raw in calls.values():
            kept = [g for _, g in raw if g is not None]
            grads_of.setdefault(tuple(id(g) for g in kept), kept)
        shared: dict[tuple[int, ...], SharedOutputGrads] = {}
        for ident, gs in grads_of.items():
            users = sum(
                1
                for raw in calls.values()
                if tuple(id(g) for _, g in raw if g is not None) == ident
            )
            if users > 1 and gs and all(g.ndim >= 3 and g.shape[0] == batch for g in gs):
                o = int(gs[0].shape[-1])
                b3 = _cat([upcast(g).reshape(batch, -1, o) for g in gs], dim=1).contiguous()
                sums = step_sums(gs[0]) if len(gs) == 1 and gs[0].ndim == 3 else None
                shared[ident] = SharedOutputGrads(b3, sums)
        for key, raw in calls.items():
            w_name, w_rows, b_name, b_rows = key
            common = shared.get(tuple(id(g) for _, g in raw if g is not None))
            used = [(upcast(x), upcast(g)) for x, g in raw if g is not None]
            names = [n for n, p in (("weight", w_name), ("bias", b_name)) if p in self.params]
            if not used or not names:
                continue
            for name, rows in ((w_name, w_rows), (b_name, b_rows)):
                if name in self.params:
                    r = rows if rows is not None else (0, int(self.params[name].shape[0]))
                    if any(r[0] < s[1] and s[0] < r[1] for s in spans.get(name, [])):
                        raise UnsupportedModelError(
                            f"parameter {name!r} is used by two affine maps on overlapping rows"
                        )
                    spans.setdefault(name, []).append(r)
            d, o = int(used[0][0].shape[-1]), int(used[0][1].shape[-1])
            self.parts.append((key, _linear_from(used, d, o, names, batch, common)))

    def sq_norms(self) -> dict[str, Tensor]:
        dev = next(iter(self.params.values())).device
        res = {n: torch.zeros(self.batch, dtype=torch.float64, device=dev) for n in self.params}
        for (w_name, _, b_name, _), sub in self.parts:
            sq = sub.sq_norms()
            if "weight" in sq:
                res[w_name] = res[w_name] + sq["weight"]
            if "bias" in sq:
                res[b_name] = res[b_name] + sq["bias"]
        return res

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        for (w_name, w_rows, b_name, b_rows), sub in self.parts:
            local = {"weight": w_name, "bias": b_name}
            ws = sub.weighted_sum(
                {k: weights[v] for k, v in local.items() if v is not None and v in self.params}
            )
            for k, v in ws.items():
                name, rows = (w_name, w_rows) if k == "weight" else (b_name, b_rows)
                assert name is not None
                p = self.params[name]
                if rows is None:  # the only map of this parameter (overlaps are refused)
                    res[name] = v.reshape(p.shape).to(compute_dtype(p.dtype))
                    continue
                if name not in res:
                    res[name] = torch.zeros(p.shape, dtype=compute_dtype(p.dtype), device=p.device)
                target = res[name][rows[0] : rows[1]]
                target += v.reshape(target.shape).to(target.dtype)
        for n, p in self.params.items():  # parameters no map used
            if n not in res:
                res[n] = torch.zeros(p.shape, dtype=compute_dtype(p.dtype), device=p.device)
        return res


def _conv_as_2d(module: nn.Conv1d | nn.Conv2d) -> tuple[tuple[int, int], ...]:
    def two(v: Any) -> tuple[int, int]:
        t = tuple(v)
        return (1, t[0]) if len(t) == 1 else (t[0], t[1])

    return two(module.kernel_size), two(module.stride), two(module.dilation)


def _synchronize(t: Tensor) -> None:
    """Wait for queued GPU work (timings of asynchronous devices would be meaningless)."""
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)


def _pad_input(module: nn.Conv1d | nn.Conv2d, x: Tensor) -> Tensor:
    """The input as the layer convolves it: 4-D, padded (so the convolution has padding 0)."""
    kernel, _, dilation = _conv_as_2d(module)
    if isinstance(module, nn.Conv1d):
        x = x.unsqueeze(2)
    if module.padding_mode != "zeros":
        pad = list(module._reversed_padding_repeated_twice)
        if isinstance(module, nn.Conv1d):
            pad = [*pad, 0, 0]
        return F.pad(x, pad, mode=module.padding_mode)
    if isinstance(module.padding, str):
        pads: list[int] = []
        if module.padding == "same":
            for k, dil in zip(reversed(kernel), reversed(dilation), strict=True):
                total = dil * (k - 1)
                pads += [total // 2, total - total // 2]
        return F.pad(x, pads) if any(pads) else x
    pad2 = tuple(module.padding)
    pad2 = (0, pad2[0]) if len(pad2) == 1 else pad2
    return F.pad(x, [pad2[1], pad2[1], pad2[0], pad2[0]]) if any(pad2) else x


@functools.lru_cache(maxsize=64)
def _window_offsets(
    size: tuple[int, int],
    out: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[Tensor, Tensor]:
    """For the ``direct`` kernel: the offset in a flattened ``size`` plane of each output
    position's window (``[Ho Wo]``) and of each kernel tap (``[kh kw]``), int64. Checked to
    stay inside the plane (the kernel reads through raw pointers): the last window's last
    tap in each dimension, which the convolution's shapes guarantee."""
    (hp, wp), (ho, wo), (kh, kw), (sh, sw), (dh, dw) = size, out, kernel, stride, dilation
    if (ho - 1) * sh + (kh - 1) * dh >= hp or (wo - 1) * sw + (kw - 1) * dw >= wp:
        raise RuntimeError(f"convolution windows outside the {hp} x {wp} input")  # never
    rows = torch.arange(ho, dtype=torch.int64) * (sh * wp)
    pos = (rows[:, None] + torch.arange(wo, dtype=torch.int64)[None, :] * sw).reshape(-1)
    taps = torch.arange(kh, dtype=torch.int64) * (dh * wp)
    offs = (taps[:, None] + torch.arange(kw, dtype=torch.int64)[None, :] * dw).reshape(-1)
    return pos, offs


#: Fastest exact per-example strategy of each convolution shape, timed once (see _ConvGrads).
_CONV_STRATEGY: dict[tuple[Any, ...], str] = {}

#: Bytes of patches per chunk of examples in ``_ConvGrads._grads_bmm`` on the CPU (the
#: benchmark CNN's second convolution: 40 examples, a third faster than the whole batch).
_CONV_CHUNK_BYTES = 1 << 20


class _ConvGrads:
    """Conv1d/Conv2d: ``g_i = sum_l b_il p_il^T`` over output positions ``l``, with ``p_il`` the
    input patch (im2col) that produced output position ``l``; per group.

    Four exact ways to get the per-example weight-gradient norms, all from the layer's input
    and output gradient: ``gram`` (Gram matrices of patches and output gradients over the
    positions, Li et al. 2022), ``bmm`` (per-example gradient of this layer by a batched matrix
    product of output gradients and patches), ``grouped`` (the same per-example gradient as one
    grouped convolution of the input with the output gradients), ``direct`` (the same by the
    compiled kernel :func:`renyi.dpsgd._conv_kernels.conv_pe_kernel`, which reads each
    window of the padded input in place, vectorised over output channels: one group,
    float32/float64 on the CPU, output channels a multiple of its vector width). The fastest
    for the shape is timed once (best of three; CPU time when torch runs one thread) and
    remembered; ``gram`` is only considered under Bu et al.'s rule ``2 L^2 < K O``. With
    per-example gradients the clipped sum is their ``B``-term weighted sum (one
    matrix-vector product); with ``gram`` it is the layer's weight gradient with the output
    gradients re-weighted (book-keeping), computed by torch's convolution backward.

    The per-example gradients stay in the layout their product wrote them in (``bmm`` with one
    group: features ordered ``(kh, kw, C)``; ``grouped``: the convolution's ``[C, B, O, kh,
    kw]``; ``direct``: ``[B, C, kh kw, O]``): norms do not depend on the order, and only the
    ``[O, C, kh, kw]`` weighted sum is permuted into the weight's layout. (Permuting the
    ``[B, O, C kh kw]`` tensor itself cost more than the product on the benchmark CNN.) On
    the CPU ``bmm`` runs in chunks of about ``_CONV_CHUNK_BYTES`` of patches, so that each
    chunk's patches, product and norms are formed while in cache.

    Measured on the benchmark CNN (``benchmarks/dpsgd.py --throughput --models cnn``, batch
    256, one thread, AVX-512 EPYC): both convolutions pick ``direct``, its first (1 -> 16
    channels, 8 x 8, stride 2) ~0.56 ms against ~2.0 ms by ``grouped``, its second (16 ->
    32, 4 x 4, stride 2) ~0.63 ms against ~1.6 ms of ``bmm`` products plus ~0.7 ms of patch
    copies (kernels alone); the private step's CPU time over the non-private step's, in one
    process with the two strategies interleaved step by step, 1.285 -> 1.142. Torch's
    weight-gradient kernel, which the user's backward no longer runs for these layers, takes
    ~0.7 ms for each.
    """

    def __init__(
        self, module: nn.Conv1d | nn.Conv2d, calls: Sequence[Call], names: Sequence[str], batch: int
    ) -> None:
        self.kernel, self.stride, self.dilation = _conv_as_2d(module)
        self.groups = module.groups
        self.weight_shape = module.weight.shape
        o, cg = module.out_channels, module.in_channels // module.groups
        self.shape2d = (o, cg, *self.kernel)
        self.calls: list[tuple[Tensor, Tensor]] = []
        for x, g in _used_calls(calls):
            xp = _pad_input(module, x)
            # detached: the products below write into preallocated tensors (``out=``)
            self.calls.append((xp, g.detach().reshape(batch, o, -1, g.shape[-1])))
        self.names, self.batch = tuple(names), batch
        # per-example gradients in the strategy's layout (see _sq_pe, _sum_pe), their norms
        self._per_example: tuple[Tensor, Tensor | None] | None = None
        self._bias: Tensor | None = None
        self._kernel: Any = None
        self.strategy = self._choose() if "weight" in self.names else "none"
        # the compiled kernel, fixed when chosen (whether it applies could change later)
        self._kernel = self._direct_kernel() if self.strategy == "direct" else None

    # -- the three strategies ------------------------------------------------------------
    def _patches(self, xp: Tensor, g: Tensor) -> Tensor:
        """im2col of one call, ``[B G, L, K]`` (a copy of a strided view of the input).

        With one group the input is made channels-last first, so the copy moves runs of
        ``kw C`` contiguous values and the features are ordered ``(kh, kw, C)``; with several
        groups they are ordered ``(Cg, kh, kw)`` as in the weight.
        """
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        b, c = xp.shape[:2]
        ho, wo = g.shape[2], g.shape[3]
        if self.groups == 1:
            if c > 1 and xp.device.type == "cpu":
                # one sequential read first: transposing an input that is not in cache took
                # twice as long as reading it and then transposing it (benchmark CNN)
                xp.sum()
            xn = xp.permute(0, 2, 3, 1).contiguous()  # [B, H, W, C]
            st = xn.stride()
            view = xn.as_strided(
                (b, ho, wo, kh, kw, c),
                (st[0], st[1] * sh, st[2] * sw, st[1] * dh, st[2] * dw, st[3]),
            )
            return view.reshape(b, ho * wo, kh * kw * c)
        xc = xp.contiguous()
        st = xc.stride()
        cg = c // self.groups
        view = xc.as_strided(
            (b, self.groups, ho, wo, cg, kh, kw),
            (st[0], st[1] * cg, st[2] * sh, st[3] * sw, st[1], st[2] * dh, st[3] * dw),
        )
        return view.reshape(b * self.groups, ho * wo, cg * kh * kw)

    def _chunk(self) -> int:
        """Examples per chunk of the ``bmm`` pipeline: on the CPU about ``_CONV_CHUNK_BYTES``
        of patches, so that the patches, their product and its norms are formed while in
        cache; elsewhere the whole batch."""
        if self.calls[0][1].device.type != "cpu":
            return max(1, self.batch)
        _, cg, kh, kw = self.shape2d
        length = max(g.shape[2] * g.shape[3] for _, g in self.calls)
        size = length * self.groups * cg * kh * kw * self.calls[0][1].element_size()
        return max(1, _CONV_CHUNK_BYTES // max(1, size))

    def _grads_bmm(self) -> tuple[Tensor, Tensor]:
        """Per-example gradients ``[B, G, Og, K]`` (features ordered as by :meth:`_patches`)
        and their norms ``[B]``, formed chunk by chunk of examples (one batched product of
        output gradients and patches per chunk and call)."""
        o, cg, kh, kw = self.shape2d
        groups, g0 = self.groups, self.calls[0][1]
        pe = g0.new_empty(self.batch, groups, o // groups, cg * kh * kw)
        norms = g0.new_empty(self.batch)
        step = self._chunk()
        for i in range(0, self.batch, step):
            j = min(i + step, self.batch)
            dst = pe[i:j].view((j - i) * groups, o // groups, -1)
            for n, (xp, g) in enumerate(self.calls):
                a = self._patches(xp[i:j], g[i:j])  # [(j - i) G, L, K]
                bg = g[i:j].reshape(dst.shape[0], dst.shape[1], -1)  # [(j - i) G, Og, L]
                if n == 0:
                    torch.bmm(bg, a, out=dst)
                else:
                    dst.baddbmm_(bg, a)
            torch.linalg.vector_norm(pe[i:j], dim=(1, 2, 3), out=norms[i:j])
        return pe, norms

    def _grads_grouped(self) -> Tensor:
        """``[C, B, O, kh, kw]`` (one group)."""
        o, c, kh, kw = self.shape2d
        parts = []
        for xp, g in self.calls:
            w = g.reshape(self.batch * o, 1, g.shape[2], g.shape[3])
            out = F.conv2d(
                xp.transpose(0, 1), w, stride=self.dilation, dilation=self.stride, groups=self.batch
            )  # [C, B * O, >= kh, >= kw]
            parts.append(out[:, :, :kh, :kw].reshape(c, self.batch, o, kh, kw))
        return _sum(parts)

    def _direct_kernel(self) -> Any:
        """The compiled kernel of the ``direct`` strategy for this layer
        (:func:`renyi.dpsgd._conv_kernels.conv_pe_kernel`), or None where it does not apply:
        one group, float32/float64 on the CPU, input and output gradients of one dtype, the
        output channels a multiple of the vector width, not traced by ``torch.compile``."""
        o, _, kh, kw = self.shape2d
        xp = self.calls[0][0]
        double = xp.dtype == torch.float64
        if (
            self.groups != 1
            or xp.device.type != "cpu"
            or xp.dtype not in (torch.float32, torch.float64)
            or any(x.dtype != xp.dtype or b.dtype != xp.dtype for x, b in self.calls)
            or _onednn._compiling()
            or not _conv_kernels.ENABLED
        ):
            return None
        lanes = next((n for n in ((8, 4) if double else (16, 8)) if o % n == 0), None)
        if lanes is None:
            return None
        taps = next(n for n in (8, 4, 2, 1) if (kh * kw) % n == 0)
        return _conv_kernels.conv_pe_kernel(double, taps, lanes)

    def _grads_direct(self) -> Tensor:
        """Per-example gradients ``[B, C, kh kw, O]`` by the compiled kernel, from the padded
        input (NCHW) and the output gradients made channels-last; no patches are formed."""
        o, c, kh, kw = self.shape2d
        kernel = self._kernel if self._kernel is not None else self._direct_kernel()
        if kernel is None:
            raise RuntimeError("the direct strategy's kernel does not apply")  # never
        pe: Tensor | None = None
        for xp, g in self.calls:
            xc = xp.contiguous()
            gn = g.permute(0, 2, 3, 1).contiguous()  # [B, Ho, Wo, O]
            hp, wp = int(xc.shape[2]), int(xc.shape[3])
            pos, offs = _window_offsets(
                (hp, wp), (int(g.shape[2]), int(g.shape[3])), (kh, kw), self.stride, self.dilation
            )
            part = g.new_empty(self.batch, c, kh * kw, o)
            kernel(
                xc.data_ptr(), pos.data_ptr(), offs.data_ptr(), gn.data_ptr(), part.data_ptr(),
                self.batch, c, hp * wp, pos.numel(), kh * kw, o,
            )  # fmt: skip
            pe = part if pe is None else pe.add_(part)
        assert pe is not None
        return pe

    def _compute(self, name: str) -> tuple[Tensor, Tensor | None]:
        """Per-example gradients in ``name``'s layout, and their norms when formed with them."""
        if name == "direct":
            return self._grads_direct(), None
        return (self._grads_grouped(), None) if name == "grouped" else self._grads_bmm()

    def _sq_pe(self, name: str, pe: Tensor, norms: Tensor | None) -> Tensor:
        """Per-example squared norms of per-example gradients in ``name``'s layout."""
        if name == "grouped":
            pe = pe.movedim(1, 0)  # [B, C, O, kh, kw], a view
        if norms is not None:
            return _squared(norms, pe)
        return _sq(pe, tuple(range(1, pe.ndim)))

    def _sum_pe(self, name: str, pe: Tensor, w: Tensor) -> Tensor:
        """``sum_i w_i g_i`` in the weight's layout from per-example gradients in ``name``'s."""
        o, cg, kh, kw = self.shape2d
        if name == "grouped":  # [C, B, O, kh, kw]
            s = torch.matmul(w, pe.reshape(cg, self.batch, -1))  # [C, O kh kw]
            return s.reshape(cg, o, kh, kw).transpose(0, 1)
        if name == "direct":  # [B, C, kh kw, O]
            s = torch.mv(pe.reshape(self.batch, -1).t(), w)
            return s.reshape(cg, kh, kw, o).permute(3, 0, 1, 2)
        s = torch.mv(pe.reshape(self.batch, -1).t(), w)
        if self.groups == 1:  # features ordered (kh, kw, C)
            return s.reshape(o, kh, kw, cg).permute(0, 3, 1, 2)
        return s.reshape(o, cg, kh, kw)

    def _sq_gram(self) -> Tensor:
        a = _cat(
            [
                self._patches(xp, g).view(self.batch, self.groups, g.shape[2] * g.shape[3], -1)
                for xp, g in self.calls
            ],
            dim=2,
        )  # [B, G, L, K]
        b = _cat(
            [
                g.reshape(self.batch, self.groups, -1, g.shape[2] * g.shape[3])
                for _, g in self.calls
            ],
            dim=3,
        )  # [B, G, Og, L]
        ga = torch.matmul(a, a.transpose(-1, -2))  # [B, G, L, L]
        gb = torch.matmul(b.transpose(-1, -2), b)
        return (ga.double() * gb.double()).sum(dim=(1, 2, 3)).clamp_min(0.0)

    def _choose(self) -> str:
        length = sum(g.shape[2] * g.shape[3] for _, g in self.calls)
        o, cg, kh, kw = self.shape2d
        candidates = ["bmm"]
        if self.groups == 1:
            candidates.append("grouped")
        if self._direct_kernel() is not None:
            candidates.append("direct")
        if 2 * length * length < (o // self.groups) * cg * kh * kw:
            candidates.append("gram")
        key = (
            tuple((tuple(xp.shape), tuple(g.shape)) for xp, g in self.calls),
            self.kernel,
            self.stride,
            self.dilation,
            self.groups,
            self.calls[0][0].dtype,
            self.calls[0][0].device.type,
        )
        if key not in _CONV_STRATEGY:
            g0 = self.calls[0][1]
            ones = torch.ones(self.batch, dtype=g0.dtype, device=g0.device)
            timing = dict.fromkeys(candidates, math.inf)
            # single-threaded CPU: the process's CPU time (other processes of a loaded machine
            # taking the core do not count); else wall-clock time (accelerators synchronised)
            one_thread = g0.device.type == "cpu" and torch.get_num_threads() == 1
            clock = time.process_time if one_thread else time.perf_counter
            for _ in range(3):  # best of three: the first run pays for allocations
                for name in candidates:
                    _synchronize(g0)
                    start = clock()
                    with torch.no_grad():  # the norms, then the clipped sum: as used below
                        if name == "gram":
                            self._sq_gram()
                            self._conv_weight_sum(ones)
                        else:
                            pe, norms = self._compute(name)
                            self._sq_pe(name, pe, norms)
                            self._sum_pe(name, pe, ones)
                    _synchronize(g0)
                    timing[name] = min(timing[name], clock() - start)
            _CONV_STRATEGY[key] = min(timing, key=timing.__getitem__)
        choice = _CONV_STRATEGY[key]
        if choice == "direct" and "direct" not in candidates:
            # timed when the kernel applied; not now (torch.compile tracing, switched off)
            return "bmm"
        return choice

    def _conv_weight_sum(self, w: Tensor) -> Tensor:
        """``sum_i w_i g_i`` for the weight by torch's convolution weight-gradient kernel."""
        w = w.to(self.calls[0][1].dtype)
        parts = [
            conv2d_weight(
                xp,
                self.shape2d,
                g * w[:, None, None, None],
                stride=self.stride,
                padding=0,
                dilation=self.dilation,
                groups=self.groups,
            )
            for xp, g in self.calls
        ]
        return _sum(parts)

    def _native_per_example(self) -> tuple[Tensor, Tensor | None]:
        if self._per_example is None:
            self._per_example = self._compute(self.strategy)
        return self._per_example

    def _weight_per_example(self) -> Tensor:
        """``[B, O, Cg, kh, kw]`` (a copy in the weight's layout: for tied parameters)."""
        o, cg, kh, kw = self.shape2d
        name = self.strategy if self.strategy in ("grouped", "direct") else "bmm"
        pe = (self._native_per_example() if self.strategy == name else self._compute(name))[0]
        if name == "grouped":
            return pe.permute(1, 2, 0, 3, 4)
        if name == "direct":
            return pe.reshape(self.batch, cg, kh, kw, o).permute(0, 4, 1, 2, 3)
        if self.groups == 1:
            return pe.reshape(self.batch, o, kh, kw, cg).permute(0, 1, 4, 2, 3)
        return pe.reshape(self.batch, o, cg, kh, kw)

    def _bias_per_example(self) -> Tensor:
        if self._bias is None:
            self._bias = _sum([g.sum(dim=(2, 3)) for _, g in self.calls])
        return self._bias

    # -- LayerGrads ----------------------------------------------------------------------
    def sq_norms(self) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        if "weight" in self.names:
            if self.strategy == "gram":
                res["weight"] = self._sq_gram()
            else:
                res["weight"] = self._sq_pe(self.strategy, *self._native_per_example())
        if "bias" in self.names:
            res["bias"] = _sq(self._bias_per_example(), (1,))
        return res

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        res: dict[str, Tensor] = {}
        dtype = self.calls[0][1].dtype
        if "weight" in self.names:
            w = weights["weight"].to(dtype)
            if self.strategy == "gram":
                gw = self._conv_weight_sum(w)
            else:
                gw = self._sum_pe(self.strategy, self._native_per_example()[0], w)
            res["weight"] = gw.reshape(self.weight_shape)
        if "bias" in self.names:
            res["bias"] = torch.mv(self._bias_per_example().t(), weights["bias"].to(dtype))
        return res


class _EmbeddingGrads:
    """Example ``i``'s gradient adds ``b_it`` to row ``idx_it``; rows are summed per example.

    On the CPU, for float32/float64 output gradients and integer indices, both the squared
    norms and the clipped sum are one compiled pass each
    (:mod:`renyi.dpsgd._embedding_kernels`) instead of torch's ``unique`` and three
    ``index_add_`` (benchmark LSTM, embedding 1000 x 64, B = 64, T = 32, one thread:
    about 50 us against 130 us, thread time); elsewhere torch's ops."""

    def __init__(self, module: nn.Embedding, calls: Sequence[Call], batch: int) -> None:
        used = _used_calls(calls)
        dim = module.embedding_dim
        self.idx = _cat([x.reshape(batch, -1) for x, _ in used], dim=1)
        self.raw_b = _cat([g.reshape(batch, -1, dim) for _, g in used], dim=1)
        self.batch = batch
        self.num = module.num_embeddings
        self.padding_idx = module.padding_idx
        self._masked: Tensor | None = None

    @property
    def b(self) -> Tensor:
        """The output gradients ``[B, S, dim]``, zero at the padding positions (the padding
        row never receives a gradient)."""
        if self._masked is None:
            b = self.raw_b
            if self.padding_idx is not None:
                b = b * (self.idx != self.padding_idx).unsqueeze(-1).to(b.dtype)
            self._masked = b
        return self._masked

    def _kernel_args(self) -> tuple[Any, Any, int] | None:
        """``(idx, b, pad)`` as numpy arrays for :mod:`renyi.dpsgd._embedding_kernels`, or
        ``None`` where the kernels do not apply (no numba, switched off, not the CPU, other
        dtypes, tensor subclasses, ``torch.compile`` tracing)."""
        idx, b = self.idx, self.raw_b
        if not (
            _embedding_kernels.ENABLED
            and _embedding_kernels.available()
            and type(idx) is Tensor
            and type(b) is Tensor
            and idx.device.type == "cpu"
            and b.device.type == "cpu"
            and idx.dtype in (torch.int64, torch.int32)
            and b.dtype in (torch.float32, torch.float64)
            and not _onednn._compiling()
        ):
            return None
        pad = -1 if self.padding_idx is None else int(self.padding_idx)
        return idx.contiguous().numpy(), b.detach().contiguous().numpy(), pad

    def _bad_indices(self) -> Exception:
        return fail(
            "embedding indices",
            f"[{int(self.idx.min())}, {int(self.idx.max())}]",
            f"indices in [0, {self.num}) (was the layer's input changed after its forward?)",
        )

    def _check_indices(self) -> None:
        """torch's path: an index outside the table would silently land in another
        example's keys (``unique`` over ``example * num + index``)."""
        if self.idx.numel() and (int(self.idx.min()) < 0 or int(self.idx.max()) >= self.num):
            raise self._bad_indices()

    def sq_norms(self) -> dict[str, Tensor]:
        args = self._kernel_args()
        if args is not None:
            sq = torch.empty(self.batch, dtype=torch.float64)
            if _embedding_kernels.sq_norms(*args, self.num, sq.numpy()) != 0:
                raise self._bad_indices()
            return {"weight": sq}
        self._check_indices()
        rows_of = torch.arange(self.batch, device=self.idx.device).unsqueeze(1) * self.num
        keys, inverse = torch.unique(rows_of + self.idx, return_inverse=True)
        flat_b = self.b.reshape(-1, self.b.shape[-1])
        rows = torch.zeros(keys.numel(), flat_b.shape[1], dtype=flat_b.dtype, device=flat_b.device)
        rows.index_add_(0, inverse.reshape(-1), flat_b)
        sq = torch.zeros(self.batch, dtype=torch.float64, device=flat_b.device)
        sq.index_add_(0, keys // self.num, _sq(rows, (1,)))
        return {"weight": sq}

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        w = weights["weight"].to(self.raw_b.dtype)
        args = self._kernel_args()
        if args is not None and type(w) is Tensor and w.device.type == "cpu":
            out = torch.empty(self.num, self.raw_b.shape[-1], dtype=self.raw_b.dtype)
            idx, b, pad = args
            w_np = w.detach().contiguous().numpy()
            if _embedding_kernels.weighted_sum(idx, b, w_np, pad, self.num, out.numpy()) != 0:
                raise self._bad_indices()
            return {"weight": out}
        self._check_indices()
        flat_b = (self.b * w[:, None, None]).reshape(-1, self.b.shape[-1])
        out = torch.zeros(self.num, flat_b.shape[1], dtype=flat_b.dtype, device=flat_b.device)
        out.index_add_(0, self.idx.reshape(-1), flat_b)
        return {"weight": out}


class _Transposed:
    """The rule of an affine map whose weight is stored transposed (``[in, out]``)."""

    def __init__(self, inner: LayerGrads) -> None:
        self.inner = inner

    def sq_norms(self) -> dict[str, Tensor]:
        return self.inner.sq_norms()

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        res = self.inner.weighted_sum(weights)
        if "weight" in res:
            res["weight"] = res["weight"].t()
        return res


def _norm_layer(
    module: nn.LayerNorm | nn.GroupNorm | nn.RMSNorm,
    calls: Sequence[Call],
    names: Sequence[str],
    batch: int,
) -> PerExampleGrads:
    grads: dict[str, Tensor] = {}
    for x, g in _used_calls(calls):
        if isinstance(module, nn.LayerNorm | nn.RMSNorm):
            shape = tuple(module.normalized_shape)
            if x.ndim <= len(shape):
                raise UnsupportedModelError(
                    f"{type(module).__name__} normalized_shape={shape} covers the batch "
                    f"dimension of an input of shape {tuple(x.shape)}: it mixes examples"
                )
            if isinstance(module, nn.LayerNorm):
                xhat = F.layer_norm(x, shape, None, None, module.eps)
            else:
                xhat = F.rms_norm(x, shape, None, module.eps)
            dims = tuple(range(1, x.ndim - len(shape)))
        else:
            xhat = F.group_norm(x, module.num_groups, None, None, module.eps)
            dims = tuple(range(2, x.ndim))
        parts = {"weight": g * xhat, "bias": g}
        for n in names:
            v = parts[n].sum(dim=dims) if dims else parts[n]
            grads[n] = grads[n] + v if n in grads else v
    return PerExampleGrads(grads)


class _ZeroGrads:
    """A layer whose output never reached the loss: all its per-example gradients are zero."""

    def __init__(self, module: nn.Module, names: Sequence[str], batch: int) -> None:
        own = dict(module.named_parameters(recurse=False))
        self.params = {n: own[n] for n in names}
        self.batch = batch

    def sq_norms(self) -> dict[str, Tensor]:
        dev = next(iter(self.params.values())).device
        return {n: torch.zeros(self.batch, dtype=torch.float64, device=dev) for n in self.params}

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {n: torch.zeros_like(p) for n, p in self.params.items()}


def ghost_layer_grads(
    module: nn.Module, calls: Sequence[Call], names: Sequence[str], batch: int
) -> LayerGrads:
    """The ghost-norm rule for ``module`` (see :func:`supports_ghost`) over its recorded calls.

    Args:
        module: a supported layer.
        calls: every call of the layer in the forward pass: ``(args, kwargs, grad_outputs)``,
            ``grad_outputs[0]`` being ``dL/d(output)`` with ``L`` the *sum* of per-example losses
            (so its slice ``i`` is example ``i``'s output gradient), or ``None`` if unused.
            Several calls of one layer (weight sharing over time) are summed per example.
        names: the layer's trainable parameter names (``"weight"``, ``"bias"``).
        batch: the batch size ``B``.
    """
    used = _used_calls(calls)
    if not used:
        return _ZeroGrads(module, names, batch)
    if isinstance(module, nn.Linear):
        return _linear_from(used, module.in_features, module.out_features, names, batch)
    if isinstance(module, nn.Conv1d | nn.Conv2d):
        return _ConvGrads(module, calls, names, batch)
    if isinstance(module, nn.Embedding):
        return _EmbeddingGrads(module, calls, batch)
    if isinstance(module, nn.LayerNorm | nn.GroupNorm | nn.RMSNorm):
        return _norm_layer(module, calls, names, batch)
    conv1d = hf_conv1d()
    if conv1d is not None and isinstance(module, conv1d):
        nx, nf = module.weight.shape  # type: ignore[misc]
        return _Transposed(_linear_from(_used_calls(calls), int(nx), int(nf), names, batch))
    raise UnsupportedModelError(
        f"layer {type(module).__name__} has no ghost-norm rule; supported: "
        + ", ".join(t.__name__ for t in GHOST_LAYER_TYPES)
    )


# ---------------------------------------------------------------- tied parameters
#: ``(left, right)``: example ``i``'s gradient of a parameter ``[P, Q]`` is
#: ``sum_s left_is right_is^T``; ``left`` is ``[B, S, P]``, or ``[B, S]`` row indices (one-hot
#: rows: an embedding lookup), ``right`` is ``[B, S, Q]``.
Factors = tuple[Tensor, Tensor]


def _factors(grads: LayerGrads, name: str) -> Factors | None:
    """The outer-product factors of one use of a weight, when its rule has them."""
    if name != "weight":
        return None
    if isinstance(grads, _Transposed):  # weight stored [in, out]: the factors swapped
        inner = _factors(grads.inner, name)
        if inner is None or not inner[0].is_floating_point():
            return None
        return inner[1], inner[0]
    if isinstance(grads, _LinearGrads):
        return grads.b.unsqueeze(1), grads.a.unsqueeze(1)
    if isinstance(grads, _SeqLinearGrads):
        return grads.b, grads.a
    if isinstance(grads, _OuterProductGrads) and grads.a.shape[1] == 1:
        if len(grads.weight_shape) == 2:
            return grads.b[:, 0].transpose(1, 2), grads.a[:, 0].transpose(1, 2)
        return None
    if isinstance(grads, _EmbeddingGrads):
        return grads.idx, grads.b
    return None


def _materialised(grads: LayerGrads, name: str, shape: torch.Size, batch: int) -> Tensor:
    """One use's per-example gradients of a parameter, ``[B, numel]`` in its layout."""
    f = _factors(grads, name)
    if f is not None:
        left, right = f
        if left.is_floating_point():
            pe = torch.bmm(left.transpose(1, 2), right)
        else:
            rows = int(shape[0])
            keys = (torch.arange(batch, device=left.device).unsqueeze(1) * rows + left).reshape(-1)
            pe = torch.zeros(batch * rows, right.shape[-1], dtype=right.dtype, device=right.device)
            pe.index_add_(0, keys, right.reshape(-1, right.shape[-1]))
        return pe.reshape(batch, -1)
    if isinstance(grads, _Transposed):
        pe = _materialised(grads.inner, name, torch.Size(reversed(shape)), batch)
        return pe.reshape(batch, int(shape[1]), int(shape[0])).transpose(1, 2).reshape(batch, -1)
    if isinstance(grads, PerExampleGrads):
        return grads.grads[name].reshape(batch, -1)
    if isinstance(grads, _ConvGrads):
        pe = grads._weight_per_example() if name == "weight" else grads._bias_per_example()
        return pe.reshape(batch, -1)
    if isinstance(grads, _LinearGrads) and name == "bias":
        return grads.b
    if isinstance(grads, _SeqLinearGrads) and name == "bias":
        return grads.b.sum(dim=1)
    if isinstance(grads, _OuterProductGrads) and name == "bias":
        return grads.b.sum(dim=3).reshape(batch, -1)
    raise UnsupportedModelError(
        f"no per-example gradient of the shared parameter {name!r} from rule {type(grads).__name__}"
    )


def _ghost_cost(f: Factors, g: Factors) -> float:
    """Multiply-adds per example of the cross term from the factors (``S T`` inner products
    of the right factors and of the left ones, or a gather for row indices)."""
    s, t = f[1].shape[1], g[1].shape[1]
    dense = f[0].is_floating_point() and g[0].is_floating_point()
    return float(s * t * (f[1].shape[-1] + (f[0].shape[-1] if dense else 1)))


def _cross_from_factors(f: Factors, g: Factors) -> Tensor:
    """``<G_i, H_i>`` for every example, ``G_i = sum_s f0_is f1_is^T``, ``H_i`` likewise:
    ``sum_{s,t} <f0_is, g0_it> <f1_is, g1_it>`` (the ghost algebra of Li et al. 2022 for two
    different uses of one weight)."""
    (l1, r1), (l2, r2) = f, g
    rr = torch.bmm(r1, r2.transpose(1, 2))  # [B, S, T]
    batch, s, t = rr.shape
    if l1.is_floating_point() and l2.is_floating_point():
        ll = torch.bmm(l1, l2.transpose(1, 2))
    elif l1.is_floating_point():  # <l1_s, e_{l2_t}> = l1_s[l2_t]
        ll = l1.gather(2, l2.unsqueeze(1).expand(batch, s, t))
    elif l2.is_floating_point():
        ll = l2.gather(2, l1.unsqueeze(1).expand(batch, t, s)).transpose(1, 2)
    else:
        ll = (l1.unsqueeze(2) == l2.unsqueeze(1)).to(rr.dtype)
    # float64 products: (l.l)(r.r) may exceed the float32 range
    return (ll.double() * rr.double()).sum(dim=(1, 2))


class TiedGrads:
    """The cross terms of a parameter used by several layers (tied weights).

    Example ``i``'s gradient of a tied parameter is the sum of its uses' gradients,
    ``G_i = sum_u G_ui`` (GPT-2's and BERT's LM heads share the input embedding: ``G_emb +
    G_head``), so ``||G_i||^2 = sum_u ||G_ui||^2 + 2 sum_{u<v} <G_ui, G_vi>``. Each use's rule
    gives its own squared norm and its share of the clipped sum; this entry gives the cross
    terms, ``sq_norms() = {name: 2 sum_{u<v} <G_ui, G_vi>}``, and adds nothing to the sum.
    Each cross term comes from the uses' factors (inputs and output gradients; an embedding's
    token ids as one-hot rows: ``sum_{s,t} g_is[idx_it] (b_it . a_is)`` for an embedding and
    a head, no ``[B, vocab, dim]`` tensor) when that costs fewer multiply-adds than forming
    the two uses' per-example gradients of the parameter, else from those (``[B, numel]``).

    Args:
        name: the parameter's name in the model.
        shape: its shape (each use's gradient is taken in this layout).
        uses: ``(rule, local name)`` of each layer using it.
        batch: ``B``.
    """

    def __init__(
        self, name: str, shape: torch.Size, uses: Sequence[tuple[LayerGrads, str]], batch: int
    ) -> None:
        self.name, self.shape, self.batch = name, shape, batch
        self.uses = [(g, n) for g, n in uses if not isinstance(g, _ZeroGrads)]

    def sq_norms(self) -> dict[str, Tensor]:
        cross: Tensor | None = None
        mats: dict[int, Tensor] = {}
        for u in range(len(self.uses)):
            for v in range(u + 1, len(self.uses)):
                c = self._cross(u, v, mats)
                cross = c if cross is None else cross + c
        return {} if cross is None else {self.name: 2.0 * cross}

    def _cross(self, u: int, v: int, mats: dict[int, Tensor]) -> Tensor:
        (gu, nu), (gv, nv) = self.uses[u], self.uses[v]
        fu, fv = _factors(gu, nu), _factors(gv, nv)
        if fu is not None and fv is not None and len(self.shape) == 2:
            s, t = fu[1].shape[1], fv[1].shape[1]
            if _ghost_cost(fu, fv) <= (s + t) * self.shape.numel():
                return _cross_from_factors(fu, fv)
        for k, (g, n) in ((u, self.uses[u]), (v, self.uses[v])):
            if k not in mats:
                mats[k] = _materialised(g, n, self.shape, self.batch)
        return (mats[u].double() * mats[v].double()).sum(dim=1)

    def weighted_sum(self, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {}  # each use's rule adds its share
