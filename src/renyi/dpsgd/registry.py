"""User rules for per-example gradients of custom layers (Opacus's ``register_grad_sampler``).

A layer type the engine has no rule for is handled by ``torch.func`` (per-layer ``vmap``),
which is exact but may be slow, or impossible for layers ``vmap`` cannot batch. A rule
registered here gives the per-example gradients of the layer's own parameters from the
layer's recorded input and output gradient, with the signature Opacus users already write::

    @register_grad_sampler(MyScale)
    def my_scale_grads(layer, activations, backprops):
        # activations: the layer's positional tensor inputs; backprops: dL_i/d(output),
        # one row per example (batch along dim 0)
        return {layer.scale: (activations[0] * backprops).sum(dim=1)}

Keys may be the parameters themselves (as Opacus) or their names local to the layer; each
value is ``[B, *param.shape]``. A rule is trusted only once it has been checked against a
batch-of-one computation (the layer's own forward on each example alone, plain autograd):
with ``example=(layer, inputs)`` at registration, otherwise by the engine on the first batch
that uses it, before any clipped sum is returned. A wrong rule raises
:class:`~renyi.dpsgd.grad_sample.UnsupportedModelError` naming the layer type and the
parameter; it is never used silently.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Scale(nn.Module):
    ...     def __init__(self, d):
    ...         super().__init__()
    ...         self.scale = nn.Parameter(torch.ones(d))
    ...     def forward(self, x):
    ...         return x * self.scale
    >>> def scale_grads(layer, activations, backprops):
    ...     return {layer.scale: activations[0] * backprops}
    >>> _ = register_grad_sampler(Scale, scale_grads, example=(Scale(3), (torch.randn(4, 3),)))
    >>> rule_for(Scale(3)) is not None
    True
    >>> unregister_grad_sampler(Scale)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from renyi._validation import fail
from renyi.dpsgd.grad_sample import UnsupportedModelError

__all__ = [
    "GradSampler",
    "register_grad_sampler",
    "rule_for",
    "unregister_grad_sampler",
    "verify_rule",
]

#: ``fn(layer, activations, backprops) -> {parameter or local name: [B, *shape]}``.
GradSampler = Callable[[nn.Module, list[Tensor], Tensor], Mapping[Any, Tensor]]


@dataclass
class Rule:
    """A registered rule and whether it has been checked against batch-of-one."""

    layer_type: type[nn.Module]
    fn: GradSampler
    verified: bool = False


_RULES: dict[type[nn.Module], Rule] = {}


def register_grad_sampler(
    layer_type: type[nn.Module] | Sequence[type[nn.Module]],
    fn: GradSampler | None = None,
    *,
    example: tuple[nn.Module, tuple[Tensor, ...]] | None = None,
) -> Any:
    """Register ``fn`` as the per-example gradient rule of ``layer_type`` (also a decorator).

    Args:
        layer_type: a ``nn.Module`` subclass (or a sequence of them).
        fn: the rule (see the module docstring); omitted, returns a decorator.
        example: ``(layer, inputs)`` with a batch of at least 2 examples: the rule is checked
            now against a batch-of-one loop with random output gradients; without it, the
            engine checks it on the first batch that uses it.

    Raises:
        UnsupportedModelError: the example check fails (the rule is not registered).
    """
    types = tuple(layer_type) if isinstance(layer_type, Sequence) else (layer_type,)
    for t in types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise fail("layer_type", t, "a torch.nn.Module subclass")

    def decorate(f: GradSampler) -> GradSampler:
        if not callable(f):
            raise fail("fn", f, "a callable (layer, activations, backprops) -> grads")
        verified = False
        if example is not None:
            layer, inputs = example
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            with torch.enable_grad():
                out = layer(*args)
            outs = out if isinstance(out, tuple) else (out,)
            gouts = [torch.randn_like(o) if isinstance(o, Tensor) else None for o in outs]
            verify_rule(layer, f, args, {}, gouts)
            verified = True
        for t in types:
            _RULES[t] = Rule(t, f, verified)
        return f

    return decorate if fn is None else decorate(fn)


def unregister_grad_sampler(layer_type: type[nn.Module]) -> None:
    """Remove the rule of ``layer_type`` (no error if there is none)."""
    _RULES.pop(layer_type, None)


def rule_for(module: nn.Module) -> Rule | None:
    """The registered rule of ``type(module)`` (exact type, then its base classes)."""
    for cls in type(module).__mro__:
        if cls in _RULES:
            return _RULES[cls]
    return None


def apply_rule(
    rule: Rule,
    module: nn.Module,
    args: Sequence[Any],
    grad_outputs: Sequence[Tensor | None],
    names: Sequence[str],
) -> dict[str, Tensor]:
    """Run ``rule`` on one recorded call; ``{local name: [B, *shape]}`` for ``names``."""
    acts = [a for a in args if isinstance(a, Tensor)]
    back = grad_outputs[0] if grad_outputs else None
    if back is None:
        raise UnsupportedModelError(
            f"rule for {type(module).__name__}: the layer's first output did not reach the loss"
        )
    raw = rule.fn(module, acts, back)
    own = dict(module.named_parameters(recurse=False))
    by_id = {id(p): n for n, p in own.items()}
    out: dict[str, Tensor] = {}
    for k, v in dict(raw).items():
        name = by_id.get(id(k)) if isinstance(k, Tensor) else k
        if name is None or name not in own:
            raise UnsupportedModelError(
                f"rule for {type(module).__name__} returned a gradient for {k!r}, which is not "
                "a parameter of the layer"
            )
        out[name] = v
    missing = [n for n in names if n not in out]
    if missing:
        raise UnsupportedModelError(
            f"rule for {type(module).__name__} gave no per-example gradient for {missing}"
        )
    batch = int(back.shape[0])
    for n in names:
        want = (batch, *own[n].shape)
        if tuple(out[n].shape) != want:
            raise UnsupportedModelError(
                f"rule for {type(module).__name__} returned shape {tuple(out[n].shape)} for "
                f"{n!r}: expected {want} (one gradient per example)"
            )
    return {n: out[n] for n in names}


def verify_rule(
    module: nn.Module,
    fn: GradSampler | Rule,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    grad_outputs: Sequence[Tensor | None],
) -> None:
    """Check a rule on one call against the layer run on each example alone (autograd).

    Example ``j``'s reference is ``grad <module(x_j), dL/dy_j>`` w.r.t. the layer's own
    trainable parameters. Raises :class:`UnsupportedModelError` on a mismatch beyond
    floating-point rounding of the dtype.
    """
    rule = fn if isinstance(fn, Rule) else Rule(type(module), fn)
    names = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
    params = [dict(module.named_parameters(recurse=False))[n] for n in names]
    tensors = [a for a in args if isinstance(a, Tensor)]
    if not tensors or tensors[0].ndim == 0:
        raise UnsupportedModelError(f"{type(module).__name__}: no batched tensor input to check")
    batch = int(tensors[0].shape[0])
    if batch < 2:
        raise UnsupportedModelError(
            f"checking the rule of {type(module).__name__} needs at least 2 examples"
        )
    got = apply_rule(rule, module, args, grad_outputs, names)
    dtypes = {t.dtype for t in (*tensors, *params)}
    if dtypes & {torch.float16, torch.bfloat16}:
        tol = 5e-2
    else:
        tol = 2e-4 if torch.float32 in dtypes else 1e-8
    for j in range(batch):
        one = [
            a[j : j + 1] if isinstance(a, Tensor) and a.ndim > 0 and a.shape[0] == batch else a
            for a in args
        ]
        one_kw = {
            k: v[j : j + 1] if isinstance(v, Tensor) and v.ndim > 0 and v.shape[0] == batch else v
            for k, v in kwargs.items()
        }
        with torch.enable_grad():
            out = module(*one, **one_kw)
            outs = out if isinstance(out, tuple | list) else (out,)
            total = torch.zeros((), dtype=params[0].dtype, device=params[0].device)
            for o, g in zip(outs, grad_outputs, strict=False):
                if isinstance(o, Tensor) and g is not None:
                    total = total + (o * g[j : j + 1]).sum()
            ref = torch.autograd.grad(total, params, allow_unused=True)
        for n, p, r in zip(names, params, ref, strict=True):
            want = torch.zeros_like(p) if r is None else r
            g = got[n][j].detach().double()
            w = want.detach().double()
            dist = float((g - w).norm())
            scale = max(float(w.norm()), float(g.norm())) + 1e-30
            if not (math.isfinite(dist) and dist <= tol * scale):
                raise UnsupportedModelError(
                    f"the per-example gradient rule registered for {type(module).__name__} is "
                    f"wrong for parameter {n!r}: example {j} differs from a batch-of-one "
                    f"computation by {dist:.3g} (reference norm {float(w.norm()):.3g})"
                )
    rule.verified = True
