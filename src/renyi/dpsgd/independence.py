"""Example independence: the premise of per-example clipping, checked against a batch-of-one run.

DP-SGD's sensitivity bound (Abadi et al. 2016, Algorithm 1) holds only if example ``i``'s
gradient depends on example ``i`` alone. Layer-wise engines (ghost norms, hooks) read every
example's gradient off one *batched* forward pass, so an operation that mixes the examples of
a batch (a hand-written batch normalisation using batch statistics in ``self.training``,
``x - x.mean(0)``, a loss normalised by the batch, ...) silently breaks the bound: removing one
example then moves every other example's clipped gradient too.

This module holds what the engine needs to refuse such models *before* an update is released:

* :func:`check_conditions`: the model as it trains (the user's train/eval mode), except the
  modules whose only train-mode behaviour is dropout, which are switched off so that a
  batch-of-one reference is deterministic; buffers and the RNG state are restored afterwards
  (the check leaves no trace in the training run);
* :func:`compare_example_grads`: per-example gradients of the engine against batch-of-one
  reference gradients, with a tolerance sized to the computation's precision;
* :func:`locate_mixing`: on a mismatch, which layer or operation mixes examples (the first
  module whose input row agrees with the batch-of-one run but whose output row does not);
* :class:`CheckSchedule`: when to check: the first batches, then randomly chosen later
  batches within a budget of the training time (2 % by default).

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Mix(nn.Module):
    ...     def forward(self, x):
    ...         return x - x.mean(dim=0)  # uses the whole batch
    >>> model = nn.Sequential(nn.Linear(3, 3), Mix(), nn.Linear(3, 2))
    >>> x = torch.randn(2, 3)
    >>> locate_mixing(model, lambda: model(x), lambda j: model(x[j : j + 1]), 2)
    "layer '1' (Mix)"
"""

from __future__ import annotations

import functools
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from renyi.dpsgd.grad_sample import UnsupportedModelError

__all__ = [
    "CheckSchedule",
    "ExampleMixingError",
    "check_conditions",
    "compare_example_grads",
    "locate_mixing",
    "tolerance_for",
]


class ExampleMixingError(UnsupportedModelError):
    """The model's output (or gradient) for one example depends on other examples of the batch.

    Raised by the engine's independence check before the step's clipped sum is returned, so
    no update of such a model is ever released. The message names the layer or operation.
    """


#: Modules whose only difference between train and eval mode is dropout (or none at all):
#: switched to eval during the check so that batch-of-one references are deterministic.
DROPOUT_ONLY: tuple[type[nn.Module], ...] = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.RNNBase,
    nn.MultiheadAttention,
)

_REDUCED = (torch.float16, torch.bfloat16)


def tolerance_for(dtypes: Sequence[torch.dtype], autocast: bool) -> float:
    """Relative tolerance of the batch-of-one comparison for a computation in ``dtypes``.

    Exact arithmetic would give equality; the engine and the reference differ only in the
    order of floating-point operations (and the engine's float32/float64 book-keeping), so the
    tolerance is a few hundred units in the last place of the lowest precision involved.
    Example mixing changes gradients by O(1) relative amounts.
    """
    if autocast or any(d in _REDUCED for d in dtypes):
        return 5e-2
    if any(d == torch.float32 for d in dtypes):
        return 2e-4
    return 1e-8


def autocast_enabled(device_type: str = "cpu") -> bool:
    """Whether autocast is active for ``device_type`` (CPU and CUDA)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # pragma: no cover - older torch without the device argument
        return bool(torch.is_autocast_enabled())


@contextmanager
def check_conditions(model: nn.Module) -> Iterator[None]:
    """The model as it trains, made deterministic for the duration of a check.

    Train/eval mode stays as the user set it (a module that mixes examples only in training
    mode is thereby caught), except :data:`DROPOUT_ONLY` modules, which are put in eval mode.
    The values of all buffers (e.g. running statistics updated by the check's forward passes)
    and the CPU random number generator state are restored on exit.
    """
    switched = [m for m in model.modules() if isinstance(m, DROPOUT_ONLY) and m.training]
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    for m in switched:
        m.training = False
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        for m in switched:
            m.training = True
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in saved and b.shape == saved[n].shape:
                    b.copy_(saved[n])


def compare_example_grads(
    got: Mapping[str, Tensor], want: Mapping[str, Tensor], tol: float
) -> tuple[float, float] | None:
    """``None`` if ``got`` and ``want`` agree to ``tol`` relative to the larger total norm,
    else ``(distance, reference norm)``. Both map parameter names to one example's gradient.
    Non-finite values never agree."""
    diff_sq, ref_sq, got_sq = 0.0, 0.0, 0.0
    for name, w in want.items():
        w64 = w.detach().double()
        g64 = got[name].detach().double().reshape(w64.shape)
        diff_sq += float((g64 - w64).pow(2).sum())
        ref_sq += float(w64.pow(2).sum())
        got_sq += float(g64.pow(2).sum())
    dist, ref = math.sqrt(diff_sq), math.sqrt(ref_sq)
    scale = max(ref, math.sqrt(got_sq)) + 1e-30
    if math.isfinite(dist) and dist <= tol * scale:
        return None
    return dist, ref


# ---------------------------------------------------------------- localisation


def _tensors(x: Any) -> list[Tensor]:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, tuple | list):
        return [t for o in x for t in _tensors(o)]
    if isinstance(x, Mapping):
        return [t for o in x.values() for t in _tensors(o)]
    return []


def _rows_agree(batched: list[Tensor], single: list[Tensor], j: int, k: int, tol: float) -> bool:
    """Row ``j`` of each batched tensor (batch ``k`` along dim 0) against the single run's."""
    for a, b in zip(batched, single, strict=False):
        if not (a.ndim > 0 and a.shape[0] == k and b.ndim > 0 and b.shape[0] == 1):
            continue
        if a.shape[1:] != b.shape[1:] or not (a.is_floating_point() or a.is_complex()):
            if a.shape[1:] == b.shape[1:] and not torch.equal(a[j], b[0]):
                return False
            continue
        ra, rb = a[j].detach().double(), b[0].detach().double()
        scale = float(torch.maximum(ra.abs().max(), rb.abs().max())) if ra.numel() else 0.0
        if not bool(torch.isfinite(ra).all()):
            continue
        if float((ra - rb).abs().max() if ra.numel() else 0.0) > tol * scale + 1e-30:
            return False
    return True


def _record_calls(model: nn.Module, run: Callable[[], Any]) -> list[tuple[str, int, list, list]]:
    """Run ``run`` with hooks on every module; the calls in completion order:
    ``(name, start index, input tensors, output tensors)``."""
    calls: list[tuple[str, int, list[Tensor], list[Tensor]]] = []
    started: dict[int, list[int]] = {}
    counter = [0]
    handles = []

    def pre(name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            started.setdefault(id(module), []).append(counter[0])
            counter[0] += 1

        return hook

    def post(name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            start = started[id(module)].pop()
            ins = [t.detach() for t in _tensors(args) + _tensors(kwargs)]
            calls.append((name, start, ins, [t.detach() for t in _tensors(output)]))

        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
        handles.append(module.register_forward_hook(post(name), with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return calls


def locate_mixing(
    model: nn.Module,
    run_batch: Callable[[], Any],
    run_one: Callable[[int], Any],
    k: int,
    tol: float = 1e-4,
) -> str | None:
    """Name the layer or operation through which examples of a batch influence each other.

    ``run_batch()`` runs ``model`` on a batch of ``k`` examples, ``run_one(j)`` on example
    ``j`` alone (both under :func:`check_conditions`). Every module call of the two runs is
    matched by (module, occurrence); the first call, in completion order, whose input rows
    agree but whose output row for some example does not is the mixing layer. If instead a
    module's input already disagrees while every earlier module agreed, the mixing happened
    in plain tensor code before that module, inside its parent's ``forward``.

    Returns:
        a description (``"layer 'bn' (MyNorm)"`` or ``"an operation in the forward of
        '<parent>' (<Type>) before layer '<child>'"``), or ``None`` if every module output
        agrees (the mixing is then in the loss or in a backward pass).
    """
    modules = dict(model.named_modules())
    batch_calls = _record_calls(model, run_batch)
    singles = [_record_calls(model, functools.partial(run_one, j)) for j in range(k)]

    def key_list(calls: list[tuple[str, int, list, list]]) -> dict[tuple[str, int], Any]:
        seen: dict[str, int] = {}
        out = {}
        for name, start, ins, outs in sorted(calls, key=lambda c: c[1]):
            occ = seen.get(name, 0)
            seen[name] = occ + 1
            out[(name, occ)] = (start, ins, outs)
        return out

    b_keys = key_list(batch_calls)
    s_keys = [key_list(s) for s in singles]
    in_bad: list[tuple[int, str]] = []
    out_bad: list[tuple[int, str]] = []
    # completion order of the batched run: inner modules complete before their parents
    seen: dict[str, int] = {}
    for name, _start, _ins, _outs in batch_calls:
        occ = seen.get(name, 0)
        seen[name] = occ + 1
        start, ins, outs = b_keys[(name, occ)]
        ins_ok = outs_ok = True
        for j in range(k):
            single = s_keys[j].get((name, occ))
            if single is None:
                continue
            ins_ok = ins_ok and _rows_agree(ins, single[1], j, k, tol)
            outs_ok = outs_ok and _rows_agree(outs, single[2], j, k, tol)
        if not ins_ok:
            in_bad.append((start, name))
        if not outs_ok:
            out_bad.append((start, name))
        if ins_ok and not outs_ok:
            prefix = f"{name}." if name else ""
            inner = [c for c in in_bad if c[1].startswith(prefix) and c[1] != name]
            if not inner:
                return _describe_layer(name, modules)
            _, child = min(inner)
            parent = child.rsplit(".", 1)[0] if "." in child else ""
            return (
                f"an operation in the forward of {_describe_layer(parent, modules)} "
                f"before {_describe_layer(child, modules)}"
            )
    if out_bad:
        return _describe_layer(min(out_bad)[1], modules)
    return None


def _describe_layer(name: str, modules: Mapping[str, nn.Module]) -> str:
    label = name or "<root>"
    return f"layer {label!r} ({type(modules[name]).__name__})"


# ---------------------------------------------------------------- schedule


class CheckSchedule:
    """When to run the independence check: the first ``first`` non-empty batches, then
    randomly chosen later batches, keeping the check's time within ``budget`` of the time
    spent computing clipped sums.

    A later batch is checked with probability ``min(1, budget * mean step time / mean check
    time)`` and only while the checks so far cost at most ``budget`` of the steps so far
    (plus one check), so the expected overhead is at most ``budget``. The choice uses its own
    generator (seeded from the OS), not torch's, so it never changes a seeded training run.
    """

    def __init__(self, first: int = 2, budget: float = 0.02, seed: int | None = None) -> None:
        self.first, self.budget = first, budget
        self.rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8)))
        self.checks = 0
        self.steps = 0
        self.check_time = 0.0
        self.step_time = 0.0

    def due(self) -> bool:
        if self.checks < self.first:
            return True
        if self.steps == 0 or self.check_time <= 0.0:
            return False
        mean_check = self.check_time / self.checks
        if self.check_time + mean_check > self.budget * self.step_time + mean_check:
            return False
        p = min(1.0, self.budget * (self.step_time / self.steps) / mean_check)
        return self.rng.random() < p

    def record_check(self, seconds: float) -> None:
        self.checks += 1
        self.check_time += seconds

    def record_step(self, seconds: float) -> None:
        self.steps += 1
        self.step_time += seconds
