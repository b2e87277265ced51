"""``PrivacyEngine``: Opacus's entry point, with renyi's clipping, noise and accounting.

An Opacus script ports by changing its import line::

    from renyi.dpsgd import PrivacyEngine          # was: from opacus import PrivacyEngine

    privacy_engine = PrivacyEngine()
    model, optimizer, train_loader = privacy_engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=train_loader,
        epochs=EPOCHS, target_epsilon=EPSILON, target_delta=DELTA, max_grad_norm=1.0)
    for epoch in range(EPOCHS):
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(data), target)
            loss.backward()                        # captured per example
            optimizer.step()                       # clip -> noise -> scale -> account -> step
        print(privacy_engine.get_epsilon(DELTA))

``make_private`` / ``make_private_with_epsilon`` take Opacus's arguments and return
``(module, optimizer, data_loader)`` (plus the criterion with ``grad_sample_mode="ghost"``,
as Opacus). What differs, on purpose:

* **sampling**: the loader's sampler is replaced by a Poisson one at ``q = 1/len(loader)``
  (as Opacus), its ``collate_fn``/``num_workers``/``pin_memory`` kept; empty batches are
  collated as zero-row tensors. renyi's ``sampling=`` picks another sampler and, with it,
  the event charged: ``"random-allocation"`` (balls in bins: every example once per epoch
  of ``n // b`` batches, privacy close to Poisson's, charged per epoch), ``"shuffle"``,
  ``"fixed-size"``.
* **``poisson_sampling=False``** trains with shuffled batches of the loader's batch size,
  as Opacus does, but accounts them honestly: the proven bound for shuffling
  (:class:`~renyi.analysis.events.ShuffledEvent`, one Gaussian per epoch, no amplification),
  never the Poisson ε Opacus would report for them, and says so with a
  :class:`ShuffledBatchesWarning` naming the Poisson value and how to get amplification.
* **the plan is enforced**: with ``make_private_with_epsilon`` the loader yields
  ``epochs × len(loader)`` batches in ``epochs`` passes and then ends, and the optimizer
  refuses a step past them (:class:`~renyi.dpsgd.optimizer.PlanExceededError`) unless
  ``allow_exceeding_target=True``.
* **``loss.backward(); optimizer.step()``**: the backward through the returned module is
  captured per example (:class:`renyi.dpsgd.capture.PerExampleCapture`: per-layer hooks);
  ``step()`` clips, noises and accounts it. One forward and backward per step: a step
  whose backward reached the module's output twice is refused (the same examples would be
  clipped twice). A backward that the capture
  did not see (e.g. through the original, unwrapped model) is refused at ``step()``
  (:class:`~renyi.dpsgd.optimizer.UnclippedGradientError`), never noised as it is.
* **noise**: from the secure source always (``secure_mode`` is accepted and has nothing to
  switch on); ``noise_generator`` is refused (pass ``seed=`` for reproducible, insecure runs).
* **accountants**: ``"prv"`` (Opacus's default, a numerical estimate) maps to renyi's PLD
  accountant (a proven upper bound), ``"rdp"`` to RDP; ``"gdp"`` is refused (a CLT
  approximation, not a bound).

Guarantee: as :class:`~renyi.dpsgd.optimizer.DPOptimizer`: the Poisson-subsampled Gaussian,
add/remove neighbouring, composed over the steps taken (Abadi et al. 2016; Mironov, Talwar &
Zhang 2019 for RDP; PLD for ``"prv"``/``"pld"``); with another ``sampling``, that sampler's
event (:func:`renyi.analysis.events.training_event`), per epoch for the epoch samplers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, BinaryIO

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from renyi._validation import check_delta, check_int, check_positive, fail
from renyi.dpsgd.grad_sample import UnsupportedModelError
from renyi.dpsgd.optimizer import DPOptimizer
from renyi.errors import RenyiWarning

__all__ = ["BatchMemoryManager", "GradSampleModule", "PrivacyEngine", "ShuffledBatchesWarning"]


class ShuffledBatchesWarning(RenyiWarning):
    """``poisson_sampling=False``: training runs on shuffled batches and is accounted with
    the proven shuffling bound (no amplification), far above the Poisson ε Opacus reports."""


def _resolve_sampling(poisson_sampling: bool, sampling: str | None) -> tuple[str, bool]:
    """(canonical sampling, whether it came from ``poisson_sampling=False``)."""
    from renyi.dpsgd.privacy import normalise_sampling

    if sampling is None:
        return ("poisson", False) if poisson_sampling else ("shuffle", True)
    kind = normalise_sampling(sampling)
    if kind == "poisson" and not poisson_sampling:
        raise fail(
            "poisson_sampling", poisson_sampling, f"True with sampling={sampling!r} (or drop one)"
        )
    return kind, False


def _batch_size_of(data_loader: DataLoader[Any], sampling: str) -> int:
    b = data_loader.batch_size
    if b is None:
        raise fail(
            "data_loader.batch_size",
            None,
            f"a DataLoader with a batch_size (sampling={sampling!r} makes batches of it)",
        )
    return check_int("data_loader.batch_size", b, 1)


def _engine_sampler(
    sampling: str, n: int, batch_size: int, steps: int, source: Any
) -> tuple[Any, int]:
    """The sampler of ``sampling`` for ``steps`` steps and its batches per epoch."""
    from renyi.dpsgd.sampler import BallsInBinsSampler, FixedSizeSampler, ShuffleSampler

    if sampling == "fixed-size":
        return FixedSizeSampler(n, batch_size, steps, random_source=source), -(-n // batch_size)
    cls = BallsInBinsSampler if sampling == "random-allocation" else ShuffleSampler
    sampler = cls(n, batch_size, steps, random_source=source)
    return sampler, sampler.steps_per_epoch


def _shuffle_warning(
    sampler: Any, noise_multiplier: float, epochs: int, delta: float, accountant: str
) -> str:
    """What a ``poisson_sampling=False`` user must know: the proven shuffling ε, the Poisson
    ε Opacus would have reported for the same run, and how to get amplification."""
    from renyi.accountants import make_accountant
    from renyi.analysis.events import training_event

    steps = epochs * sampler.steps_per_epoch
    n, b = sampler.num_samples, sampler.batch_size

    def eps(kind: str) -> float:
        event = training_event(kind, noise_multiplier, dataset_size=n, batch_size=b, steps=steps)
        acc = make_accountant(accountant).compose(event)
        return float(acc.epsilon(delta).epsilon)

    span = f"{epochs} epoch{'s' if epochs != 1 else ''}"
    return (
        f"poisson_sampling=False: training on shuffled batches of {b} (renyi's "
        "ShuffleSampler), accounted with the proven shuffling bound, which has no "
        f"amplification: {span} at sigma={noise_multiplier:.4g} cost epsilon={eps('shuffle'):.4g}"
        f" at delta={delta:g} (replace-one neighbours). Poisson accounting of the same run "
        f"would claim epsilon={eps('poisson'):.4g}, which is not proven for shuffled batches "
        "and is never reported here. For that amplification, train with Poisson sampling "
        "(poisson_sampling=True) or balls-in-bins (sampling='random-allocation': every "
        "example once per epoch, privacy close to Poisson's)"
    )


_ACCOUNTANTS = {"prv": "pld", "pld": "pld", "rdp": "rdp", "zcdp": "zcdp"}
_MODES = ("hooks", "functorch", "ew", "expanded_weights", "ghost", "ghost_fsdp", "auto", "vmap")


class _OneForwardPerStep:
    """Wraps :class:`renyi.dpsgd.capture.PerExampleCapture` for Poisson-sampled steps.

    The capture sums every captured forward/backward before ``step()`` (micro-batches). With
    the engine's Poisson loader one step is one batch, and two captured forwards in a step
    are most often the *same* examples twice (two augmentations, a repeated forward and
    backward), which would clip each example's gradient twice: sensitivity 2C against noise
    for C. So, as Opacus refuses gradient accumulation under Poisson sampling, a step whose
    sums come from more than one forward pass with a backward is refused (use
    ``optimizer.accumulate(inputs, targets)`` per micro-batch, or ``BatchMemoryManager``).
    Forward passes without a backward (evaluation, an accuracy computed with gradients
    enabled) are not counted: they release nothing.
    """

    def __init__(self, capture: Any, module: nn.Module) -> None:
        self.capture = capture

    @property
    def sensitivity(self) -> float:
        return float(self.capture.sensitivity)

    @property
    def max_grad_norm(self) -> Any:
        return self.capture.max_grad_norm

    @max_grad_norm.setter
    def max_grad_norm(self, value: float) -> None:
        self.capture.max_grad_norm = value

    def pop_clipped_sum(self) -> tuple[dict[str, Tensor], int, Tensor]:
        result: tuple[dict[str, Tensor], int, Tensor] = self.capture.pop_clipped_sum()
        forwards = int(self.capture.last_forwards)
        if forwards > 1:
            raise UnsupportedModelError(
                f"{forwards} forward passes of the module, each with a backward, in one step: "
                "the examples of the passes cannot be told apart, so one example's gradient "
                "could be clipped more than once; use one forward and one backward per step "
                "(for micro-batches call optimizer.accumulate(inputs, targets) per "
                "micro-batch, or use BatchMemoryManager); nothing was released"
            )
        return result

    def zero_grad(self) -> None:
        self.capture.zero_grad()

    def remove(self) -> None:
        self.capture.remove()

    cleanup = remove


def _make_capture(
    module: nn.Module,
    *,
    max_grad_norm: float | Sequence[float],
    clipping: str,
    loss_reduction: str,
    mode: str,
    batch_first: bool = True,
    self_check: bool | str = True,
) -> _OneForwardPerStep:
    """The hook capture of :mod:`renyi.dpsgd.capture`, one forward/backward per step."""
    from renyi.dpsgd.capture import PerExampleCapture

    if loss_reduction not in ("mean", "sum"):
        raise fail("loss_reduction", loss_reduction, "'mean' or 'sum'")
    capture = PerExampleCapture(
        module,
        max_grad_norm=max_grad_norm,
        clipping=clipping,  # type: ignore[arg-type]
        loss_reduction=loss_reduction,  # type: ignore[arg-type]
        mode=mode,  # type: ignore[arg-type]
        batch_first=batch_first,
        self_check=self_check,  # type: ignore[arg-type]
    )
    return _OneForwardPerStep(capture, module)


class GradSampleModule(nn.Module):
    """The module returned by :meth:`PrivacyEngine.make_private` (Opacus's name).

    Calls the wrapped module (``_module``; ``state_dict`` keys gain the ``_module.`` prefix,
    as Opacus's); attributes not found here are looked up on it. Its backward is captured per
    example for the private optimizer.
    """

    def __init__(self, module: nn.Module, capture: Any) -> None:
        super().__init__()
        self._module = module
        self.__dict__["capture"] = capture

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("_module"), name)

    def cleanup(self) -> None:
        """Remove the capture hooks (the module then trains non-privately)."""
        self.capture.remove()


class _EngineAccountant:
    """Opacus's ``privacy_engine.accountant`` view of renyi's accountant."""

    def __init__(self, name: str) -> None:
        from renyi.accountants import make_accountant

        self.name = name
        self.accountant = make_accountant(_ACCOUNTANTS[name])
        self.optimizers: list[DPOptimizer] = []

    def mechanism(self) -> str:
        return self.name

    def _flush(self) -> None:
        for opt in self.optimizers:
            opt._flush()

    def __len__(self) -> int:
        return sum(opt.steps_taken for opt in self.optimizers)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """``(noise_multiplier, sample_rate, steps)`` per private optimizer, as Opacus."""
        return [
            (opt.noise_multiplier, float(opt.sampler.sample_rate), opt.steps_taken)
            for opt in self.optimizers
        ]

    def get_epsilon(self, delta: float, **_: Any) -> float:
        """ε spent so far at ``delta`` (0 before the first step), restored history included."""
        delta = check_delta(delta)
        self._flush()
        if self.accountant.is_empty:
            return 0.0
        return float(self.accountant.epsilon(delta).epsilon)

    def state_dict(self) -> dict[str, Any]:
        """The accountant's history (every step of every optimizer of the engine)."""
        self._flush()
        return {"name": self.name, "accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` in place (checked first: same accountant kind)."""
        from renyi.dpsgd.optimizer import _restore_in_place

        name = state.get("name") if isinstance(state, dict) else state
        if _ACCOUNTANTS.get(str(name)) != _ACCOUNTANTS[self.name]:
            raise fail("checkpoint accountant", name, f"{self.name!r} (this engine's accountant)")
        restored = type(self.accountant).from_state_dict(state["accountant"])
        for opt in self.optimizers:
            opt._pending_steps = 0  # what they had pending is in the restored history or gone
        _restore_in_place(self.accountant, restored)


class PrivacyEngine:
    """Opacus's ``PrivacyEngine``: make a model, optimizer and loader private (DP-SGD).

    Args:
        accountant: ``"prv"`` (default; renyi's PLD accountant, a proven bound), ``"pld"``,
            ``"rdp"`` or ``"zcdp"``.
        secure_mode: accepted for Opacus compatibility; renyi's noise is always drawn from the
            secure source (a ``seed`` passed to ``make_private`` is the only way to get an
            insecure, reproducible run).
        ledger, ledger_token: a budget every optimizer this engine makes charges before each
            release (a ledger service URL ``http[s]://host:port#name`` with its token, a
            ledger path or URL, or a Budget; :func:`renyi.ledger.client.budget_hook`): a
            refused or unreachable ledger stops the step before any noise is drawn.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> data = TensorDataset(torch.randn(100, 4), torch.randint(0, 2, (100,)))
        >>> model = torch.nn.Linear(4, 2)
        >>> engine = PrivacyEngine(accountant="rdp")
        >>> model, optimizer, loader = engine.make_private_with_epsilon(
        ...     module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        ...     data_loader=DataLoader(data, batch_size=10), epochs=1,
        ...     target_epsilon=3.0, target_delta=1e-5, max_grad_norm=1.0)
        >>> len(loader), optimizer.max_steps
        (10, 10)
    """

    def __init__(
        self,
        *,
        accountant: str = "prv",
        secure_mode: bool = False,
        ledger: Any = None,
        ledger_token: str | None = None,
    ) -> None:
        if accountant == "gdp":
            raise fail(
                "accountant",
                accountant,
                "'prv', 'pld', 'rdp' or 'zcdp' (Opacus's 'gdp' is a central-limit "
                "approximation, not an upper bound on ε)",
            )
        if accountant not in _ACCOUNTANTS:
            raise fail("accountant", accountant, f"one of {sorted(_ACCOUNTANTS)}")
        self.secure_mode = bool(secure_mode)
        self.accountant = _EngineAccountant(accountant)
        self.ledger, self.ledger_token = ledger, ledger_token

    def get_epsilon(self, delta: float) -> float:
        """ε spent so far by every optimizer this engine made, at ``delta``."""
        return self.accountant.get_epsilon(delta)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self,
        *,
        path: str | os.PathLike[str] | BinaryIO,
        module: nn.Module,
        optimizer: DPOptimizer | None = None,
        noise_scheduler: Any = None,
        grad_clip_scheduler: Any = None,
        checkpoint_dict: dict[str, Any] | None = None,
        module_state_dict_kwargs: dict[str, Any] | None = None,
        torch_save_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Opacus's ``save_checkpoint``: the module, the accountant and the optimizer at
        ``path`` (``torch.save``), between two steps.

        ``optimizer_state_dict`` is :meth:`DPOptimizer.state_dict`: the wrapped optimizer,
        the accountant, the sampler's position and random state, and the noise source's
        state — for renyi's secure source nothing (no key is ever written; a resumed run
        draws fresh noise from the OS), for a seeded source its generator state (so a
        seeded run resumes bit for bit). Everything is plain values and tensors: it loads
        with ``torch.load(weights_only=True)``. Your own entries (an LR scheduler's
        ``state_dict()``, the epoch) go in ``checkpoint_dict``.

        Raises:
            PrivacyParameterError: a noise or clipping scheduler (renyi has none: σ and C
                are fixed by the plan), or a checkpoint in the middle of a logical batch.
        """
        _no_schedulers(noise_scheduler, grad_clip_scheduler)
        checkpoint = dict(checkpoint_dict or {})
        checkpoint["module_state_dict"] = module.state_dict(**(module_state_dict_kwargs or {}))
        if optimizer is not None:
            checkpoint["optimizer_state_dict"] = optimizer.state_dict()
        checkpoint["privacy_accountant_state_dict"] = self.accountant.state_dict()
        torch.save(checkpoint, path, **(torch_save_kwargs or {}))

    def load_checkpoint(
        self,
        *,
        path: str | os.PathLike[str] | BinaryIO,
        module: nn.Module,
        optimizer: DPOptimizer | None = None,
        noise_scheduler: Any = None,
        grad_clip_scheduler: Any = None,
        module_load_dict_kwargs: dict[str, Any] | None = None,
        torch_load_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Opacus's ``load_checkpoint``: restore what :meth:`save_checkpoint` wrote and
        return the checkpoint dict (your ``checkpoint_dict`` entries included).

        Resume as in Opacus: a fresh engine, ``make_private_with_epsilon`` with the run's
        arguments (σ comes out the same), then this. The optimizer's checkpoint is checked
        before anything is restored (same σ, C, batch size and event); its accountant history
        goes into this engine's accountant, and the loader returned by ``make_private``
        continues after the checkpoint's last batch, so ``get_epsilon`` and the remaining
        steps are those of the uninterrupted run. Read with ``torch.load(weights_only=True)``
        unless ``torch_load_kwargs`` says otherwise.

        Raises:
            PrivacyParameterError: a checkpoint of another mechanism or accountant, an
                optimizer without its state in the checkpoint (or the reverse), a scheduler.
        """
        _no_schedulers(noise_scheduler, grad_clip_scheduler)
        load_kwargs = {"weights_only": True, **(torch_load_kwargs or {})}
        checkpoint: dict[str, Any] = torch.load(path, **load_kwargs)
        if not isinstance(checkpoint, dict) or "module_state_dict" not in checkpoint:
            raise fail("checkpoint", type(checkpoint).__name__, "a save_checkpoint() file")
        opt_state = checkpoint.pop("optimizer_state_dict", None)
        if (optimizer is None) != (opt_state is None):
            raise fail(
                "optimizer",
                "given" if optimizer is not None else None,
                "given exactly when the checkpoint holds an optimizer state (a resumed "
                "optimizer without it would restart its sampler and step count)",
            )
        if optimizer is not None:
            optimizer.load_state_dict(opt_state)  # checks the mechanism before restoring
        if optimizer is None or optimizer.accountant is not self.accountant.accountant:
            self.accountant.load_state_dict(checkpoint["privacy_accountant_state_dict"])
        module.load_state_dict(checkpoint["module_state_dict"], **(module_load_dict_kwargs or {}))
        return checkpoint

    # ------------------------------------------------------------------ make_private
    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        criterion: Any = None,
        data_loader: DataLoader[Any],
        noise_multiplier: float,
        max_grad_norm: float | Sequence[float],
        batch_first: bool = True,
        loss_reduction: str = "mean",
        poisson_sampling: bool = True,
        clipping: str = "flat",
        noise_generator: Any = None,
        grad_sample_mode: str = "hooks",
        wrap_model: bool = True,
        rand_on_empty: bool = False,
        epochs: int | None = None,
        seed: int | None = None,
        allow_exceeding_target: bool = False,
        sampling: str | None = None,
        self_check: bool | str = True,
        keep_freed_memory: bool = True,
        _target: tuple[float, float] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Opacus's ``make_private``: returns ``(module, optimizer, data_loader)``.

        ``(module, optimizer, criterion, data_loader)`` with ``grad_sample_mode="ghost"``.
        renyi extras: ``epochs`` (the loader then ends after ``epochs × len(loader)``
        batches), ``seed`` (reproducible, insecure noise and sampling), ``sampling`` (below),
        ``self_check`` (the independence check: ``True``, ``"strict"`` for every batch, or
        ``False``; :mod:`renyi.dpsgd.independence`), ``keep_freed_memory`` (glibc keeps
        freed memory for reuse, so that the private step's per-example buffers are not
        faulted in anew at every step; process-wide, peak memory unchanged;
        :mod:`renyi.dpsgd._memory`), and the adaptive clipping arguments of Opacus
        (``target_unclipped_quantile``, ``clipbound_learning_rate``, ``max_clipbound``,
        ``min_clipbound``, ``unclipped_num_std``) with ``clipping="adaptive"``.

        ``sampling``: ``"poisson"`` (default; ``q = 1/len(data_loader)``),
        ``"random-allocation"`` (balls in bins: each epoch every example goes to one of
        ``n // batch_size`` batches; one ``RandomAllocationEvent`` charged per epoch, at its
        first step), ``"shuffle"`` (one ``ShuffledEvent`` per epoch) or ``"fixed-size"``
        (per step); batches of the loader's ``batch_size``.

        ``poisson_sampling=False`` (without ``sampling``) means what it means in Opacus —
        shuffled batches of the loader's batch size — and is trained so, with
        :class:`~renyi.dpsgd.sampler.ShuffleSampler`; but it is accounted with the bound
        that is *proven* for shuffling (one Gaussian per epoch, no amplification), never
        the Poisson ε that Opacus reports for it (Chua et al., ICML 2024, show that number
        can understate the real loss). A :class:`ShuffledBatchesWarning` names both values
        and the way to amplification (``poisson_sampling=True`` or
        ``sampling="random-allocation"``). Why not refuse: the script then runs as its
        author meant, every reported ε is a proven upper bound, and the warning tells them
        what shuffling costs; refusing would only push them back to a tool that reports the
        unproven number.
        """
        from renyi.dpsgd.privacy import private_data_loader
        from renyi.dpsgd.sampler import PoissonSampler, make_random_source

        if not isinstance(module, nn.Module):
            raise fail("module", type(module).__name__, "a torch.nn.Module")
        if not isinstance(data_loader, DataLoader):
            raise fail("data_loader", type(data_loader).__name__, "a torch DataLoader")
        kind, implied = _resolve_sampling(poisson_sampling, sampling)
        if noise_generator is not None:
            raise fail(
                "noise_generator",
                type(noise_generator).__name__,
                "None (noise comes from renyi's secure source; pass seed=... for a "
                "reproducible, insecure run)",
            )
        if rand_on_empty:
            raise fail("rand_on_empty", rand_on_empty, "False (empty batches are real steps)")
        if grad_sample_mode not in _MODES:
            raise fail("grad_sample_mode", grad_sample_mode, f"one of {_MODES}")
        mode = "vmap" if grad_sample_mode == "vmap" else "auto"
        if wrap_model and isinstance(module, GradSampleModule):
            raise fail("module", "a GradSampleModule", "a module not made private already")
        noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        adaptive = _adaptive_kwargs(clipping, kwargs)
        if kwargs:
            raise fail("make_private keyword", sorted(kwargs), "arguments of make_private")
        if criterion is None:
            criterion = nn.CrossEntropyLoss()
        if not isinstance(keep_freed_memory, bool):
            raise fail("keep_freed_memory", keep_freed_memory, "True or False")
        if keep_freed_memory:
            from renyi.dpsgd._memory import keep_freed_memory as keep

            keep()

        from renyi.dpsgd.privacy import dataset_of

        dataset = dataset_of(data_loader)
        n = check_int("len(data_loader.dataset)", len(dataset), 1)  # type: ignore[arg-type]
        if epochs is not None:
            epochs = check_int("epochs", epochs, 1)
        source = make_random_source(seed)
        sampler: Any
        if kind == "poisson":
            per_epoch = check_int("len(data_loader)", len(data_loader), 1)
            steps = per_epoch * epochs if epochs is not None else None
            sampler = PoissonSampler(
                n, 1.0 / per_epoch, steps if steps is not None else per_epoch, random_source=source
            )
        else:
            b = _batch_size_of(data_loader, kind)
            if b > n:
                raise fail("data_loader.batch_size", b, f"an integer in [1, {n}]")
            per_epoch = _engine_sampler(kind, n, b, 1, source)[1]
            steps = per_epoch * epochs if epochs is not None else None
            sampler = _engine_sampler(kind, n, b, steps or per_epoch, source)[0]
        if implied:
            import warnings

            delta = _target[1] if _target is not None else 1e-5
            warnings.warn(
                _shuffle_warning(
                    sampler,
                    noise_multiplier,
                    epochs or 1,
                    delta,
                    _ACCOUNTANTS[self.accountant.name],
                ),
                ShuffledBatchesWarning,
                stacklevel=2,
            )
        loader = private_data_loader(
            data_loader, sampler, steps_per_epoch=per_epoch, unlimited=steps is None
        )
        engine_clipping = "flat" if clipping == "adaptive" else clipping
        capture = _make_capture(
            module,
            max_grad_norm=max_grad_norm,
            clipping=engine_clipping,
            loss_reduction=loss_reduction,
            mode=mode,
            batch_first=bool(batch_first),
            self_check=self_check,
        )
        from renyi.dpsgd.clipping import ClippedGradientEngine

        engine = ClippedGradientEngine(
            module,
            criterion,
            max_grad_norm=max_grad_norm,
            clipping=engine_clipping,  # type: ignore[arg-type]
            mode=mode,  # type: ignore[arg-type]
            batch_first=bool(batch_first),
            self_check=self_check,  # type: ignore[arg-type]
        )
        common: dict[str, Any] = {
            "model": module,
            "loss_fn": criterion,
            "noise_multiplier": noise_multiplier,
            "max_grad_norm": engine.sensitivity,
            "sampler": sampler,
            "accountant": self.accountant.accountant,
            "random_source": source,
            "engine": engine,
            "capture": capture,
            "max_steps": steps if _target is not None else None,
            "target": _target,
            "allow_exceeding_target": allow_exceeding_target,
        }
        if self.ledger is not None:
            from renyi.ledger.client import budget_hook

            charges = getattr(sampler, "charges", None)  # per-epoch samplers charge less often
            common["budget"] = budget_hook(
                self.ledger,
                token=self.ledger_token,
                planned_steps=steps,
                planned_charges=None if charges is None or steps is None else charges(steps),
            )
        dp_optimizer: DPOptimizer
        if adaptive is not None:
            from renyi.dpsgd.adaptive import AdaptiveClipDPOptimizer

            dp_optimizer = AdaptiveClipDPOptimizer(optimizer, **common, **adaptive)
        else:
            dp_optimizer = DPOptimizer(optimizer, **common)
        self.accountant.optimizers.append(dp_optimizer)
        from renyi.dpsgd.privacy import link_loader

        link_loader(loader, dp_optimizer)
        out_module: Any = GradSampleModule(module, capture) if wrap_model else capture
        if "ghost" in grad_sample_mode:
            return out_module, dp_optimizer, criterion, loader
        return out_module, dp_optimizer, loader

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        criterion: Any = None,
        data_loader: DataLoader[Any],
        target_epsilon: float,
        target_delta: float,
        epochs: int,
        max_grad_norm: float | Sequence[float],
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Opacus's ``make_private_with_epsilon``: σ calibrated so that ``epochs`` epochs
        (``epochs × len(data_loader)`` steps at ``q = 1/len(data_loader)``) cost at most
        ``target_epsilon`` at ``target_delta`` by this engine's accountant.

        With ``sampling=`` (or ``poisson_sampling=False``, i.e. shuffling; see
        :meth:`make_private`) σ is calibrated on that sampler's event for ``epochs`` whole
        epochs (:func:`renyi.dpsgd.privacy.calibrate_sampler_noise`).

        The plan is enforced: the loader ends after those steps and the optimizer refuses a
        step past them unless ``allow_exceeding_target=True``.

        Raises:
            PrivacyParameterError: this engine has accounted steps already (calibrating a
                fresh σ would ignore them: make one engine per training run).
        """
        from renyi.calibration import calibrate_noise_multiplier

        target_epsilon = check_positive("target_epsilon", target_epsilon)
        target_delta = check_delta(target_delta, "target_delta")
        epochs = check_int("epochs", epochs, 1)
        if len(self.accountant) > 0:
            raise fail(
                "PrivacyEngine",
                f"{len(self.accountant)} steps already accounted",
                "a fresh PrivacyEngine (σ calibrated for this run alone would not meet the "
                "target together with the steps already taken)",
            )
        kind, _ = _resolve_sampling(kwargs.get("poisson_sampling", True), kwargs.get("sampling"))
        accountant = _ACCOUNTANTS[self.accountant.name]
        if kind == "poisson":
            per_epoch = check_int("len(data_loader)", len(data_loader), 1)
            steps = per_epoch * epochs
            calibration = calibrate_noise_multiplier(
                target_epsilon, target_delta, 1.0 / per_epoch, steps, accountant=accountant
            )
        else:
            from renyi.dpsgd.privacy import calibrate_sampler_noise, dataset_of

            n = check_int("len(data_loader.dataset)", len(dataset_of(data_loader)), 1)  # type: ignore[arg-type]
            b = _batch_size_of(data_loader, kind)
            if b > n:
                raise fail("data_loader.batch_size", b, f"an integer in [1, {n}]")
            per_epoch = _engine_sampler(kind, n, b, 1, None)[1]
            probe = _engine_sampler(kind, n, b, per_epoch * epochs, None)[0]
            calibration = calibrate_sampler_noise(
                target_epsilon, target_delta, probe, per_epoch * epochs, accountant=accountant
            )
        return self.make_private(
            module=module,
            optimizer=optimizer,
            criterion=criterion,
            data_loader=data_loader,
            noise_multiplier=calibration.noise_multiplier,
            max_grad_norm=max_grad_norm,
            epochs=epochs,
            _target=(target_epsilon, target_delta),
            **kwargs,
        )


def _no_schedulers(noise_scheduler: Any, grad_clip_scheduler: Any) -> None:
    for name, value in (
        ("noise_scheduler", noise_scheduler),
        ("grad_clip_scheduler", grad_clip_scheduler),
    ):
        if value is not None:
            raise fail(
                name,
                type(value).__name__,
                "None (renyi has no noise or clipping schedulers: sigma and C are fixed by "
                "the plan the guarantee was computed for)",
            )


def _adaptive_kwargs(clipping: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Pop Opacus's AdaClip arguments (``clipping="adaptive"``) from ``kwargs``."""
    names = (
        "target_unclipped_quantile",
        "clipbound_learning_rate",
        "max_clipbound",
        "min_clipbound",
        "unclipped_num_std",
    )
    given = {k: kwargs.pop(k) for k in names if k in kwargs}
    if clipping not in ("flat", "per_layer", "automatic", "adaptive"):
        raise fail("clipping", clipping, "'flat', 'per_layer', 'automatic' or 'adaptive'")
    if clipping != "adaptive":
        if given:
            raise fail("clipping", clipping, f"'adaptive' (for {sorted(given)})")
        return None
    missing = [k for k in names if k not in given]
    if missing:
        raise fail("clipping='adaptive'", sorted(given), f"also {missing}")
    return {
        "target_unclipped_quantile": given["target_unclipped_quantile"],
        "clipbound_learning_rate": given["clipbound_learning_rate"],
        "max_clipbound": given["max_clipbound"],
        "min_clipbound": given["min_clipbound"],
        "unclipped_num_std": given["unclipped_num_std"],
    }


def _split(batch: Any, size: int) -> list[Any]:
    """Cut a collated batch (a tensor, or a tuple/list of tensors batched along dim 0) into
    consecutive pieces of at most ``size`` examples; an empty batch gives one empty piece."""
    tensors = batch if isinstance(batch, tuple | list) else (batch,)
    if not tensors or not all(isinstance(t, Tensor) and t.ndim > 0 for t in tensors):
        raise fail("batch", type(batch).__name__, "a tensor or tuple/list of tensors [B, ...]")
    n = int(tensors[0].shape[0])
    starts = range(0, n, size) if n else [0]
    pieces = []
    for start in starts:
        part = [t[start : start + size] for t in tensors]
        pieces.append(type(batch)(part) if isinstance(batch, tuple | list) else part[0])
    return pieces


class BatchMemoryManager:
    """Opacus's ``BatchMemoryManager``: logical Poisson batches in physical pieces.

    ``with BatchMemoryManager(data_loader=loader, max_physical_batch_size=64,
    optimizer=optimizer) as batches: for x, y in batches: ...`` yields every logical batch of
    ``loader`` cut into consecutive pieces of at most ``max_physical_batch_size`` examples,
    and tells ``optimizer`` (:meth:`~renyi.dpsgd.optimizer.DPOptimizer.signal_skip_step`)
    that a ``step()`` after any piece but the last only collects it. The pieces partition
    the logical batch, so the released update — the clipped sum over all of them, one noise
    draw, one accounted step — is the mechanism of the unsplit batch.
    """

    def __init__(
        self, *, data_loader: Any, max_physical_batch_size: int, optimizer: DPOptimizer
    ) -> None:
        self.data_loader = data_loader
        self.max_physical_batch_size = check_int(
            "max_physical_batch_size", max_physical_batch_size, 1
        )
        if not isinstance(optimizer, DPOptimizer):
            raise fail("optimizer", type(optimizer).__name__, "a renyi DPOptimizer")
        self.optimizer = optimizer

    def __enter__(self) -> BatchMemoryManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.optimizer.signal_skip_step(False)

    def __len__(self) -> int:
        return len(self.data_loader)

    def __iter__(self) -> Any:
        for batch in self.data_loader:
            pieces = _split(batch, self.max_physical_batch_size)
            for i, piece in enumerate(pieces):
                self.optimizer.signal_skip_step(i < len(pieces) - 1)
                yield piece
