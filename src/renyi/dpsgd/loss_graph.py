"""The user's loss on the ``loss.backward()`` path, read from its autograd graph.

DP-SGD needs each example's gradient to depend on that example alone (Abadi et al. 2016,
Algorithm 1: the clipped sum then moves by at most ``C`` when one example is added or
removed). On the capture path (:mod:`renyi.dpsgd.capture`) the loss is the user's code, and
the habits of the field normalise it by quantities of the *whole batch*: the mean over the
batch (``1/B``, rounded in bfloat16/float16 under autocast), the total of the class weights
(``CrossEntropyLoss(weight=w)``), the number of non-ignored tokens (``ignore_index``, every
Hugging Face causal-LM loss), ``num_items_in_batch``. Scaling the captured gradient by ``B``
is right only for the plain mean: otherwise removing one example rescales every other
example's gradient, and the clipped sum moves by more than ``C`` (measured: 1.385 C with class
weights, 1.064 C with token-level ``ignore_index``, 1.0069 C under bf16 autocast).

This module replaces the batch normalisation by a per-example one, from the graph itself:

1. The model's outputs are handed to the user as :class:`TracedOutput` tensors (a plain
   ``torch.Tensor`` subclass whose only addition is that ``backward()`` of anything computed
   from them comes here first).
2. The graph from the loss down to the model's outputs (the *seams*) is read: the **scalar
   part** (the reduced loss and what is done to it: constant factors, divisions by counts,
   sums of several losses) and the **reductions** that turn per-element terms into a scalar
   (``sum``/``mean``, and torch's fused losses: NLL/cross-entropy, MSE, BCE, Huber, ...).
   Anything else (``sqrt`` of a mean, a product of two losses, a reduction that is not a
   sum or mean, a trainable tensor added to the loss outside the model) is refused with
   :class:`UnsupportedLossError`, naming the operation and the fix.
3. Example ``i``'s loss is defined as ``l_i = sum_R rho_R red_R(terms of R belonging to i)``
   where ``red_R`` is the sum of R's terms for a sum, and their mean over the example's
   *counted* terms for a mean (counted: not ``ignore_index``; the class or element weights
   stay on the terms, so ``CrossEntropyLoss(weight=w)`` gives ``w[y_i] l_i``); a sum over
   counted terms (``ignore_index``, ``(terms * mask).sum()``) followed by any division
   (``/ mask.sum()``, ``/ num_items_in_batch``) is a mean, a sum of unmasked terms stays a
   sum whatever it is divided by (``/ B``, ``batchmean``): decided from the graph's
   structure, never from the divisor's value (a count of other micro-batches' tokens, or a
   constant that equals the number of terms only in some batches, would make the choice,
   hence every example's loss, depend on the batch). ``rho_R`` is the product of the factors
   the loss is *multiplied* by on the way from R (constants such as label smoothing's
   ``1 - eps``, a weight of an auxiliary loss, a ``GradScaler``'s loss scale); every
   *division* of the reduced loss is dropped, because any of them may be a batch quantity
   (``/ B``, ``/ num_items_in_batch``, ``/ gradient_accumulation_steps`` too: DP-SGD divides
   the clipped sum by the *expected* batch size later, as always).
4. The backward runs from the reductions' inputs, seeded with ``d l_i / d term``: the
   scalar part never runs, so nothing computed from the whole batch reaches the model, and
   no ``1/B`` is ever rounded. The per-example gradient at every layer is that of ``l_i``.

**Which example a term belongs to**: terms laid out with the batch on dim 0, or flattened
from ``[B, T, ...]`` (``logits.view(-1, V)``) or ``[T, B, ...]`` (sequence-first), found
from the graph's views; a per-example mean over terms in any other layout is refused.

**Checked, on the first two backward passes and then on random ones**: one random term of
the loss is back-propagated alone to the model's outputs; its gradient must land on one
example only (the one it was mapped to), otherwise the loss mixes examples (contrastive
losses over the batch, softmax over dim 0, ...) and :class:`LossMixingError` is raised
before anything is released.

Not seen by the graph (documented limits): a tensor factor *inside* the per-element terms
(``(loss / n).sum()`` with ``n`` computed from the batch) cannot be told from a constant
(Python numbers reach the graph as tensors too): divide after the reduction instead.

Example:
    >>> import torch
    >>> from torch import nn
    >>> y = nn.Linear(2, 3)(torch.randn(4, 2))      # a model's output
    >>> loss = nn.functional.cross_entropy(y, torch.tensor([0, 1, 2, 1]),
    ...                                    weight=torch.tensor([1.0, 2.0, 3.0]))
    >>> plan = analyse_loss([loss], {y.grad_fn: SeamInfo(None, 4)})
    >>> [(r.name, r.mode, r.rho) for r in plan.reductions]
    [('NllLossBackward0', 'mean', 1.0)]
    >>> plan.seeds()[0][1][1].tolist()  # d l_1 / d log-probabilities: class weight 2, target 1
    [0.0, -2.0, 0.0]
"""

from __future__ import annotations

import math
import random
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge

from renyi.dpsgd.grad_sample import (
    NonFiniteGradientError,
    UnsupportedModelError,
    exact_arithmetic,
)
from renyi.dpsgd.independence import ExampleMixingError

__all__ = [
    "LossMixingError",
    "LossPlan",
    "SeamInfo",
    "SeamSource",
    "TracedOutput",
    "UnsupportedLossError",
    "analyse_loss",
    "current_seams",
    "register_source",
]


class UnsupportedLossError(UnsupportedModelError):
    """The loss is not a sum or mean of per-example terms that renyi can split by example.

    Raised when ``loss.backward()`` is called on the capture path, before any gradient is
    computed; the message names the operation and how to write the loss instead.
    """


class LossMixingError(ExampleMixingError):
    """A term of the loss depends on several examples of the batch (e.g. a contrastive loss
    over the batch, a softmax over dim 0). Raised before anything is released."""


@dataclass
class SeamInfo:
    """A model output (batched along dim 0) where the loss graph ends.

    ``owner``: the capture's record of the forward pass it belongs to (``None`` for a bare
    analysis); ``batch``: its batch size; ``edge``: its gradient edge (for the probe).
    """

    owner: Any
    batch: int
    edge: GradientEdge | None = None


class SeamSource(Protocol):
    """Holds the seams of the forward passes it captures (``grad_fn`` node -> seam)."""

    seams: dict[Any, SeamInfo]


#: The live captures (weakly: a capture dropped with its model releases its graphs).
_SOURCES: weakref.WeakSet[Any] = weakref.WeakSet()


def register_source(source: SeamSource) -> None:
    """Make ``source.seams`` (``grad_fn`` of model outputs) ends of loss graphs."""
    _SOURCES.add(source)


def current_seams() -> dict[Any, SeamInfo]:
    """The seams of every live capture."""
    merged: dict[Any, SeamInfo] = {}
    for source in list(_SOURCES):
        merged.update(source.seams)
    return merged


# --------------------------------------------------------------------------- traced outputs
class TracedOutput(Tensor):
    """A model output on the capture path: a ``torch.Tensor`` whose ``backward`` (and that of
    every tensor computed from it) is routed through :func:`seeded_backward`.

    Every other operation behaves as on a plain tensor (results keep the class, so the loss
    computed from the output is traced too).
    """

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is Tensor.backward:
            return _tensor_backward(*args, **kwargs)
        if func is torch.autograd.backward:
            return _autograd_backward(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            ret = func(*args, **kwargs)
        return _keep_traced(ret, cls)

    def __repr__(self, **kwargs: Any) -> str:  # type: ignore[override]
        with torch._C.DisableTorchFunctionSubclass():
            return Tensor.__repr__(self.as_subclass(Tensor), **kwargs)


def _keep_traced(ret: Any, cls: type) -> Any:
    """Results that can reach a backward stay traced; the others (detached values, metrics,
    integer results) are plain tensors again."""
    if isinstance(ret, Tensor):
        if isinstance(ret, cls) or not ret.requires_grad:
            return ret
        with torch._C.DisableTorchFunctionSubclass():
            return ret.as_subclass(cls)
    if isinstance(ret, tuple | list) and any(isinstance(r, Tensor) for r in ret):
        # tuples, lists and torch's structseq results (torch.max(..., dim) etc.), as torch's
        # own Tensor.__torch_function__ converts them
        return type(ret)(_keep_traced(r, cls) for r in ret)
    return ret


def _plain(t: Any) -> Any:
    return t.as_subclass(Tensor) if isinstance(t, TracedOutput) else t


def _tensor_backward(
    self: Tensor,
    gradient: Tensor | None = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Any = None,
) -> None:
    seeded_backward([self], [gradient], retain_graph, create_graph, inputs)


def _autograd_backward(
    tensors: Any,
    grad_tensors: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    grad_variables: Any = None,
    inputs: Any = None,
) -> None:
    roots = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    grads = grad_tensors if grad_tensors is not None else grad_variables
    if grads is None or isinstance(grads, Tensor):
        grads = [grads] * len(roots) if grads is None else [grads]
    seeded_backward(roots, list(grads), retain_graph, create_graph, inputs)


def seeded_backward(
    roots: Sequence[Tensor],
    grads: Sequence[Tensor | None],
    retain_graph: bool | None,
    create_graph: bool,
    inputs: Any,
) -> None:
    """``backward`` of a loss computed from traced model outputs (see the module docstring).

    A loss that reaches no seam (nothing of a captured forward pass) gets the plain backward.
    """
    with torch._C.DisableTorchFunctionSubclass():
        # read through the traced roots themselves: a plain alias would add a graph node
        plan = analyse_loss(list(roots), current_seams())
        if plan is None:
            torch.autograd.backward(
                [_plain(r) for r in roots],
                [_plain(g) for g in grads],
                retain_graph=retain_graph,
                create_graph=create_graph,
                inputs=inputs,
            )
            return
        if create_graph or inputs is not None:
            raise UnsupportedLossError(
                "backward(create_graph=True) or backward(inputs=...) of a loss of a model "
                "made private: per-example clipping needs the plain backward of the loss"
            )
        for g in grads:
            if g is not None and g.numel() != 1:
                raise UnsupportedLossError(
                    f"backward(gradient=<tensor of shape {tuple(g.shape)}>): call backward() "
                    "on the scalar loss (the sum or mean of per-example losses)"
                )
        plan.run(retain_graph=bool(retain_graph))


# --------------------------------------------------------------------------- graph reading
def _shape(node: Any, index: int) -> torch.Size | None:
    """Shape of the forward tensor that the edge ``(node, index)`` stands for."""
    try:
        return torch.Size(node._input_metadata[index].shape)
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None


def _meta(node: Any, index: int) -> tuple[torch.dtype, torch.device]:
    md = node._input_metadata[index]
    return md.dtype, md.device


def _numel(shape: torch.Size | None) -> int:
    return -1 if shape is None else int(math.prod(shape))


def _out_shapes(node: Any) -> list[torch.Size | None]:
    try:
        return [torch.Size(m.shape) for m in node._input_metadata]
    except (AttributeError, RuntimeError, TypeError):
        return [None]


def _value(t: Any) -> float:
    if isinstance(t, Tensor):
        if t.numel() != 1:
            raise ValueError
        return float(t.detach().reshape(()))
    return float(t)


def _edges(node: Any) -> list[tuple[int, Any, int]]:
    return [(i, n, k) for i, (n, k) in enumerate(node.next_functions) if n is not None]


#: Operations on the reduced loss that only reshape or change its dtype.
_SCALAR_PASS = frozenset(
    {
        "AliasBackward0",
        "ToCopyBackward0",
        "CloneBackward0",
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "SqueezeBackward3",
        "UnsqueezeBackward0",
        "ExpandBackward0",
        "TBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "SelectBackward0",
        "SliceBackward0",
        "AsStridedBackward0",
        "SqueezeBackwardAutogradNestedTensor0",
    }
)

#: Reductions of per-element terms: plain ones, and torch's fused losses (term recomputed
#: with ``reduction="none"`` from the node's saved tensors, see ``_FUSED``).
_PLAIN_REDUCTIONS = {
    "SumBackward0": "sum",
    "SumBackward1": "sum",
    "MeanBackward0": "mean",
    "MeanBackward1": "mean",
}


def _nll(n: Any) -> Callable[..., Tensor]:
    ignore = _signed(n._saved_ignore_index)
    return lambda x: torch.nn.functional.nll_loss(
        x, n._saved_target, n._saved_weight, ignore_index=ignore, reduction="none"
    )


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v


def _pair(fn: Callable[..., Tensor]) -> Callable[[Any], Callable[..., Tensor]]:
    return lambda n: fn


_FUSED: dict[str, Callable[[Any], Callable[..., Tensor]]] = {
    "NllLossBackward0": _nll,
    "NllLoss2DBackward0": _nll,
    "MseLossBackward0": _pair(lambda x, t: torch.nn.functional.mse_loss(x, t, reduction="none")),
    "SmoothL1LossBackward0": lambda n: (
        lambda x, t: torch.nn.functional.smooth_l1_loss(x, t, reduction="none", beta=n._saved_beta)
    ),
    "HuberLossBackward0": lambda n: (
        lambda x, t: torch.nn.functional.huber_loss(x, t, reduction="none", delta=n._saved_delta)
    ),
    "BinaryCrossEntropyBackward0": lambda n: (
        lambda x, t: torch.nn.functional.binary_cross_entropy(
            x, t, n._saved_weight, reduction="none"
        )
    ),
    "BinaryCrossEntropyWithLogitsBackward0": lambda n: (
        lambda x, t: torch.nn.functional.binary_cross_entropy_with_logits(
            x, t, n._saved_weight, reduction="none", pos_weight=n._saved_pos_weight
        )
    ),
    "SoftMarginLossBackward0": _pair(
        lambda x, t: torch.nn.functional.soft_margin_loss(x, t, reduction="none")
    ),
    "MultiMarginLossBackward0": lambda n: (
        lambda x: torch.nn.functional.multi_margin_loss(
            x,
            n._saved_target,
            p=n._saved_p,
            margin=n._saved_margin,
            weight=n._saved_weight,
            reduction="none",
        )
    ),
    "MultilabelMarginLossBackward0": lambda n: (
        lambda x: torch.nn.functional.multilabel_margin_loss(x, n._saved_target, reduction="none")
    ),
}
#: Fused losses whose saved inputs are (self, target), both possibly differentiable.
_TWO_INPUTS = frozenset(
    {
        "MseLossBackward0",
        "SmoothL1LossBackward0",
        "HuberLossBackward0",
        "BinaryCrossEntropyBackward0",
        "BinaryCrossEntropyWithLogitsBackward0",
        "SoftMarginLossBackward0",
    }
)


@dataclass
class _Path:
    """What the scalar part does to one reduction: constant factor and divisors."""

    factor: float = 1.0
    divisors: list[float] = field(default_factory=list)


@dataclass
class Reduction:
    """One reduction of per-element terms into the scalar loss.

    ``name``: the autograd node; ``mode``: ``"sum"`` or ``"mean"`` (per example, over its
    counted terms); ``rho``: its constant factor; ``shape``: the terms' shape.
    """

    node: Any
    name: str
    mode: str
    rho: float
    shape: torch.Size
    inputs: list[tuple[int, Any, int]]  # (input index, next node, next index)
    terms: Callable[..., Tensor] | None  # fused: terms from the differentiable inputs
    saved: list[Tensor]  # fused: the saved inputs (self[, target])
    counted: Tensor | None = None  # bool [shape] (None: every term counts)
    #: the count a mean divides by when the terms are weighted (fused NLL: torch's
    #: total_weight; a sum of ``terms * mask``: the mask's total), read only when a division
    #: of the reduced loss is to be matched (a tensor: not read back otherwise)
    weights_total: Tensor | None = None
    owner_batch: int = 0
    layout: str = "batch"  # how terms map to examples: batch (dim 0), flat, seqfirst
    #: whether ``layout`` was found (False: not needed for the weights, unknown to the probe)
    mapped: bool = True


def _nll_parts(r: Reduction) -> tuple[Tensor, Tensor, Tensor, Tensor | None] | None:
    """``(log-probabilities, target, counted, class weight)`` of an NLL loss over ``[B, C]``
    in float32/float64 whose seed has a closed form (:func:`_nll_seed`), else ``None``."""
    if r.name != "NllLossBackward0" or len(r.inputs) != 1 or r.inputs[0][0] != 0:
        return None
    x = r.saved[0]
    target = r.node._saved_target
    if (
        x.ndim != 2
        or x.dtype not in (torch.float32, torch.float64)
        or target.ndim != 1
        or target.shape[0] != x.shape[0]
        or r.counted is None
    ):
        return None
    _, node, k = r.inputs[0]
    if _meta(node, k)[0] != x.dtype:
        return None
    weight = r.node._saved_weight
    # int64 indices: torch's NLL also takes uint8 targets, which would index ``weight`` as a
    # mask and which scatter_ refuses
    target = target.long()
    return x, target, r.counted.reshape(-1), None if weight is None else weight.to(x.dtype)


def _nll_seed(r: Reduction, w: Tensor) -> list[tuple[GradientEdge, Tensor]] | None:
    """The seed of an NLL loss over ``[B, C]`` log-probabilities (cross-entropy's) in closed
    form, without an autograd call: ``d/dx sum_i w_i nll_i`` is ``-weight[t_i] w_i`` at
    ``(i, t_i)`` and zero elsewhere (and in the rows of ignored targets). The same products,
    in the same dtype, as torch's ``nll_loss_backward`` computes from ``w`` (float32 and
    float64 inputs only; other cases return ``None`` and take the autograd path)."""
    parts = _nll_parts(r)
    if parts is None:
        return None
    x, target, counted, weight = parts
    safe = torch.where(counted, target, 0)
    value = w.reshape(-1).to(x.dtype)
    if weight is not None:
        value = weight[safe] * value
    value = torch.where(counted, -value, 0.0)
    return _scatter_seed(r, x, safe, value)


def _nll_seed_of_rho(r: Reduction, batch: int) -> list[tuple[GradientEdge, Tensor]] | None:
    """:func:`_nll_seed` for the step's own term weights when each example has one term
    (cross-entropy over ``[B, C]``): ``w_i = rho`` (``rho`` where counted, for a mean), so
    the seed is ``-weight[t_i] rho`` in the rows of counted targets, written directly (the
    same float32/float64 products as from the term weights, fewer operations)."""
    if tuple(r.shape) != (batch,) or r.layout != "batch" or r.mode not in ("sum", "mean"):
        return None
    parts = _nll_parts(r)
    if parts is None:
        return None
    x, target, counted, weight = parts
    safe = torch.where(counted, target, 0)
    neg_rho = torch.tensor(-r.rho, dtype=torch.float64).to(x.dtype)  # -(rho rounded)
    if weight is None:
        value = torch.zeros(batch, dtype=x.dtype, device=x.device).masked_fill_(counted, neg_rho)
    else:
        value = torch.where(counted, weight[safe] * neg_rho.to(x.device), 0.0)
    return _scatter_seed(r, x, safe, value)


def _scatter_seed(
    r: Reduction, x: Tensor, safe: Tensor, value: Tensor
) -> list[tuple[GradientEdge, Tensor]]:
    _, node, k = r.inputs[0]
    seed = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    seed.scatter_(1, safe.unsqueeze(1), value.unsqueeze(1))
    return [(GradientEdge(node, k), seed)]


@dataclass
class LossPlan:
    """How to back-propagate one loss per example (see the module docstring)."""

    reductions: list[Reduction]
    owners: list[Any]
    batch: int
    seams: dict[Any, SeamInfo]

    # ------------------------------------------------------------------ seeds
    def _example_index(self, r: Reduction) -> Tensor:
        """Example of every term of ``r`` (int64, shape ``r.shape``)."""
        shape, b = r.shape, self.batch
        dev = self._device(r)
        if len(shape) == 0 or b <= 1:  # a batch of one: every term is example 0's
            return torch.zeros(shape, dtype=torch.long, device=dev)
        lead = torch.arange(shape[0], device=dev)
        if r.layout == "batch":
            idx = lead
        elif r.layout == "flat":
            idx = torch.div(lead, shape[0] // b, rounding_mode="floor")
        else:  # seqfirst
            idx = lead % b
        return idx.reshape(-1, *([1] * (len(shape) - 1))).expand(shape)

    def _device(self, r: Reduction) -> torch.device:
        return _meta(r.inputs[0][1], r.inputs[0][2])[1]

    def _term_weights(self, r: Reduction) -> Tensor:
        """``d l / d term`` for every term of ``r`` (float64)."""
        dev = self._device(r)
        if r.mode == "sum":
            return torch.full(r.shape, r.rho, dtype=torch.float64, device=dev)
        counted = (
            torch.ones(r.shape, dtype=torch.bool, device=dev) if r.counted is None else r.counted
        )
        if r.counted is None:
            per = _numel(r.shape) // self.batch if self.batch else 1
            return torch.full(r.shape, r.rho / max(per, 1), dtype=torch.float64, device=dev)
        zero = torch.zeros((), dtype=torch.float64, device=dev)
        if len(r.shape) == 1 and r.shape[0] == self.batch and r.layout == "batch":
            # one term per example (cross-entropy over [B, C]): its count is 1 or 0, so the
            # general case below is rho where counted, 0 elsewhere (rho / 1 is exact)
            return torch.where(counted, r.rho, zero)
        idx = self._example_index(r)
        counts = torch.zeros(max(self.batch, 1), dtype=torch.float64, device=dev)
        counts.index_add_(0, idx.reshape(-1), counted.reshape(-1).to(torch.float64))
        per_term = counts.clamp_min(1.0)[idx]
        return torch.where(counted, r.rho / per_term, zero)

    def _seeds_for(self, r: Reduction, w: Tensor) -> list[tuple[GradientEdge, Tensor]]:
        """Gradients to feed into ``r``'s input edges for term weights ``w``."""
        if r.terms is None:  # plain sum/mean: the terms are its input
            _, node, k = r.inputs[0]
            dtype, _ = _meta(node, k)
            return [(GradientEdge(node, k), w.to(dtype))]
        direct = _nll_seed(r, w)
        if direct is not None:
            return direct
        diff = [i for i, _, _ in r.inputs]
        leaves = [
            s.detach().requires_grad_(i in diff) if isinstance(s, Tensor) else s
            for i, s in enumerate(r.saved)
        ]
        with torch.enable_grad():
            terms = r.terms(*leaves)
            total = (terms * w.to(terms.dtype)).sum()
            grads = torch.autograd.grad(total, [leaves[i] for i in diff], allow_unused=True)
        out = []
        for (_, node, k), g in zip(r.inputs, grads, strict=True):
            if g is not None:
                out.append((GradientEdge(node, k), g.to(_meta(node, k)[0])))
        return out

    def seeds(self) -> list[tuple[GradientEdge, Tensor]]:
        if len(self.reductions) == 1:  # cross-entropy: its seed in closed form
            direct = _nll_seed_of_rho(self.reductions[0], self.batch)
            if direct is not None:
                return direct
        merged: dict[tuple[int, int], tuple[GradientEdge, Tensor]] = {}
        with exact_arithmetic():
            for r in self.reductions:
                for edge, g in self._seeds_for(r, self._term_weights(r)):
                    key = (id(edge.node), edge.output_nr)
                    if key in merged:
                        merged[key] = (edge, merged[key][1] + g)
                    else:
                        merged[key] = (edge, g)
        return list(merged.values())

    # ------------------------------------------------------------------ run
    def run(self, retain_graph: bool) -> None:
        """The probe (when due), then the seeded backward (activation checkpointing, whose
        recomputed forward differs from the recorded one, refused with our error)."""
        from torch.utils.checkpoint import CheckpointError

        try:
            self._run(retain_graph)
        except CheckpointError as exc:
            raise UnsupportedModelError(
                "activation (gradient) checkpointing recomputes the forward pass during "
                "loss.backward(), which per-example clipping from the user's backward does "
                "not support: disable it (model.gradient_checkpointing_disable()); to save "
                "memory, use smaller physical batches instead (make_private's "
                "max_physical_batch_size=, or gradient accumulation), which keep the logical "
                "batch, sigma and epsilon; nothing was released"
            ) from exc

    def _run(self, retain_graph: bool) -> None:
        owners = [o for o in self.owners if o is not None]
        if any(o.probe_due() for o in owners):
            start = time.perf_counter()
            self.probe()
            for o in owners:
                o.record_probe(time.perf_counter() - start)
        seeds = self.seeds()
        for o in owners:
            o.begin_seeded()
        try:
            torch.autograd.backward(
                [e for e, _ in seeds], [g for _, g in seeds], retain_graph=retain_graph
            )
        finally:
            for o in owners:
                o.end_seeded()

    def probe(self, rng: random.Random | None = None) -> None:
        """Back-propagate one random counted term alone to the seams: it must reach one
        example only (the one it is mapped to). Raises :class:`LossMixingError`."""
        rng = rng or random.Random()
        seams = [(s, s.edge) for s in self.seams.values() if s.edge is not None]
        if not seams or self.batch < 2:
            return
        for r in self.reductions:
            w = self._term_weights(r)
            flat = torch.nonzero(w.reshape(-1)).flatten()
            if flat.numel() == 0:
                continue
            k = int(flat[rng.randrange(flat.numel())])
            one = torch.zeros(w.numel(), dtype=torch.float64, device=w.device)
            one[k] = 1.0
            with exact_arithmetic():
                seeds = self._seeds_for(r, one.reshape(w.shape))
            if not seeds:
                continue
            owners = [o for o in self.owners if o is not None]
            for o in owners:
                o.begin_probe()
            try:
                grads = torch.autograd.grad(
                    [e for e, _ in seeds],
                    [e for _, e in seams],
                    [g for _, g in seeds],
                    retain_graph=True,
                    allow_unused=True,
                )
            finally:
                for o in owners:
                    o.end_probe()
            hit = torch.zeros(self.batch, dtype=torch.bool)
            bad = torch.zeros(self.batch, dtype=torch.bool)
            for g in grads:
                if g is not None and g.ndim > 0 and g.shape[0] == self.batch:
                    rows = g.reshape(self.batch, -1)
                    hit |= (rows != 0).any(dim=1).cpu()
                    bad |= (~torch.isfinite(rows)).any(dim=1).cpu()
            expected = int(self._example_index(r).reshape(-1)[k]) if r.shape else 0
            where = torch.nonzero(hit).flatten().tolist()
            mismatch = where and r.mode == "mean" and r.mapped and where[0] != expected
            if len(where) > 1 or mismatch:
                if bool(bad.any()):
                    # a NaN/inf in an example's forward (e.g. in its data) reaches other
                    # terms' probes as 0 * NaN = NaN in a batched backward: refused all the
                    # same, but named for what it is (the step would refuse it too)
                    idx = torch.nonzero(bad).flatten().tolist()
                    raise NonFiniteGradientError(
                        f"gradient is not finite for {len(idx)} of {self.batch} examples "
                        f"(first at batch index {idx[0]}; a NaN or infinity in the model's "
                        "output or the loss): per-example clipping needs finite gradients. "
                        "Nothing was released."
                    )
                raise LossMixingError(
                    f"the loss mixes the examples of a batch: one term of its {r.name} "
                    f"(term {k} of shape {tuple(r.shape)}) depends on examples {where[:6]} of "
                    f"the batch of {self.batch}"
                    + ("" if len(where) > 1 else f" (mapped to example {expected})")
                    + ". DP-SGD needs one loss per example, each depending on its own example "
                    "only (no contrastive loss over the batch, no softmax over dim 0). "
                    "Nothing was released."
                )


def _fix(op: str, what: str) -> UnsupportedLossError:
    return UnsupportedLossError(
        f"the loss {what} ({op}): renyi needs the loss to be a sum or mean of per-example "
        "terms (e.g. criterion(model(x), y) with a torch.nn loss, reduction 'mean' or 'sum', "
        "or losses.mean() of per-example losses), to clip each example's gradient; nothing "
        "was computed"
    )


def analyse_loss(roots: Sequence[Tensor], seams: Mapping[Any, SeamInfo]) -> LossPlan | None:
    """Read the loss graph from ``roots`` down to ``seams`` (see the module docstring).

    Returns ``None`` if no seam is reached (not the loss of a captured forward pass).

    Raises:
        UnsupportedLossError: the loss cannot be split per example.
    """
    reached = _reached_seams(roots, seams)
    if not reached:
        return None
    owners: list[Any] = []
    for s in reached.values():
        if all(s.owner is not o for o in owners):
            owners.append(s.owner)
    if len(owners) > 1:
        raise UnsupportedLossError(
            f"one loss is computed from {len(owners)} forward passes of the model: their "
            "examples cannot be told apart (the same example could be clipped twice); call "
            "backward once per forward pass (for micro-batches: forward, backward, forward, "
            "backward, then step); nothing was computed"
        )
    if any(getattr(o, "closed", False) for o in owners):
        raise UnsupportedLossError(
            "backward of a loss computed from the output of a forward pass that is over (the "
            "model was called again, or the step was taken, before this backward): call "
            "backward right after the forward pass whose output the loss uses; nothing was "
            "computed"
        )
    batch = next(iter(reached.values())).batch
    paths: dict[Any, list[_Path]] = {}
    roots_found: list[Any] = []
    for t in roots:
        if t.grad_fn is None:
            continue
        if t.numel() != 1:
            raise UnsupportedLossError(
                f"backward() of a tensor of shape {tuple(t.shape)}: call it on the scalar "
                "loss (the sum or mean of per-example losses)"
            )
        roots_found.append(t.grad_fn)
        _walk_scalar(t.grad_fn, _Path(), paths, seams, depth=0)
    reductions = [_reduction(node, seams) for node in paths]
    _share_masks(reductions)
    for r in reductions:
        _finish(r, paths[r.node])
    if not all(math.isfinite(r.rho) for r in reductions):
        raise _fix("a factor that is not finite", "is multiplied by infinity or NaN")
    for r in reductions:
        r.owner_batch = batch
        _check_terms(r, seams)
        _decide_layout(r, batch, seams)
    plan = LossPlan(reductions, owners, batch, dict(reached))
    return plan


def _reached_seams(roots: Sequence[Tensor], seams: Mapping[Any, SeamInfo]) -> dict[Any, SeamInfo]:
    """The seams reachable from the roots (one pass over the graph, stopping at seams)."""
    if not seams:
        return {}
    found: dict[Any, SeamInfo] = {}
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in seams:
            found[node] = seams[node]
            continue
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return found


def _walk_scalar(
    node: Any, path: _Path, out: dict[Any, list[_Path]], seams: Mapping[Any, SeamInfo], depth: int
) -> None:
    """Follow the scalar part of the graph from ``node``; record every reduction reached with
    the constant factors and divisors on the way."""
    if depth > 200:
        raise _fix(type(node).__name__, "has more than 200 operations after its reduction")
    name = node.name()
    if node in seams:  # the model output itself is the (one-element) loss
        out.setdefault(node, []).append(path)
        return
    edges = _edges(node)
    if name in _PLAIN_REDUCTIONS or name in _FUSED:
        out.setdefault(node, []).append(path)
        return
    if "AccumulateGrad" in name:
        raise UnsupportedLossError(
            "a trainable tensor is added to the reduced loss (a penalty on parameters or a "
            "learnable loss weight): its gradient would not be clipped per example; use the "
            "optimizer's weight_decay for a penalty on the model's parameters"
        )
    for _, nxt, k in edges:
        shape = _shape(nxt, k)
        if _numel(shape) != 1 and nxt not in seams:
            raise _fix(name, "reduces the model's output by an operation other than sum or mean")
    for mult, div, nxt in _scalar_rule(node, name, edges):
        step = _Path(path.factor * mult, path.divisors + ([div] if div is not None else []))
        _walk_scalar(nxt, step, out, seams, depth + 1)


def _scalar_rule(
    node: Any, name: str, edges: list[tuple[int, Any, int]]
) -> list[tuple[float, float | None, Any]]:
    """(factor, divisor or None, next node) for each input of a scalar operation."""
    by_input = {i: n for i, n, _ in edges}
    if name in _SCALAR_PASS or name in ("SumBackward0", "MeanBackward0"):
        return [(1.0, None, n) for _, n, _ in edges]
    if name == "NegBackward0":
        return [(-1.0, None, n) for _, n, _ in edges]
    if name in ("AddBackward0", "SubBackward0"):
        alpha = _value(getattr(node, "_saved_alpha", 1))
        sign = -1.0 if name == "SubBackward0" else 1.0
        return [(1.0 if i == 0 else sign * alpha, None, n) for i, n in by_input.items()]
    if name in ("AddBackward1", "SubBackward1"):
        return [(1.0, None, n) for _, n, _ in edges]
    if name == "RsubBackward1":
        return [(-_value(getattr(node, "_saved_alpha", 1)), None, n) for _, n, _ in edges]
    if name == "MulBackward1":
        return [(_value(node._saved_other), None, n) for _, n, _ in edges]
    if name == "DivBackward1":
        return [(1.0 / _value(node._saved_other), None, n) for _, n, _ in edges]
    if name == "MulBackward0":
        if len(by_input) > 1:
            raise _fix(name, "multiplies two quantities computed from the model's output")
        i, n = next(iter(by_input.items()))
        other = node._saved_other if i == 0 else node._saved_self
        return [(_value(other), None, n)]
    if name == "DivBackward0":
        if 1 in by_input:
            raise _fix(name, "divides by a quantity computed from the model's output")
        return [(1.0, _value(node._saved_other), by_input[0])]
    raise _fix(name, "applies an operation other than a constant factor to the reduced loss")


def _reduction(node: Any, seams: Mapping[Any, SeamInfo]) -> Reduction:
    name = node.name()
    if node in seams:  # the model's one-element output is the loss
        shape = _shape(node, 0) or torch.Size([])
        return Reduction(node, "output", "sum", 0.0, shape, [(0, node, 0)], None, [])
    edges = _edges(node)
    if name in _PLAIN_REDUCTIONS:
        shape = _shape(edges[0][1], edges[0][2]) or torch.Size([])
        r = Reduction(node, name, _PLAIN_REDUCTIONS[name], 0.0, shape, edges[:1], None, [])
        _mask_from_product(r)
        return r
    mode = {1: "mean", 2: "sum"}.get(int(getattr(node, "_saved_reduction", 1)), "mean")
    saved = [node._saved_self]
    if name in _TWO_INPUTS:
        saved.append(node._saved_target)
    if any(i >= len(saved) for i, _, _ in edges):
        raise _fix(name, "has a weight that requires grad (a learnable loss weight)")
    terms = _FUSED[name](node)
    known = _terms_shape(name, node, saved)
    if known is None:
        with torch._C.DisableTorchFunctionSubclass(), exact_arithmetic(), torch.no_grad():
            known = terms(*[s.detach() for s in saved]).shape
    shape = torch.Size(known)
    r = Reduction(node, name, mode, 0.0, torch.Size(shape), edges, terms, saved)
    if name.startswith("NllLoss"):
        ignore = _signed(node._saved_ignore_index)
        target = node._saved_target
        r.counted = (target != ignore).reshape(shape)
        r.weights_total = node._saved_total_weight
    return r


def _terms_shape(name: str, node: Any, saved: list[Tensor]) -> torch.Size | None:
    """The shape of a fused loss's per-element terms, from its saved tensors (None: not
    known without evaluating them)."""
    if name == "MultilabelMarginLossBackward0":
        return torch.Size(node._saved_target.shape[:-1])
    if name.startswith("NllLoss") or name == "MultiMarginLossBackward0":
        return torch.Size(node._saved_target.shape)
    if name in _TWO_INPUTS and len(saved) == 2:
        return torch.broadcast_shapes(saved[0].shape, saved[1].shape)
    return None


def _mask_from_product(r: Reduction) -> None:
    """A sum of ``terms * mask`` (a tensor without gradient, the terms' shape): the mask's
    non-zero entries are the counted terms, its total the count a mean divides by."""
    _, node, _ = r.inputs[0]
    if node.name() != "MulBackward0":
        return
    by_input = {i: n for i, n, _ in _edges(node)}
    if len(by_input) != 1:
        return
    i = next(iter(by_input))
    other = node._saved_other if i == 0 else node._saved_self
    if isinstance(other, Tensor) and tuple(other.shape) == tuple(r.shape):
        r.counted = other != 0
        r.weights_total = other.detach().double().sum()


def _finish(r: Reduction, paths: list[_Path]) -> None:
    """Decide sum vs mean and the constant factor from the paths to the loss.

    The decision must not depend on the batch's values or size (else adding one example
    could turn every other example's loss from a sum into a mean). A sum over *counted*
    terms (an NLL loss with ``ignore_index``, ``(terms * mask).sum()``) followed by any
    division is a mean over each example's counted terms, whatever the divisor's value
    (``/ mask.sum()``, ``/ num_items_in_batch`` counted over several micro-batches, ``/ B``);
    a sum of unmasked terms stays a sum whatever it is divided by (``/ B``, ``kl_div``'s
    ``batchmean``, a constant such as the expected batch size times the output size, which
    equals the realised number of terms only in some batches)."""
    modes, rho = set(), 0.0
    for p in paths:
        mode = r.mode
        if mode == "sum" and p.divisors and r.counted is not None:
            mode = "mean"  # a normalised masked sum: a mean over each example's own terms
        modes.add(mode)
        rho += p.factor  # the divisions are not used: any of them may be a batch quantity
    if len(modes) > 1:
        raise _fix(r.name, "uses one reduction both as a sum and as a mean")
    r.mode = modes.pop()
    r.rho = rho


def _share_masks(reductions: list[Reduction]) -> None:
    """Reductions over terms of the same shape as an NLL loss's (label smoothing's second
    term) count the terms that loss counts (not the ignored ones)."""
    masks = {
        tuple(r.shape): (r.counted, r.weights_total)
        for r in reductions
        if r.name.startswith("NllLoss")
    }
    for r in reductions:
        if r.counted is None and tuple(r.shape) in masks:
            r.counted, r.weights_total = masks[tuple(r.shape)]


def _check_terms(r: Reduction, seams: Mapping[Any, SeamInfo]) -> None:
    """The per-element part under ``r`` must reach the model only through its outputs."""
    stack = [n for _, n, _ in r.inputs]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen or node in seams:
            continue
        seen.add(node)
        if len(seen) > 100_000:
            return
        if "AccumulateGrad" in node.name():
            var = getattr(node, "variable", None)
            shape = tuple(var.shape) if isinstance(var, Tensor) else "?"
            raise UnsupportedLossError(
                f"the loss uses a trainable tensor of shape {shape} other than through the "
                "model's output: its gradient would not be clipped per example. A penalty on "
                "the model's parameters belongs in the optimizer (weight_decay); a learnable "
                "temperature or loss weight must be computed inside the model's forward"
            )
        stack.extend(n for n, _ in node.next_functions if n is not None)


#: Operations that keep which example a term belongs to (for the layout search).
_LAYOUT_KEEP = frozenset(
    {
        "AliasBackward0",
        "ToCopyBackward0",
        "CloneBackward0",
        "LogSoftmaxBackward0",
        "SoftmaxBackward0",
        "SliceBackward0",
        "NegBackward0",
        "MulBackward0",
        "MulBackward1",
        "DivBackward0",
        "DivBackward1",
        "AddBackward0",
        "AddBackward1",
        "SubBackward0",
        "SubBackward1",
        "ExpBackward0",
        "LogBackward0",
        "SigmoidBackward0",
        "TanhBackward0",
        "MaskedFillBackward0",
        "SumBackward1",
        "MeanBackward1",
        "NllLossBackward0",
        "NllLoss2DBackward0",
    }
)


def _decide_layout(r: Reduction, batch: int, seams: Mapping[Any, SeamInfo]) -> None:
    """How ``r``'s terms map to examples (needed only for a mean over counted terms)."""
    shape = r.shape
    if len(shape) == 0 or batch <= 1 or shape[0] == batch:
        r.layout = "batch"
        return
    if r.mode == "sum" or (r.counted is None and _numel(shape) % batch == 0):
        # the per-example weights do not depend on the mapping; the probe's check of which
        # example a term belongs to does: found where it can be
        found = _find_flatten(r, shape[0], batch, seams) if shape[0] % batch == 0 else None
        r.layout = found or "batch"
        r.mapped = found is not None
        return
    lead = shape[0]
    if lead % batch == 0:
        layout = _find_flatten(r, lead, batch, seams)
        if layout is not None:
            r.layout = layout
            return
    raise UnsupportedLossError(
        f"the loss averages {lead} terms ({r.name} over a tensor of shape {tuple(shape)}) "
        f"that renyi cannot attribute to the {batch} examples of the batch (neither batch "
        "along dim 0 nor flattened from [B, T, ...] or [T, B, ...] by a view); reduce per "
        "example first (e.g. reduction='none', then .view(B, -1) and a per-example mean), or "
        "use reduction='sum'"
    )


def _find_flatten(r: Reduction, lead: int, batch: int, seams: Mapping[Any, SeamInfo]) -> str | None:
    node = r.inputs[0][1]
    for _ in range(64):
        if node is None or node in seams:
            return None
        name = node.name()
        if name in ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"):
            src = tuple(getattr(node, "_saved_self_sym_sizes", ()) or ())
            if len(src) >= 2 and src[0] * src[1] == lead:
                if src[0] == batch:
                    return "flat"
                if src[1] == batch:
                    return "seqfirst"
            if not src or src[0] != lead:
                return None
        elif name not in _LAYOUT_KEEP:
            return None
        nxt = _edges(node)
        if not nxt:
            return None
        # follow the input that carries the terms (the first with the same leading size)
        cand = [(n, j) for _, n, j in nxt if (_shape(n, j) or (0,))[:1] == (lead,)]
        if not cand:
            cand = [(n, j) for _, n, j in nxt if _numel(_shape(n, j)) > 1]
        if not cand:
            return None
        node = cand[0][0]
    return None
