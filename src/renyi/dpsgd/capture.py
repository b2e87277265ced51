"""Per-example clipping from the user's own ``loss.backward()`` (the Opacus idiom).

Opacus users write ``loss = criterion(model(x), y); loss.backward(); optimizer.step()``.
:class:`PerExampleCapture` makes that loop private without changing it: hooks on the model
record, during the user's forward pass, what the clipping engine
(:class:`renyi.dpsgd.clipping.ClippedGradientEngine`) records in its own: each layer's input
and, through tensor hooks that fire during the user's backward pass, the gradient at each
layer output. From those, the engine's rules give per-example norms and the clipped sum
(ghost norms and book-keeping, decomposed RNN/attention layers, user rules, per-layer vmap)
exactly as for ``optimizer.accumulate(x, y)``; no second forward or backward pass is run.

Interface with :class:`renyi.dpsgd.optimizer.DPOptimizer` (``capture=``)::

    cap = PerExampleCapture(model, max_grad_norm=1.0)     # hooks registered on model
    out = model(x); loss = criterion(out, y); loss.backward()
    sums, n, norms = cap.pop_clipped_sum()                 # DPOptimizer.step() does this

* ``sums[name]``: ``sum_i clip(g_i)`` for every trainable parameter (float32 for float16/
  bfloat16 parameters); ``n``: examples captured since the last pop (several forward/backward
  pairs before one step are micro-batches of one logical batch); ``norms``: per-example
  total norms before clipping.
* ``loss_reduction``: ``"mean"`` (Opacus's default: the loss is the mean of per-example
  losses, so example ``i``'s output gradient is ``B`` times the captured one) or ``"sum"``.
  The loss must be a mean or sum of per-example losses, as in Opacus; the per-example
  gradients are those of ``B * loss`` (mean) restricted to each example.
* A forward pass whose backward never ran (evaluation, a discarded forward) is dropped: it
  released nothing. Forward passes under ``torch.no_grad()`` and calls of submodules alone
  are not recorded.
* Nothing captured since the last pop raises :class:`MissingGradientError`: the optimiser
  must then refuse the step rather than noise a raw or empty gradient.
* The independence check of the engine runs on the captured batches (first two, then random
  ones within ``check_budget``), with the per-example objective ``<model(x_i), dL_i/dy_i>``
  (the captured output gradient), inside :meth:`pop_clipped_sum`, before sums are returned.
  It cannot see a loss that mixes examples (the criterion is the user's code): use a
  per-example criterion (any ``torch.nn`` loss with mean or sum reduction is one).

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> cap = PerExampleCapture(model, max_grad_norm=1.0)
    >>> loss = nn.functional.cross_entropy(model(torch.randn(5, 4)), torch.arange(5) % 3)
    >>> loss.backward()
    >>> sums, n, norms = cap.pop_clipped_sum()
    >>> n, tuple(norms.shape), sorted(sums) == sorted(n for n, _ in model.named_parameters())
    (5, (5,), True)
    >>> cap.remove()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge
from torch.utils._pytree import tree_flatten, tree_unflatten

from renyi._validation import fail
from renyi.dpsgd.clipping import (
    ClippedGradientEngine,
    Clipping,
    Mode,
    _Recording,
    _sq_norms,
    is_engine_running,
    used_outside_error,
)
from renyi.dpsgd.grad_sample import UnsupportedModelError
from renyi.dpsgd.independence import CheckSchedule
from renyi.dpsgd.layout import LayoutError, input_batch_dim
from renyi.dpsgd.loss_graph import (
    SeamInfo,
    TracedOutput,
    UnsupportedLossError,
    register_source,
)
from renyi.errors import RenyiError

__all__ = ["MissingGradientError", "PerExampleCapture"]


class MissingGradientError(RenyiError):
    """No forward and backward pass of the model was captured since the last step.

    E.g. ``step()`` without ``loss.backward()``, a loss not computed from this model's output,
    or a forward pass under ``torch.no_grad()``. Nothing was released.
    """


def _outputs(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for o in out for t in _outputs(o)]
    if isinstance(out, Mapping):
        return [t for o in out.values() for t in _outputs(o)]
    return []


def _map_outputs(out: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``out`` with every tensor ``t`` replaced by ``fn(t)`` (tuples, named tuples, lists,
    dicts and dict-like model outputs such as Hugging Face's ``ModelOutput``, in place for
    the latter so that their class and attributes stay)."""
    if isinstance(out, Tensor):
        return fn(out)
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return type(out)(*(_map_outputs(o, fn) for o in out))
    if isinstance(out, tuple | list):
        return type(out)(_map_outputs(o, fn) for o in out)
    if isinstance(out, dict):
        if type(out) is dict:
            return {k: _map_outputs(v, fn) for k, v in out.items()}
        for k in list(out.keys()):
            out[k] = _map_outputs(out[k], fn)
        return out
    return out


def _batched(t: Tensor, batch: int) -> bool:
    return t.is_floating_point() and t.ndim > 0 and int(t.shape[0]) == batch


def _inner_product(outputs: Any, grad_outputs: Tensor) -> Tensor:
    """Per-example objective ``<y_i, g_i>`` over the batched outputs (flattened,
    concatenated): its gradient is example ``i``'s gradient when ``g_i = dl_i/dy_i``."""
    first = [o for o in _outputs(outputs) if o.is_floating_point() and o.ndim > 0]
    batch = int(grad_outputs.shape[0])
    outs = [o for o in first if o.requires_grad and int(o.shape[0]) == batch]
    flat = torch.cat([o.reshape(batch, -1) for o in outs], dim=1)
    return (flat * grad_outputs.to(flat.dtype)).sum(dim=1)


class _Call:
    """The model's call on a batch, with the batched tensors (dim 0 = batch, anywhere in the
    positional or keyword arguments, nested or not) exchangeable for a slice of them."""

    def __init__(
        self,
        model: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        batch: int,
        batch_first: bool = True,
    ) -> None:
        self.spec: Any = None
        if kwargs or not all(isinstance(a, Tensor) for a in args):
            leaves, self.spec = tree_flatten((args, kwargs))
        else:
            leaves = list(args)  # the common call model(x): no tree walk
        self.model, self.leaves = model, [_detach(v) for v in leaves]
        self.where = [
            i
            for i, v in enumerate(self.leaves)
            if isinstance(v, Tensor)
            and v.ndim > 0
            and int(v.shape[input_batch_dim(v, batch_first)]) == batch
        ]

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(self.leaves[i] for i in self.where)

    def __call__(self, inputs: tuple[Tensor, ...]) -> Any:
        leaves = list(self.leaves)
        for i, v in zip(self.where, inputs, strict=True):
            leaves[i] = v
        if self.spec is None:
            return self.model(*leaves)
        args, kwargs = tree_unflatten(leaves, self.spec)
        return self.model(*args, **kwargs)


def _detach(v: Any) -> Any:
    return v.detach() if isinstance(v, Tensor) else v


class _Pending:
    """One recorded forward pass of the root module, waiting for its backward.

    The owner of its outputs' seams in :mod:`renyi.dpsgd.loss_graph`: the seeded backward of
    the loss marks the recording while it runs (``begin_seeded``/``end_seeded``).
    """

    def __init__(
        self, capture: PerExampleCapture, rec: _Recording, call: _Call, batch: int
    ) -> None:
        self.capture, self.rec, self.call, self.batch = capture, rec, call, batch
        self.out_slots: list[tuple[int, tuple[int, ...]]] = []
        self.closed = False

    def probe_due(self) -> bool:
        return self.capture._probe_due()

    def record_probe(self, seconds: float) -> None:
        self.capture._probe_schedule.record_check(seconds)

    def begin_seeded(self) -> None:
        self.rec.seeding = True
        self.capture._mark_grads()

    def end_seeded(self) -> None:
        self.rec.seeding = False
        self.capture._check_grads()

    def begin_probe(self) -> None:
        self.rec.probing = True

    def end_probe(self) -> None:
        self.rec.probing = False


class PerExampleCapture:
    """Hooks that turn a plain ``loss.backward()`` into per-example clipped gradient sums.

    Args:
        model: the model; its forward's batched tensors (positional or keyword, nested or
            not) and its floating-point outputs are batched along dim 0.
        max_grad_norm, clipping, mode, gamma, self_check, check_budget, batch_first: as for
            :class:`~renyi.dpsgd.clipping.ClippedGradientEngine` (``batch_first=False``: the
            model's batched inputs of two or more dimensions are ``[T, B, ...]``; its
            outputs stay batched along dim 0).
        loss_reduction: accepted for Opacus compatibility (``"mean"`` or ``"sum"``); how the
            loss combines per-example terms is read from its graph
            (:mod:`renyi.dpsgd.loss_graph`).

    Raises:
        UnsupportedModelError: as the engine (layers that mix examples, ...).
        PrivacyParameterError: bad arguments.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        max_grad_norm: float | Sequence[float] | Mapping[str, float],
        clipping: Clipping = "flat",
        loss_reduction: Literal["mean", "sum"] = "mean",
        mode: Mode = "auto",
        gamma: float = 0.01,
        self_check: bool | Literal["strict"] = True,
        check_budget: float = 0.02,
        batch_first: bool = True,
    ) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise fail("loss_reduction", loss_reduction, "'mean' or 'sum'")
        self.loss_reduction = loss_reduction
        self.batch_first = bool(batch_first)
        self.engine = ClippedGradientEngine(
            model,
            _inner_product,
            max_grad_norm=max_grad_norm,
            clipping=clipping,
            mode=mode,
            gamma=gamma,
            self_check=self_check,
            check_budget=check_budget,
            batch_first=batch_first,
        )
        self.model = model
        self._busy = False
        self._pending: _Pending | None = None
        self._sums: dict[str, Tensor] | None = None
        self._count = 0
        self._forwards = 0
        self._norms: list[Tensor] = []
        self._captured = False
        self._error: RenyiError | None = None
        self._closed: list[_Recording] = []
        #: the model outputs of this capture's forward passes, where loss graphs end
        self.seams: dict[Any, SeamInfo] = {}
        register_source(self)
        self._unbacked: _Pending | None = None
        #: Forward passes (with a backward) in the sums of the last :meth:`pop_clipped_sum`.
        self.last_forwards = 0
        self._probe_schedule = CheckSchedule(budget=check_budget)
        self._marks: list[tuple[str, Tensor, Tensor | None, int]] = []
        self._zeros: dict[str, Tensor] = {}
        detached = {
            full
            for lay in self.engine._layers.values()
            if lay.kind in ("ghost", "decomposed")
            for full in lay.full
        }
        self._detached_params = [(n, p) for n, p in self.engine._params.items() if n in detached]
        #: the recording in place while the engine's own passes (the check) run: inactive
        self._idle = _Recording(self.engine._layers, hooks=False)
        self._idle.active = False
        self._cm = self.engine._recording(hooks=True)
        self._holder = self._cm.__enter__()
        self._holder[0].active = False
        self._handles = [
            model.register_forward_pre_hook(self._before, with_kwargs=True),
            model.register_forward_hook(self._after, with_kwargs=True),
        ]

    # ------------------------------------------------------------------ public
    @property
    def sensitivity(self) -> float:
        """L2 bound on one clipped per-example gradient (``C`` for flat clipping)."""
        return self.engine.sensitivity

    @property
    def max_grad_norm(self) -> float | dict[str, float]:
        """The clipping norm; settable for flat and automatic clipping."""
        return self.engine.max_grad_norm

    @max_grad_norm.setter
    def max_grad_norm(self, value: float) -> None:
        self.engine.max_grad_norm = value

    @property
    def parameter_names(self) -> list[str]:
        """The trainable parameters, keys of the returned sums."""
        return self.engine.parameter_names

    @property
    def mode(self) -> str:
        """How per-example gradients are obtained (the engine's mode)."""
        return self.engine.mode

    def pop_clipped_sum(self) -> tuple[dict[str, Tensor], int, Tensor]:
        """Clipped sums of everything captured since the last pop (or :meth:`zero_grad`).

        Returns:
            ``(sums, n, norms)`` (see the module docstring); :attr:`last_forwards` is then
            the number of forward passes (with a backward) they came from.

        Raises:
            MissingGradientError: no forward and backward pass captured.
            UnsupportedLossError: a backward that did not go through the loss analysis (e.g.
                ``torch.autograd.grad``), or one that reached a finished forward pass.
            ExampleMixingError, UnsupportedModelError: the independence check refused the
                model (nothing is returned).
            NonFiniteGradientError: a non-finite per-example gradient norm.
        """
        try:
            self._finish_pending()
            late = any(rec.late for rec in self._closed)
            if self._error is not None:
                raise self._error
            if late:
                raise UnsupportedLossError(
                    "a backward pass reached an output of a forward pass after the next "
                    "forward pass of the model had started (or after step()): call backward "
                    "before the next forward; nothing was released"
                )
        except RenyiError:
            self._reset()
            raise
        if not self._captured or self._sums is None:
            self._reset()
            raise MissingGradientError(
                "no forward and backward pass of the model was captured since the last step: "
                "call loss.backward() on a loss computed from the model's output (with "
                "gradients enabled) before optimizer.step(); nothing was released"
            )
        sums, n, forwards = self._sums, self._count, self._forwards
        first = next(iter(self.engine._params.values()))
        norms = torch.cat(self._norms) if self._norms else torch.zeros(0, device=first.device)
        self._reset()
        self.last_forwards = forwards
        return sums, n, norms

    def zero_grad(self) -> None:
        """Drop everything captured (pending and accumulated)."""
        if self._pending is not None:
            self._close(self._pending)
        self._pending = None
        self._holder[0].active = False
        self._reset()

    def remove(self) -> None:
        """Remove the hooks (and the decomposed forwards) from the model."""
        if self._pending is not None:
            self._close(self._pending)
            self._pending = None
        self._reset()
        for h in self._handles:
            h.remove()
        self._handles = []
        self._cm.__exit__(None, None, None)

    # ------------------------------------------------------------------ hooks
    def _before(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._busy or not torch.is_grad_enabled() or is_engine_running():
            return
        if module.training and getattr(module, "is_gradient_checkpointing", False) is True:
            raise UnsupportedModelError(
                "the model has gradient checkpointing on (Hugging Face "
                "gradient_checkpointing_enable()): its backward recomputes the forward, which "
                "per-example clipping from loss.backward() does not support. Call "
                "model.gradient_checkpointing_disable(); to save memory, use smaller physical "
                "batches instead (make_private's max_physical_batch_size=, or gradient "
                "accumulation), which keep the logical batch, sigma and epsilon; nothing was "
                "released"
            )
        self._finish_pending()
        if not kwargs and all(isinstance(a, Tensor) for a in args):
            tensors = list(args)  # the common call model(x): no tree walk
        else:
            tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Tensor)]
        if not tensors or tensors[0].ndim == 0:
            raise fail("model input", type(args).__name__, "a tensor batched along dim 0")
        batch = int(tensors[0].shape[input_batch_dim(tensors[0], self.batch_first)])
        if batch == 0 and _cannot_run_empty(module):
            raise fail(
                "model input",
                f"an empty batch for {type(module).__name__} (Hugging Face models cannot run "
                "on zero rows; Poisson sampling draws empty batches)",
                "a non-empty batch: skip the forward and backward of an empty batch of the "
                "private loader, but call optimizer.step(), which releases the noise-only step "
                "the sampler drew (skipping the step would reveal that the batch was empty)",
            )
        rec = _Recording(self.engine._layers, hooks=True)
        self._holder[0] = rec
        call = _Call(module, args, kwargs, batch, self.batch_first)
        self._pending = _Pending(self, rec, call, batch)

    def _after(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        pending, rec = self._pending, self._holder[0]
        if self._busy or pending is None or pending.rec is not rec or not rec.active:
            return None
        rec.active = False  # later calls of submodules alone are not part of this batch
        seams: dict[Any, SeamInfo] = {}
        for o in _outputs(output):
            if o.requires_grad and _batched(o, pending.batch) and o.grad_fn is not None:
                slot = rec.slot_of(o)  # the last layer's output, its hook already set
                if slot is None:
                    slot = rec.register(o)
                pending.out_slots.append((slot, tuple(o.shape)))
                seams[o.grad_fn] = SeamInfo(pending, pending.batch, get_gradient_edge(o))
        self.seams.update(seams)
        return _map_outputs(output, _traced)

    # ------------------------------------------------------------------ internals
    def _mark_grads(self) -> None:
        """Before the seeded backward: the ``.grad`` of every parameter whose layer runs on
        detached parameters (no gradient may reach them)."""
        self._marks = [
            (name, p, p.grad, -1 if p.grad is None else p.grad._version)
            for name, p in self._detached_params
            if self.engine.mode != "vmap"  # whole-model vmap: the captured grads are unused
        ]

    def _check_grads(self) -> None:
        """After the seeded backward: a parameter of a detached layer that received a
        gradient is used outside its layer's forward (a parameter used in a parent's forward,
        or shared with a module without a rule): its per-example gradient would be missed,
        so the step is refused.
        Then every trainable parameter without ``.grad`` gets a zero one (what the user's
        backward contributes to the non-private gradient: the update comes from the clipped
        sums at ``step()``; ``torch.amp.GradScaler`` needs gradients to check)."""
        for name, p, before, version in self._marks:
            after = p.grad
            if after is not before or (after is not None and after._version != version):
                self._error = used_outside_error(name)
                break
        self._marks = []
        for name, p in self.engine._params.items():
            if p.grad is None:
                zero = self._zeros.get(name)
                if zero is None or zero._version != 0 or zero.shape != p.shape:
                    zero = self._zeros[name] = torch.zeros_like(p)  # reused while unchanged
                p.grad = zero

    def _probe_due(self) -> bool:
        return self.engine.self_check and self._probe_schedule.due()

    def _reset(self) -> None:
        self._sums, self._count, self._norms, self._captured = None, 0, [], False
        self._forwards, self._error = 0, None
        self._closed = []
        if self._unbacked is not None:
            self._release_seams(self._unbacked)
            self._unbacked = None

    def _release_seams(self, owner: _Pending) -> None:
        for node in [n for n, s in self.seams.items() if s.owner is owner]:
            del self.seams[node]

    def _close(self, pending: _Pending) -> None:
        """The forward pass is over: what it recorded is dropped (a validation loop run with
        gradients enabled keeps nothing alive). A later backward reaching it is refused:
        through ``rec.late`` at the step, or, for the last forward without a backward, by the
        loss analysis (one loss from two forward passes), which still sees its outputs."""
        rec = pending.rec
        rec.active = False
        rec.closed = True
        rec.records, rec.recorders, rec.grads, rec.versions = {}, {}, [], []
        rec.draws = {}
        pending.closed = True
        self._closed.append(rec)
        if rec.backward_seen:
            self._release_seams(pending)
            return
        if self._unbacked is not None:
            self._release_seams(self._unbacked)
        self._unbacked = pending

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        rec = pending.rec
        rec.active = False
        try:
            if not rec.backward_seen or self._error is not None:
                return  # a forward pass without backward: nothing to release
            if rec.unanalysed:
                self._error = UnsupportedLossError(
                    "a backward pass reached the model's output without going through "
                    "renyi's per-example loss analysis (torch.autograd.grad, or a loss "
                    "computed from a copy of the output that is not a torch tensor operation "
                    "on it): call loss.backward() on the loss computed from the returned "
                    "output; nothing was released"
                )
                return
            self._busy = True
            try:
                sums, norms = self._clipped(pending)
            except RenyiError as exc:
                self._error = exc
                return
            finally:
                self._busy = False
            if self._sums is None:
                self._sums = sums
            else:
                self._sums = {n: self._sums[n] + v for n, v in sums.items()}
            self._count += pending.batch
            self._forwards += 1
            self._norms.append(norms.detach())
            self._captured = True
        finally:
            self._close(pending)

    def _clipped(self, pending: _Pending) -> tuple[dict[str, Tensor], Tensor]:
        engine, rec, batch = self.engine, pending.rec, pending.batch
        if batch == 0:
            sums, _, norms = engine._empty()
            return sums, norms
        if not pending.out_slots:
            self._output_grads(pending)  # raises: no output to take gradients from
        holder_before = self._holder[0]
        self._holder[0] = self._idle  # the check's own forwards are not captured
        engine.call = pending.call
        try:
            inputs = pending.call.inputs
            if engine.mode == "vmap":
                gy = self._output_grads(pending)
                call = pending.call
                if call.spec is not None or len(call.leaves) != len(inputs):
                    raise UnsupportedModelError(
                        "whole-model vmap (mode 'vmap') on the backward-capture path needs "
                        "the model called with its batched tensors as positional arguments "
                        "only"
                    )
                sums, _, norms = engine.clipped_grad_sum(
                    inputs if len(inputs) > 1 else inputs[0], gy
                )
                return sums, norms
            start = time.perf_counter()
            # the output gradients (the check's per-example objective) only when it runs
            if engine.self_check and engine.schedule.due():
                engine._self_check(inputs, self._output_grads(pending), batch)
                engine.schedule.record_check(time.perf_counter() - start)
                start = time.perf_counter()
            try:
                by_layer = engine._collect(rec, batch)
            except LayoutError:  # a batch dimension not yet learned: the check learns it
                if not engine.self_check:
                    raise
                engine._self_check(inputs, self._output_grads(pending), batch)
                by_layer = engine._collect(rec, batch)
            total_sq = engine._total_sq(by_layer)
            sq = None
            if total_sq is None:
                every = _sq_norms(by_layer)
                sq = {n: every[n] for n in engine._params}
            engine.schedule.record_step(time.perf_counter() - start)
            self._probe_schedule.record_step(time.perf_counter() - start)
            sums, norms = engine._clip_and_sum(by_layer, sq, total_sq)
            return sums, norms
        finally:
            engine.call = None
            self._holder[0] = holder_before

    def _output_grads(self, pending: _Pending) -> Tensor:
        """Per-example gradients at the model's outputs, flattened and concatenated ``[B, N]``
        (zeros for outputs the loss did not use)."""
        parts = []
        for slot, shape in pending.out_slots:
            g = pending.rec.grads[slot]
            if g is None:
                g = torch.zeros(shape)
            parts.append(g.reshape(pending.batch, -1))
        if not parts:
            raise MissingGradientError(
                "the model's output has no floating-point tensor batched along dim 0 that "
                "requires grad: nothing to clip"
            )
        return torch.cat([p.to(parts[0].dtype) for p in parts], dim=1)


def _cannot_run_empty(module: nn.Module) -> bool:
    """Whether ``module`` is a Hugging Face model (or a ``peft`` model around one): their
    forward raises torch's raw reshape error on a batch of zero rows."""
    import sys

    get = getattr(module, "get_base_model", None)
    base = get() if callable(get) else module
    transformers = sys.modules.get("transformers")
    pretrained = getattr(transformers, "PreTrainedModel", None)
    return pretrained is not None and isinstance(base, pretrained)


def _traced(t: Tensor) -> Tensor:
    if t.requires_grad and t.is_floating_point() and not isinstance(t, TracedOutput):
        return t.as_subclass(TracedOutput)
    return t
