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
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from renyi._validation import fail
from renyi.dpsgd.clipping import ClippedGradientEngine, Clipping, Mode, _Recording, _sq_norms
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


def _inner_product(outputs: Any, grad_outputs: Tensor) -> Tensor:
    """Per-example objective ``<y_i, g_i>`` over all tensor outputs (flattened, concatenated):
    its gradient is example ``i``'s gradient when ``g_i = dL_i/dy_i``."""
    outs = [o for o in _outputs(outputs) if o.is_floating_point()]
    flat = torch.cat([o.reshape(o.shape[0], -1) for o in outs], dim=1)
    return (flat * grad_outputs.to(flat.dtype)).sum(dim=1)


class _Pending:
    """One recorded forward pass of the root module, waiting for its backward."""

    def __init__(self, rec: _Recording, args: tuple[Any, ...], batch: int) -> None:
        self.rec, self.args, self.batch = rec, args, batch
        self.out_slots: list[tuple[int, tuple[int, ...]]] = []


class PerExampleCapture:
    """Hooks that turn a plain ``loss.backward()`` into per-example clipped gradient sums.

    Args:
        model: the model; its forward's first tensor argument (and every tensor output) is
            batched along dim 0.
        max_grad_norm, clipping, mode, gamma, self_check, check_budget: as for
            :class:`~renyi.dpsgd.clipping.ClippedGradientEngine`.
        loss_reduction: ``"mean"`` (default, as Opacus) or ``"sum"``: how the user's loss
            combines per-example losses.

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
        self_check: bool = True,
        check_budget: float = 0.02,
    ) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise fail("loss_reduction", loss_reduction, "'mean' or 'sum'")
        self.loss_reduction = loss_reduction
        self.engine = ClippedGradientEngine(
            model,
            _inner_product,
            max_grad_norm=max_grad_norm,
            clipping=clipping,
            mode=mode,
            gamma=gamma,
            self_check=self_check,
            check_budget=check_budget,
        )
        self.model = model
        self._busy = False
        self._pending: _Pending | None = None
        self._sums: dict[str, Tensor] | None = None
        self._count = 0
        self._norms: list[Tensor] = []
        self._captured = False
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
            ``(sums, n, norms)`` (see the module docstring).

        Raises:
            MissingGradientError: no forward and backward pass captured.
            ExampleMixingError, UnsupportedModelError: the independence check refused the
                model (nothing is returned).
            NonFiniteGradientError: a non-finite per-example gradient norm.
        """
        self._finish_pending()
        if not self._captured or self._sums is None:
            self._reset()
            raise MissingGradientError(
                "no forward and backward pass of the model was captured since the last step: "
                "call loss.backward() on a loss computed from the model's output (with "
                "gradients enabled) before optimizer.step(); nothing was released"
            )
        sums, n = self._sums, self._count
        first = next(iter(self.engine._params.values()))
        norms = torch.cat(self._norms) if self._norms else torch.zeros(0, device=first.device)
        self._reset()
        return sums, n, norms

    def zero_grad(self) -> None:
        """Drop everything captured (pending and accumulated)."""
        self._pending = None
        self._holder[0].active = False
        self._reset()

    def remove(self) -> None:
        """Remove the hooks (and the decomposed forwards) from the model."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._cm.__exit__(None, None, None)

    # ------------------------------------------------------------------ hooks
    def _before(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._busy or not torch.is_grad_enabled():
            return
        self._finish_pending()
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if not tensors or tensors[0].ndim == 0:
            raise fail("model input", type(args).__name__, "a tensor batched along dim 0")
        rec = _Recording(self.engine._layers, hooks=True)
        self._holder[0] = rec
        detached = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
        self._pending = _Pending(rec, detached, int(tensors[0].shape[0]))

    def _after(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        pending, rec = self._pending, self._holder[0]
        if self._busy or pending is None or pending.rec is not rec or not rec.active:
            return
        rec.active = False  # later calls of submodules alone are not part of this batch
        for o in _outputs(output):
            if o.requires_grad and o.is_floating_point():
                pending.out_slots.append((rec.register(o), tuple(o.shape)))

    # ------------------------------------------------------------------ internals
    def _reset(self) -> None:
        self._sums, self._count, self._norms, self._captured = None, 0, [], False

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.rec.active = False
        if not pending.rec.backward_seen:
            return  # a forward pass without backward: nothing to release
        self._busy = True
        try:
            sums, norms = self._clipped(pending)
        finally:
            self._busy = False
        if self._sums is None:
            self._sums = sums
        else:
            self._sums = {n: self._sums[n] + v for n, v in sums.items()}
        self._count += pending.batch
        self._norms.append(norms.detach())
        self._captured = True

    def _clipped(self, pending: _Pending) -> tuple[dict[str, Tensor], Tensor]:
        engine, rec, batch = self.engine, pending.rec, pending.batch
        if batch == 0:
            sums, _, norms = engine._empty()
            return sums, norms
        scale = float(batch) if self.loss_reduction == "mean" else 1.0
        if scale != 1.0:
            rec.grads = [None if g is None else g * scale for g in rec.grads]
        gy = self._output_grads(pending)
        holder_before = self._holder[0]
        self._holder[0] = _Recording(engine._layers, hooks=False)
        self._holder[0].active = False  # the check's own forwards are not captured
        try:
            if engine.mode == "vmap":
                inputs = pending.args if len(pending.args) > 1 else pending.args[0]
                sums, _, norms = engine.clipped_grad_sum(inputs, gy)
                return sums, norms
            args = pending.args
            start = time.perf_counter()
            if engine.self_check and engine.schedule.due():
                engine._self_check(args if len(args) > 1 else args[0], gy, batch)
                engine.schedule.record_check(time.perf_counter() - start)
                start = time.perf_counter()
            by_layer = engine._collect(rec, batch)
            sq = _sq_norms(by_layer)
            engine.schedule.record_step(time.perf_counter() - start)
            sums, norms = engine._clip_and_sum(by_layer, {n: sq[n] for n in engine._params})
            return sums, norms
        finally:
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
            raise MissingGradientError("the model's output does not require grad: nothing to clip")
        return torch.cat([p.to(parts[0].dtype) for p in parts], dim=1)
