"""Example independence: the premise of per-example clipping, checked against each example alone.

DP-SGD's sensitivity bound (Abadi et al. 2016, Algorithm 1) holds only if example ``i``'s
gradient depends on example ``i`` alone. Layer-wise engines (ghost norms, hooks) read every
example's gradient off one *batched* forward pass, so an operation that mixes the examples of
a batch (a hand-written batch normalisation using batch statistics in ``self.training``,
``x - x.mean(0)``, ``F.batch_norm(..., training=True)``, a loss normalised by the batch, ...)
silently breaks the bound: removing one example then moves every other example's clipped
gradient too. :func:`run_check` tests this on a few examples of a batch, before the batch's
clipped sum is returned, so that no update of such a model is released.

**What is compared.** ``k = 3`` examples of the batch (padded with public all-zero dummies when
the batch is smaller) go through the engine as a batch; examples 0 and 1 are then run each on
its own, as a batch of ``m = 2`` copies of the example, through the model's own forward and
plain autograd (the reference). Copies rather than a batch of one: a batch of one breaks honest
code (``.squeeze()``, unbiased statistics, ``F.batch_norm`` in training mode raise or give NaN)
and a size that differs from ``k`` exposes models that depend on the batch size.

**Randomness is replayed.** Dropout (``nn.Dropout``, ``F.dropout``, attention dropout),
stochastic depth and sampling (``randn_like``, ``bernoulli``) draw random numbers; the check
records every random draw of the batched run (:class:`RandomTape`, at the level of torch's
operators) and gives each reference run the rows of its example, so an honest stochastic
model compares equal. ``nn.RNNBase`` and ``nn.MultiheadAttention`` are put in eval mode
during the check (the engine's decomposed forward draws their dropout differently from
torch's fused kernels); buffers and the random number generators are restored afterwards.

**Tolerance from the computation** (:func:`roundoff_bound`). The engine and the reference
evaluate the same function with operations in a different order; their difference is
round-off, bounded per layer by ``K (u (log2(n) + D) + rho) S``: ``S`` the layer gradient's
magnitude before cancellation (``sum over calls of ||b_i|| (||a_i|| sqrt(r) + sqrt(P))`` from
its input ``a``, output gradient ``b``, ``P`` positions and receptive field ``r``), ``u`` the
unit round-off, ``n`` the accumulation length, ``D`` the number of layers (errors carried
through depth), ``rho`` the measured relative round-off of the loss's gradient at the model's
outputs (a confidently classified example's ``softmax - onehot`` cancels to a few ulps). Only
a difference beyond the bound fails the first stage; it is then recomputed in float64 with the
random draws replayed, and the model is refused only if the difference persists (is still
beyond the float32 bound). Models in bfloat16/float16 or under autocast are compared in
float32 first. Example mixing changes gradients by O(1) relative amounts.

**What the random checks guarantee** (:class:`CheckSchedule`). The first two batches are
checked, then every later batch independently with probability ``p`` (at least
``min_rate``, more within the time ``budget``), chosen by a generator seeded from the OS that
the model cannot see. A model that starts mixing later (or mixes only on some batches) is
caught at the first checked mixing batch: the number ``N`` of mixed updates released before
that satisfies ``P(N >= t) <= (1 - min_rate)^t`` (with the default ``min_rate = 0.02``:
fewer than 228 with probability 99 %, 49 on average). ``strict=True``
(``self_check="strict"``) checks every batch: no mixed update is ever released.

A refusal raises :class:`ExampleMixingError` (or :class:`UnsupportedModelError` when the
forward agrees but the gradients do not) before anything is released: the model, optimizer
and accountant are as they were before the refused step.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Mix(nn.Module):
    ...     def forward(self, x):
    ...         return x - x.mean(dim=0)  # uses the whole batch
    >>> model = nn.Sequential(nn.Linear(3, 3), Mix(), nn.Linear(3, 2))
    >>> x = torch.randn(3, 3)
    >>> locate_mixing(model, lambda: model(x), lambda j: model(x[[j, j]]), 3, 2)
    "layer '1' (Mix)"
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from renyi._validation import check_positive, fail
from renyi.dpsgd.grad_sample import (
    UnsupportedModelError,
    autocast_devices,
    per_example_losses,
)
from renyi.dpsgd.layout import BatchLayout, example_block, input_batch_dim
from renyi.dpsgd.replay import RandomTape, ReplayError, flat_tensors
from renyi.errors import RenyiError

if TYPE_CHECKING:  # pragma: no cover
    from renyi.dpsgd.clipping import ClippedGradientEngine

__all__ = [
    "CheckSchedule",
    "CheckStats",
    "ExampleMixingError",
    "RandomTape",
    "check_conditions",
    "locate_mixing",
    "roundoff_bound",
    "run_check",
]

#: Examples run as a batch by the check, and copies of one example in each reference run.
K_BATCH, M_COPIES = 3, 2

#: Safety factor of the round-off bound (see :func:`roundoff_bound`).
BOUND_FACTOR = 16.0

_UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
_REDUCED = (torch.float16, torch.bfloat16)

RESUMABLE = (
    "Nothing was released: the model, the optimizer and the accountant are as they were before "
    "this step, so training can resume from them (or from optimizer.state_dict()) once the "
    "model is fixed."
)


class ExampleMixingError(UnsupportedModelError):
    """The model's output (or gradient) for one example depends on other examples of the batch.

    Raised by the engine's independence check before the step's clipped sum is returned, so
    no update of such a model is ever released. The message names the layer or operation.
    """


# ---------------------------------------------------------------- conditions


#: Modules whose dropout is drawn inside torch's fused kernels, differently from the engine's
#: decomposed forward: put in eval mode during the check (both runs then skip their dropout).
FUSED_DROPOUT: tuple[type[nn.Module], ...] = (nn.RNNBase, nn.MultiheadAttention)


@contextmanager
def check_conditions(model: nn.Module) -> Iterator[None]:
    """The model as it trains, for the duration of a check, leaving no trace.

    Train/eval mode stays as the user set it (a module that mixes examples only in training
    mode is thereby caught), except :data:`FUSED_DROPOUT` modules, which are put in eval mode.
    Attention runs in PyTorch's math kernel (its dropout is then an operator the check can
    replay), float32 without TensorFloat-32 (CUDA). The values of all buffers (e.g. running
    statistics updated by the check's forward passes) and the CPU and CUDA random number
    generator states are restored on exit.
    """
    switched = [m for m in model.modules() if isinstance(m, FUSED_DROPOUT) and m.training]
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    for m in switched:
        m.training = False
    devices: list[int] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = list(range(torch.cuda.device_count()))
    tf32 = (torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    try:
        # float32 means float32 during the check: no TensorFloat-32 (10-bit) CUDA kernels
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        with torch.random.fork_rng(devices=devices), _math_attention():
            yield
    finally:
        torch.backends.cudnn.allow_tf32 = tf32[0]
        torch.set_float32_matmul_precision(tf32[1])
        for m in switched:
            m.training = True
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in saved and b.shape == saved[n].shape and b.dtype == saved[n].dtype:
                    b.copy_(saved[n])


@contextmanager
def _math_attention() -> Iterator[None]:
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - older torch
        yield
        return
    with sdpa_kernel([SDPBackend.MATH]):
        yield


@contextmanager
def _in_dtype(modules: Sequence[Any], dtype: torch.dtype) -> Iterator[None]:
    """Floating parameters and buffers of ``modules`` temporarily in ``dtype`` (the original
    tensors are put back on exit, bit for bit); autocast off."""
    swapped: list[tuple[Tensor, Tensor]] = []
    seen: set[int] = set()
    try:
        for mod in modules:
            if not isinstance(mod, nn.Module):
                continue
            for t in [*mod.parameters(), *mod.buffers()]:
                if id(t) in seen or not t.is_floating_point() or t.dtype == dtype:
                    continue
                seen.add(id(t))
                swapped.append((t, t.data))
                t.data = t.data.to(dtype)
        with _no_autocast():
            yield
    finally:
        for t, original in swapped:
            t.data = original


@contextmanager
def _no_autocast() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield


def _cast(x: Any, dtype: torch.dtype | None) -> Any:
    if dtype is None or not isinstance(x, Tensor) or not x.is_floating_point():
        return x
    return x.to(dtype)


# ---------------------------------------------------------------- bound


def roundoff_bound(magnitude: float, length: int, depth: int, unit: float, rho: float) -> float:
    """Bound on the round-off difference of one layer's per-example gradient between two
    evaluations in a precision of unit round-off ``unit``: ``K (u (log2(n) + D) + rho) S``.

    ``magnitude`` (``S``): the gradient's magnitude before cancellation,
    ``sum over calls of ||b|| (||a|| sqrt(r) + sqrt(P))`` for the example's layer input ``a``,
    output gradient ``b``, ``P`` positions summed over and receptive field ``r`` (kernel
    size of a convolution, else 1); ``length`` (``n``): the accumulation length; ``depth``
    (``D``): layers the error is carried through; ``rho``: relative round-off of the loss
    gradient at the outputs; ``K`` = :data:`BOUND_FACTOR`. A sum of ``n`` terms computed
    pairwise (blocked), as BLAS kernels and torch's reductions do, is off by at most
    ``log2(n) u`` times the sum of the terms' magnitudes (Higham, *Accuracy and Stability of
    Numerical Algorithms*, 2nd ed., Sec. 4.2); each of the ``D`` layers before and after adds
    its own relative error to the factors; ``K`` is the margin, measured in docs/dpsgd.md.

    Example:
        >>> roundoff_bound(2.0, 16, 2, 2.0**-24, 0.0) == 16 * 2.0**-24 * (4 + 2) * 2.0
        True
    """
    return BOUND_FACTOR * (unit * (math.log2(max(length, 2)) + depth) + rho) * magnitude


@dataclass
class _LayerScale:
    magnitude: list[float]  # per checked example
    length: int
    steps: int = 0  # recurrent layers: time steps the round-off is carried through


def _layer_scales(engine: ClippedGradientEngine, rec: Any, k: int) -> dict[str, _LayerScale]:
    """Magnitudes before cancellation of each layer's per-example gradient, for the check's
    ``k`` examples, from the engine's recording of the batched run."""
    out: dict[str, _LayerScale] = {}
    for name, lay in engine._layers.items():
        pairs: list[tuple[Tensor | None, Tensor | None, int]] = []
        if lay.kind == "decomposed":
            for lst in rec.recorders[name].calls.values():
                for x, slot in lst:
                    pairs.append((x, rec.grad(slot), 1))
        else:
            calls = [(a, kw, [rec.grad(i) for i in ids]) for a, kw, ids in rec.records[name]]
            fixed = isinstance(lay.module, _CHANNELS_FIRST)
            try:
                calls = engine.layout.to_batch_first(name, calls, k, fixed)
            except UnsupportedModelError:
                pass
            r = 1
            normalised = "Norm" in type(lay.module).__name__
            w = getattr(lay.module, "weight", None)
            if isinstance(lay.module, nn.modules.conv._ConvNd) and isinstance(w, Tensor):
                r = int(math.prod(w.shape[2:]))
            for args, kwargs, gouts in calls:
                floats = [
                    t
                    for t in (*args, *kwargs.values())
                    if isinstance(t, Tensor)
                    and t.is_floating_point()
                    and t.ndim > 0
                    and int(t.shape[0]) % k == 0
                ]
                x = torch.cat([t.reshape(k, -1) for t in floats], dim=1) if floats else None
                grads = [g for g in gouts if g is not None and int(g.shape[0]) % k == 0]
                g = torch.cat([t.reshape(k, -1) for t in grads], dim=1) if grads else None
                if normalised and x is not None:  # the gradient sees the normalised input
                    x = torch.ones_like(x)
                pairs.append((x, g, r))
        mags = [0.0] * k
        length = 1
        steps = 0
        for x, g, r in pairs:
            if g is None:
                continue
            g64 = g.detach().reshape(k, -1).double()
            gn = g64.norm(dim=1)
            last = int(g.shape[-1]) if g.ndim > 1 else 1
            positions = max(1, g64.shape[1] // max(last, 1))
            an = (
                x.detach().reshape(k, -1).double().norm(dim=1)
                if x is not None
                else torch.zeros(k, dtype=torch.float64)
            )
            fan = 1 if x is None else max(1, x.reshape(k, -1).shape[1] // positions)
            length = max(length, positions * fan * r)
            if isinstance(lay.module, nn.RNNBase):
                steps = max(steps, positions * lay.module.num_layers)
            for i in range(k):
                mags[i] += float(gn[i]) * (float(an[i]) * math.sqrt(r) + math.sqrt(positions))
        out[name] = _LayerScale(mags, length, steps)
    return out


_CHANNELS_FIRST: tuple[type[nn.Module], ...] = (nn.modules.conv._ConvNd, nn.GroupNorm)


# ---------------------------------------------------------------- statistics


@dataclass
class CheckStats:
    """What the checks of one engine saw (for the false-alarm measurements in docs/dpsgd.md).

    ``checks``: checks run; ``rechecks``: of them, how many exceeded the bound in the model's
    dtype and were recomputed in float64; ``max_ratio``: largest difference / bound of a
    passing first stage; ``max_ratio_float64``: the same after a float64 recomputation;
    ``ratios``: every check's largest ratio (first stage)."""

    checks: int = 0
    rechecks: int = 0
    max_ratio: float = 0.0
    max_ratio_float64: float = 0.0
    ratios: list[float] = field(default_factory=list)


# ---------------------------------------------------------------- the check


def _pick(
    engine: ClippedGradientEngine, inputs: Any, targets: Tensor, batch: int, first: bool
) -> tuple[tuple[Any, ...], Tensor]:
    """``K_BATCH`` examples of the batch (the first ones on the first checks, random ones
    later), padded with public all-zero dummies."""
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    take = min(batch, K_BATCH)
    if first or batch <= K_BATCH:
        idx = list(range(take))
    else:
        idx = engine.schedule.rng.sample(range(batch), take)
    index = torch.tensor(idx, dtype=torch.long)
    pad = K_BATCH - take
    bf = engine.layout.batch_first

    def rows(t: Any) -> Any:
        if not isinstance(t, Tensor) or t.ndim == 0:
            return t
        d = input_batch_dim(t, bf)
        if int(t.shape[d]) != batch:
            return t
        got = t.index_select(d, index.to(t.device))
        if pad:
            zeros = torch.zeros_like(got.narrow(d, 0, 1))
            got = torch.cat([got, *([zeros] * pad)], dim=d)
        return got

    return tuple(rows(a) for a in args), rows_dim0(targets, index, pad)


def rows_dim0(t: Tensor, index: Tensor, pad: int) -> Tensor:
    got = t.index_select(0, index.to(t.device))
    if pad:
        got = torch.cat([got, *([torch.zeros_like(got[:1])] * pad)])
    return got


def _copies(args: tuple[Any, ...], y: Tensor, j: int, batch_first: bool) -> tuple[Any, Tensor]:
    def rep(t: Any) -> Any:
        if not isinstance(t, Tensor) or t.ndim == 0:
            return t
        d = input_batch_dim(t, batch_first)
        if int(t.shape[d]) != K_BATCH:
            return t
        idx = torch.tensor([j] * M_COPIES, device=t.device)
        return t.index_select(d, idx)

    return tuple(rep(a) for a in args), y.index_select(
        0, torch.tensor([j] * M_COPIES, device=y.device)
    )


@dataclass
class _Outcome:
    ratio: float  # largest difference / bound
    worst: tuple[int, str, float, float]  # (example, layer, difference, bound)
    finite: bool


def _first_tensor(out: Any) -> list[Tensor]:
    return [t for t in flat_tensors(out) if t.is_floating_point()]


def _reference(
    engine: ClippedGradientEngine,
    args: tuple[Any, ...],
    y: Tensor,
    j: int,
    tape: RandomTape | None,
    shapes: dict[str, list[dict[str, tuple[int, ...]]]] | None,
) -> tuple[dict[str, Tensor], float]:
    """Example ``j`` run as ``M_COPIES`` copies through the model's own forward and plain
    autograd: its gradient, and the relative round-off of the loss gradient at the outputs."""
    params = engine._params
    cargs, cy = _copies(args, y, j, engine.layout.batch_first)
    handles = _shape_hooks(engine, shapes) if shapes is not None else []
    replay = _nothing() if tape is None else tape.replay((j, K_BATCH, M_COPIES))
    try:
        with torch.enable_grad(), replay:
            out = engine._call(cargs)
            for h in handles:
                h.remove()
            handles = []
            losses = per_example_losses(engine.loss_fn, out, cy)
            outs = [o for o in _first_tensor(out) if o.requires_grad]
            ref = torch.autograd.grad(
                losses[0], list(params.values()) + outs, allow_unused=True, retain_graph=True
            )
    finally:
        for h in handles:
            h.remove()
    grads = {
        n: torch.zeros_like(p) if r is None else r
        for (n, p), r in zip(params.items(), ref[: len(params)], strict=True)
    }
    rho = _loss_roundoff(engine, out, outs, cy, ref[len(params) :])
    return grads, rho


def _loss_roundoff(
    engine: ClippedGradientEngine,
    out: Any,
    outs: list[Tensor],
    cy: Tensor,
    g_low: Sequence[Tensor | None],
) -> float:
    """Relative round-off of the gradient of example 0's loss at the model's outputs: the
    same loss on the same outputs in float64 (0 if it cannot be evaluated so)."""
    if not outs or all(o.dtype == torch.float64 for o in outs) or not isinstance(out, Tensor):
        return 0.0
    try:
        with torch.enable_grad(), _in_dtype([engine.loss_fn], torch.float64):
            o64 = out.detach().double().requires_grad_(True)
            y64 = cy.double() if cy.is_floating_point() else cy
            l64 = per_example_losses(engine.loss_fn, o64, y64)[0]
            (g64,) = torch.autograd.grad(l64, [o64])
    except (RuntimeError, TypeError, ValueError, UnsupportedModelError):
        return 0.0
    g32 = g_low[0] if g_low else None
    if g32 is None:
        return 0.0
    ref = float(g64[0].norm())
    diff = float((g32[0].double() - g64[0]).norm())
    if ref == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / ref


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _rng_states() -> list[Tensor]:
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += list(torch.cuda.get_rng_state_all())
    return states


def _same_states(a: list[Tensor] | None, b: list[Tensor]) -> bool:
    if a is None or len(a) != len(b):
        return False
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _shape_hooks(
    engine: ClippedGradientEngine, shapes: dict[str, list[dict[str, tuple[int, ...]]]]
) -> list[Any]:
    handles = []
    for name, lay in engine._layers.items():
        if lay.kind == "decomposed":
            continue

        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any, name: str = name) -> None:
            outs = flat_tensors(output)
            call = (tuple(args), dict(kwargs), list(outs))
            shapes.setdefault(name, []).append(BatchLayout.shapes(call))  # type: ignore[arg-type]

        handles.append(lay.module.register_forward_hook(hook, with_kwargs=True))
    return handles


def _compare(
    engine: ClippedGradientEngine,
    got: Sequence[Mapping[str, Tensor]],
    want: Sequence[Mapping[str, Tensor]],
    scales: Mapping[str, _LayerScale],
    rhos: Sequence[float],
    unit: float,
) -> _Outcome:
    depth = max(1, len(engine._layers)) + sum(sc.steps for sc in scales.values())
    worst: tuple[int, str, float, float] = (0, "", 0.0, 0.0)
    ratio, finite = 0.0, True
    covered: set[str] = set()
    units = _units(engine)
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        for unit_layers in units:
            diff_sq, bound = 0.0, 0.0
            names: dict[str, None] = {}
            for name in unit_layers:
                names.update(dict.fromkeys(engine._layers[name].full))
                sc = scales[name]
                bound += roundoff_bound(sc.magnitude[j], sc.length, depth, unit, rhos[j])
            for full in names:
                covered.add(full)
                d = g[full].detach().double().reshape(w[full].shape) - w[full].double()
                diff_sq += float(d.pow(2).sum())
            diff = math.sqrt(diff_sq)
            name = " + ".join(unit_layers)
            bound = max(bound, 1e-300)
            r = diff / bound if math.isfinite(diff) else math.inf
            if not math.isfinite(diff):
                finite = False
            if r > ratio or not worst[1]:
                ratio, worst = max(ratio, r), (j, name, diff, bound)
        rest = [n for n in engine._params if n not in covered]
        for full in rest:  # parameters outside the layer plan: compared with the total norm
            dist = float((g[full].double().reshape(w[full].shape) - w[full].double()).norm())
            bound = BOUND_FACTOR * unit * (depth + 1) * float(w[full].double().norm()) + 1e-300
            if dist / bound > ratio:
                ratio, worst = dist / bound, (j, full, dist, bound)
    return _Outcome(ratio, worst, finite)


def _units(engine: ClippedGradientEngine) -> list[list[str]]:
    """The layers compared together: one layer, or the layers sharing a parameter (tied
    weights: their gradients of it are summed; the bound is the sum of theirs)."""
    units: list[list[str]] = []
    where: dict[str, int] = {}
    for name, lay in engine._layers.items():
        found = sorted({where[f] for f in lay.full if f in where})
        if not found:
            units.append([name])
            k = len(units) - 1
        else:
            k = found[0]
            for other in found[1:]:  # a layer joining two units: merged
                units[k].extend(units[other])
                units[other] = []
            units[k].append(name)
        for lname in units[k]:
            for f in engine._layers[lname].full:
                where[f] = k
    return [u for u in units if u]


def _engine_grads(
    engine: ClippedGradientEngine, by_layer: Any, k: int, rows: Sequence[int]
) -> list[dict[str, Tensor]]:
    out = []
    for j in rows:
        onehot = torch.zeros(k, dtype=torch.float64)
        onehot[j] = 1.0
        w = {n: onehot.to(p.device) for n, p in engine._params.items()}
        out.append(engine._weighted(by_layer, w))
    return out


def _stage(
    engine: ClippedGradientEngine,
    args: tuple[Any, ...],
    y: Tensor,
    tape: RandomTape,
    replay: bool,
    learn: bool,
    unit: float,
    scales: Mapping[str, _LayerScale] | None,
    allow_plain: bool = True,
) -> tuple[_Outcome, dict[str, _LayerScale], bool] | None:
    """One comparison: the batched run through the engine (recording or replaying the random
    draws) and the reference runs of examples 0 and 1. A model that drew no random numbers
    at the last check in this train/eval mode runs without the tape (``plain``, returned):
    unchanged generator states confirm it, else the stage runs again with the tape."""
    from renyi.dpsgd.grad_sample import NonFiniteGradientError

    draws: dict[bool, bool] = engine.__dict__.setdefault("_check_draws", {})
    training = engine.model.training
    plain = allow_plain and not replay and draws.get(training) is False
    while True:
        before = _rng_states() if plain else None
        ctx = tape.replay(None) if replay else tape.record() if not plain else _nothing()
        try:
            with ctx:
                rec, _ = engine._record(args if len(args) > 1 else args[0], y, K_BATCH)
        except NonFiniteGradientError:
            return None  # the step itself reports it
        shapes: dict[str, list[dict[str, tuple[int, ...]]]] = {}
        want, rhos = [], []
        for j in range(2):
            grads, rho = _reference(
                engine, args, y, j, None if plain else tape, shapes if learn and j == 0 else None
            )
            want.append(grads)
            rhos.append(rho)
        if plain and not _same_states(before, _rng_states()):
            plain = False  # the model draws random numbers now: again, with the tape
            draws[training] = True
            continue
        break
    if not replay and not plain:
        draws[training] = len(tape) > 0
    if learn:
        for name, calls in rec.records.items():
            batched = [
                BatchLayout.shapes((a, kw, [rec.grad(i) for i in ids])) for a, kw, ids in calls
            ]
            engine.layout.learn(name, batched, shapes.get(name, []), K_BATCH, M_COPIES)
    by_layer = engine._collect(rec, K_BATCH)
    from renyi.dpsgd.clipping import _sq_norms

    if not all(bool(torch.isfinite(v).all()) for v in _sq_norms(by_layer).values()):
        return None  # a non-finite gradient: the step itself reports it
    if scales is None:
        scales = _layer_scales(engine, rec, K_BATCH)
    got = _engine_grads(engine, by_layer, K_BATCH, range(2))
    return _compare(engine, got, want, scales, rhos, unit), dict(scales), plain


def run_check(engine: ClippedGradientEngine, inputs: Any, targets: Tensor, batch: int) -> None:
    """The independence check of ``engine`` on a few examples of one batch (module docstring).

    Raises:
        ExampleMixingError: the model's output for one example depends on other examples.
        UnsupportedModelError: the forward agrees, but the per-example gradients do not (a
            parameter used outside its module, a loss or backward pass that mixes), or the
            random draws cannot be matched to examples.
    """
    try:
        _run_check(engine, inputs, targets, batch)
    except RenyiError as err:
        if not isinstance(err, ReplayError):
            raise
        raise UnsupportedModelError(
            f"the independence check cannot replay the model's random numbers: {err}. It "
            "compares each example's gradient with the same example run on its own, with the "
            "same random draws (dropout masks, samples), which it matches to examples by the "
            "batch dimension of each draw. Train with grad_sample_mode='vmap' (mode='vmap'), "
            f"which runs every example on its own and needs no check. {RESUMABLE}"
        ) from None
    except (RuntimeError, ValueError, IndexError, TypeError) as err:
        raise UnsupportedModelError(
            f"the independence check could not run the model on {K_BATCH} examples of the "
            f"batch, or on {M_COPIES} copies of one of them: {type(err).__name__}: {err}. A "
            "forward that works only for some batch sizes, or that indexes across the batch "
            "(a permutation of the examples, a gather by batch position), depends on the other "
            "examples; train with grad_sample_mode='vmap' (mode='vmap') to run every example "
            f"on its own. {RESUMABLE}"
        ) from err


def _run_check(engine: ClippedGradientEngine, inputs: Any, targets: Tensor, batch: int) -> None:
    model = engine.model
    first = engine.schedule.checks < engine.schedule.first
    args, y = _pick(engine, inputs, targets, batch, first)
    dtypes = {p.dtype for p in engine._params.values()}
    reduced = bool(autocast_devices()) or bool(dtypes & set(_REDUCED))
    low = torch.float32 if reduced else max(dtypes, key=lambda d: _UNIT_ROUNDOFF.get(d, 0.0))
    unit = _UNIT_ROUNDOFF.get(low, 2.0**-24)
    modules = [model, engine.loss_fn]
    tape = RandomTape()
    stats = engine.check_stats
    low_args = tuple(_cast(a, torch.float32 if reduced else None) for a in args)
    low_y = _cast(y, torch.float32 if reduced else None)
    with check_conditions(model):
        ctx = _in_dtype(modules, torch.float32) if reduced else contextlib.nullcontext()
        with ctx:
            res = _stage(engine, low_args, low_y, tape, False, True, unit, None)
            if res is not None and res[2] and not (res[0].finite and res[0].ratio <= 1.0):
                # it ran without the tape: a generator of the model's own may have drawn
                res = _stage(
                    engine, low_args, low_y, tape, False, True, unit, None, allow_plain=False
                )
        if res is None:
            return
        outcome, scales, _ = res
        stats.checks += 1
        stats.ratios.append(outcome.ratio)
        if outcome.finite and outcome.ratio <= 1.0:
            stats.max_ratio = max(stats.max_ratio, outcome.ratio)
            return
        if low == torch.float64:
            final = outcome
        else:
            stats.rechecks += 1
            with _in_dtype(modules, torch.float64):
                res64 = _stage(engine, _f64(args), _f64((y,))[0], tape, True, False, unit, scales)
            if res64 is None:
                return
            final = res64[0]
            if final.finite and final.ratio <= 1.0:
                stats.max_ratio_float64 = max(stats.max_ratio_float64, final.ratio)
                return
        with _in_dtype(modules, torch.float64):
            where = locate_mixing(
                model,
                lambda: _replayed(tape, None, engine, _f64(args)),
                lambda j: _replayed(
                    tape,
                    (j, K_BATCH, M_COPIES),
                    engine,
                    _copies(_f64(args), y, j, engine.layout.batch_first)[0],
                ),
                K_BATCH,
                M_COPIES,
                tol=1e-7,
            )
    _refuse(engine, final, outcome, where, low)


def _f64(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_cast(a, torch.float64) for a in args)


def _replayed(
    tape: RandomTape, rows: Any, engine: ClippedGradientEngine, args: tuple[Any, ...]
) -> Any:
    with tape.replay(rows):
        return engine._call(args)


def _refuse(
    engine: ClippedGradientEngine,
    final: _Outcome,
    first: _Outcome,
    where: str | None,
    low: torch.dtype,
) -> None:
    j, layer, dist, bound = final.worst
    mode = "training" if engine.model.training else "eval"
    rechecked = "" if low == torch.float64 else ", also when recomputed in float64"
    found = (
        f"the per-example gradient of layer {layer!r} for example {j} of the checked batch "
        f"differs from that example run on its own by {dist:.3g}, "
        f"{dist / bound:.3g} times the round-off bound {bound:.3g}{rechecked}"
    )
    if where is not None:
        hint = (
            "use per-example normalisation (nn.GroupNorm, nn.LayerNorm) instead of batch "
            "statistics, or put the layer in eval mode"
            if "Norm" in where
            else "replace operations across the batch dimension (x.mean(0), x.std(0), "
            "F.batch_norm(..., training=True), ...) by per-example ones"
        )
        raise ExampleMixingError(
            f"{where} mixes the examples of a batch: its output for one example depends on "
            f"the other examples ({found}; model in {mode} mode). DP-SGD clips each example's "
            "gradient, which bounds the update's sensitivity only if examples are processed "
            f"independently: {hint}; or train with grad_sample_mode='vmap' (mode='vmap'), "
            "which runs every example on its own (a batch statistic then becomes a statistic "
            f"of one example). {RESUMABLE}"
        )
    raise UnsupportedModelError(
        f"the layer-wise per-example gradients are wrong for this model: {found}, although "
        "the output of every module for that example agrees with the run on its own. A "
        "parameter is used outside the forward of its module, or the loss or a backward pass "
        "mixes examples: train with grad_sample_mode='vmap' (mode='vmap'), which "
        f"differentiates every example on its own, or register a per-sample rule. {RESUMABLE}"
    )


# ---------------------------------------------------------------- localisation


def _tensors(x: Any) -> list[Tensor]:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, tuple | list):
        return [t for o in x for t in _tensors(o)]
    if isinstance(x, Mapping):
        return [t for o in x.values() for t in _tensors(o)]
    return []


def _rows_agree(
    batched: list[Tensor], single: list[Tensor], j: int, k: int, m: int, tol: float
) -> bool:
    """Example ``j``'s rows of each batched tensor (``k`` examples) against the first copy of
    the run of ``m`` copies; tensors not related by a batch dimension are skipped."""
    for a, b in zip(batched, single, strict=False):
        try:
            found = example_block(tuple(a.shape), tuple(b.shape), k, m)
        except ValueError:
            continue
        if found is None:
            ra, rb = a, b
        else:
            d, s = found
            ra, rb = a.narrow(d, j * s, s), b.narrow(d, 0, s)
        if not (a.is_floating_point() or a.is_complex()):
            if not torch.equal(ra, rb):
                return False
            continue
        ra, rb = ra.detach().double(), rb.detach().double()
        if not ra.numel():
            continue
        scale = float(torch.maximum(ra.abs().max(), rb.abs().max()))
        diff = (ra - rb).abs()
        if not bool(torch.isfinite(ra).all()) or not bool(torch.isfinite(rb).all()):
            if not torch.equal(torch.isfinite(ra), torch.isfinite(rb)):
                return False
            diff = diff[torch.isfinite(diff)]
        if diff.numel() and float(diff.max()) > tol * scale + 1e-300:
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
    m: int = 1,
    tol: float = 1e-4,
) -> str | None:
    """Name the layer or operation through which examples of a batch influence each other.

    ``run_batch()`` runs ``model`` on a batch of ``k`` examples, ``run_one(j)`` on ``m``
    copies of example ``j`` (``m = 1``: example ``j`` alone). Every module call of the two
    runs is matched by (module, occurrence); the first call, in completion order, whose input
    rows agree but whose output rows for some example do not is the mixing layer. If instead a
    module's input already disagrees while every earlier module agreed, the mixing happened in
    plain tensor code before that module, inside its parent's ``forward``.

    Returns:
        a description (``"layer 'bn' (MyNorm)"`` or ``"an operation in the forward of
        '<parent>' (<Type>) before layer '<child>'"``), or ``None`` if every module output
        agrees (the mixing is then in the loss, a backward pass, or a parameter is used
        outside its module).
    """
    modules = dict(model.named_modules())
    batch_calls = _record_calls(model, run_batch)
    singles = [_record_calls(model, functools.partial(run_one, j)) for j in range(min(k, 2))]

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
    seen: dict[str, int] = {}
    for name, _start, _ins, _outs in batch_calls:
        occ = seen.get(name, 0)
        seen[name] = occ + 1
        start, ins, outs = b_keys[(name, occ)]
        ins_ok = outs_ok = True
        for j, s_key in enumerate(s_keys):
            single = s_key.get((name, occ))
            if single is None:
                continue
            ins_ok = ins_ok and _rows_agree(ins, single[1], j, k, m, tol)
            outs_ok = outs_ok and _rows_agree(outs, single[2], j, k, m, tol)
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
    """When to run the independence check.

    The first ``first`` non-empty batches are checked; then each later batch independently
    with probability ``p = min(1, max(min_rate, budget * mean step time / mean check time))``
    (``strict``: every batch). The choice uses its own generator (seeded from the OS), not
    torch's, so it never changes a seeded training run and the model cannot foresee it.

    Guarantee for a model that starts mixing later (or mixes only on some batches): the number
    ``N`` of mixing batches whose updates are released before one is checked satisfies
    ``P(N >= t) <= (1 - min_rate)^t``, e.g. ``min_rate = 0.02`` gives ``N < 228`` with
    probability 99 % (mixing visible on the checked examples). ``strict`` gives ``N = 0``.
    The floor costs ``min_rate`` checks per step: a check cost 0.23 of an engine step for the
    Fashion-MNIST CNN at batch 256 and 0.96 of a full step for the LSTM example at batch 64
    (docs/dpsgd.md), so 0.5 % and 2 % of the training time.

    Example:
        >>> CheckSchedule().releases_bound(0.99)
        228
    """

    def __init__(
        self,
        first: int = 2,
        budget: float = 0.02,
        seed: int | None = None,
        *,
        min_rate: float = 0.02,
        strict: bool = False,
    ) -> None:
        self.first, self.budget = first, budget
        self.min_rate = check_positive("min_rate", min_rate)
        if self.min_rate > 1:
            raise fail("min_rate", min_rate, "a probability in (0, 1]")
        self.strict = bool(strict)
        self.rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8)))
        self.checks = 0
        self.steps = 0
        self.check_time = 0.0
        self.step_time = 0.0

    def rate(self) -> float:
        """The probability that the next later batch is checked."""
        if self.strict:
            return 1.0
        if self.steps == 0 or self.checks == 0 or self.check_time <= 0.0:
            return 1.0
        mean_check = self.check_time / self.checks
        return min(
            1.0, max(self.min_rate, self.budget * (self.step_time / self.steps) / mean_check)
        )

    def due(self) -> bool:
        if self.strict or self.checks < self.first:
            return True
        return self.rng.random() < self.rate()

    def releases_bound(self, confidence: float) -> int:
        """``t`` such that at most ``t`` mixing updates are released before a check catches
        the model, with probability ``confidence`` (0 in strict mode)."""
        if self.strict or self.min_rate >= 1.0:
            return 0
        return math.ceil(math.log1p(-confidence) / math.log1p(-self.min_rate))

    def record_check(self, seconds: float) -> None:
        self.checks += 1
        self.check_time += seconds

    def record_step(self, seconds: float) -> None:
        self.steps += 1
        self.step_time += seconds
