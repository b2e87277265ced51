"""Per-example clipping for DP-SGD: the sum of clipped per-example gradients of a batch.

DP-SGD (Abadi et al. 2016, Algorithm 1) releases ``sum_i clip(g_i) + N(0, sigma^2 S^2 I)``.
The privacy analysis needs one fact from this module: for neighbouring batches (one example
added or removed; or replaced, which moves the sum by at most twice as much) the clipped sum
moves by at most the **sensitivity** ``S`` in L2 norm, because every clipped per-example
gradient has norm at most ``S``:

* ``flat``: ``clip(g) = g * min(1, C / ||g||)`` over all parameters jointly, ``S = C``.
* ``per_layer``: each parameter tensor ``l`` is clipped to its own ``C_l``; the whole clipped
  gradient then has norm at most ``sqrt(sum_l C_l^2) = S`` (McMahan et al. 2018, "A general
  approach to adding differential privacy to iterative training procedures", Sec. 3). A single
  ``C`` is split evenly, ``C_l = C / sqrt(L)``, so that ``S = C``.
* ``automatic`` (optional, never the default): ``clip(g) = C g / (||g|| + gamma)``, the
  normalised clipping "AUTO-S" of Bu et al. 2022 ("Automatic clipping: differentially private
  deep learning made easier and stronger", Eq. 4.1); ``||clip(g)|| < C = S``.

The clipping weights carry a relative safety margin of ``1e-6`` (a gradient of norm exactly
``C`` is scaled by ``1 / (1 + 1e-6)``), so that rounding in float32 does not push a clipped
norm above ``C``.

Per-example gradients come from :mod:`renyi.dpsgd.ghost` (norms from activations, no
per-example gradient tensors) or :mod:`renyi.dpsgd.grad_sample` (``torch.func.vmap``),
chosen per layer; see :class:`ClippedGradientEngine`.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=1.0)
    >>> grads, losses, norms = engine.clipped_grad_sum(torch.randn(6, 4), torch.arange(6) % 3)
    >>> engine.mode, sorted(grads) == sorted(n for n, _ in model.named_parameters())
    ('ghost', True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from renyi._validation import check_int, check_positive, fail
from renyi.dpsgd.ghost import LayerGrads, PerExampleGrads, ghost_layer_grads, supports_ghost
from renyi.dpsgd.grad_sample import (
    Inputs,
    LossFn,
    NonFiniteGradientError,
    UnsupportedModelError,
    _flatten_outputs,
    check_finite_losses,
    check_model,
    layer_per_example_grads,
    per_example_grads,
    per_example_losses,
    trainable_parameters,
)

__all__ = ["CLIP_MARGIN", "ClippedGradientEngine", "clipping_weights"]

Clipping = Literal["flat", "per_layer", "automatic"]
Mode = Literal["auto", "vmap", "ghost"]

#: Relative margin of the clipping weights: norms are treated as ``(1 + CLIP_MARGIN)`` larger.
CLIP_MARGIN = 1e-6


def clipping_weights(
    sq_norms: Mapping[str, Tensor],
    max_grad_norm: float | Mapping[str, float],
    clipping: Clipping = "flat",
    gamma: float = 0.01,
    total: Tensor | None = None,
) -> dict[str, Tensor]:
    """Per-example weights ``w_i`` such that ``w_i g_i`` is the clipped gradient, per parameter.

    Args:
        sq_norms: per-example squared gradient norm of each parameter, ``{name: [B]}``.
        max_grad_norm: ``C`` (flat, automatic) or ``{name: C_l}`` (per_layer).
        clipping: ``"flat"``, ``"per_layer"`` or ``"automatic"`` (see the module docstring).
        gamma: the stability constant of automatic clipping.
        total: the per-example total norm ``sqrt(sum of sq_norms)`` if the caller already has
            it (flat and automatic clipping use it; computed here otherwise).

    Returns:
        ``{name: [B]}`` float64 weights; with flat/automatic clipping one tensor shared by all.
    """
    names = list(sq_norms)
    if clipping == "per_layer":
        if not isinstance(max_grad_norm, Mapping) or set(max_grad_norm) != set(names):
            raise fail(
                "max_grad_norm", max_grad_norm, f"a mapping with one norm for each of {names}"
            )
        return {n: _flat_weight(sq_norms[n].clamp_min(0).sqrt(), max_grad_norm[n]) for n in names}
    if clipping not in ("flat", "automatic"):
        raise fail("clipping", clipping, "one of 'flat', 'per_layer', 'automatic'")
    if isinstance(max_grad_norm, Mapping):
        raise fail("max_grad_norm", max_grad_norm, f"one number for clipping={clipping!r}")
    if total is None:
        total = torch.stack([sq_norms[n] for n in names]).sum(dim=0).sqrt()
    if clipping == "flat":
        w = _flat_weight(total, max_grad_norm)
    else:
        w = max_grad_norm / (total * (1.0 + CLIP_MARGIN) + gamma)
    return dict.fromkeys(names, w)


def _flat_weight(norm: Tensor, c: float) -> Tensor:
    # norm = 0 gives c / 0 = inf, clamped to weight 1 (nothing to clip).
    return (c / (norm * (1.0 + CLIP_MARGIN))).clamp(max=1.0)


class _NotBatchFirstError(UnsupportedModelError):
    """A layer without a ghost rule is not called with the batch along dim 0 (mode 'auto'
    then switches to whole-model vmap)."""


class _Layer:
    """A module owning trainable parameters, and how its per-example gradients are obtained."""

    def __init__(self, name: str, module: nn.Module, local: list[str], ghost: bool) -> None:
        self.name, self.module, self.local, self.ghost = name, module, local, ghost
        self.full = [f"{name}.{n}" if name else n for n in local]


class ClippedGradientEngine:
    """Sum over a batch of per-example clipped gradients, for DP-SGD.

    Guarantee: the returned sum is ``sum_i w_i g_i`` with ``||w_i g_i|| <= S`` (``S`` =
    :attr:`sensitivity`) for every example ``i``, where ``g_i`` is the gradient of example
    ``i``'s loss. Adding or removing one example changes it by at most ``S`` in L2 norm
    (add/remove adjacency; replace-one: ``2 S``), the sensitivity that the Gaussian noise of
    DP-SGD is calibrated to (Abadi et al. 2016, Algorithm 1 and Theorem 1).

    The model is checked before any step (:func:`renyi.dpsgd.grad_sample.check_model`): layers
    that mix examples (BatchNorm, InstanceNorm with running statistics, ...) are refused.

    Modes (``mode=``):

    * ``"ghost"``: every layer with trainable parameters has a ghost-norm rule
      (:data:`renyi.dpsgd.ghost.GHOST_LAYER_TYPES`); one forward and one backward pass to the
      layer outputs give activations and output gradients, from which the norms and the
      clipped sum are computed layer by layer (Li et al. 2022; Bu et al. 2023 book-keeping).
      Per-example gradients of the whole model never exist at once.
    * ``"vmap"``: per-example gradients of the whole model with ``torch.func`` (any model
      of standard layers, including weight sharing between modules); memory ``B x #params``.
    * ``"auto"`` (default): ghost rules where the layer has one, per-layer ``vmap`` for the
      other layers (reported as :attr:`mode` ``"hybrid"``), or whole-model ``vmap`` when a
      parameter is shared by several modules, a module with parameters has submodules with
      parameters, or (found on the first batch) a layer without a ghost rule is not called
      with the batch along dim 0 (e.g. an LSTM's ``[layers, B, H]`` states).

    :attr:`mode` is the mode actually used: ``"ghost"``, ``"hybrid"`` or ``"vmap"``.

    Layer-wise modes assume each parameter is used only inside the forward of the module
    owning it. With ``self_check=True`` (default) the first batch is checked once against
    a batch-of-one computation in eval mode (two examples), and a mismatch is refused.

    Args:
        model: the model; its forward takes ``inputs`` (a tensor or tuple of tensors batched
            along dim 0).
        loss_fn: a ``torch.nn`` loss module (evaluated with ``reduction="none"``) or a callable
            ``(outputs, targets) -> [B]`` per-example losses.
        max_grad_norm: ``C > 0``; for ``per_layer`` also one ``C_l`` per trainable parameter
            tensor (sequence in ``model.named_parameters()`` order, or a mapping by name).
        clipping: ``"flat"`` (default), ``"per_layer"`` or ``"automatic"``.
        mode: ``"auto"`` (default), ``"vmap"`` or ``"ghost"``.
        gamma: stability constant of automatic clipping (Bu et al. 2022 use 0.01).
        chunk_size: examples vectorised at once in whole-model ``vmap`` (``None``: all).
        self_check: check the layer-wise computation once, on the first batch.

    Raises:
        UnsupportedModelError: a layer mixes examples; ``mode="ghost"`` with a layer lacking a
            ghost rule; no trainable parameters.
        PrivacyParameterError: a bad ``max_grad_norm``, ``clipping``, ``mode`` or ``gamma``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(),
        ...                       nn.Linear(4 * 6 * 6, 10))
        >>> engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.5)
        >>> grads, losses, norms = engine.clipped_grad_sum(torch.randn(3, 1, 8, 8),
        ...                                                torch.tensor([1, 2, 3]))
        >>> engine.sensitivity, tuple(norms.shape)
        (0.5, (3,))
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn | nn.Module,
        *,
        max_grad_norm: float | Sequence[float] | Mapping[str, float],
        clipping: Clipping = "flat",
        mode: Mode = "auto",
        gamma: float = 0.01,
        chunk_size: int | None = None,
        self_check: bool = True,
    ) -> None:
        if clipping not in ("flat", "per_layer", "automatic"):
            raise fail("clipping", clipping, "one of 'flat', 'per_layer', 'automatic'")
        if mode not in ("auto", "vmap", "ghost"):
            raise fail("mode", mode, "one of 'auto', 'vmap', 'ghost'")
        if not callable(loss_fn):
            raise fail("loss_fn", loss_fn, "a callable (outputs, targets) -> losses")
        self.gamma = check_positive("gamma", gamma)
        self.chunk_size = None if chunk_size is None else check_int("chunk_size", chunk_size, 1)
        check_model(model)
        self.model, self.loss_fn, self.clipping = model, loss_fn, clipping
        self._params = trainable_parameters(model)
        self._max_norm = self._check_max_grad_norm(max_grad_norm)
        self._layers, layerwise = self._plan(model)
        missing = [
            f"{n!r} ({type(lay.module).__name__})"
            for n, lay in self._layers.items()
            if not lay.ghost
        ]
        if mode == "ghost" and (not layerwise or missing):
            why = (
                "layers without a ghost-norm rule: " + ", ".join(missing)
                if layerwise
                else "parameters are shared between modules or owned by a module with submodules"
            )
            raise UnsupportedModelError(f"mode='ghost' is not possible for this model: {why}")
        if mode == "vmap" or not layerwise:
            self.mode: str = "vmap"
        else:
            self.mode = "hybrid" if missing else "ghost"
        self._checked = not self_check or self.mode == "vmap"
        self._requested = mode

    # ------------------------------------------------------------------ set-up
    def _check_max_grad_norm(self, value: Any) -> float | dict[str, float]:
        names = list(self._params)
        if self.clipping != "per_layer":
            return check_positive("max_grad_norm", value)
        if isinstance(value, Mapping):
            if set(value) != set(names):
                raise fail(
                    "max_grad_norm", dict(value), f"one norm per trainable parameter: {names}"
                )
            return {n: check_positive(f"max_grad_norm[{n!r}]", value[n]) for n in names}
        if isinstance(value, Sequence) and not isinstance(value, str):
            if len(value) != len(names):
                raise fail(
                    "max_grad_norm",
                    list(value),
                    f"{len(names)} norms, one per trainable parameter tensor {names}",
                )
            return {
                n: check_positive(f"max_grad_norm[{i}]", v)
                for i, (n, v) in enumerate(zip(names, value, strict=True))
            }
        c = check_positive("max_grad_norm", value)
        return dict.fromkeys(names, c / math.sqrt(len(names)))

    def _plan(self, model: nn.Module) -> tuple[dict[str, _Layer], bool]:
        layers: dict[str, _Layer] = {}
        owner_count: dict[int, int] = {}
        layerwise = True
        for name, module in model.named_modules():
            local = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
            for n in local:
                pid = id(getattr(module, n))
                owner_count[pid] = owner_count.get(pid, 0) + 1
            if not local:
                continue
            has_child_params = any(
                p.requires_grad for c in module.children() for p in c.parameters()
            )
            if has_child_params:
                layerwise = False
            layers[name] = _Layer(name, module, local, supports_ghost(module))
        if any(c > 1 for c in owner_count.values()):
            layerwise = False
        if layerwise:
            covered = {n for lay in layers.values() for n in lay.full}
            layerwise = covered == set(self._params)
        return layers, layerwise

    @property
    def sensitivity(self) -> float:
        """L2 bound on each clipped per-example gradient (flat/automatic: ``C``; per-layer:
        ``sqrt(sum_l C_l^2)``): the sensitivity of the clipped sum under add/remove-one."""
        if isinstance(self._max_norm, dict):
            return math.sqrt(sum(c * c for c in self._max_norm.values()))
        return self._max_norm

    @property
    def parameter_names(self) -> list[str]:
        """Names of the trainable parameters, the keys of the returned gradient dict."""
        return list(self._params)

    # ------------------------------------------------------------------ main
    def clipped_grad_sum(
        self, inputs: Inputs, targets: Tensor
    ) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """Clip every example's gradient and sum them over the batch.

        Args:
            inputs: tensor ``[B, ...]`` or tuple of tensors batched along dim 0; ``B = 0`` is
                allowed (Poisson sampling can draw an empty batch) and gives zero gradients.
            targets: tensor ``[B, ...]``.

        Returns:
            ``(grad_sum, losses, norms)``: ``grad_sum[name]`` is the sum of the clipped
            per-example gradients for every trainable parameter (``model.named_parameters()``
            order; the model's ``.grad`` fields are not touched); ``losses`` the per-example
            losses ``[B]``; ``norms`` the per-example gradient norms before clipping ``[B]``
            (all parameters jointly).

        Raises:
            NonFiniteGradientError: a loss or gradient norm is NaN or infinite.
        """
        batch = self._check_batch(inputs, targets)
        first = next(iter(self._params.values()))
        if batch == 0:
            zeros = {n: torch.zeros_like(p) for n, p in self._params.items()}
            empty = torch.zeros(0, dtype=first.dtype, device=first.device)
            return zeros, empty, empty.clone()
        by_layer, losses, sq = self._per_example(inputs, targets, batch)
        total = torch.stack(list(sq.values())).sum(dim=0).sqrt()
        self._check_finite_norms(total)
        weights = clipping_weights(sq, self._max_norm, self.clipping, self.gamma, total=total)
        sums: dict[str, Tensor] = {}
        for lay, grads in by_layer.values():
            local_w = {
                local: weights[_full(lay, local)]
                for local in (lay.local if lay is not None else list(self._params))
            }
            for local, v in grads.weighted_sum(local_w).items():
                sums[_full(lay, local)] = v
        out = {n: sums[n].to(p.dtype).reshape(p.shape) for n, p in self._params.items()}
        return out, losses.detach(), total.to(first.dtype)

    def per_example_norms(self, inputs: Inputs, targets: Tensor) -> dict[str, Tensor]:
        """Per-example gradient norm of every trainable parameter, before clipping.

        A diagnostic (e.g. to choose ``max_grad_norm`` on public data): the norms are computed
        exactly as for clipping but nothing here is private.

        Returns:
            ``{name: [B]}`` float64, in ``model.named_parameters()`` order.
        """
        batch = self._check_batch(inputs, targets)
        if batch == 0:
            return {
                n: torch.zeros(0, dtype=torch.float64, device=p.device)
                for n, p in self._params.items()
            }
        sq = self._per_example(inputs, targets, batch)[2]
        return {n: v.clamp_min(0.0).sqrt() for n, v in sq.items()}

    def _per_example(
        self, inputs: Inputs, targets: Tensor, batch: int
    ) -> tuple[dict[str, tuple[_Layer | None, LayerGrads]], Tensor, dict[str, Tensor]]:
        """Per-layer gradient information, losses and per-parameter squared norms."""
        by_layer: dict[str, tuple[_Layer | None, LayerGrads]] = {}
        try:
            if not self._checked:
                self._checked = self._self_check(inputs, targets)
            if self.mode != "vmap":
                by_layer, losses = self._layerwise(inputs, targets, batch)
        except _NotBatchFirstError:
            if self._requested != "auto":
                raise
            self.mode, self._checked = "vmap", True  # e.g. an LSTM's [layers, B, H] states
        if self.mode == "vmap":
            per_ex, losses = per_example_grads(
                self.model, self.loss_fn, inputs, targets, chunk_size=self.chunk_size
            )
            check_finite_losses(losses)
            by_layer = {"": (None, PerExampleGrads(per_ex))}
        sq: dict[str, Tensor] = {}
        for lay, grads in by_layer.values():
            for local, v in grads.sq_norms().items():
                sq[_full(lay, local)] = v
        return by_layer, losses, {n: sq[n] for n in self._params}

    # ------------------------------------------------------------------ helpers
    def _check_batch(self, inputs: Inputs, targets: Tensor) -> int:
        tensors = inputs if isinstance(inputs, tuple) else (inputs,)
        if not tensors or not all(isinstance(t, Tensor) and t.ndim > 0 for t in tensors):
            raise fail("inputs", type(inputs).__name__, "a tensor [B, ...] or tuple of them")
        batch = int(tensors[0].shape[0])
        if any(int(t.shape[0]) != batch for t in tensors):
            raise fail("inputs", [tuple(t.shape) for t in tensors], "equal batch sizes (dim 0)")
        if not isinstance(targets, Tensor) or targets.ndim == 0:
            raise fail("targets", type(targets).__name__, "a tensor [B, ...]")
        if int(targets.shape[0]) != batch:
            raise fail("targets", tuple(targets.shape), f"batch size {batch} as the inputs")
        return batch

    def _check_finite_norms(self, total: Tensor) -> None:
        bad = ~torch.isfinite(total)
        if bool(bad.any()):
            idx = torch.nonzero(bad).flatten()
            raise NonFiniteGradientError(
                f"gradient norm is not finite for {idx.numel()} of {total.numel()} examples "
                f"(first at batch index {int(idx[0])}): per-example clipping needs finite "
                "gradients"
            )

    def _layerwise(
        self, inputs: Inputs, targets: Tensor, batch: int
    ) -> tuple[dict[str, tuple[_Layer | None, LayerGrads]], Tensor]:
        """One forward pass with hooks, one backward pass to the layer outputs only."""
        edges: list[GradientEdge] = []
        records: dict[str, list[tuple[tuple[Any, ...], dict[str, Any], list[int | None]]]] = {
            name: [] for name in self._layers
        }
        versions: list[tuple[str, Tensor, int]] = []

        def make_hook(name: str) -> Any:
            def hook(
                module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
            ) -> None:
                ids: list[int | None] = []
                for o in _flatten_outputs(output):
                    if o.requires_grad:
                        edges.append(get_gradient_edge(o))
                        ids.append(len(edges) - 1)
                    else:
                        ids.append(None)
                saved_args = tuple(_detach(a) for a in args)
                saved_kwargs = {k: _detach(v) for k, v in kwargs.items()}
                for t in (*saved_args, *saved_kwargs.values()):
                    if isinstance(t, Tensor):
                        versions.append((name, t, t._version))
                records[name].append((saved_args, saved_kwargs, ids))

            return hook

        handles = [
            lay.module.register_forward_hook(make_hook(name), with_kwargs=True)
            for name, lay in self._layers.items()
        ]
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        with torch.enable_grad():  # also inside a caller's torch.no_grad()
            try:
                outputs = self.model(*args)
            finally:
                for h in handles:
                    h.remove()
            losses = per_example_losses(self.loss_fn, outputs, targets)
            check_finite_losses(losses)
            grads: Sequence[Tensor | None] = []
            if edges and losses.requires_grad:
                grads = torch.autograd.grad(losses.sum(), edges, allow_unused=True)
        for name, t, v in versions:
            if t._version != v:
                raise UnsupportedModelError(
                    f"the input of layer {name!r} was modified in place after the layer used "
                    "it; per-example norms need it unchanged (avoid in-place ops such as "
                    "`x += ...` on tensors fed to a layer with parameters)"
                )
        result: dict[str, tuple[_Layer | None, LayerGrads]] = {}
        for name, lay in self._layers.items():
            calls = [
                (a, k, [grads[i] if i is not None and grads else None for i in ids])
                for a, k, ids in records[name]
            ]
            result[name] = (lay, self._layer_grads(lay, calls, batch))
        return result, losses

    def _layer_grads(
        self,
        lay: _Layer,
        calls: list[tuple[tuple[Any, ...], dict[str, Any], list[Tensor | None]]],
        batch: int,
    ) -> LayerGrads:
        if lay.ghost:
            return ghost_layer_grads(lay.module, calls, lay.local, batch)
        total: dict[str, Tensor] = {}
        for args, kwargs, gouts in calls:
            if all(g is None for g in gouts):
                continue
            batched_out = all(g is None or (g.ndim > 0 and g.shape[0] == batch) for g in gouts)
            batched_in = any(
                isinstance(t, Tensor) and t.ndim > 0 and t.shape[0] == batch
                for t in (*args, *kwargs.values())
            )
            if not (batched_out and batched_in):
                raise _NotBatchFirstError(
                    f"layer {lay.name!r} ({type(lay.module).__name__}) is not called with the "
                    "batch along dim 0 of its input and output; use mode='vmap'"
                )
            g = layer_per_example_grads(lay.module, args, kwargs, gouts, lay.local, batch)
            total = {n: total[n] + g[n] if n in total else g[n] for n in g}
        if not total:
            total = {
                n: torch.zeros(batch, *p.shape, dtype=p.dtype, device=p.device)
                for n, p in lay.module.named_parameters(recurse=False)
                if n in lay.local
            }
        return PerExampleGrads(total)

    def _self_check(self, inputs: Inputs, targets: Tensor) -> bool:
        """Compare layer-wise per-example norms with a batch-of-one loop on two examples.

        Returns False (check again on the next batch) when a norm is not finite; the caller's
        own computation then reports it.
        """
        k = min(2, int(targets.shape[0]))
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        was_training = self.model.training
        self.model.eval()
        try:
            sub = tuple(a[:k] for a in args)
            by_layer, _ = self._layerwise(sub, targets[:k], k)
            sq: dict[str, Tensor] = {}
            for lay, grads in by_layer.values():
                for local, v in grads.sq_norms().items():
                    sq[_full(lay, local)] = v
            params = list(self._params.values())
            for j in range(k):
                out = self.model(*(a[j : j + 1] for a in args))
                loss = per_example_losses(self.loss_fn, out, targets[j : j + 1]).sum()
                ref = torch.autograd.grad(loss, params, allow_unused=True)
                want_all = [0.0 if g is None else float(g.double().norm()) for g in ref]
                total = math.sqrt(sum(v * v for v in want_all))
                for name, want in zip(self._params, want_all, strict=True):
                    got = float(sq[name][j].sqrt())
                    if not (math.isfinite(got) and math.isfinite(total)):
                        return False
                    # float32 rounding: relative to this parameter and to the example's norm
                    scale = max(want, got) + 1e-2 * total + 1e-30
                    if not abs(got - want) <= 1e-3 * scale:
                        raise UnsupportedModelError(
                            f"per-example gradient of {name!r} from the layer-wise engine "
                            f"(norm {got:.6g}) differs from a batch-of-one computation "
                            f"(norm {want:.6g}): is the parameter used outside the forward of "
                            "its module, shared, or is there a layer that mixes examples? "
                            "Use mode='vmap'."
                        )
        finally:
            self.model.train(was_training)
        return True


def _full(lay: _Layer | None, local: str) -> str:
    if lay is None or not lay.name:
        return local
    return f"{lay.name}.{local}"


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, Tensor) else x
