"""Per-example gradients with ``torch.func`` and the checks a DP-SGD model must pass.

DP-SGD (Abadi et al. 2016, Algorithm 1) bounds each example's influence on a step by clipping
that example's gradient, so it needs the gradient of every example's loss separately. This
module computes them with ``torch.func`` (``functional_call`` + ``vmap(grad(...))``), which
works for any model built from standard layers without per-layer code:

* :func:`per_example_grads` differentiates the whole model once per example, vectorised;
* :func:`layer_per_example_grads` does the same for one layer from its recorded input and
  output gradient (used by :class:`renyi.dpsgd.clipping.ClippedGradientEngine` for layers that
  have no ghost-norm rule);
* :func:`check_model` refuses, before training, layers that mix examples (BatchNorm and friends),
  since for them "the gradient of one example" is not defined and the clipping bound would not
  hold;
* :func:`per_example_losses` turns a loss module or callable into one loss per example.

Neighbouring relation: nothing here is private by itself; the per-example gradients are the
inputs of clipping, whose bound holds for add/remove-one and replace-one neighbours alike.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(3, 2)
    >>> grads, losses = per_example_grads(model, nn.CrossEntropyLoss(),
    ...                                   torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]))
    >>> tuple(grads["weight"].shape), tuple(losses.shape)
    ((5, 2, 3), (5,))
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from renyi._validation import fail
from renyi.errors import PrivacyParameterError, RenyiError

if TYPE_CHECKING:  # pragma: no cover
    from renyi.dpsgd.replay import RandomTape

__all__ = [
    "LossFn",
    "NonFiniteGradientError",
    "UnsupportedModelError",
    "check_model",
    "layer_per_example_grads",
    "per_example_grads",
    "per_example_losses",
    "trainable_parameters",
]

#: A loss: ``loss_fn(outputs, targets)``. A ``torch.nn`` loss module (any reduction: it is
#: evaluated with ``reduction="none"``) or a callable returning one loss per example, shape [B].
LossFn = Callable[[Tensor, Tensor], Tensor]

Inputs = Tensor | tuple[Tensor, ...]


class UnsupportedModelError(PrivacyParameterError):
    """The model cannot be trained with per-example clipping as it stands.

    Raised before any training step, e.g. for BatchNorm (which mixes the examples of a batch,
    so no example has a gradient of its own) or a loss that does not give one value per example.
    """


class NonFiniteGradientError(RenyiError, ArithmeticError):
    """A per-example loss or gradient norm is NaN or infinite: clipping it is meaningless.

    Raised before any gradient is returned. Lower the learning rate, check the data, or
    use a numerically safer loss.
    """


def autocast_enabled(device: str) -> bool:
    """``torch.is_autocast_enabled(device)``, also on torch < 2.4 (pyproject allows 2.2),
    whose ``is_autocast_enabled()`` takes no device (it is CUDA's) and has a CPU twin."""
    try:
        return bool(torch.is_autocast_enabled(device))
    except TypeError:  # torch < 2.4
        if device == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


def autocast_devices() -> list[str]:
    """The devices (``"cpu"``, ``"cuda"`` when available) whose autocast is on."""
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    return [d for d in devices if autocast_enabled(d)]


class exact_arithmetic:
    """Autocast off, for the engine's book-keeping: norms, clipping weights, clipped sums and
    the loss's seeds must not be computed in bfloat16/float16 when the caller's forward runs
    under autocast (the products would be rounded).

    Enters ``torch.autocast(..., enabled=False)`` only for the devices where autocast is on:
    outside autocast (the common case) entering it changes nothing and costs a few
    microseconds a call, several times a step.
    """

    __slots__ = ("_cms",)

    def __enter__(self) -> None:
        cms = [torch.autocast(d, enabled=False) for d in autocast_devices()]
        for cm in cms:
            cm.__enter__()
        self._cms = cms

    def __exit__(self, *exc: object) -> None:
        for cm in reversed(self._cms):
            cm.__exit__(*exc)


# Layers that mix the examples of a batch in training mode, with the fix to suggest.
_MIXING_LAYERS: tuple[tuple[type[nn.Module], str], ...] = (
    (
        nn.modules.batchnorm._BatchNorm,
        "it normalises with statistics of the whole batch, so each example's output "
        "depends on the others; use nn.GroupNorm or nn.LayerNorm instead",
    ),
)


def _mixing_reason(module: nn.Module) -> str | None:
    for kind, why in _MIXING_LAYERS:
        if isinstance(module, kind):
            return why
    if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats:
        return (
            "track_running_stats=True accumulates statistics over all examples into buffers "
            "that are released with the model; use track_running_stats=False"
        )
    if isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.scale_grad_by_freq:
        return (
            "scale_grad_by_freq=True scales each gradient by word counts of the whole batch; "
            "use scale_grad_by_freq=False"
        )
    return None


def check_model(model: nn.Module) -> None:
    """Refuse models in which one example's gradient depends on the other examples.

    Checked: any BatchNorm (``nn.BatchNorm1d/2d/3d``, ``SyncBatchNorm``, lazy variants), an
    InstanceNorm with ``track_running_stats=True`` (its running statistics pool all examples),
    ``nn.Embedding``/``nn.EmbeddingBag`` with ``scale_grad_by_freq=True``, and a model without
    trainable parameters.

    Raises:
        UnsupportedModelError: naming the offending submodule and the fix.
    """
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(
            f"model={type(model).__name__} is invalid: expected a torch.nn.Module"
        )
    for name, module in model.named_modules():
        why = _mixing_reason(module)
        if why is not None:
            raise UnsupportedModelError(
                f"model layer {name or '<root>'!r} ({type(module).__name__}) is not supported by "
                f"DP-SGD: {why}"
            )
    if not trainable_parameters(model):
        raise UnsupportedModelError("model has no trainable parameters (requires_grad=True)")


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters that receive gradients, by name, in ``model.named_parameters()`` order."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _batch_size(inputs: Inputs) -> int:
    first = inputs[0] if isinstance(inputs, tuple) else inputs
    if not isinstance(first, Tensor) or first.ndim == 0:
        raise fail("inputs", type(first).__name__, "a tensor (or tuple of tensors) [B, ...]")
    return int(first.shape[0])


def _none_reduction(loss_fn: nn.Module) -> tuple[nn.Module, str]:
    reduction = str(getattr(loss_fn, "reduction", "mean"))
    if reduction == "none":
        return loss_fn, reduction
    clone = copy.copy(loss_fn)  # shallow: shares weights/buffers, only the attribute differs
    clone.__dict__["reduction"] = "none"
    return clone, reduction


def per_example_losses(loss_fn: LossFn | nn.Module, outputs: Tensor, targets: Tensor) -> Tensor:
    """One loss per example, shape ``[B]``.

    A ``torch.nn`` loss module (``nn.modules.loss._Loss``) is evaluated with
    ``reduction="none"``; extra trailing dimensions (e.g. per-output ``MSELoss``) are reduced
    per example the way its own reduction would (mean or sum). Any other callable must already
    return shape ``[B]``.

    Raises:
        UnsupportedModelError: if the loss does not give exactly one value per example.
    """
    if isinstance(outputs, Tensor):
        batch = int(outputs.shape[0]) if outputs.ndim > 0 else -1
    else:  # a model returning a tuple or dict of outputs: one loss per target
        batch = int(targets.shape[0]) if isinstance(targets, Tensor) and targets.ndim else -1
    if isinstance(loss_fn, nn.modules.loss._Loss):
        fn, reduction = _none_reduction(loss_fn)
        losses = fn(outputs, targets)
        if losses.ndim > 1 and losses.shape[0] == batch:
            dims = tuple(range(1, losses.ndim))
            losses = losses.sum(dim=dims) if reduction == "sum" else losses.mean(dim=dims)
    else:
        losses = loss_fn(outputs, targets)
    if not isinstance(losses, Tensor) or losses.ndim != 1 or losses.shape[0] != batch:
        shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
        raise UnsupportedModelError(
            f"loss_fn returned {shape} for a batch of {batch}: expected one loss per example, "
            f"shape ({batch},) (pass a torch.nn loss module or a callable with reduction='none')"
        )
    return losses


def check_finite_losses(losses: Tensor) -> None:
    """Raise :class:`NonFiniteGradientError` if any per-example loss is NaN or infinite."""
    values = losses.detach()
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        idx = torch.nonzero(bad).flatten()
        raise NonFiniteGradientError(
            f"loss is not finite for {idx.numel()} of {losses.numel()} examples "
            f"(first at batch index {int(idx[0])}, value {float(values[idx[0]])}): "
            "per-example clipping needs finite losses"
        )


def per_example_grads(
    model: nn.Module,
    loss_fn: LossFn | nn.Module,
    inputs: Inputs,
    targets: Tensor,
    *,
    chunk_size: int | None = None,
    batch_first: bool = True,
) -> tuple[dict[str, Tensor], Tensor]:
    """Gradient of every example's loss w.r.t. every trainable parameter, via ``torch.func``.

    ``vmap(grad(loss of one example))`` over the batch, with the model's buffers passed to
    ``functional_call`` and independent randomness per example (dropout). Each example is run
    as a batch of one, so the result equals a loop of ``loss_i.backward()`` calls.

    Args:
        model: any ``nn.Module`` whose forward takes ``inputs`` (a tensor ``[B, ...]`` or a
            tuple of them, batched along dim 0).
        loss_fn: see :func:`per_example_losses`.
        inputs, targets: the batch, ``B`` examples along dim 0.
        chunk_size: examples vectorised at once (``None``: all); lowers peak memory.
        batch_first: ``False``: inputs of two or more dimensions are batched along dim 1
            (``[T, B, ...]``, Opacus's meaning); targets stay batched along dim 0.

    Returns:
        ``(grads, losses)``: ``grads[name]`` has shape ``[B, *param.shape]``; ``losses`` is
        ``[B]`` (detached).
    """
    params = {n: p.detach() for n, p in trainable_parameters(model).items()}
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    dims = tuple(0 if batch_first or t.ndim < 2 else 1 for t in args)

    def loss_one(
        p: dict[str, Tensor], b: dict[str, Tensor], x: tuple[Tensor, ...], y: Tensor
    ) -> tuple[Tensor, Tensor]:
        xs = tuple(t.unsqueeze(d) for t, d in zip(x, dims, strict=True))
        out = functional_call(model, (p, b), xs)
        loss = per_example_losses(loss_fn, out, y.unsqueeze(0))
        return loss.sum(), loss.detach()

    fn = vmap(
        grad(loss_one, has_aux=True),
        in_dims=(None, None, dims, 0),
        randomness="different",
        chunk_size=chunk_size,
    )
    with _functorch_errors(f"the model ({type(model).__name__})", whole_model=True):
        grads, losses = fn(params, buffers, args, targets)
    return dict(grads), losses.reshape(-1)


@contextmanager
def _functorch_errors(what: str, whole_model: bool) -> Iterator[None]:
    """Our error for what ``torch.func`` cannot differentiate per example."""
    try:
        yield
    except RuntimeError as err:
        text = str(err)
        if "autograd.Function" in text or "setup_context" in text:
            if not whole_model:  # the caller differentiates the layer example by example
                raise _CustomFunctionError(text) from None
            fix = (
                "train with mode='auto' (grad_sample_mode='hooks'/'ghost') and register a "
                "per-sample rule for the layer type that calls it"
                if whole_model
                else "register a per-sample rule for the layer type"
            )
            raise UnsupportedModelError(
                f"{what} calls a custom torch.autograd.Function that torch.func cannot "
                "differentiate per example (no setup_context staticmethod / vmap support): "
                f"{fix} with renyi.dpsgd.register_grad_sampler(LayerType) (Opacus's "
                "signature: fn(layer, activations, backprops) -> {parameter: [B, ...]}), or "
                "give the Function a setup_context staticmethod and generate_vmap_rule = True"
            ) from None
        if "randomness" in text and "vmap" in text:
            raise UnsupportedModelError(
                f"{what} draws random numbers (e.g. dropout) inside a layer that owns "
                "parameters and has no per-example rule, so its per-example gradient cannot "
                "be recomputed with the same random draws: move the randomness into its own "
                "module (nn.Dropout) or outside the layer, register a rule with "
                "renyi.dpsgd.register_grad_sampler, or train with grad_sample_mode='vmap' "
                "(mode='vmap')"
            ) from None
        if "vmap" in text and (".item()" in text or "data-dependent control flow" in text):
            where = (
                "(renyi runs the whole model per example when the layer-wise path cannot: a "
                "trainable parameter shared by modules, e.g. tied input/output embeddings whose "
                "embedding has no per-example rule, or used outside its module): untie or "
                "freeze it (tie_word_embeddings=False, or LoRA adapters), or register a "
                "per-sample rule with renyi.dpsgd.register_grad_sampler"
                if whole_model
                else "register a per-sample rule with renyi.dpsgd.register_grad_sampler"
            )
            raise UnsupportedModelError(
                f"torch.func cannot run {what} per example: its forward branches on a tensor's "
                "value (.item() or data-dependent control flow, e.g. Hugging Face's attention "
                f"mask construction) {where}; nothing was released"
            ) from None
        raise


class _CustomFunctionError(UnsupportedModelError):
    """A layer's forward calls a custom ``autograd.Function`` that ``torch.func`` cannot run."""


def _row(t: Any, d: int | None, i: int) -> Any:
    """Example ``i`` of ``t`` batched along ``d`` (kept as a batch of one), or ``t`` shared."""
    return t if d is None else t.narrow(d, i, 1)


def _empty_tape() -> RandomTape:
    from renyi.dpsgd.replay import RandomTape

    return RandomTape()


@contextmanager
def _replaying(draws: RandomTape | None, what: str) -> Iterator[None]:
    """The recorded draws of a layer call given back whole, or nothing (no draws)."""
    if draws is None:
        yield
        return
    from renyi.dpsgd.replay import ReplayError

    try:
        with draws.replay(None):
            yield
    except ReplayError as err:
        raise UnsupportedModelError(
            f"{what} draws random numbers that cannot be given back to each example (a row "
            "per example, e.g. dropout on its input, or draws its batched call did not make) "
            "inside a layer that owns parameters and has no per-example rule, so its "
            f"per-example gradient cannot be recomputed with the same random draws ({err}): "
            "move the randomness into its own module (nn.Dropout) or outside the layer, "
            "register a rule with renyi.dpsgd.register_grad_sampler, or train with "
            "grad_sample_mode='vmap' (mode='vmap'); nothing was released"
        ) from None


def _is_batched(t: Any, batch: int) -> bool:
    return isinstance(t, Tensor) and t.ndim > 0 and t.shape[0] == batch


def layer_per_example_grads(
    module: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    grad_outputs: Sequence[Tensor | None],
    param_names: Sequence[str],
    batch: int,
    *,
    batch_dims: Mapping[str, int | None] | None = None,
    draws: RandomTape | None = None,
) -> dict[str, Tensor]:
    """Per-example gradients of one layer's own parameters from its input and output gradient.

    For a layer ``y = f(theta, x)`` called on the batch, the gradient of example ``i``'s loss
    w.r.t. ``theta`` is ``J_theta f(theta, x_i)^T dL_i/dy_i`` (chain rule; example ``i``'s loss
    depends on ``theta`` through ``y_i`` only when no layer mixes examples). Computed as
    ``vmap(grad(<f(theta, x_i), dL/dy_i>))`` over the batch; the layer is called on each
    example in its own layout (a batch of one along each tensor's batch dimension). A layer
    whose forward calls a custom ``torch.autograd.Function`` that ``torch.func`` cannot
    transform (no ``setup_context``, e.g. peft's LoHa ``HadaWeight``) is differentiated one
    example at a time with plain autograd instead (same result, ``B`` calls of the layer).

    Random draws: a layer that draws random numbers in its forward is refused unless
    ``draws`` holds the draws of the recorded call (:class:`~renyi.dpsgd.replay.RandomTape`).
    Then each example's run gets them back whole, which is exact for draws shared by the
    whole batch (one shape for the batch and for one example: peft's LyCORIS
    ``module_dropout`` gate ``torch.rand(1)`` and ``rank_dropout`` mask
    ``torch.rand(out_features)``); a draw with a row per example (dropout on the layer's
    input) is refused (:class:`UnsupportedModelError`).

    Args:
        module: the layer; its forward must treat examples independently.
        args, kwargs: its recorded call; tensors with leading dimension ``batch`` are batched,
            everything else is shared by all examples.
        grad_outputs: ``dL/dy`` for each tensor output (``None`` where unused), in the order of
            the flattened output (tensor, or tuple/list of tensors).
        param_names: names (local to ``module``) of the parameters to differentiate.
        batch: the batch size.
        batch_dims: the batch dimension of each tensor (``{"arg<i>" | "kw:<name>" |
            "out<i>": dim or None}``, see :mod:`renyi.dpsgd.layout`); default: dim 0 where
            its size is ``batch``.
        draws: the random draws of the recorded call (``None``: it drew none).

    Returns:
        ``{name: [B, *param.shape]}``.
    """
    params = {n: module.get_parameter(n).detach() for n in param_names}

    def dim_of(slot: str, t: Any) -> int | None:
        if batch_dims is not None and slot in batch_dims:
            return batch_dims[slot]
        return 0 if _is_batched(t, batch) else None

    arg_dims = tuple(dim_of(f"arg{i}", a) for i, a in enumerate(args))
    kw_dims = {k: dim_of(f"kw:{k}", v) for k, v in kwargs.items()}
    kw_batched = {k: v for k, v in kwargs.items() if kw_dims[k] is not None}
    kw_shared = {k: v for k, v in kwargs.items() if kw_dims[k] is None}
    gouts = tuple(grad_outputs)  # one per tensor output; None where it did not reach the loss
    out_dims = tuple(
        None if g is None else (dim_of(f"out{i}", g) or 0) for i, g in enumerate(gouts)
    )

    def inner(
        p: dict[str, Tensor],
        xa: tuple[Any, ...],
        xk: dict[str, Tensor],
        gy: tuple[Tensor | None, ...],
    ) -> Tensor:
        call_args = tuple(
            a if d is None else a.unsqueeze(d) for a, d in zip(xa, arg_dims, strict=True)
        )
        call_kwargs = {k: v.unsqueeze(kw_dims[k] or 0) for k, v in xk.items()} | kw_shared
        out = functional_call(module, p, call_args, call_kwargs)
        outs = _flatten_outputs(out)
        total = torch.zeros((), dtype=next(iter(p.values())).dtype, device=outs[0].device)
        for o, g, d in zip(outs, gy, out_dims, strict=True):
            if g is not None:
                total = total + (o * g.unsqueeze(d or 0)).sum()
        return total

    fn = vmap(
        grad(inner),
        in_dims=(None, arg_dims, {k: kw_dims[k] for k in kw_batched}, out_dims),
        randomness="error" if draws is None else "same",
    )
    what = f"a layer of type {type(module).__name__}"
    try:
        with _functorch_errors(what, whole_model=False), _replaying(draws, what):
            result: dict[str, Tensor] = fn(params, tuple(args), kw_batched, gouts)
    except UnsupportedModelError as err:
        if not isinstance(err, _CustomFunctionError):
            raise
        # torch.func cannot run the layer: plain autograd, one example at a time
        result = {n: p.new_zeros(batch, *p.shape) for n, p in params.items()}
        # no draws recorded: an empty tape, which refuses any draw (never fresh ones)
        tape = draws if draws is not None else _empty_tape()
        for i in range(batch):
            one = {n: p.clone().requires_grad_(True) for n, p in params.items()}
            xa = tuple(_row(a, d, i) for a, d in zip(args, arg_dims, strict=True))
            xk = {k: _row(v, kw_dims[k], i) for k, v in kwargs.items()}
            with torch.enable_grad(), _replaying(tape, what):
                outs = _flatten_outputs(functional_call(module, one, xa, xk))
                terms = [
                    (o * _row(g, d, i)).sum()
                    for o, g, d in zip(outs, gouts, out_dims, strict=True)
                    if g is not None and o.requires_grad
                ]
                if not terms:
                    continue
                got = torch.autograd.grad(sum(terms), list(one.values()), allow_unused=True)
            for n, g in zip(one, got, strict=True):
                if g is not None:
                    result[n][i] = g
    # detached: a layer whose forward also uses other layers' parameters (peft's DoRA
    # magnitude calls its LoRA factors) would otherwise hand back gradients that carry a
    # graph to those parameters
    return {n: g.detach() for n, g in result.items()}


def _flatten_outputs(out: Any) -> list[Tensor]:
    """The tensors of a layer's output, depth first (nested tuples, lists and dicts)."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for o in out for t in _flatten_outputs(o)]
    if isinstance(out, Mapping):
        return [t for o in out.values() for t in _flatten_outputs(o)]
    return []
