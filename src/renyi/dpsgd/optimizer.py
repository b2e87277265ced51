"""The DP-SGD optimizer: clip → noise → scale → account → step, one readable stage each.

:class:`DPOptimizer` wraps any ``torch.optim.Optimizer``. Per logical batch:

1. **clip** — :meth:`DPOptimizer.accumulate` asks the clipping engine
   (:class:`renyi.dpsgd.clipping.ClippedGradientEngine`) for the *sum* of per-example
   gradients, each clipped to L2 norm ``C`` (``max_grad_norm``). Call it once per physical
   micro-batch of a logical batch (virtual steps); the sums add up. Non-finite losses or
   gradients are refused before anything is accumulated.
2. **noise** — :meth:`DPOptimizer.add_noise` adds ``N(0, σ² C² I)`` once per logical batch
   (σ = ``noise_multiplier``), from the secure OS source by default.
3. **scale** — :meth:`DPOptimizer.scale_grad` divides by the *expected* batch size ``q·n``,
   fixed before training. Never by the realised size: that is data-dependent and would leak
   (and it is never floored).
4. **account** — :meth:`DPOptimizer.account` records the event the sampler says is due at
   this step (:meth:`DPOptimizer.event_at`, which asks ``sampler.event_at(σ, k)``): one
   ``PoissonSampledEvent(q, GaussianEvent(σ))`` per step for Poisson sampling; one whole
   epoch's ``RandomAllocationEvent`` / ``ShuffledEvent`` at the first step of each epoch for
   the epoch samplers (:class:`~renyi.dpsgd.sampler.BallsInBinsSampler`,
   :class:`~renyi.dpsgd.sampler.ShuffleSampler`), so a partial epoch costs a full one. The
   optional budget hook is asked for that event before any noise of the step is drawn.
5. **step** — the wrapped optimizer's ``step()`` runs on the privatised gradient.

Guarantee: if batches come from the sampler given here and every trainable parameter the
wrapped optimizer updates is in ``model``, the released parameters after T steps satisfy
whatever the accountant reports for the composition of the events charged in those T steps,
which is the sampler's ``training_event(σ, T)`` (add/remove neighbouring for Poisson sampling
and random allocation, replace-one for fixed-size batches and shuffling; Abadi et al. 2016,
Thm. 1, with the tight analyses of Mironov, Talwar & Zhang 2019 or the PLD accountant;
Feldman & Shenfeld 2025 and Chua et al. 2025 for random allocation).

Example:
    >>> import torch
    >>> from renyi.dpsgd.sampler import PoissonSampler
    >>> model = torch.nn.Linear(4, 2)
    >>> sampler = PoissonSampler(num_samples=100, sample_rate=0.1, steps=10)
    >>> opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model,
    ...                   loss_fn=torch.nn.CrossEntropyLoss(), noise_multiplier=1.0,
    ...                   max_grad_norm=1.0, sampler=sampler)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from renyi._validation import check_int, check_positive, fail
from renyi.analysis.events import Event, Neighbouring
from renyi.dpsgd.grad_sample import NonFiniteGradientError, UnsupportedModelError
from renyi.errors import BudgetExceededError, RenyiError

__all__ = [
    "BudgetHook",
    "ClippingEngine",
    "DPOptimizer",
    "GradientCapture",
    "NonFiniteLossError",
    "PlanExceededError",
    "PrivacySampler",
    "UnclippedGradientError",
]


class NonFiniteLossError(NonFiniteGradientError):
    """A per-example loss or clipped gradient sum was NaN or infinite; the step was refused.

    A subclass of the clipping engine's :class:`NonFiniteGradientError`, so catching that
    catches both (the engine refuses non-finite losses first; this re-checks its output).
    """


class PlanExceededError(BudgetExceededError):
    """A step beyond the steps the noise was calibrated for was refused (nothing released).

    Raised by :meth:`DPOptimizer.step` of an optimizer made for a target (ε, δ) before any
    noise is drawn or parameter changed. Opt out explicitly with
    ``allow_exceeding_target=True`` (ε then grows past the target; read it with
    :meth:`DPOptimizer.epsilon`).
    """


class UnclippedGradientError(RenyiError):
    """``step()`` had no per-example clipped gradients to privatise; nothing was released.

    Raised when neither :meth:`DPOptimizer.accumulate` nor an attached backward capture
    produced clipped sums for the step (e.g. a plain ``loss.backward()`` on an optimizer
    without a capture): the step would otherwise add noise to an unclipped or empty gradient.
    """


class GradientCapture(Protocol):
    """Per-example clipped sums captured from the user's own ``loss.backward()``."""

    @property
    def sensitivity(self) -> float: ...

    def pop_clipped_sum(self) -> tuple[dict[str, torch.Tensor], int, torch.Tensor]: ...

    def zero_grad(self) -> None: ...


class ClippingEngine(Protocol):
    """What :class:`DPOptimizer` needs from the per-example clipping engine."""

    def clipped_grad_sum(
        self, inputs: Any, targets: Any
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]: ...


class PrivacySampler(Protocol):
    """A batch sampler that knows its accounting event (see :mod:`renyi.dpsgd.sampler`).

    renyi's samplers also have ``charged_event(σ)`` (the unit they are accounted in) and
    ``event_at(σ, step)`` (the event due before step ``step`` is released, or None when an
    earlier charge covers it); a sampler without them is charged ``accounting_event(σ)`` at
    every step.
    """

    @property
    def sample_rate(self) -> float: ...

    @property
    def expected_batch_size(self) -> float: ...

    @property
    def neighbouring(self) -> Neighbouring: ...

    def accounting_event(self, noise_multiplier: float) -> Event: ...


class BudgetHook(Protocol):
    """Extension point for budgets/ledgers: refuse a step *before* it is taken.

    ``spend(event)`` must raise :class:`~renyi.errors.BudgetExceededError` (changing nothing)
    if releasing one more ``event`` would exceed the budget, else record it.
    """

    def spend(self, event: Event) -> Any: ...


def _default_engine(
    model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], **kwargs: Any
) -> ClippingEngine:
    from renyi.dpsgd.clipping import ClippedGradientEngine

    engine: ClippingEngine = ClippedGradientEngine(model, loss_fn, **kwargs)
    return engine


def _batch_len(inputs: Any) -> int:
    """Examples in a batch: dim 0 of the tensor, or of the first of a tuple of tensors."""
    first = inputs[0] if isinstance(inputs, tuple | list) else inputs
    return int(first.shape[0])


def _slice(inputs: Any, start: int, stop: int) -> Any:
    if isinstance(inputs, tuple | list):
        return tuple(t[start:stop] for t in inputs)
    return inputs[start:stop]


def _own(t: torch.Tensor) -> torch.Tensor:
    """A fresh sum as it is (a view keeps its base: the flat buffer ``add_noise`` noises
    without a copy), detached if it requires grad."""
    return t.detach() if t.requires_grad else t


def _fresh_capture(capture: Any) -> bool:
    """Whether ``capture`` is renyi's own (:class:`~renyi.dpsgd.capture.PerExampleCapture`,
    possibly in the engine's one-forward-per-step wrapper): its popped sums are new tensors
    that nothing else holds, so the optimiser keeps them without a copy."""
    from renyi.dpsgd.capture import PerExampleCapture
    from renyi.dpsgd.engine import _OneForwardPerStep

    if type(capture) is _OneForwardPerStep:
        capture = capture.capture
    return type(capture) is PerExampleCapture


def _check_noise_source(source: Any, allow_predictable_noise: bool) -> bool:
    """True for renyi's own torch sources (exact type); a caller-supplied source is refused
    unless ``allow_predictable_noise`` (then False is returned and a warning is emitted)."""
    from renyi import random as rrandom
    from renyi.dpsgd.sampler import SecureRandomSource, SeededRandomSource

    if type(source) is SecureRandomSource:
        if rrandom.is_trusted_source(source.source) and source.source.secure:
            return True
    elif type(source) is SeededRandomSource:
        return True
    if not allow_predictable_noise:
        raise fail(
            "random_source",
            source,
            "renyi's SecureRandomSource (default) or SeededRandomSource; a caller-supplied "
            "source needs allow_predictable_noise=True (its noise is neither checked nor "
            "lattice-safe)",
        )
    rrandom._warn_insecure(
        f"a caller-supplied {type(source).__name__} (allow_predictable_noise=True)",
        "renyi cannot vouch for its noise; leave random_source unset for the secure OS source",
    )
    return False


class DPOptimizer(torch.optim.Optimizer):
    """Differentially private wrapper around a ``torch.optim.Optimizer`` (DP-SGD).

    It is a ``torch.optim.Optimizer`` itself, sharing ``param_groups``, ``state`` and
    ``defaults`` with the wrapped optimizer (the same objects, not copies): learning-rate
    schedulers (``StepLR``, ``LambdaLR``, Hugging Face's ``get_linear_schedule_with_warmup``)
    read and write the wrapped optimizer's learning rates; ``torch.amp.GradScaler`` is
    supported exactly (see :meth:`step`); :meth:`state_dict` / :meth:`load_state_dict`
    round-trip the whole private state (wrapped optimizer, accountant, sampler, noise source).

    Args:
        optimizer: the wrapped optimizer; every parameter it updates must belong to ``model``.
        model: the model whose per-example gradients are clipped.
        loss_fn: a ``torch.nn`` loss module (e.g. ``nn.CrossEntropyLoss()``; the engine
            evaluates it per example) or a callable returning one loss per example.
        noise_multiplier: σ > 0; the noise std on the clipped sum is σ·C.
        max_grad_norm: C > 0, the per-example L2 clipping norm.
        sampler: the batch sampler (gives the expected batch size and, through its
            ``event_at``, the event charged at each step: per step for Poisson, fixed-size
            and truncated Poisson sampling, per epoch — at the epoch's first step, a partial
            epoch costing a full one — for balls-in-bins and shuffling).
        accountant: ``"rdp"``, ``"pld"``, ``"zcdp"``, an accountant object (duck-typed:
            ``compose(event, count)``, ``epsilon(delta)``, ``state_dict()``), or None.
        random_source: noise source; default the sampler's source (secure by default). Only
            renyi's :class:`~renyi.dpsgd.sampler.SecureRandomSource` and
            :class:`~renyi.dpsgd.sampler.SeededRandomSource` are accepted (by exact type);
            any other object is refused unless ``allow_predictable_noise=True``.
        allow_predictable_noise: accept a caller-supplied ``random_source`` (its
            ``normal(shape, dtype)`` is added as is, NOT lattice-safe; warns). For tests.
        max_physical_batch_size: split each :meth:`accumulate` call into micro-batches of at
            most this many examples (virtual steps); None = no split.
        clipping, grad_mode: passed to the clipping engine.
        engine: a ready clipping engine (advanced; it must clip to ``max_grad_norm``).
        budget: optional :class:`BudgetHook` asked before every charge (every step, or
            the first step of each epoch for the epoch samplers), before any noise is drawn.
        capture: a backward capture (e.g. :class:`renyi.dpsgd.capture.PerExampleCapture`):
            when :meth:`accumulate` was not called, :meth:`step` takes the clipped sums of
            the user's own ``loss.backward()`` from it (the Opacus idiom).
        max_steps: the steps the noise was calibrated for (the plan); :meth:`step` refuses
            step ``max_steps + 1`` with :class:`PlanExceededError` unless
            ``allow_exceeding_target=True``. None: no plan (ε is whatever the steps cost).
        target: ``(ε, δ)`` the plan was calibrated for (named in the refusal).
        allow_exceeding_target: explicit opt-out of the plan's refusal.

    Frozen parameters (``requires_grad=False``) in the wrapped optimizer are skipped (never
    updated, so LoRA and partial fine-tuning work); one unfrozen after set-up, or a parameter
    added to the wrapped optimizer after set-up, is refused at the next step.

    Raises:
        PrivacyParameterError: σ ≤ 0, C ≤ 0, a parameter outside ``model``, etc.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        model: torch.nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        noise_multiplier: float,
        max_grad_norm: float,
        sampler: PrivacySampler,
        accountant: Any = "rdp",
        random_source: Any = None,
        max_physical_batch_size: int | None = None,
        clipping: str = "flat",
        grad_mode: str = "auto",
        engine: ClippingEngine | None = None,
        budget: BudgetHook | None = None,
        capture: GradientCapture | None = None,
        max_steps: int | None = None,
        target: tuple[float, float] | None = None,
        allow_exceeding_target: bool = False,
        allow_predictable_noise: bool = False,
    ) -> None:
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self.max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
        if max_physical_batch_size is not None:
            max_physical_batch_size = check_int(
                "max_physical_batch_size", max_physical_batch_size, 1
            )
        self.max_physical_batch_size = max_physical_batch_size
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise fail("optimizer", type(optimizer).__name__, "a torch.optim.Optimizer")
        named = {id(p): name for name, p in model.named_parameters() if p.requires_grad}
        self._param_names: list[str] = []
        self._params: list[torch.nn.Parameter] = []
        self._frozen: list[torch.Tensor] = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if not p.requires_grad:  # frozen (fine-tuning, LoRA): never updated
                    self._frozen.append(p)
                    continue
                if id(p) not in named:
                    raise fail(
                        "optimizer",
                        f"parameter of shape {tuple(p.shape)}",
                        "only trainable parameters of `model` (others would be updated "
                        "without clipping or noise)",
                    )
                self._param_names.append(named[id(p)])
                self._params.append(p)
        self.original_optimizer = optimizer
        #: every parameter of the wrapped optimizer at set-up (a later one is refused)
        self._known_ids = frozenset(id(p) for p in [*self._params, *self._frozen])
        self.model = model
        self.sampler = sampler
        self.expected_batch_size = check_positive(
            "sampler.expected_batch_size", sampler.expected_batch_size
        )
        charged = getattr(sampler, "charged_event", None)
        self.event = (
            charged(self.noise_multiplier)
            if charged is not None
            else sampler.accounting_event(self.noise_multiplier)
        )
        if isinstance(accountant, str):
            from renyi.accountants import make_accountant

            accountant = make_accountant(accountant)
        self.accountant = accountant
        if random_source is None:
            random_source = getattr(sampler, "random_source", None)
        if random_source is None:
            from renyi.dpsgd.sampler import SecureRandomSource

            random_source = SecureRandomSource()
        self._own_noise = _check_noise_source(random_source, allow_predictable_noise)
        self.random_source = random_source
        self.budget = budget
        self.engine = (
            engine
            if engine is not None
            else _default_engine(
                model, loss_fn, max_grad_norm=self.max_grad_norm, clipping=clipping, mode=grad_mode
            )
        )
        from renyi.dpsgd.clipping import ClippedGradientEngine

        self._fresh_sums = type(self.engine) is ClippedGradientEngine
        # The noise is calibrated to max_grad_norm: the engine's sensitivity (the L2 bound on
        # one clipped per-example gradient) must be exactly that.
        engine_norm = getattr(
            self.engine, "sensitivity", getattr(self.engine, "max_grad_norm", self.max_grad_norm)
        )
        if not math.isclose(float(engine_norm), self.max_grad_norm, rel_tol=1e-12):
            raise fail("engine sensitivity", engine_norm, f"equal to max_grad_norm={max_grad_norm}")
        if capture is not None:
            cap_norm = float(capture.sensitivity)
            if not math.isclose(cap_norm, self.max_grad_norm, rel_tol=1e-12):
                raise fail(
                    "capture sensitivity", cap_norm, f"equal to max_grad_norm={max_grad_norm}"
                )
        self.capture = capture
        self.max_steps = None if max_steps is None else check_int("max_steps", max_steps, 1)
        self.target = target
        self.allow_exceeding_target = bool(allow_exceeding_target)
        self.steps_taken = 0
        self._skip_next = False  # signal_skip_step: the next step() only collects
        self._mid_batch = False  # a skipped step collected sums of this logical batch
        self._pending_steps = 0  # charges not yet composed into the accountant (lazy, exact)
        self._pending_event: Event | None = None  # what those charges are of
        self._summed: dict[str, torch.Tensor] | None = None
        self._examples_seen = 0
        self._linked_batches: list[Any] = []  # loaders to move on when a checkpoint is loaded
        # torch.optim.Optimizer's hook tables (Optimizer.__init__ is not called: it would
        # build a second set of parameter groups; param_groups/state/defaults are the wrapped
        # optimizer's, below)
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()

    # -- torch.optim.Optimizer: the wrapped optimizer's groups, state and defaults ---------
    #: ``torch.amp.GradScaler.step`` hands this optimizer its scale (``grad_scale``) and
    #: inf flag (``found_inf``) instead of unscaling ``.grad`` itself: see :meth:`step`.
    _step_supports_amp_scaling = True

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups (schedulers change ``lr`` here)."""
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property  # type: ignore[override]
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state (e.g. Adam's moments)."""
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.original_optimizer.state = value

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.original_optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the clipped parameters are fixed when the DP optimizer is made."""
        raise fail(
            "add_param_group",
            f"a group of {len(list(param_group.get('params', [])))} parameters",
            "no new groups after the DP optimizer is made (their gradients would be neither "
            "clipped nor noised): add them to the optimizer before make_private",
        )

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r})"

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``.grad`` and the accumulated clipped sums of the current logical batch.

        Between the micro-batches of one logical batch (after a step skipped by
        :meth:`signal_skip_step`) the clipped sums so far are kept; only ``.grad`` and
        what the capture holds are cleared.
        """
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        if not self._mid_batch:
            self._summed = None
            self._examples_seen = 0
        if self.capture is not None:
            self.capture.zero_grad()

    def signal_skip_step(self, do_skip: bool = True) -> None:
        """Make the next :meth:`step` only collect its micro-batch (Opacus's name).

        For virtual steps with the ``loss.backward()`` idiom
        (:class:`renyi.dpsgd.engine.BatchMemoryManager` calls it): the clipped sums of a
        skipped step are kept, and the next step that is not skipped privatises the sum over
        all micro-batches of the logical batch — one noise draw, one accounted step. The
        micro-batches must partition one logical batch (each example in one of them).
        """
        self._skip_next = bool(do_skip)

    # -- stage 1: clip (accumulate clipped sums over micro-batches) ----------------------
    def accumulate(self, inputs: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the clipped per-example gradient sum of ``(inputs, targets)`` to this batch.

        Call once per physical micro-batch of the current logical (Poisson) batch, then
        :meth:`step`. Inputs larger than ``max_physical_batch_size`` are split here.
        Returns the per-example losses and (pre-clipping) gradient norms.

        Raises:
            NonFiniteLossError: a loss or a clipped gradient is NaN/inf (nothing is added).
        """
        n = _batch_len(inputs)
        chunk = self.max_physical_batch_size or max(n, 1)
        sums: dict[str, torch.Tensor] = {}
        losses: list[torch.Tensor] = []
        norms: list[torch.Tensor] = []
        for start in range(0, max(n, 1), chunk):
            try:
                part_sums, part_losses, part_norms = self.engine.clipped_grad_sum(
                    _slice(inputs, start, start + chunk), targets[start : start + chunk]
                )
            except UnsupportedModelError:
                self._drop_batch()  # a refused model: nothing of this step is kept
                raise
            for name, g in part_sums.items():
                if name in sums:
                    sums[name] = sums[name] + g
                else:  # our engine returns fresh tensors; another might keep and reuse them
                    # (kept as they are when fresh: slices of the engine's flat buffer)
                    sums[name] = _own(g) if self._fresh_sums else g.detach().clone()
            losses.append(part_losses.detach().reshape(-1))
            norms.append(part_norms.detach().reshape(-1))
        all_losses = torch.cat(losses)
        all_norms = torch.cat(norms)
        self._check_finite(all_losses, sums, n)
        missing = [name for name in self._param_names if name not in sums]
        if missing:
            raise fail(
                "engine output", sorted(sums), f"a clipped sum for every parameter {missing}"
            )
        if self._summed is None:
            self._summed = sums
        else:
            for name, g in sums.items():
                self._summed[name] = self._summed[name] + g
        self._examples_seen += n
        return all_losses, all_norms

    def add_clipped_sum(self, sums: Mapping[str, torch.Tensor], num_examples: int) -> None:
        """Add clipped sums computed elsewhere (e.g. by your own engine call) to this batch."""
        self._add_sums(sums, num_examples, fresh=False)

    def _add_sums(
        self, sums: Mapping[str, torch.Tensor], num_examples: int, *, fresh: bool
    ) -> None:
        """:meth:`add_clipped_sum`; ``fresh``: the tensors are this batch's own (made by
        renyi's capture for this step, referenced nowhere else), kept without a copy."""
        num_examples = check_int("num_examples", num_examples, 0)
        self._check_finite(None, dict(sums), num_examples)
        missing = [name for name in self._param_names if name not in sums]
        if missing:
            raise fail("clipped sums", sorted(sums), f"a clipped sum for every parameter {missing}")
        if self._summed is None:
            self._summed = {k: _own(v) if fresh else v.detach().clone() for k, v in sums.items()}
        else:
            for name, g in sums.items():
                self._summed[name] = self._summed[name] + g
        self._examples_seen += num_examples

    def _check_finite(
        self, losses: torch.Tensor | None, sums: dict[str, torch.Tensor], num_examples: int
    ) -> None:
        """Refuse non-finite losses or clipped sums, and a sum longer than ``n C``."""
        if losses is not None and not bool(torch.isfinite(losses).all()):
            bad = int((~torch.isfinite(losses)).sum())
            raise NonFiniteLossError(
                f"{bad} of {losses.numel()} per-example losses are NaN or infinite; the step "
                "was refused (lower the learning rate or check the data)"
            )
        # the common case in one pass over all sums: one norm per tensor in its own dtype
        # (torch._foreach_norm), their float64 norm (no overflow of the squares of the
        # norms), one read. A non-finite total (a NaN/inf anywhere, or float32 squares
        # that overflowed in a tensor's own norm) is redone tensor by tensor below.
        flat = self._flat_sum(sums)
        if flat is not None:
            total = float(torch.linalg.vector_norm(flat))
            if math.isfinite(total):
                self._check_bound(total * total, num_examples)
                return
        tensors = [g.detach() for g in sums.values()]
        if flat is None and tensors and len({(g.dtype, g.device) for g in tensors}) == 1:
            norms = torch.stack(torch._foreach_norm(tensors)).double()
            total = float(torch.linalg.vector_norm(norms))
            if math.isfinite(total):
                self._check_bound(total * total, num_examples)
                return
        sq = 0.0
        for name, g in sums.items():
            # one pass in the gradient's own dtype: a NaN/inf anywhere makes the norm
            # non-finite; only then (or if float32 squares overflowed) is it redone in float64
            norm = float(torch.linalg.vector_norm(g.detach()))
            if not math.isfinite(norm):
                norm = float(torch.linalg.vector_norm(g.detach(), dtype=torch.float64))
            if not math.isfinite(norm):
                raise NonFiniteLossError(f"the clipped gradient sum of {name!r} is not finite")
            sq += norm * norm
        self._check_bound(sq, num_examples)

    def _check_bound(self, sq: float, num_examples: int) -> None:
        # Defence in depth: a sum of k vectors of norm <= C has norm <= k C.
        bound = num_examples * self.max_grad_norm * (1 + 1e-4) + 1e-6
        if math.sqrt(sq) > bound:
            raise RenyiError(
                f"clipped gradient sum has norm {math.sqrt(sq):.6g} > num_examples * "
                f"max_grad_norm = {bound:.6g}: the clipping engine did not clip"
            )

    # -- stage 2: noise -------------------------------------------------------------------
    def add_noise(self) -> None:
        """Set ``p.grad`` to the released ``clipped_sum + N(0, σ² C² I)`` (once per step).

        The release is :func:`renyi.noise.gaussian` on the flat clipped sum: every coordinate
        on the lattice ``renyi.noise.lattice_step(σC) ℤ``, a post-processing of the Gaussian
        mechanism the accountant analyses (see ``docs/noise.md``).
        """
        dtype = self._noise_dtype()
        flat = self._flat_sum(self._summed, dtype)
        if flat is None:
            pieces = []
            for name, p in zip(self._param_names, self._params, strict=True):
                summed = self._summed.get(name) if self._summed is not None else None
                pieces.append(
                    summed.detach().reshape(-1).to(dtype)
                    if summed is not None
                    else torch.zeros(p.numel(), dtype=dtype)
                )
            flat = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype)
        released = self.release_noisy_sum(flat)
        chunks = released.split([p.numel() for p in self._params]) if self._params else ()
        for p, chunk in zip(self._params, chunks, strict=True):
            chunk = chunk.view(p.shape)
            p.grad = (
                chunk
                if chunk.dtype == p.dtype and chunk.device == p.device
                else (chunk.to(dtype=p.dtype, device=p.device))
            )

    def _flat_sum(
        self, sums: Mapping[str, torch.Tensor] | None, dtype: torch.dtype | None = None
    ) -> torch.Tensor | None:
        """``sums`` (one per parameter, no other) as one flat tensor without a copy, when they
        are the consecutive slices, in parameter order, of one contiguous buffer (of ``dtype``
        if given): the engine writes a step's clipped sums so
        (``ClippedGradientEngine._flat_views``). ``None`` otherwise."""
        if not sums or not self._params or len(sums) != len(self._params):
            return None
        first = sums.get(self._param_names[0])
        base = None if first is None else first._base
        if base is None or base.ndim != 1 or not base.is_contiguous():
            return None
        if (dtype is not None and base.dtype != dtype) or base.numel() != sum(
            p.numel() for p in self._params
        ):
            return None
        offset = base.storage_offset()
        for name, p in zip(self._param_names, self._params, strict=True):
            v = sums.get(name)
            if (
                v is None
                or v._base is not base
                or v.storage_offset() != offset
                or v.shape != p.shape
                or not v.is_contiguous()
            ):
                return None
            offset += p.numel()
        return base.detach()

    def release_noisy_sum(self, flat: torch.Tensor) -> torch.Tensor:
        """``flat + N(0, σ² C²)`` per entry, released on the lattice by :mod:`renyi.noise`.

        With a caller-supplied source (``allow_predictable_noise=True``) its ``normal`` is
        added as is instead (not lattice-safe; that source was refused without the flag),
        but still with the sign of zero canonical: ``+ 0.0`` turns a ``-0.0`` coordinate
        (which would reveal that the clipped sum was just below zero) into ``+0.0``.
        """
        std = self.noise_std()
        if self._own_noise:
            from renyi import noise

            if self._releases_fresh_noise():
                # fresh noise: the exact lattice release draws it itself (the fast path)
                return noise.gaussian(flat, std, rng=self.random_source)
            # a subclass's shaping of fresh normals (correlated noise: rows of C^-1 Z),
            # released on the lattice
            return noise.snap(flat, self.draw_noise(), std)
        return (flat + std * self.draw_noise().to(flat.dtype)).add_(0.0)

    def _releases_fresh_noise(self) -> bool:
        """Whether this step's noise is fresh i.i.d. N(0, 1) per coordinate, so that
        :func:`renyi.noise.gaussian` draws and releases it exactly; a subclass that shapes
        its noise (:meth:`draw_noise`) releases through :func:`renyi.noise.snap` instead."""
        # an instance attribute (a patched draw_noise) shapes the noise too
        return type(self).draw_noise is DPOptimizer.draw_noise and "draw_noise" not in vars(self)

    def noise_std(self) -> float:
        """Standard deviation of the noise on each coordinate of the clipped sum: σ·C.

        (Adaptive clipping overrides it: part of the budget goes to the quantile estimate.)
        """
        return self.noise_multiplier * self.max_grad_norm

    def draw_noise(self) -> torch.Tensor:
        """One flat float64 vector of i.i.d. N(0, 1) for all parameters (parameter order).

        Raw floating-point normals from :attr:`random_source` (for the secure source, the
        full-precision sampler of :mod:`renyi.noise`): NOT for release on their own (their
        low bits leak); :meth:`release_noisy_sum` snaps the noisy sum to the lattice.
        """
        total = sum(p.numel() for p in self._params)
        return self.random_source.normal((total,), torch.float64)

    def _noise_dtype(self) -> torch.dtype:
        # float16/bfloat16 parameters: the clipped sums come in float32 and the noise is added
        # in float32; rounding to the parameter dtype happens after (post-processing)
        reduced = (torch.float16, torch.bfloat16)
        dtypes = {torch.float32 if p.dtype in reduced else p.dtype for p in self._params}
        return dtypes.pop() if len(dtypes) == 1 else torch.float64

    # -- stage 3: scale -------------------------------------------------------------------
    def scale_grad(self) -> None:
        """Divide every gradient by the expected batch size q·n (a constant)."""
        grads = [p.grad for p in self._params if p.grad is not None]
        if grads:  # one vectorised division (the same quotient per entry as div_)
            torch._foreach_div_(grads, self.expected_batch_size)

    # -- stage 4: account -----------------------------------------------------------------
    def event_at(self, step: int) -> Event | None:
        """The event charged before step ``step`` (0-based) is released, or None when an
        earlier charge covers it: the one place the optimizer learns what a step costs.

        Asks the sampler (``sampler.event_at(σ, step)``); a sampler without ``event_at`` is
        charged :attr:`event` at every step. Subclasses with another plan override this.
        """
        ask = getattr(self.sampler, "event_at", None)
        return self.event if ask is None else ask(self.noise_multiplier, step)

    def account(self) -> None:
        """Count the step and record the event due at it (composed lazily, exactly)."""
        due = self.event_at(self.steps_taken)
        if due is not None:
            if self._pending_steps and due != self._pending_event:
                self._flush()
            self._pending_event = due
            self._pending_steps += 1
        self.steps_taken += 1

    def _flush(self) -> None:
        if self.accountant is not None and self._pending_steps:
            event = self.event if self._pending_event is None else self._pending_event
            self.accountant.compose(event, self._pending_steps)
            self._pending_steps = 0

    # -- stage 5: step --------------------------------------------------------------------
    def pre_step(self) -> None:
        """Stages 2-4 on the accumulated clipped sums (override to customise)."""
        self.add_noise()
        self.scale_grad()
        self.account()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Privatise the accumulated batch, record it, and run the wrapped optimizer step.

        The clipped sums come from :meth:`accumulate` (or :meth:`add_clipped_sum`) calls since
        the last step, else from the attached :attr:`capture` (the user's own
        ``loss.backward()``). An empty logical batch (``accumulate`` of zero examples, or a
        captured forward/backward of an empty batch) is still a step: it releases pure noise
        and is accounted like any other.

        Step hooks registered on this optimizer (``register_step_pre_hook`` /
        ``register_step_post_hook``) run around it; those of the wrapped optimizer run
        around its own step.

        **Gradient scaling** (``scaler.scale(loss).backward(); scaler.step(optimizer)`` with
        ``torch.amp.GradScaler``): the scaler hands its scale ``S`` to this optimizer
        (``_step_supports_amp_scaling``) instead of unscaling ``.grad``. The captured
        per-example gradients are those of ``S·loss``; each is clipped to ``S·C`` and the sum
        divided by ``S``, which is exactly ``Σ clip(g_i, C)`` (bit for bit when ``S`` is a
        power of two, as GradScaler's are). A step whose scaled gradients overflowed is
        **refused** (:class:`NonFiniteLossError`), never skipped: a skipped step would
        reveal, without noise, that some example's gradient overflowed, and the scale that
        the scaler then lowers would carry that bit into every later step. Flat clipping only.

        Raises:
            PlanExceededError: the step would go past the plan (``max_steps``).
            UnclippedGradientError: no clipped sums for this step (e.g. ``loss.backward()``
                without a capture): nothing is released, never noise on a raw ``.grad``.
            BudgetExceededError: the budget hook refused the step.
            NonFiniteLossError: non-finite gradients (also those a GradScaler found).
        """
        if closure is not None:
            raise fail("closure", closure, "None (closures re-evaluate the loss non-privately)")
        args: tuple[Any, ...] = (self,)
        kwargs: dict[str, Any] = {}
        for pre_hook in list(self._optimizer_step_pre_hooks.values()):
            result = pre_hook(self, args, kwargs)
            if result is not None:
                raise fail("step pre-hook result", result, "None (the DP step takes no arguments)")
        out = self._private_step()
        for post_hook in list(self._optimizer_step_post_hooks.values()):
            post_hook(self, args, kwargs)
        return out

    def _amp_scale(self) -> float:
        """The loss scale ``S`` a ``torch.amp.GradScaler`` set for this step (1 without one);
        refuses a step whose scaled gradients the scaler found non-finite."""
        scale = getattr(self, "grad_scale", None)
        if scale is None:
            return 1.0
        found = getattr(self, "found_inf", None)
        if found is not None and float(found) > 0:
            raise NonFiniteLossError(
                "torch.amp.GradScaler found inf/NaN in the scaled gradients; the step was "
                "refused, not skipped (a skipped step, and the lowered scale after it, would "
                "reveal without noise that an example's gradient overflowed). Start from a "
                "smaller init_scale, or train without a scaler (bfloat16 needs none); nothing "
                "was released"
            )
        value = float(scale)
        if not math.isfinite(value) or value <= 0:
            raise fail("GradScaler scale", value, "a finite positive loss scale")
        return value

    def _private_step(self) -> Any:
        self._check_plan()
        self._check_frozen()
        if self._summed is None or (self._mid_batch and self.capture is not None):
            self._take_captured()
        if self._skip_next:  # a micro-batch of a logical batch: collected, nothing released
            self._skip_next = False
            self._mid_batch = True
            return None
        self._mid_batch = False
        self._check_drawn()
        if self.budget is not None:  # the gate: refuses before any noise is drawn or released
            due = self.event_at(self.steps_taken)
            if due is not None:
                self.budget.spend(due)
        self.pre_step()
        result = self.original_optimizer.step()
        self._summed = None
        self._examples_seen = 0
        if self.capture is not None:  # what it saw this step is spent (or superseded)
            self.capture.zero_grad()
        return result

    def _check_drawn(self) -> None:
        """Refuse a release unless a batch was drawn for it from the private data loader this
        optimizer was made with (when one is linked: a loader without worker processes).
        The accountant charges that loader's sampling (e.g. Poisson with rate ``q``) once per
        batch; a batch of another loader (a ``transformers.Trainer`` given this optimizer
        builds its own, shuffled and of fixed size) or a second step on one batch would be
        released under a guarantee it does not have."""
        linked = [b for b in self._linked_batches if getattr(b, "_optimizer", None) is self]
        if not linked:
            return
        step = self.steps_taken + 1
        if any(b.batches_drawn >= step - b._step_base for b in linked):
            return
        drawn = max(b.batches_drawn - (self.steps_taken - b._step_base) for b in linked)
        self._drop_batch()
        raise fail(
            "training loop",
            f"step {step} with {max(drawn, 0)} new batches drawn from the private data loader",
            "exactly one optimizer.step() per batch drawn from the data loader make_private "
            "returned (its sampling is what ε accounts for: batches of a loader of your own, "
            "e.g. the one a transformers.Trainer builds, are not, and a second step on one "
            "batch is not a second sample); iterate that loader, or use "
            "renyi.dpsgd.hf.DPTrainer (audits feeding chosen batches: "
            "unlink_data_loaders()); nothing was released",
        )

    def _drew_empty_batch(self) -> bool:
        """Whether this step's batch, drawn from a linked private loader, is empty (Poisson
        sampling draws empty batches; Hugging Face models cannot run on zero rows, so its
        step comes without a forward: it releases noise only, as an empty batch does)."""
        step = self.steps_taken + 1
        return any(
            getattr(b, "_optimizer", None) is self
            and b.batches_drawn == step - b._step_base
            and getattr(b, "last_size", None) == 0
            for b in self._linked_batches
        )

    def unlink_data_loaders(self) -> None:
        """Stop checking that every step has a batch drawn from the private loaders linked
        to this optimizer (white-box audits and tests that feed batches of their choice: the
        reported ε then does not describe how those batches were chosen)."""
        for batches in self._linked_batches:
            if getattr(batches, "_optimizer", None) is self:
                batches._optimizer = None
        self._linked_batches.clear()

    def _check_plan(self) -> None:
        if self.max_steps is None or self.allow_exceeding_target:
            return
        if self.steps_taken >= self.max_steps:
            target = ""
            if self.target is not None:
                target = f" for ε = {self.target[0]:g} at δ = {self.target[1]:g}"
            raise PlanExceededError(
                f"step {self.steps_taken + 1} refused: {self.steps_taken} steps taken of the "
                f"{self.max_steps} planned{target} (σ was calibrated for exactly that many); "
                "nothing was released. Stop training here, or opt out explicitly with "
                "allow_exceeding_target=True (ε then grows past the target)"
            )

    def _check_frozen(self) -> None:
        known = self._known_ids
        for group in self.original_optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in known:
                    # e.g. optimizer.original_optimizer.add_param_group(...) after set-up: the
                    # wrapped optimizer would step it with its raw, unclipped, unnoised .grad
                    raise fail(
                        "optimizer",
                        f"parameter of shape {tuple(p.shape)} added after set-up",
                        "the parameters fixed when the DP optimizer was made (add them to the "
                        "optimizer before make_private)",
                    )
        for p in self._frozen:
            if p.requires_grad:
                raise fail(
                    "optimizer",
                    f"parameter of shape {tuple(p.shape)} unfrozen after set-up",
                    "the trainable parameters fixed when the DP optimizer was made (make a new "
                    "one after changing requires_grad)",
                )
            p.grad = None  # a frozen parameter is never updated (weight decay included)

    def _take_captured(self) -> None:
        """Clipped sums of the user's own backward from :attr:`capture`, or refuse."""
        raw = [
            n for n, p in zip(self._param_names, self._params, strict=True) if p.grad is not None
        ]
        if self.capture is None:
            why = (
                f"the parameters {raw[:3]}{'...' if len(raw) > 3 else ''} have gradients from a "
                "plain loss.backward(), which are not clipped per example"
                if raw
                else "nothing was accumulated for this step"
            )
            raise UnclippedGradientError(
                f"step() refused: {why}. Call optimizer.accumulate(inputs, targets) for every "
                "batch (an empty Poisson batch too), or make the optimizer with "
                "renyi.dpsgd.PrivacyEngine().make_private(...) so that loss.backward() is "
                "captured per example; nothing was released"
            )
        try:
            sums, n, norms = self._pop_captured(self.capture)
        except RenyiError as exc:
            if type(exc).__name__ != "MissingGradientError":
                self._drop_batch()
                raise  # a refused model or input (e.g. ExampleMixingError): its own error
            if self._drew_empty_batch():  # nothing to run the model on: a noise-only step
                zeros = {
                    n: torch.zeros(p.shape, dtype=_sum_dtype(p.dtype), device=p.device)
                    for n, p in zip(self._param_names, self._params, strict=True)
                }
                self._add_sums(zeros, 0, fresh=True)
                return
            raise UnclippedGradientError(
                f"step() refused: no per-example gradients were captured for this step ({exc}); "
                "nothing was released"
            ) from exc
        self._add_captured(sums, n, norms)

    def _pop_captured(
        self, capture: GradientCapture
    ) -> tuple[dict[str, torch.Tensor], int, torch.Tensor]:
        """The capture's clipped sums; under a GradScaler's scale ``S``, clipped at ``S·C``
        and divided by ``S`` (= the sums of the unscaled gradients clipped at ``C``)."""
        scale = self._amp_scale()
        if scale == 1.0:
            return capture.pop_clipped_sum()
        if getattr(self.engine, "clipping", "flat") != "flat":
            capture.zero_grad()
            raise fail(
                "clipping",
                getattr(self.engine, "clipping", None),
                "'flat' with a GradScaler (only flat clipping commutes with the loss scale)",
            )
        clip = self.max_grad_norm
        capture.max_grad_norm = scale * clip  # type: ignore[attr-defined]
        try:
            sums, n, norms = capture.pop_clipped_sum()
        finally:
            capture.max_grad_norm = clip  # type: ignore[attr-defined]
        return {k: v / scale for k, v in sums.items()}, n, norms / scale

    def _drop_batch(self) -> None:
        """A refused step: forget the logical batch's clipped sums and the raw gradients of
        the refused batch, so model, optimizer and accountant stay as before the step."""
        self._summed, self._examples_seen = None, 0
        self._skip_next = self._mid_batch = False
        if self.capture is not None:
            self.capture.zero_grad()
        for p in self._params:
            p.grad = None

    def _add_captured(self, sums: dict[str, torch.Tensor], n: int, norms: torch.Tensor) -> None:
        """Add a captured batch's clipped sums (hook for subclasses that use the norms)."""
        self._add_sums(sums, n, fresh=_fresh_capture(self.capture))

    # -- privacy --------------------------------------------------------------------------
    def epsilon(self, delta: float) -> Any:
        """The accountant's ε for all steps so far at ``delta`` (an ``EpsilonResult``): every
        event charged, so with an epoch sampler the current epoch counts in full."""
        if self.accountant is None:
            raise fail("accountant", None, "an accountant (pass accountant='rdp' or 'pld')")
        self._flush()
        return self.accountant.epsilon(delta)

    # -- checkpointing --------------------------------------------------------------------
    def _mechanism(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "expected_batch_size": self.expected_batch_size,
            "event": self.event.to_dict(),
        }

    def state_dict(self) -> dict[str, Any]:
        """The whole private state, between steps: the wrapped optimizer's state, the
        accountant's history, the sampler's position and random state, the noise source's
        state and the mechanism's parameters (checked on load).

        Plain Python values and tensors only (``torch.load(..., weights_only=True)`` reads
        it). **Noise keys are never written**: renyi's secure source has no state to save
        (``{"kind": "secure"}``), and a run resumed from the checkpoint draws fresh noise
        from the OS, which leaves the guarantee unchanged (each step's noise is independent
        of the others') but is not bit-identical. A seeded source (``seed=``, insecure by
        design) saves its generator state, so a seeded run resumes bit for bit.

        Raises:
            PrivacyParameterError: called in the middle of a logical batch (after a step
                skipped by :meth:`signal_skip_step`, or after :meth:`accumulate` before its
                :meth:`step`): the partial clipped sums are not part of a checkpoint.
        """
        if self._mid_batch or self._summed is not None:
            raise fail(
                "state_dict",
                "called in the middle of a logical batch",
                "a checkpoint taken between steps (after optimizer.step(), before the next "
                "batch's gradients are accumulated)",
            )
        self._flush()
        sampler_state = getattr(self.sampler, "state_dict", None)
        return {
            "optimizer": self.original_optimizer.state_dict(),
            "accountant": None if self.accountant is None else self.accountant.state_dict(),
            "random_source": self.random_source.state_dict(),
            "sampler": None if sampler_state is None else sampler_state(),
            "steps_taken": self.steps_taken,
            "mechanism": self._mechanism(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:  # type: ignore[override]
        """Restore :meth:`state_dict`: the run continues where the checkpoint was taken.

        Everything is checked before anything is restored: the mechanism (σ, C, expected
        batch size, charged event) must be this optimizer's, the accountant of the same
        kind, the noise source of the same kind (secure or seeded), and with an epoch
        sampler the checkpoint must be at an epoch boundary. The accountant is restored in
        place (a ``PrivacyEngine`` sharing it sees the restored history); the sampler's
        position and random state are restored and every private loader linked to this
        optimizer continues after the checkpoint's last batch.
        """
        if not isinstance(state, Mapping) or not {"mechanism", "optimizer"} <= set(state):
            raise fail(
                "checkpoint", type(state).__name__, "a DPOptimizer.state_dict() (with 'mechanism')"
            )
        saved = state["mechanism"]
        for key, value in self._mechanism().items():
            if saved.get(key) != value:
                raise fail(f"checkpoint {key}", saved.get(key), f"{value!r} (this optimizer's)")
        taken = check_int("checkpoint steps_taken", state["steps_taken"], 0)
        per_epoch = getattr(self.sampler, "steps_per_epoch", None)
        if isinstance(per_epoch, int) and taken % per_epoch:
            # the epoch samplers cannot resume mid-epoch (its allocation is not saved); a
            # fresh allocation from there would run uncharged until the next boundary
            raise fail(
                "checkpoint steps_taken",
                taken,
                f"an epoch boundary (a multiple of the sampler's {per_epoch} steps per epoch)",
            )
        restored = None
        if self.accountant is not None:
            if state.get("accountant") is None:
                raise fail("checkpoint accountant", None, "the accountant's state")
            restored = type(self.accountant).from_state_dict(state["accountant"])
        source_state = state["random_source"]
        mine = self.random_source.state_dict().get("kind")
        if not isinstance(source_state, Mapping) or source_state.get("kind") != mine:
            raise fail(
                "checkpoint random_source",
                source_state.get("kind") if isinstance(source_state, Mapping) else source_state,
                f"{mine!r} (this optimizer's noise source)",
            )
        sampler_state = state.get("sampler")
        if sampler_state is not None and not hasattr(self.sampler, "load_state_dict"):
            raise fail("sampler", type(self.sampler).__name__, "a sampler with load_state_dict")
        self.original_optimizer.load_state_dict(state["optimizer"])  # checks the groups first
        self.random_source.load_state_dict(dict(source_state))
        if sampler_state is not None:
            self.sampler.load_state_dict(sampler_state)  # type: ignore[attr-defined]
        if restored is not None:
            _restore_in_place(self.accountant, restored)
        self.steps_taken = taken
        self._pending_steps = 0
        self._pending_event = None
        self._summed = None
        self._examples_seen = 0
        self._mid_batch = False
        self._skip_next = False
        for batches in self._linked_batches:
            batches.resync()


def _restore_in_place(accountant: Any, restored: Any) -> None:
    """Make ``accountant`` hold ``restored``'s history (a rebuilt accountant of the same
    type), keeping its identity: whoever holds the object (a ``PrivacyEngine``, a second
    optimizer) sees the restored state."""
    accountant.__dict__.clear()
    accountant.__dict__.update(restored.__dict__)


def _sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a clipped sum for a parameter of ``dtype`` (float32 for half types)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
