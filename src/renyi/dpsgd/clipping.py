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
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from renyi._validation import check_int, check_positive, fail
from renyi.dpsgd.decomposed import DECOMPOSED_LAYER_TYPES, Recorder, supports_decomposed
from renyi.dpsgd.ghost import (
    LayerGrads,
    LinearMapGrads,
    PerExampleGrads,
    TiedGrads,
    _LinearGrads,
    anchored,
    compute_dtype,
    detached_forward,
    ghost_layer_grads,
    linear_total_sq,
    supports_ghost,
)
from renyi.dpsgd.grad_sample import (
    Inputs,
    LossFn,
    NonFiniteGradientError,
    UnsupportedModelError,
    _flatten_outputs,
    check_finite_losses,
    check_model,
    exact_arithmetic,
    layer_per_example_grads,
    per_example_grads,
    per_example_losses,
    trainable_parameters,
)
from renyi.dpsgd.independence import CheckSchedule, CheckStats, run_check
from renyi.dpsgd.layout import BatchLayout, LayoutError, input_batch_dim
from renyi.dpsgd.registry import apply_rule, rule_for, verify_rule
from renyi.dpsgd.replay import RandomTape

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


class _UsedOutsideError(UnsupportedModelError):
    """A parameter reached by the backward pass outside the layers whose rules give its
    per-example gradient (mode 'auto' then switches the engine to whole-model vmap)."""


def used_outside_error(name: str) -> UnsupportedModelError:
    """A parameter reached by the backward pass outside the layers whose rules give its
    per-example gradient (a parent's forward using it directly, or a module without a rule
    sharing it): its per-example gradient would be incomplete."""
    return _UsedOutsideError(
        f"parameter {name!r} received a gradient from outside the forward of its module (a "
        "parent's forward using it directly, or a module without a per-example rule sharing "
        "it); its per-example gradient would be incomplete. Use mode='vmap' (whole-model "
        "per-example gradients); nothing was released"
    )


class _NotBatchFirstError(UnsupportedModelError):
    """A layer without a ghost rule is not called with the batch along dim 0 (mode 'auto'
    then switches to whole-model vmap)."""


#: Modules that only hold parameters (no forward): their parameters belong to the layer that
#: holds them and uses them in its own forward (``peft``'s LoRA-on-embedding factors, IA3
#: vectors, LoHa/VeRA factors are ``ParameterDict`` entries of the adapted layer).
_HOLDERS = (nn.ParameterDict, nn.ParameterList)


def _held(module: nn.Module) -> list[str]:
    """``module``'s trainable parameters held in its parameter containers (dotted names),
    when they are all its trainable parameters (an adapter layer around a frozen one);
    else ``[]`` (the containers' parameters then need whole-model vmap, as before)."""
    held = [
        f"{cn}.{pn}"
        for cn, c in module.named_children()
        if isinstance(c, _HOLDERS)
        for pn, p in c.named_parameters()
        if p.requires_grad
    ]
    others = [
        n
        for n, p in module.named_parameters()
        if p.requires_grad and n.split(".")[0] not in {h.split(".")[0] for h in held}
    ]
    return held if held and not others else []


#: How a layer's per-example gradients are obtained.
LayerKind = Literal["ghost", "decomposed", "rule", "vmap"]


class _Layer:
    """A module owning trainable parameters, and how its per-example gradients are obtained:
    a ghost rule, a decomposed forward (RNNs, attention; the module's children's parameters
    included), a registered user rule, or per-layer ``vmap``."""

    def __init__(
        self,
        name: str,
        module: nn.Module,
        local: list[str],
        kind: LayerKind,
        full: list[str] | None = None,
    ) -> None:
        self.name, self.module, self.local, self.kind = name, module, local, kind
        self.ghost = kind != "vmap"
        #: the parameters' names in the model (``model.named_parameters()``: a parameter
        #: shared with another module, e.g. a tied LM head, has its first name there)
        self.full = full if full is not None else [f"{name}.{n}" if name else n for n in local]
        self.full_of = dict(zip(local, self.full, strict=True))

    def local_of(self, full: str) -> str:
        return self.local[self.full.index(full)]


class _Recording:
    """What one forward pass leaves for the per-example computation.

    ``records[layer]``: the hooked calls ``(args, kwargs, slots)``; ``recorders[layer]``: the
    affine maps of decomposed layers. Every layer output that requires grad gets a *slot*;
    its gradient ``dL/dy`` (``L`` = sum of per-example losses) arrives in ``grads[slot]``,
    either from ``torch.autograd.grad`` to the recorded gradient edges (the engine's own
    backward) or from tensor hooks during the user's ``loss.backward()`` (capture mode).
    """

    def __init__(self, layers: Mapping[str, _Layer], hooks: bool) -> None:
        self.hooks = hooks
        self.records: dict[str, list[tuple[tuple[Any, ...], dict[str, Any], list[int | None]]]] = {
            n: [] for n, lay in layers.items() if lay.kind != "decomposed"
        }
        self.recorders = {
            n: Recorder(self.register, detach_params=hooks)
            for n, lay in layers.items()
            if lay.kind == "decomposed"
        }
        self.versions: list[tuple[str, Tensor, int]] = []
        #: the random draws of vmap-rule layer calls that drew: ``(layer, call index)``
        self.draws: dict[tuple[str, int], RandomTape] = {}
        self.edges: list[GradientEdge] = []
        self.grads: list[Tensor | None] = []
        self.backward_seen = False
        self.active = True  # capture mode: only during the root module's forward
        # capture mode: set while renyi's seeded backward of the loss runs (a backward
        # without it did not go through renyi.dpsgd.loss_graph), while the loss check's own
        # probe runs (ignored), and once the forward pass is finished (a later backward)
        self.seeding = False
        self.probing = False
        self.closed = False
        self.unanalysed = False
        self.late = False
        self._last: tuple[weakref.ref[Tensor], int] | None = None

    def slot_of(self, t: Tensor) -> int | None:
        """The slot of ``t`` if it is the tensor registered last (the model's output is
        most often its last layer's: one hook serves both), else ``None``."""
        if self._last is None or self._last[0]() is not t:
            return None
        return self._last[1]

    def register(self, t: Tensor) -> int:
        slot = len(self.grads)
        self.grads.append(None)
        self._last = (weakref.ref(t), slot)  # weak: a forward's logits are not kept alive
        if self.hooks:

            def hook(g: Tensor) -> None:
                if self.probing:
                    return
                if self.closed:
                    self.late = True
                    return
                if not self.seeding:
                    self.unanalysed = True
                self.backward_seen = True
                old = self.grads[slot]
                self.grads[slot] = g if old is None else old + g

            t.register_hook(hook)
        else:
            self.edges.append(get_gradient_edge(t))
        return slot

    def grad(self, slot: int | None) -> Tensor | None:
        return None if slot is None else self.grads[slot]


class ClippedGradientEngine:
    """Sum over a batch of per-example clipped gradients, for DP-SGD.

    Guarantee: the returned sum is ``sum_i w_i g_i`` with ``||w_i g_i|| <= S`` (``S`` =
    :attr:`sensitivity`) for every example ``i``, where ``g_i`` is the gradient of example
    ``i``'s loss. Adding or removing one example changes it by at most ``S`` in L2 norm
    (add/remove adjacency; replace-one: ``2 S``), the sensitivity that the Gaussian noise of
    DP-SGD is calibrated to (Abadi et al. 2016, Algorithm 1 and Theorem 1).

    The model is checked before any step (:func:`renyi.dpsgd.grad_sample.check_model`): layers
    known to mix examples (BatchNorm, InstanceNorm with running statistics, ...) are refused.

    Modes (``mode=``):

    * ``"ghost"``: every layer with trainable parameters has a rule: a ghost-norm rule
      (:data:`renyi.dpsgd.ghost.GHOST_LAYER_TYPES`), a decomposed forward (RNN, GRU, LSTM,
      MultiheadAttention: :mod:`renyi.dpsgd.decomposed`) or a registered user rule
      (:mod:`renyi.dpsgd.registry`); one forward and one backward pass to the layer outputs
      give activations and output gradients, from which the norms and the clipped sum are
      computed layer by layer (Li et al. 2022; Bu et al. 2023 book-keeping). Per-example
      gradients of the whole model never exist at once.
    * ``"vmap"``: per-example gradients of the whole model with ``torch.func`` (any model
      of standard layers, including weight sharing between modules); memory ``B x #params``.
    * ``"auto"`` (default): rules where the layer has one, per-layer ``vmap`` for the
      other layers (reported as :attr:`mode` ``"hybrid"``), or whole-model ``vmap`` when a
      parameter is shared by several modules, a module with parameters has submodules with
      parameters (other than the decomposed layers), or (found on the first batch) a layer
      without a rule is not called with the batch along dim 0.

    :attr:`mode` is the mode actually used: ``"ghost"``, ``"hybrid"`` or ``"vmap"``.

    **Independence check** (``self_check=True``, default; ``"strict"``: every batch;
    layer-wise modes): per-example gradients read off a batched forward pass are right only if
    no operation mixes the examples of the batch. :func:`renyi.dpsgd.independence.run_check`
    compares, on the first two batches and then on randomly chosen ones (at least 2 % of them,
    more within ``check_budget`` of the engine's time), the engine's per-example gradients
    of a few examples with each example run on its own through the model's own forward and
    autograd (random draws replayed, a round-off bound derived from the computation, a
    float64 recomputation before any refusal). A mismatch raises
    :class:`~renyi.dpsgd.independence.ExampleMixingError` naming the layer or operation
    (or :class:`UnsupportedModelError` when the forward agrees but a parameter is used
    outside its module) before the batch's clipped sum is returned. Whole-model ``vmap``
    evaluates every example alone and needs no check. The check also learns the batch
    dimension of every layer call (:mod:`renyi.dpsgd.layout`: ``[T, B, d]`` tensors).

    **Precision**: activations and gradients in float16/bfloat16 (half-precision parameters
    or autocast) are converted to float32 for the norms, the clipping weights and the
    clipped sums, which are returned in float32 (noise is added before any rounding to the
    parameters' dtype); the clipping margin ``CLIP_MARGIN`` covers float32 rounding.

    Args:
        model: the model; its forward takes ``inputs`` (a tensor or tuple of tensors batched
            along dim 0, or dim 1 with ``batch_first=False``).
        loss_fn: a ``torch.nn`` loss module (evaluated with ``reduction="none"``) or a callable
            ``(outputs, targets) -> [B]`` per-example losses.
        max_grad_norm: ``C > 0``; for ``per_layer`` also one ``C_l`` per trainable parameter
            tensor (sequence in ``model.named_parameters()`` order, or a mapping by name).
        clipping: ``"flat"`` (default), ``"per_layer"`` or ``"automatic"``.
        mode: ``"auto"`` (default), ``"vmap"`` or ``"ghost"``.
        gamma: stability constant of automatic clipping (Bu et al. 2022 use 0.01).
        chunk_size: examples vectorised at once in whole-model ``vmap`` (``None``: all).
        self_check: run the independence check (see above): ``True``, ``"strict"`` or ``False``.
        check_budget: fraction of the engine's time the later checks may take (default 0.02).
        batch_first: ``False``: model inputs of two or more dimensions are ``[T, B, ...]``
            (Opacus's meaning); one-dimensional inputs and ``targets`` are batched along dim 0.

    Raises:
        UnsupportedModelError: a layer mixes examples; ``mode="ghost"`` with a layer lacking a
            rule; no trainable parameters.
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
        self_check: bool | Literal["strict"] = True,
        check_budget: float = 0.02,
        batch_first: bool = True,
    ) -> None:
        if self_check not in (True, False, "strict"):
            raise fail("self_check", self_check, "True, False or 'strict' (every batch)")
        if clipping not in ("flat", "per_layer", "automatic"):
            raise fail("clipping", clipping, "one of 'flat', 'per_layer', 'automatic'")
        if mode not in ("auto", "vmap", "ghost"):
            raise fail("mode", mode, "one of 'auto', 'vmap', 'ghost'")
        if not callable(loss_fn):
            raise fail("loss_fn", loss_fn, "a callable (outputs, targets) -> losses")
        self.gamma = check_positive("gamma", gamma)
        self.chunk_size = None if chunk_size is None else check_int("chunk_size", chunk_size, 1)
        budget = check_positive("check_budget", check_budget)
        if budget > 1:
            raise fail("check_budget", check_budget, "a fraction in (0, 1]")
        check_model(model)
        self.model, self.loss_fn, self.clipping = model, loss_fn, clipping
        self._params = trainable_parameters(model)
        self._max_norm = self._check_max_grad_norm(max_grad_norm)
        self._layers, layerwise = self._plan(model)
        missing = [
            f"{n!r} ({type(lay.module).__name__})"
            for n, lay in self._layers.items()
            if lay.kind == "vmap"
        ]
        if mode == "ghost" and (not layerwise or missing):
            why = (
                "layers without a per-example rule: " + ", ".join(missing)
                if layerwise
                else "parameters are shared between modules or owned by a module with submodules"
            )
            raise UnsupportedModelError(f"mode='ghost' is not possible for this model: {why}")
        if mode == "vmap" or not layerwise:
            self.mode: str = "vmap"
        else:
            self.mode = "hybrid" if missing else "ghost"
        self.self_check = bool(self_check)
        self.schedule = CheckSchedule(budget=budget, strict=self_check == "strict")
        self.check_stats = CheckStats()
        self.layout = BatchLayout(batch_first)
        self.layout.guess_ties = not self.self_check
        self._requested = mode
        #: How the model is called on (a slice of) the batched inputs: ``model(*inputs)``
        #: unless the capture path sets it (keyword arguments, nested inputs).
        self.call: Callable[[tuple[Tensor, ...]], Any] | None = None

    def _call(self, args: tuple[Any, ...]) -> Any:
        return self.model(*args) if self.call is None else self.call(args)

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
        """The layers that own trainable parameters and how each gets its per-example
        gradients; ``False`` when the model needs whole-model vmap.

        A parameter owned by several modules (tied weights: GPT-2's and BERT's LM heads
        share the input embedding) is handled layer by layer when every module that owns it
        has a ghost rule, apart from modules that only hold it and own no other trainable
        parameter (BERT's prediction head holds its decoder's bias): example ``i``'s gradient
        of it is the sum of its uses' (:class:`renyi.dpsgd.ghost.TiedGrads` adds the cross
        terms to the norm). Other sharing needs whole-model vmap.
        """
        canon = {id(p): n for n, p in self._params.items()}
        found: list[tuple[str, nn.Module, list[str], LayerKind]] = []
        owners: dict[int, list[tuple[str, str]]] = {}
        covered: list[str] = []  # decomposed layers: their submodules are part of them
        for name, module in model.named_modules():
            if any(c == "" or name.startswith(c + ".") for c in covered):
                continue
            if name and isinstance(module, _HOLDERS) and _held(_parent(model, name)):
                continue  # its parameters are its parent's (the module that uses them)
            kind: LayerKind
            if supports_decomposed(module) and rule_for(module) is None:
                covered.append(name)
                local = [n for n, p in module.named_parameters() if p.requires_grad]
                kind = "decomposed"
            else:
                local = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
                held = _held(module)
                if held:  # no rule knows a container's parameters: per-layer vmap
                    local += held
                    kind = "vmap"
                elif rule_for(module) is not None:
                    kind = "rule"
                elif supports_ghost(module):
                    kind = "ghost"
                else:
                    kind = "vmap"
            if not local:
                continue
            for n in local:
                owners.setdefault(id(module.get_parameter(n)), []).append((name, n))
            found.append((name, module, local, kind))
        kinds = {name: kind for name, _, _, kind in found}
        holds = {name: local for name, _, local, _ in found}
        layerwise = True
        aliases: set[tuple[str, str]] = set()  # (module, local): holds a ghost layer's
        shared: dict[str, list[str]] = {}
        for pid, own in owners.items():
            if len(own) < 2:
                continue
            users = [m for m, _ in own if kinds[m] == "ghost"]
            holders = [(m, n) for m, n in own if kinds[m] != "ghost"]
            pure = all(
                kinds[m] == "vmap"
                and all(len(owners[id(_module(model, m).get_parameter(k))]) > 1 for k in holds[m])
                for m, _ in holders
            )
            if not users or not pure:
                layerwise = False
                continue
            aliases.update(holders)
            shared[canon[pid]] = users
        layers: dict[str, _Layer] = {}
        for name, module, local, kind in found:
            kept = [n for n in local if (name, n) not in aliases]
            if not kept:
                continue
            if kind != "decomposed" and any(
                p.requires_grad
                for c in module.children()
                if not (isinstance(c, _HOLDERS) and _held(module))
                for p in c.parameters()
            ):
                layerwise = False
            full = [canon[id(module.get_parameter(n))] for n in kept]
            layers[name] = _Layer(name, module, kept, kind, full)
        #: parameters owned by several modules, handled layer by layer: their using layers
        self._shared = shared
        if layerwise:
            covered_names = {n for lay in layers.values() for n in lay.full}
            layerwise = covered_names == set(self._params)
        return layers, layerwise

    @property
    def max_grad_norm(self) -> float | dict[str, float]:
        """The clipping norm ``C`` (per-layer clipping: ``{name: C_l}``). Settable for flat
        and automatic clipping (e.g. adaptive clipping changes it between steps)."""
        return self._max_norm

    @max_grad_norm.setter
    def max_grad_norm(self, value: float) -> None:
        if self.clipping == "per_layer":
            raise fail("max_grad_norm", value, "unchanged with clipping='per_layer'")
        self._max_norm = check_positive("max_grad_norm", value)

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
            order; float32 for float16/bfloat16 parameters, else the parameter's dtype; the
            model's ``.grad`` fields are not touched); ``losses`` the per-example losses
            ``[B]``; ``norms`` the per-example gradient norms before clipping ``[B]`` (all
            parameters jointly).

        Raises:
            NonFiniteGradientError: a loss or gradient norm is NaN or infinite.
            ExampleMixingError: the independence check found examples influencing each other.
        """
        batch = self._check_batch(inputs, targets)
        if batch == 0:
            return self._empty()
        by_layer, losses, sq = self._per_example(inputs, targets, batch)
        sums, total = self._clip_and_sum(by_layer, sq)
        return sums, losses.detach(), total

    def _empty(self) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        first = next(iter(self._params.values()))
        dt = compute_dtype(first.dtype)
        zeros = {
            n: torch.zeros(p.shape, dtype=compute_dtype(p.dtype), device=p.device)
            for n, p in self._params.items()
        }
        empty = torch.zeros(0, dtype=dt, device=first.device)
        return zeros, empty, empty.clone()

    def _total_sq(self, by_layer: Mapping[str, tuple[_Layer | None, LayerGrads]]) -> Tensor | None:
        """Per-example squared total norm ``[B]`` (float64) when the clipping needs only it
        (flat and automatic clipping) and no parameter is tied (whose per-parameter squares
        are clamped at 0 before they are added: see :func:`_sq_norms`); else ``None``.

        The per-parameter squares are not formed: plain Linear layers' norms are taken
        together (:func:`~renyi.dpsgd.ghost.linear_total_sq`), the other layers' squares
        added as they come. The same squares as :func:`_sq_norms` (summed in another order).
        """
        if self.clipping == "per_layer":
            return None
        linear: list[_LinearGrads] = []
        others: list[LayerGrads] = []
        for lay, grads in by_layer.values():
            if lay is None:  # tied parameters' cross terms, or the whole-model fall-back
                return None
            if type(grads) is _LinearGrads:
                linear.append(grads)
            else:
                others.append(grads)
        with exact_arithmetic():
            parts = [linear_total_sq(linear)] if linear else []
            for grads in others:
                parts.extend(grads.sq_norms().values())
            if not parts:
                return None
            total = parts[0]
            for v in parts[1:]:
                total = total + v
        return total

    def _clip_and_sum(
        self,
        by_layer: Mapping[str, tuple[_Layer | None, LayerGrads]],
        sq: Mapping[str, Tensor] | None,
        total_sq: Tensor | None = None,
    ) -> tuple[dict[str, Tensor], Tensor]:
        """Clipping weights from the per-parameter squared norms ``sq`` (or, for flat and
        automatic clipping, the squared total ``total_sq`` of :meth:`_total_sq`) and the
        weighted sums."""
        if total_sq is not None:
            total = total_sq.sqrt()
            sq = dict.fromkeys(self._params, total_sq)  # only the names are read (total given)
        elif sq is not None:
            total = torch.stack(list(sq.values())).sum(dim=0).sqrt()
        else:
            raise ValueError("_clip_and_sum needs the squared norms or their total")
        self._check_finite_norms(total)
        weights = clipping_weights(sq, self._max_norm, self.clipping, self.gamma, total=total)
        views = self._flat_views()
        sums = self._weighted(by_layer, weights, views)
        out = {}
        for n, p in self._params.items():
            v = sums[n]
            if views is not None:
                if v is not views[n]:  # a rule without out=, or a tied parameter's total
                    views[n].copy_(v.reshape(p.shape))
                out[n] = views[n]
                continue
            dt = compute_dtype(p.dtype)
            if v.dtype != dt:
                v = v.to(dt)
            out[n] = v if v.shape == p.shape else v.reshape(p.shape)
        first = next(iter(self._params.values()))
        return out, total.to(compute_dtype(first.dtype))

    def _flat_views(self) -> dict[str, Tensor] | None:
        """One new flat buffer for this step's clipped sums (parameter order), as views shaped
        like the parameters, when all parameters share a compute dtype and device: the
        Linear rule's products write straight into it, and the optimizer noises it as it
        is (no concatenation; see ``DPOptimizer.add_noise``). ``None`` otherwise."""
        params = list(self._params.values())
        dt, dev = compute_dtype(params[0].dtype), params[0].device
        if any(compute_dtype(p.dtype) != dt or p.device != dev for p in params):
            return None
        sizes = [p.numel() for p in params]
        flat = torch.empty(sum(sizes), dtype=dt, device=dev)
        return {
            n: v.view(p.shape)
            for (n, p), v in zip(self._params.items(), flat.split(sizes), strict=True)
        }

    def _weighted(
        self,
        by_layer: Mapping[str, tuple[_Layer | None, LayerGrads]],
        weights: Mapping[str, Tensor],
        views: Mapping[str, Tensor] | None = None,
    ) -> dict[str, Tensor]:
        """Every layer's weighted sums, summed over a tied parameter's uses; plain Linear
        layers write theirs into ``views`` (the parameters' slices of a flat buffer) when
        given and the parameter is not tied."""
        sums: dict[str, Tensor] = {}
        converted: dict[tuple[int, torch.dtype], Tensor] = {}
        with exact_arithmetic():
            for lay, grads in by_layer.values():
                local_w = {
                    local: weights[_full(lay, local)]
                    for local in (lay.local if lay is not None else list(self._params))
                }
                if type(grads) is _LinearGrads:
                    # the rule's own conversion of the (shared) weights, done once per step
                    dt = grads.b.dtype
                    for local, w in local_w.items():
                        key = (id(w), dt)
                        if key not in converted:
                            converted[key] = w.to(dt)
                        local_w[local] = converted[key]
                    if views is not None and lay is not None:
                        fulls = [lay.full_of[local] for local in local_w]
                        dev = grads.b.device
                        if all(
                            f not in self._shared
                            and views[f].dtype == dt
                            and views[f].device == dev
                            for f in fulls
                        ):
                            into = {
                                local: views[f] for local, f in zip(local_w, fulls, strict=True)
                            }
                            for local, v in grads.weighted_sum(local_w, out=into).items():
                                sums[lay.full_of[local]] = v
                            continue
                for local, v in grads.weighted_sum(local_w).items():
                    full = _full(lay, local)  # a tied parameter: the sum of its uses'
                    sums[full] = sums[full] + v if full in sums else v
        return sums

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
        with engine_running():
            return self._per_example_now(inputs, targets, batch)

    def _per_example_now(
        self, inputs: Inputs, targets: Tensor, batch: int
    ) -> tuple[dict[str, tuple[_Layer | None, LayerGrads]], Tensor, dict[str, Tensor]]:
        by_layer: dict[str, tuple[_Layer | None, LayerGrads]] = {}
        start = time.perf_counter()
        try:
            if self.mode != "vmap" and self.self_check and self.schedule.due():
                self._self_check(inputs, targets, batch)
                self.schedule.record_check(time.perf_counter() - start)
                start = time.perf_counter()
            if self.mode != "vmap":
                try:
                    by_layer, losses = self._layerwise(inputs, targets, batch)
                except LayoutError:
                    if not self.self_check:
                        raise
                    self._self_check(inputs, targets, batch)  # learns the batch dimensions
                    by_layer, losses = self._layerwise(inputs, targets, batch)
        except (_NotBatchFirstError, _UsedOutsideError):
            if self._requested != "auto":
                raise
            # a layer without a rule, not called batch-first; or a shared parameter used
            # outside the layers that own it
            self.mode = "vmap"
        if self.mode == "vmap":
            per_ex, losses = per_example_grads(
                self.model,
                self.loss_fn,
                inputs,
                targets,
                chunk_size=self.chunk_size,
                batch_first=self.layout.batch_first,
            )
            check_finite_losses(losses)
            by_layer = {"": (None, PerExampleGrads(per_ex))}
        sq = _sq_norms(by_layer)
        self.schedule.record_step(time.perf_counter() - start)
        return by_layer, losses, {n: sq[n] for n in self._params}

    # ------------------------------------------------------------------ helpers
    def _check_batch(self, inputs: Inputs, targets: Tensor) -> int:
        tensors = inputs if isinstance(inputs, tuple) else (inputs,)
        if not tensors or not all(isinstance(t, Tensor) and t.ndim > 0 for t in tensors):
            raise fail("inputs", type(inputs).__name__, "a tensor [B, ...] or tuple of them")
        bf = self.layout.batch_first
        batch = int(tensors[0].shape[input_batch_dim(tensors[0], bf)])
        if any(int(t.shape[input_batch_dim(t, bf)]) != batch for t in tensors):
            where = "dim 0" if bf else "dim 1, or dim 0 of one-dimensional inputs"
            raise fail("inputs", [tuple(t.shape) for t in tensors], f"equal batch sizes ({where})")
        if not isinstance(targets, Tensor) or targets.ndim == 0:
            raise fail("targets", type(targets).__name__, "a tensor [B, ...]")
        if int(targets.shape[0]) != batch:
            raise fail("targets", tuple(targets.shape), f"batch size {batch} as the inputs")
        return batch

    def _check_finite_norms(self, total: Tensor) -> None:
        # one reduction decides (norms are >= 0: their sum is finite iff every norm is);
        # a sum that overflows float64 although every norm is finite goes on to the
        # element-wise check, which finds nothing to refuse
        if math.isfinite(float(total.sum())):
            return
        bad = ~torch.isfinite(total)
        if bool(bad.any()):
            idx = torch.nonzero(bad).flatten()
            raise NonFiniteGradientError(
                f"gradient norm is not finite for {idx.numel()} of {total.numel()} examples "
                f"(first at batch index {int(idx[0])}): per-example clipping needs finite "
                "gradients"
            )

    @contextmanager
    def _recording(self, hooks: bool) -> Iterator[list[_Recording]]:
        """Hooks on the layers and decomposed forwards, writing into ``holder[0]`` (a fresh
        :class:`_Recording` each forward in capture mode)."""
        holder = [_Recording(self._layers, hooks)]

        def make_hook(name: str) -> Any:
            def hook(
                module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
            ) -> None:
                rec = holder[0]
                if not rec.active:
                    return
                ids: list[int | None] = [
                    rec.register(o) if o.requires_grad else None for o in _flatten_outputs(output)
                ]
                saved_args = tuple(_detach(a) for a in args)
                saved_kwargs = {k: _detach(v) for k, v in kwargs.items()}
                for t in (*saved_args, *saved_kwargs.values()):
                    if isinstance(t, Tensor):
                        rec.versions.append((name, t, t._version))
                rec.records[name].append((saved_args, saved_kwargs, ids))

            return hook

        def make_draw_hooks(name: str) -> tuple[Any, Any]:
            # a layer recomputed per example by vmap: its random draws (peft's LyCORIS
            # module_dropout gate, rank_dropout mask) are kept for that recomputation. A
            # layer that drew nothing at its first recorded call in this train/eval mode is
            # not recorded again (the tape costs Python per operator); should it draw later,
            # the recomputation refuses it (vmap's randomness="error", or an empty tape)
            open_: list[tuple[RandomTape, Any, int] | None] = []
            seen: dict[tuple[str, bool], bool] = self.__dict__.setdefault("_layer_draws", {})

            def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
                rec = holder[0]
                if (
                    not rec.active
                    or seen.get((name, module.training)) is False
                    or torch.compiler.is_compiling()
                ):
                    open_.append(None)
                    return
                tape = RandomTape()
                cm = tape.record()
                cm.__enter__()
                open_.append((tape, cm, len(rec.records[name])))

            def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                entry = open_.pop() if open_ else None
                if entry is None:
                    return
                tape, cm, index = entry
                cm.__exit__(None, None, None)
                seen[(name, module.training)] = seen.get((name, module.training), False) or (
                    len(tape) > 0
                )
                rec = holder[0]
                if len(tape) and len(rec.records.get(name, ())) == index + 1:
                    rec.draws[(name, index)] = tape

            return pre, post

        def make_forward(name: str, module: nn.Module) -> Callable[..., Any]:
            fn = next(f for k, f in DECOMPOSED_LAYER_TYPES.items() if isinstance(module, k))

            def forward(*args: Any, **kwargs: Any) -> Any:
                if not holder[0].active:  # called outside a recorded forward: torch's own
                    return type(module).forward(module, *args, **kwargs)
                return fn(module, holder[0].recorders[name], *args, **kwargs)

            return forward

        def make_ghost_forward(name: str, lay: _Layer) -> Callable[..., Any]:
            # capture path: the user's backward forms no weight gradient for this layer
            module, hook = lay.module, make_hook(name)
            fn = detached_forward(module)
            anchor = getattr(module, lay.local[0])

            def forward(*args: Any, **kwargs: Any) -> Any:
                rec = holder[0]
                if not rec.active or len(args) + len(kwargs) != 1:
                    return type(module).forward(module, *args, **kwargs)
                x = args[0] if args else next(iter(kwargs.values()))
                if not isinstance(x, Tensor) or kwargs:
                    out = anchored(fn, anchor, x)
                    hook(module, args, kwargs, out)
                    return out
                # the common call layer(x): what anchored() and the hook do, for one tensor
                out = fn(x) if x.requires_grad else anchored(fn, anchor, x)
                if not isinstance(out, Tensor):
                    hook(module, args, kwargs, out)
                    return out
                xd = x.detach()
                rec.versions.append((name, xd, xd._version))
                slot = rec.register(out) if out.requires_grad else None
                rec.records[name].append(((xd,), {}, [slot]))
                return out

            return forward

        # the engine's own pass: layers using a shared parameter run on detached parameters
        # too, so that a gradient reaching it shows a use outside them (see _record)
        shared_users = {u for users in self._shared.values() for u in users}
        handles = []
        patched: list[tuple[nn.Module, Any]] = []
        try:
            for name, lay in self._layers.items():
                if lay.kind == "decomposed":
                    patched.append((lay.module, lay.module.__dict__.get("forward")))
                    lay.module.forward = make_forward(name, lay.module)  # type: ignore[method-assign]
                elif lay.kind == "ghost" and (hooks or name in shared_users):
                    patched.append((lay.module, lay.module.__dict__.get("forward")))
                    lay.module.forward = make_ghost_forward(name, lay)  # type: ignore[method-assign]
                else:
                    if lay.kind == "vmap":
                        pre, post = make_draw_hooks(name)
                        handles.append(lay.module.register_forward_pre_hook(pre))
                    handles.append(
                        lay.module.register_forward_hook(make_hook(name), with_kwargs=True)
                    )
                    if lay.kind == "vmap":
                        handles.append(lay.module.register_forward_hook(post, always_call=True))
            yield holder
        finally:
            for h in handles:
                h.remove()
            for module, old in patched:
                if old is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.forward = old  # type: ignore[method-assign]

    def _layerwise(
        self, inputs: Inputs, targets: Tensor, batch: int
    ) -> tuple[dict[str, tuple[_Layer | None, LayerGrads]], Tensor]:
        """One forward pass with hooks, one backward pass to the layer outputs only."""
        rec, losses = self._record(inputs, targets, batch)
        return self._collect(rec, batch), losses

    def _record(self, inputs: Inputs, targets: Tensor, batch: int) -> tuple[_Recording, Tensor]:
        """The forward pass with hooks and the backward pass to the layer outputs."""
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        with torch.enable_grad():  # also inside a caller's torch.no_grad()
            with self._recording(hooks=False) as holder:
                outputs = self._call(args)
            rec = holder[0]
            losses = per_example_losses(self.loss_fn, outputs, targets)
            check_finite_losses(losses)
            shared = [self._params[n] for n in self._shared]
            if (rec.edges or shared) and losses.requires_grad:
                wrt: list[Any] = [*rec.edges, *shared]  # output edges, shared parameters
                grads = torch.autograd.grad(losses.sum(), wrt, allow_unused=True)
                rec.grads = list(grads[: len(rec.edges)])
                for name, g in zip(self._shared, grads[len(rec.edges) :], strict=True):
                    if g is not None:
                        raise used_outside_error(name)
        return rec, losses

    def _collect(self, rec: _Recording, batch: int) -> dict[str, tuple[_Layer | None, LayerGrads]]:
        """Per-layer gradient information from a recording whose backward has run."""
        with exact_arithmetic():
            return self._collect_layers(rec, batch)

    def _collect_layers(
        self, rec: _Recording, batch: int
    ) -> dict[str, tuple[_Layer | None, LayerGrads]]:
        for name, t, v in rec.versions:
            if t._version != v:
                raise UnsupportedModelError(
                    f"the input of layer {name!r} was modified in place after the layer used "
                    "it; per-example norms need it unchanged (avoid in-place ops such as "
                    "`x += ...` on tensors fed to a layer with parameters)"
                )
        result: dict[str, tuple[_Layer | None, LayerGrads]] = {}
        for name, lay in self._layers.items():
            if lay.kind == "decomposed":
                own = dict(lay.module.named_parameters())
                calls = {
                    key: [(x, rec.grad(slot)) for x, slot in lst]
                    for key, lst in rec.recorders[name].calls.items()
                }
                grads: LayerGrads = LinearMapGrads(calls, {n: own[n] for n in lay.local}, batch)
            else:
                calls_h = [(a, k, [rec.grad(i) for i in ids]) for a, k, ids in rec.records[name]]
                fixed = isinstance(lay.module, _CHANNELS_FIRST)
                if lay.kind == "vmap":  # called in the layer's own layout, batch dims given
                    dims = [
                        self.layout.batch_dims(name, i, c, batch) for i, c in enumerate(calls_h)
                    ]
                    tapes = [rec.draws.get((name, i)) for i in range(len(calls_h))]
                    grads = self._layer_grads(lay, calls_h, batch, dims, tapes)
                else:
                    calls_h = self.layout.to_batch_first(name, calls_h, batch, fixed)
                    grads = self._layer_grads(lay, calls_h, batch)
            result[name] = (lay, grads)
        for full, users in self._shared.items():
            if len(users) > 1:  # tied weights: the cross terms of the uses' norms
                uses = [(result[u][1], self._layers[u].local_of(full)) for u in users]
                result[f"\0tied {full}"] = (
                    None,
                    TiedGrads(full, self._params[full].shape, uses, batch),
                )
        return result

    def _layer_grads(
        self,
        lay: _Layer,
        calls: list[tuple[tuple[Any, ...], dict[str, Any], list[Tensor | None]]],
        batch: int,
        dims: Sequence[Mapping[str, int | None]] | None = None,
        draws: Sequence[RandomTape | None] | None = None,
    ) -> LayerGrads:
        if lay.kind == "ghost":
            _require_batch_first(lay, calls, batch)
            return ghost_layer_grads(lay.module, calls, lay.local, batch)
        total: dict[str, Tensor] = {}
        for occ, (args, kwargs, gouts) in enumerate(calls):
            if all(g is None for g in gouts):
                continue
            if lay.kind == "rule":
                rule = rule_for(lay.module)
                assert rule is not None
                if not rule.verified and batch >= 2:
                    verify_rule(lay.module, rule, args, kwargs, gouts)
                g = apply_rule(rule, lay.module, args, gouts, lay.local)
            else:
                bd = dims[occ] if dims is not None else {}
                batched_out = all(
                    g is None or bd.get(f"out{i}") is not None for i, g in enumerate(gouts)
                )
                batched_in = any(d is not None for s, d in bd.items() if not s.startswith("out"))
                if not (batched_out and batched_in):
                    raise _NotBatchFirstError(
                        f"layer {lay.name!r} ({type(lay.module).__name__}) is not called with "
                        "the batch along dim 0 of its input and output; use mode='vmap'"
                    )
                g = layer_per_example_grads(
                    lay.module,
                    args,
                    kwargs,
                    gouts,
                    lay.local,
                    batch,
                    batch_dims=bd,
                    draws=draws[occ] if draws is not None else None,
                )
            total = {n: total[n] + g[n] if n in total else g[n] for n in g}
        if not total:
            total = {
                n: torch.zeros(batch, *p.shape, dtype=p.dtype, device=p.device)
                for n, p in ((n, lay.module.get_parameter(n)) for n in lay.local)
            }
        return PerExampleGrads(total)

    # ------------------------------------------------------------------ independence check
    def _self_check(self, inputs: Inputs, targets: Tensor, batch: int) -> None:
        """The independence check (see the class docstring and
        :func:`renyi.dpsgd.independence.run_check`)."""
        with engine_running():
            run_check(self, inputs, targets, batch)


def _require_batch_first(
    lay: _Layer,
    calls: Sequence[tuple[tuple[Any, ...], dict[str, Any], list[Tensor | None]]],
    batch: int,
) -> None:
    """Refuse a ghost-rule layer called with one input shared by the whole batch (e.g. the
    ``[1, T]`` position ids of BERT and GPT-2 broadcast over the batch): the gradient at its
    output is already summed over the examples, so no per-example gradient can be read off it.
    """
    for args, _, gouts in calls:
        first = args[0] if args and isinstance(args[0], Tensor) else None
        used = [g for g in gouts if g is not None]
        if not used or first is None:
            continue
        if first.ndim == 0 or first.shape[0] != batch or any(g.shape[0] != batch for g in used):
            raise UnsupportedModelError(
                f"layer {lay.name!r} ({type(lay.module).__name__}) is called with an input of "
                f"shape {tuple(first.shape)} shared by the batch of {batch} examples (e.g. "
                "position ids broadcast over the batch): its per-example gradients cannot be "
                "read off its output. Pass that input per example (Hugging Face models: "
                "position_ids=torch.arange(T).expand(B, T)), or freeze the layer; nothing was "
                "released"
            )


#: Layers whose dimension 1 is channels: their batch is dimension 0.
_CHANNELS_FIRST: tuple[type[nn.Module], ...] = (nn.modules.conv._ConvNd, nn.GroupNorm)


#: How many engine computations (own forward/backward passes, checks) are running: a
#: backward capture on the same model ignores the forward passes they make.
_RUNNING = [0]


@contextmanager
def engine_running() -> Iterator[None]:
    """Mark an engine's own forward and backward passes (see :func:`is_engine_running`)."""
    _RUNNING[0] += 1
    try:
        yield
    finally:
        _RUNNING[0] -= 1


def is_engine_running() -> bool:
    """Whether a clipping engine is running its own passes (captures then stand aside)."""
    return _RUNNING[0] > 0


def _sq_norms(by_layer: Mapping[str, tuple[_Layer | None, LayerGrads]]) -> dict[str, Tensor]:
    """Per-example squared norm of every parameter; a parameter used by several layers
    (tied weights) gets the sum of its uses' squared norms and of the cross terms (a
    :class:`~renyi.dpsgd.ghost.TiedGrads` entry)."""
    sq: dict[str, Tensor] = {}
    tied: set[str] = set()
    with exact_arithmetic():
        for lay, grads in by_layer.values():
            for local, v in grads.sq_norms().items():
                full = _full(lay, local)
                if full in sq:
                    sq[full] = sq[full] + v
                    tied.add(full)
                else:
                    sq[full] = v
    for full in tied:  # |a + b|^2 >= 0: only rounding of the cross terms can go below
        sq[full] = sq[full].clamp_min(0.0)
    return sq


def _full(lay: _Layer | None, local: str) -> str:
    return local if lay is None else lay.full_of[local]


def _module(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name) if name else model


def _parent(model: nn.Module, name: str) -> nn.Module:
    return _module(model, name.rpartition(".")[0])


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, Tensor) else x
