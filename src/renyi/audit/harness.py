"""Canary harnesses for every training path of renyi: the real code on a task built to be audited.

Each ``audit_<path>`` function runs one of renyi's training paths, unchanged, on a
:class:`DiracTask` (a linear model whose every example owns one input column, so each
canary's clipped gradient lands in coordinates nothing else touches) and returns a
:class:`~renyi.audit.training.TrainingAuditResult`: a lower bound on ε beside the ε the path
claims for what the attacker observed. The model is frozen (learning rate 0), so the path's
releases at the canaries' coordinates are independent draws of one step (or one epoch, or
one run) of its mechanism, audited with :func:`renyi.audit.training.audit_release_samples`.

Canaries (per run, each column's coin independent, probability 1/2):

* ``gaussian``: input ``10 C e_i`` (always clipped to ``C``): the worst case of the analysis;
  scored by the release projected on its gradient's direction, in units of ``C``.
* ``sign``: input ``2^-20 C e_i``: a clipped sum just below zero in one coordinate. A correct
  release of a tiny negative value is ``+0.0`` or a lattice point, never ``-0.0``.
* ``residue``: a gradient of norm ``C/2``, whose coordinates (``+-C/(2 sqrt 2)``) lie off
  every power-of-two lattice: the release must still be on the noise lattice.

Global effects (a normaliser or a loss weight computed from the whole batch) move the other
examples' contributions, not the canary's: with ``background`` examples (unclipped, in their
own columns) and one canary per step, the audit also attacks the release along the
background's direction and the scale of the pure-noise columns.

Claims: a forced batch is one Gaussian step without amplification (the adversary chose the
batch: ``gaussian_epsilon(1/σ, δ)``); a sampler-driven path is charged what its sampler's
event costs for one step (Poisson, fixed size) or one epoch (balls in bins, shuffling);
correlated noise, the whole plan; federated paths, one round. All seeded (reproducible
noise, ``InsecureRandomnessWarning`` silenced): a test built on them is deterministic, and
its false-alarm rate is the stated ``1 - confidence`` over the choice of seed.

Example:
    >>> r = audit_path("poisson", seed=0)
    >>> r.passed, r.epsilon_lower_bound <= r.epsilon_claimed, r.details["unit"]
    (True, True, 'step')
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from renyi._validation import check_int, fail
from renyi.analysis.closed_forms import gaussian_epsilon
from renyi.audit.training import TrainingAuditResult, audit_release_samples

__all__ = [
    "GROUPS",
    "PATHS",
    "DiracTask",
    "audit_accumulate",
    "audit_capture",
    "audit_correlated",
    "audit_ddg",
    "audit_fedavg",
    "audit_gopa",
    "audit_hf_trainer",
    "audit_individual",
    "audit_path",
    "audit_sampler",
    "audit_user_level",
    "record_releases",
]

FloatArray = NDArray[np.float64]
#: canary groups of a per-canary run: (name, input scale in units of C)
GROUPS = (("gaussian", 10.0), ("sign", 2.0**-20), ("residue", 0.5))
ALL_GROUPS = ("gaussian", "sign", "residue")
DELTA = 1e-3


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    from renyi.errors import InsecureRandomnessWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


@dataclass(frozen=True)
class DiracTask:
    """A linear classifier ``Linear(d, classes, bias=False)`` (zero weights) whose canaries
    each own one input column: ``canaries`` canary columns, one column shared by the
    ``background`` always-present unclipped examples (their contributions add up along one
    direction, so a normaliser that scales them shows), ``spare`` columns no example touches
    (pure noise).

    With ``tokens > 1`` inputs are sequences ``[B, tokens, d]`` (token-level losses): a
    canary fills every token of its column; a background example uses its first token and
    marks the others ``ignore_index`` (-100). With ``two_blocks`` the canaries live in a
    second ``nn.Linear`` (so that a per-layer bug can miss them).
    """

    canaries: int = 64
    background: int = 0
    spare: int = 16
    classes: int = 2
    tokens: int = 1
    canary_label: int = 0
    background_scale: float = 0.8  # gradient norm in units of C (never clipped)
    two_blocks: bool = False
    canary_scale: float = 10.0  # gradient norm of a "gaussian" canary in units of C

    @property
    def shared(self) -> int:
        """Columns of the background examples (one, shared, or none)."""
        return 1 if self.background else 0

    @property
    def width(self) -> int:
        return self.canaries + self.shared + self.spare

    def model(self) -> Any:
        import torch
        from torch import nn

        if self.two_blocks:
            first, m = self.shared + self.spare, self.canaries

            class TwoBlocks(nn.Module):
                def __init__(self, k: int) -> None:
                    super().__init__()
                    self.rest = nn.Linear(first, k, bias=False)
                    self.canary = nn.Linear(m, k, bias=False)

                def forward(self, x: Any) -> Any:
                    return self.rest(x[..., :first]) + self.canary(x[..., first:])

            model: nn.Module = TwoBlocks(self.classes)
        else:
            model = nn.Linear(self.width, self.classes, bias=False)
        model = model.double()
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        return model

    # -- columns ----------------------------------------------------------------------
    def canary_column(self, i: Any) -> Any:
        base = self.shared + self.spare if self.two_blocks else 0
        return base + np.asarray(i)

    def background_column(self) -> int:
        return 0 if self.two_blocks else self.canaries

    def spare_column(self, j: Any) -> Any:
        base = self.shared if self.two_blocks else self.canaries + self.shared
        return base + np.asarray(j)

    def direction(self, label: int) -> FloatArray:
        """Unit direction of a clipped gradient in its column at zero weights (softmax
        ``1/k`` minus the one-hot label; for cross-entropy)."""
        u = np.full(self.classes, 1.0 / self.classes)
        u[label] -= 1.0
        return u / np.linalg.norm(u)

    # -- batches ----------------------------------------------------------------------
    def batch(self, canaries: Any, scales: Any, *, background: bool = True) -> tuple[Any, Any]:
        """Inputs and targets: the listed canary columns (input ``scale * C``, scaled so that
        the gradient norm is ``scale`` in units of C before clipping) and the background."""
        import torch

        idx = np.asarray(canaries, dtype=np.int64).reshape(-1)
        sc = np.broadcast_to(np.asarray(scales, dtype=np.float64), idx.shape)
        nb = self.background if background else 0
        n = idx.size + nb
        u = np.full(self.classes, 1.0 / self.classes)
        u[0] -= 1.0
        u_norm = float(np.linalg.norm(u))  # |softmax - onehot| at zero weights
        shape = (n, self.tokens, self.width) if self.tokens > 1 else (n, self.width)
        x = torch.zeros(shape, dtype=torch.float64)
        y = torch.full((n, self.tokens) if self.tokens > 1 else (n,), 0, dtype=torch.long)
        cols = self.canary_column(idx)
        for r, (c, s) in enumerate(zip(cols.tolist(), sc.tolist(), strict=True)):
            value = s / u_norm / self.tokens
            if self.tokens > 1:
                x[r, :, c] = value
                y[r, :] = self.canary_label
            else:
                x[r, c] = value
                y[r] = self.canary_label
        for j in range(nb):
            r = idx.size + j
            c = self.background_column()
            value = self.background_scale / u_norm
            if self.tokens > 1:
                x[r, 0, c] = value
                y[r, 1:] = -100
            else:
                x[r, c] = value
        return x, y

    # -- reading a release ------------------------------------------------------------
    def columns(self, flat: FloatArray) -> FloatArray:
        """The released gradient as ``[classes, width]`` (the model's weight layout)."""
        if self.two_blocks:
            first = self.shared + self.spare
            a = flat[: self.classes * first].reshape(self.classes, first)
            b = flat[self.classes * first :].reshape(self.classes, self.canaries)
            return np.concatenate([a, b], axis=1)
        return flat.reshape(self.classes, self.width)

    def canary_scores(self, flat: FloatArray, clip: float) -> tuple[FloatArray, FloatArray]:
        """Per canary: the release along its gradient direction (units of C), and the raw
        released value of its negative component (class ``canary_label``)."""
        w = self.columns(flat)[:, self.canary_column(np.arange(self.canaries))]
        u = self.direction(self.canary_label)
        return (u @ w) / clip, w[self.canary_label]

    def features(self, flat: FloatArray, clip: float) -> dict[str, float]:
        """Global features of one release: the background's contributions along their
        direction (normalised), and the root-mean-square of the pure-noise columns."""
        w = self.columns(flat)
        out: dict[str, float] = {}
        if self.background:
            out["background"] = float(self.direction(0) @ w[:, self.background_column()] / clip)
        if self.spare:
            s = w[:, self.spare_column(np.arange(self.spare))]
            out["noise_scale"] = float(np.sqrt(np.mean(s**2)) / clip)
        return out


def record_releases(torch_optimizer: Any, scale: float) -> list[FloatArray]:
    """Wrap ``torch_optimizer.step`` (on the instance) to record every released gradient:
    the flat ``p.grad`` of all parameters, times ``scale`` (the fixed batch size), as
    float64. Returns the list the records are appended to."""
    import torch

    records: list[FloatArray] = []
    inner = torch_optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        flat = [
            (torch.zeros(p.numel()) if p.grad is None else p.grad.detach().reshape(-1))
            .to(torch.float64)
            .cpu()
            for g in torch_optimizer.param_groups
            for p in g["params"]
        ]
        records.append(torch.cat(flat).numpy() * scale)
        return inner(*args, **kwargs)

    torch_optimizer.step = step
    return records


# --------------------------------------------------------------------------- forced batches
Step = Callable[[Any, Any], FloatArray]


def _groups(task: DiracTask, names: tuple[str, ...]) -> tuple[NDArray[np.int64], FloatArray]:
    """Group index (into :data:`GROUPS`) of each canary column (round robin over ``names``)
    and its input scale (the task's ``canary_scale`` for the gaussian group)."""
    index = [i for i, (n, _) in enumerate(GROUPS) if n in names]
    if not index:
        raise fail("groups", names, f"names from {[n for n, _ in GROUPS]}")
    groups = np.array(index)[np.arange(task.canaries) % len(index)]
    scales = np.array([task.canary_scale if n == "gaussian" else s for n, s in GROUPS])
    return groups, scales[groups]


def _forced_defaults(single: bool, sigma: float | None, steps: int | None) -> tuple[float, int]:
    """σ and steps of a forced audit unless given: σ 4 over 200 steps with a canary per
    column, σ 2 over 500 steps with one canary per step."""
    return (
        sigma if sigma is not None else (2.0 if single else 4.0),
        steps if steps is not None else (500 if single else 200),
    )


def _forced_audit(
    step: Step,
    task: DiracTask,
    *,
    steps: int,
    sigma: float,
    clip: float,
    delta: float,
    confidence: float,
    seed: int,
    single: bool,
    details: dict[str, Any],
    groups: tuple[str, ...] = ALL_GROUPS,
) -> TrainingAuditResult:
    """Run ``step(x, y) -> release`` on forced batches; audit the canaries' releases.

    ``single=False``: every canary column flips its own coin each step (many samples per
    step; the three canary groups are audited separately, Bonferroni). ``single=True``: one
    Gaussian canary per step plus the background and spare columns' global features.
    The claim is one step of the Gaussian mechanism at noise multiplier ``sigma`` (each
    canary's release is a full-batch step, no subsampling).
    """
    from renyi import noise

    steps = check_int("steps", steps, 8)
    claim = float(gaussian_epsilon(1.0 / sigma, delta))
    gen = np.random.default_rng(seed)
    g = noise.lattice_step(sigma * clip)
    if single:
        y: dict[bool, list[float]] = {False: [], True: []}
        feats: dict[str, dict[bool, list[float]]] = {}
        for _ in range(steps):
            coin = bool(gen.random() < 0.5)
            x_, y_ = task.batch([0] if coin else [], [task.canary_scale] if coin else [])
            flat = step(x_, y_)
            proj, _ = task.canary_scores(flat, clip)
            y[coin].append(float(proj[0]))
            for name, v in task.features(flat, clip).items():
                feats.setdefault(name, {False: [], True: []})[coin].append(v)
        return audit_release_samples(
            np.array(y[False]),
            np.array(y[True]),
            claimed_epsilon=claim,
            delta=delta,
            confidence=confidence,
            features={k: (np.array(v[False]), np.array(v[True])) for k, v in feats.items()},
            details={**details, "steps": steps, "mode": "one canary per step"},
            claimed_mu=1.0 / sigma,
        )
    names = groups
    groups_, scales = _groups(task, names)
    used = [(gi, name) for gi, (name, _) in enumerate(GROUPS) if name in names]
    samples: dict[str, tuple[list[Any], list[Any]]] = {name: ([], []) for _, name in used}
    for _ in range(steps):
        coins = gen.random(task.canaries) < 0.5
        idx = np.flatnonzero(coins)
        x_, y_ = task.batch(idx, scales[idx])
        flat = step(x_, y_)
        proj, raw = task.canary_scores(flat, clip)
        for gi, name in used:
            sel = groups_ == gi
            value = proj if name == "gaussian" else raw
            samples[name][0].append(value[sel & ~coins])
            samples[name][1].append(value[sel & coins])
    each = 1.0 - (1.0 - confidence) / len(used)
    results = {}
    for _, name in used:
        y0 = np.concatenate(samples[name][0])
        y1 = np.concatenate(samples[name][1])
        results[name] = audit_release_samples(
            y0,
            y1,
            claimed_epsilon=claim,
            delta=delta,
            confidence=each,
            lattice=g if name == "residue" else None,
            claimed_mu=1.0 / sigma,
        )
    best = max(results, key=lambda k: results[k].epsilon_lower_bound)
    r = results[best]
    return TrainingAuditResult(
        "releases",
        r.epsilon_lower_bound,
        claim,
        delta,
        confidence,
        task.canaries * steps,
        all(v.passed for v in results.values()),
        mu_lower_bound=max(v.mu_lower_bound or 0.0 for v in results.values()),
        epsilon_gdp=max(v.epsilon_gdp or 0.0 for v in results.values()),
        fdp_claim_refuted=any(bool(v.fdp_claim_refuted) for v in results.values()),
        details={
            **details,
            "steps": steps,
            "mode": "canaries per step",
            "best_group": best,
            "groups": {k: v.details for k, v in results.items()},
        },
        audit=r.audit,
    )


def _dp_optimizer(model: Any, loss_fn: Any, sigma: float, clip: float, seed: int, **kw: Any) -> Any:
    import torch

    from renyi.dpsgd.optimizer import DPOptimizer
    from renyi.dpsgd.sampler import PoissonSampler, SeededRandomSource

    source = SeededRandomSource(seed)
    return DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),
        model=model,
        loss_fn=loss_fn,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        sampler=PoissonSampler(1000, 0.01, 10**9, random_source=source),
        accountant=None,
        random_source=source,
        **kw,
    )


def audit_accumulate(
    *,
    steps: int | None = None,
    sigma: float | None = None,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
    single: bool = False,
    task: DiracTask | None = None,
    patch: Callable[[Any], Any] | None = None,
    loss_fn: Any = None,
    groups: tuple[str, ...] = ALL_GROUPS,
) -> TrainingAuditResult:
    """:meth:`DPOptimizer.accumulate` + ``step`` on forced batches (per-example loss).

    ``patch(optimizer)`` may modify the optimizer first (a planted bug); ``loss_fn``
    replaces the per-example cross-entropy. Defaults: ``sigma`` 4 with a canary per column
    (200 steps), 2 with one canary per step (500 steps).
    """
    from torch import nn

    sigma, steps = _forced_defaults(single, sigma, steps)

    t = task if task is not None else (DiracTask(background=8) if single else DiracTask(192))
    model = t.model()
    with _quiet():
        opt = _dp_optimizer(
            model, loss_fn if loss_fn is not None else nn.CrossEntropyLoss(), sigma, clip, seed
        )
        if patch is not None:
            patch(opt)
        rec = record_releases(opt.original_optimizer, opt.expected_batch_size)

        def step(x: Any, y: Any) -> FloatArray:
            opt.zero_grad()
            opt.accumulate(x, y)
            opt.step()
            return rec.pop()

        return _forced_audit(
            step,
            t,
            steps=steps,
            sigma=sigma,
            clip=clip,
            delta=delta,
            confidence=confidence,
            seed=seed,
            single=single,
            details={"path": "DPOptimizer.accumulate", "sigma": sigma},
            groups=groups,
        )


#: the losses users write with loss.backward(): (criterion, loss_reduction, task options)
CAPTURE_LOSSES = ("mean", "sum", "class-weighted", "ignore-index")


def _capture_setup(loss: str) -> tuple[Any, str, dict[str, Any]]:
    import torch
    from torch import nn

    if loss == "mean":
        return nn.CrossEntropyLoss(), "mean", {}
    if loss == "sum":
        return nn.CrossEntropyLoss(reduction="sum"), "sum", {}
    if loss == "class-weighted":
        # the canary's class weighs 100 times the others': a weighted mean divides by the
        # batch's total weight, which the canary changes
        w = torch.tensor([1.0, 100.0], dtype=torch.float64)
        return nn.CrossEntropyLoss(weight=w), "mean", {"canary_label": 1, "background": 16}
    if loss == "ignore-index":
        ce = nn.CrossEntropyLoss(ignore_index=-100)

        def token_mean(out: Any, y: Any) -> Any:  # mean over the batch's non-ignored tokens
            return ce(out.reshape(-1, out.shape[-1]), y.reshape(-1))

        return token_mean, "mean", {"tokens": 32, "background": 16}
    raise fail("loss", loss, f"one of {CAPTURE_LOSSES}")


def audit_capture(
    loss: str = "mean",
    *,
    steps: int | None = None,
    sigma: float | None = None,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
    single: bool | None = None,
    capture_factory: Callable[..., Any] | None = None,
    patch: Callable[[Any], Any] | None = None,
    canaries: int | None = None,
    groups: tuple[str, ...] = ALL_GROUPS,
) -> TrainingAuditResult:
    """``PrivacyEngine.make_private`` + the user's ``loss.backward(); optimizer.step()``.

    ``loss``: ``"mean"``, ``"sum"``, ``"class-weighted"`` (``CrossEntropyLoss(weight=...)``,
    the canary in the heavy class) or ``"ignore-index"`` (token-level cross-entropy averaged
    over the non-ignored tokens of the batch). The weighted and token-mean losses are audited
    with one canary per step and background examples (their normaliser is what the canary
    moves). ``capture_factory(model, max_grad_norm=..., loss_reduction=...)`` replaces the
    optimizer's capture (a planted copy); ``patch(optimizer)`` modifies the optimizer.
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from renyi.dpsgd.engine import PrivacyEngine

    criterion, reduction, opts = _capture_setup(loss)
    if single is None:
        single = loss in ("class-weighted", "ignore-index")
    sigma, steps = _forced_defaults(single, sigma, steps)
    opts.setdefault("background", 8 if single else 0)
    opts.setdefault("canaries", canaries if canaries is not None else (64 if single else 192))
    t = DiracTask(**opts)
    model = t.model()
    x0, y0 = t.batch([0], [1.0])
    loader = DataLoader(TensorDataset(x0, y0), batch_size=1)
    with _quiet():
        engine = PrivacyEngine(accountant="rdp")
        module, opt, _ = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=clip,
            loss_reduction=reduction,
            criterion=criterion,
            seed=seed,
        )
        opt.unlink_data_loaders()  # the audit forces its batches (canaries in or out)
        if capture_factory is not None:
            opt.capture.remove() if hasattr(opt.capture, "remove") else None
            opt.capture = capture_factory(model, max_grad_norm=clip, loss_reduction=reduction)
            module = model
        if patch is not None:
            patch(opt)
        rec = record_releases(opt.original_optimizer, opt.expected_batch_size)

        def step(x: Any, y: Any) -> FloatArray:
            opt.zero_grad()
            out = module(x)
            criterion(out, y).backward()
            opt.step()
            return rec.pop()

        return _forced_audit(
            step,
            t,
            steps=steps,
            sigma=sigma,
            clip=clip,
            delta=delta,
            confidence=confidence,
            seed=seed,
            single=single,
            details={"path": f"PrivacyEngine capture, {loss} loss", "sigma": sigma},
            groups=groups,
        )


# --------------------------------------------------------------------------- samplers
def _column_samples(
    task: DiracTask, flats: list[FloatArray], clip: float
) -> tuple[FloatArray, FloatArray]:
    """Per release: the canaries' (``[T, m]``) and spare columns' (``[T, s]``) projections."""
    u = task.direction(0)
    cols = np.stack([task.columns(f) for f in flats])  # [T, k, width]
    proj = np.einsum("k,tkw->tw", u, cols) / clip
    return proj[:, task.canary_column(np.arange(task.canaries))], proj[
        :, task.spare_column(np.arange(task.spare))
    ]


def _train(private: Any) -> None:
    """Every planned step of a ``make_private*`` set-up (the loader yields one epoch a pass)."""
    opt = private.optimizer
    while opt.steps_taken < private.steps:
        drawn = 0
        for xb, yb in private.data_loader:
            drawn += 1
            opt.zero_grad()
            opt.accumulate(xb, yb)
            opt.step()
        if drawn == 0:
            break


def _epoch_scores(z: FloatArray, per_epoch: int, sigma: float) -> FloatArray:
    """Log-likelihood ratio of "in one step of the epoch, uniformly" vs "absent", per epoch."""
    s2 = sigma**2
    lr = z / s2 - 0.5 / s2
    t = (z.shape[0] // per_epoch) * per_epoch
    blocks = lr[:t].reshape(-1, per_epoch, z.shape[1])
    return np.asarray(np.logaddexp.reduce(blocks, axis=1) - math.log(per_epoch))


def audit_sampler(
    sampling: str = "poisson",
    *,
    epochs: int | None = None,
    canaries: int = 32,
    batch_size: int | None = None,
    sigma: float = 1.0,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
    patch: Callable[[Any], Any] | None = None,
) -> TrainingAuditResult:
    """``make_private(sampling=...)`` with its own loader: the sampler decides who is in.

    The dataset is ``canaries`` examples, one per canary column (all present); the spare
    columns give the "absent" samples (what the column would show with its example replaced
    by one with zero gradient). Poisson and fixed-size: one sample per step and column,
    claim = one step of the sampler's event. Balls in bins and shuffling: one sample per
    epoch and column (the likelihood ratio of one participation somewhere in the epoch),
    claim = one epoch's charged event. ``patch(private)`` may modify the set-up first.
    Defaults: batches of 2 (q = 1/16) for 10 epochs per step sampler; batches of 8 (4 steps
    an epoch) for 40 epochs for the epoch samplers.
    """
    import torch
    from torch.utils.data import TensorDataset

    from renyi.accountants import make_accountant
    from renyi.dpsgd.privacy import make_private

    epoch_sampler = sampling in ("random-allocation", "shuffle")
    batch_size = batch_size if batch_size is not None else (8 if epoch_sampler else 2)
    epochs = epochs if epochs is not None else (40 if epoch_sampler else 10)
    t = DiracTask(canaries=canaries, spare=canaries)
    model = t.model()
    x, y = t.batch(np.arange(canaries), np.full(canaries, 10.0), background=False)
    with _quiet():
        private = make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=0.0),
            TensorDataset(x, y),
            loss_fn=torch.nn.CrossEntropyLoss(),
            delta=delta,
            max_grad_norm=clip,
            batch_size=batch_size,
            noise_multiplier=sigma,
            epochs=epochs,
            sampling=sampling,  # type: ignore[arg-type]
            seed=seed,
            accountant="pld",
        )
        if patch is not None:
            patch(private)
        opt = private.optimizer
        rec = record_releases(opt.original_optimizer, opt.expected_batch_size)
        _train(private)
        inn, out = _column_samples(t, rec, clip)
        per = getattr(private.sampler, "steps_per_epoch", None)
        event = private.sampler.charged_event(sigma)
        claim = float(make_accountant("pld").compose(event).epsilon(delta).epsilon)
        if isinstance(per, int):
            inn, out = _epoch_scores(inn, per, sigma), _epoch_scores(out, per, sigma)
        return audit_release_samples(
            out.reshape(-1),
            inn.reshape(-1),
            claimed_epsilon=claim,
            delta=delta,
            confidence=confidence,
            details={
                "path": f"make_private(sampling={sampling!r})",
                "sigma": sigma,
                "steps": len(rec),
                "unit": "epoch" if isinstance(per, int) else "step",
                "event": event.kind,
            },
        )


def audit_correlated(
    noise: str = "tree",
    *,
    runs: int = 1,
    canaries: int = 512,
    steps: int = 16,
    batch_size: int = 128,
    target_epsilon: float = 2.0,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
) -> TrainingAuditResult:
    """``make_private_correlated(noise=...)``: whole-run scores per coordinate.

    Each run trains ``steps`` steps on ``canaries`` examples (one per column); a column's
    score is the sum of its releases over the run (canary columns: "in"; spare columns:
    "absent"), independent across columns. Claim: the plan's ε after the run.
    """
    import torch
    from torch.utils.data import TensorDataset

    from renyi.dpsgd.correlated import make_private_correlated

    t = DiracTask(canaries=canaries, spare=canaries)
    x, y = t.batch(np.arange(canaries), np.full(canaries, 10.0), background=False)
    ins, outs = [], []
    claim = math.nan
    with _quiet():
        for r in range(check_int("runs", runs, 1)):
            model = t.model()
            private = make_private_correlated(
                model,
                torch.optim.SGD(model.parameters(), lr=0.0),
                TensorDataset(x, y),
                loss_fn=torch.nn.CrossEntropyLoss(),
                noise=noise,  # type: ignore[arg-type]
                target_epsilon=target_epsilon,
                delta=delta,
                epochs=steps * batch_size / canaries,
                batch_size=batch_size,
                max_grad_norm=clip,
                seed=seed + r,
            )
            opt = private.optimizer
            rec = record_releases(opt.original_optimizer, opt.expected_batch_size)
            _train(private)
            inn, out = _column_samples(t, rec, clip)
            ins.append(inn.sum(axis=0))
            outs.append(out.sum(axis=0))
            claim = float(opt.epsilon(delta).epsilon)
    return audit_release_samples(
        np.concatenate(outs),
        np.concatenate(ins),
        claimed_epsilon=claim,
        delta=delta,
        confidence=confidence,
        details={"path": f"make_private_correlated(noise={noise!r})", "runs": runs},
    )


def audit_individual(
    *,
    canaries: int = 48,
    batch_size: int = 12,
    epochs: float = 16.0,
    target_epsilon: float = 8.0,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
) -> TrainingAuditResult:
    """``train_individual`` (a Rényi filter per record): per-step samples per column; claim
    = one step of the Poisson-subsampled Gaussian every record is charged at worst."""
    import torch

    from renyi.accountants import make_accountant
    from renyi.analysis.events import GaussianEvent, PoissonSampledEvent
    from renyi.dpsgd.individual import train_individual

    t = DiracTask(canaries=canaries, spare=canaries)
    model = t.model()
    x, y = t.batch(np.arange(canaries), np.full(canaries, 10.0), background=False)
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    q = batch_size / canaries
    rec = record_releases(sgd, q * canaries)
    with _quiet():
        run = train_individual(
            model,
            sgd,
            (x, y),
            loss_fn=torch.nn.CrossEntropyLoss(),
            target_epsilon=target_epsilon,
            delta=delta,
            batch_size=batch_size,
            epochs=epochs,
            max_grad_norm=clip,
            seed=seed,
        )
    sigma = run.noise_multiplier
    inn, out = _column_samples(t, rec, clip)
    event = PoissonSampledEvent(run.sample_rate, GaussianEvent(sigma))
    claim = float(make_accountant("pld").compose(event).epsilon(delta).epsilon)
    return audit_release_samples(
        out.reshape(-1),
        inn.reshape(-1),
        claimed_epsilon=claim,
        delta=delta,
        confidence=confidence,
        details={"path": "train_individual", "sigma": sigma, "steps": len(rec)},
    )


def audit_user_level(
    level: str = "ULS",
    *,
    users: int = 32,
    examples_per_user: int = 3,
    batch_size: int = 8,
    epochs: float = 24.0,
    target_epsilon: float = 6.0,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
) -> TrainingAuditResult:
    """``make_private_user_level(level)``: every canary user owns one column (all their
    examples in it); per-step samples per column; claim = one step of the user-level event."""
    import torch

    from renyi.accountants import make_accountant
    from renyi.dpsgd.user_level import group_by_user, make_private_user_level

    t = DiracTask(canaries=users, spare=users)
    x, y = t.batch(np.repeat(np.arange(users), examples_per_user), 10.0, background=False)
    owner = torch.as_tensor(np.repeat(np.arange(users), examples_per_user))
    data = group_by_user(x, y, owner, examples_per_user=examples_per_user)
    model = t.model()
    with _quiet():  # make_private_user_level takes no seed: secure noise and sampling
        run = make_private_user_level(
            level,  # type: ignore[arg-type]
            model,
            torch.optim.SGD(model.parameters(), lr=0.0),
            data,
            target_epsilon=target_epsilon,
            delta=delta,
            epochs=epochs,
            batch_size=batch_size,
            max_grad_norm=clip,
        )
        opt = run.private.optimizer
        rec = record_releases(opt.original_optimizer, opt.expected_batch_size)
        run.fit()
    inn, out = _column_samples(t, rec, clip)
    claim = float(make_accountant("rdp").compose(run.event).epsilon(delta).epsilon)
    return audit_release_samples(
        out.reshape(-1),
        inn.reshape(-1),
        claimed_epsilon=claim,
        delta=delta,
        confidence=confidence,
        details={"path": f"make_private_user_level({level!r})", "steps": len(rec)},
    )


def audit_hf_trainer(
    *,
    canaries: int = 32,
    batch_size: int = 2,
    steps: int = 160,
    sigma: float = 1.0,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
) -> TrainingAuditResult:
    """Hugging Face ``DPTrainer`` (``renyi.dpsgd.hf``) on the Dirac task: its own Poisson
    sampler over ``canaries`` examples (one column each; the spare columns are "absent"),
    its per-example loss, optimizer wrapping and logical batches; learning rate 0. One
    sample per step and column; claim = one step of the Poisson-subsampled Gaussian."""
    import tempfile

    import torch
    import transformers

    from renyi.accountants import make_accountant
    from renyi.analysis.events import GaussianEvent, PoissonSampledEvent
    from renyi.dpsgd.hf import DPTrainer

    t = DiracTask(canaries=canaries, spare=canaries)
    x, y = t.batch(np.arange(canaries), np.full(canaries, 10.0), background=False)
    rows = [{"features": x[i], "labels": y[i]} for i in range(canaries)]
    inner = t.model()

    class Dirac(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = inner

        def forward(self, features: Any, labels: Any = None) -> Any:
            return {"logits": self.linear(features)}

    class Recorded(DPTrainer):
        def create_optimizer(self, model: Any = None) -> Any:
            dp: Any = super().create_optimizer(model)
            self._records = record_releases(dp.original_optimizer, dp.expected_batch_size)
            return dp

    def ce(logits: Any, labels: Any) -> Any:
        return torch.nn.functional.cross_entropy(logits, labels, reduction="none")

    with _quiet(), tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch_size,
            max_steps=check_int("steps", steps, 8),
            learning_rate=0.0,
            weight_decay=0.0,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = Recorded(
            model=Dirac(),
            args=args,
            train_dataset=rows,
            data_collator=transformers.default_data_collator,
            noise_multiplier=sigma,
            target_delta=delta,
            max_grad_norm=clip,
            per_example_loss=ce,
            noise_seed=seed,
        )
        trainer.train()
        records: list[FloatArray] = trainer._records
    inn, absent = _column_samples(t, records, clip)
    q = batch_size / canaries
    claim = float(
        make_accountant("pld")
        .compose(PoissonSampledEvent(q, GaussianEvent(sigma)))
        .epsilon(delta)
        .epsilon
    )
    return audit_release_samples(
        absent.reshape(-1),
        inn.reshape(-1),
        claimed_epsilon=claim,
        delta=delta,
        confidence=confidence,
        details={"path": "renyi.dpsgd.hf.DPTrainer", "steps": len(records), "sigma": sigma},
    )


# --------------------------------------------------------------------------- federated
def audit_fedavg(
    *,
    rounds: int = 240,
    canaries: int = 96,
    sigma: float = 4.0,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
) -> TrainingAuditResult:
    """``DpFedAvg.round`` on forced rounds: canary client ``i`` sends an update in its own
    coordinate when in: ``10 C e_i`` (clipped to ``C e_i``), ``-2^-20 C e_i`` (sign) or
    ``C/3 e_i`` (residue), by groups as :data:`GROUPS`; the round's noisy average times
    ``clients_per_round`` is the release; claim = one Gaussian round (z = ``sigma``) without
    amplification."""
    from renyi import noise
    from renyi.federated.fedavg import DpFedAvg

    gen = np.random.default_rng(seed)
    server = DpFedAvg(
        population=canaries,
        clients_per_round=canaries,
        noise_multiplier=sigma,
        clip_norm=clip,
        rng=np.random.default_rng(seed + 1),
    )
    groups = np.arange(canaries) % len(GROUPS)
    value = np.array([10.0, -(2.0**-20), 1.0 / 3.0])[groups] * clip
    samples: dict[int, tuple[list[Any], list[Any]]] = {i: ([], []) for i in range(len(GROUPS))}
    with _quiet():
        for _ in range(check_int("rounds", rounds, 2)):
            coin = gen.random(canaries) < 0.5
            rows = np.diag(value)[coin]
            release = server.round(rows) * canaries
            for gi in range(len(GROUPS)):
                sel = groups == gi
                scale = 1.0 / clip if gi == 0 else 1.0  # gaussian: units of C; others: raw
                samples[gi][0].append(release[sel & ~coin] * scale)
                samples[gi][1].append(release[sel & coin] * scale)
    claim = float(gaussian_epsilon(1.0 / sigma, delta))
    each = 1.0 - (1.0 - confidence) / len(GROUPS)
    results = {
        name: audit_release_samples(
            np.concatenate(samples[gi][0]),
            np.concatenate(samples[gi][1]),
            claimed_epsilon=claim,
            delta=delta,
            confidence=each,
            lattice=noise.lattice_step(sigma * clip) if name == "residue" else None,
            claimed_mu=1.0 / sigma,
        )
        for gi, (name, _) in enumerate(GROUPS)
    }
    best = max(results, key=lambda k: results[k].epsilon_lower_bound)
    return TrainingAuditResult(
        "releases",
        results[best].epsilon_lower_bound,
        claim,
        delta,
        confidence,
        canaries * rounds,
        all(r.passed for r in results.values()),
        mu_lower_bound=max(r.mu_lower_bound or 0.0 for r in results.values()),
        epsilon_gdp=max(r.epsilon_gdp or 0.0 for r in results.values()),
        fdp_claim_refuted=any(bool(r.fdp_claim_refuted) for r in results.values()),
        details={
            "path": "DpFedAvg.round",
            "rounds": rounds,
            "best_group": best,
            "groups": {k: v.details for k, v in results.items()},
        },
        audit=results[best].audit,
    )


def audit_gopa(
    *,
    parties: int = 3,
    runs: int = 8,
    dimension: int = 256,
    value: float = 0.01,
    sigma_eta: float = 1.0,
    sigma_delta: float = 5.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
) -> TrainingAuditResult:
    """``GopaProtocol`` (vector values): party 0's coordinate ``j`` is ``value`` or 0 (its
    coin), the others 0. The release is the estimate times the number of parties, attacked
    with the threshold, bytes and residue (``mod renyi.noise.lattice_step(sigma_eta)``)
    attacks; claim = the run's honest-server ε per coordinate (``GopaProtocol.privacy``)."""
    from renyi import noise
    from renyi.federated.gopa import GopaProtocol

    gen = np.random.default_rng(seed)
    y0, y1 = [], []
    claim = math.nan
    with _quiet():
        for _ in range(check_int("runs", runs, 1)):
            coin = gen.random(dimension) < 0.5
            values = np.zeros((parties, dimension))
            values[0] = value * coin
            proto = GopaProtocol(
                values,
                sigma_eta=sigma_eta,
                sigma_delta=sigma_delta,
                peers=max(1, parties - 1),
                rng=gen,
            )
            est = np.asarray(proto.run().estimate, dtype=np.float64) * parties
            y0.append(est[~coin])
            y1.append(est[coin])
            claim = float(proto.privacy().epsilon(delta))
    return audit_release_samples(
        np.concatenate(y0),
        np.concatenate(y1),
        claimed_epsilon=claim,
        delta=delta,
        confidence=confidence,
        lattice=noise.lattice_step(sigma_eta),
        details={"path": "GopaProtocol", "parties": parties, "runs": runs, "value": value},
    )


def audit_ddg(
    *,
    clients: int = 3,
    runs: int = 16,
    dimension: int = 64,
    local_sigma: float = 30.0,
    gamma: float = 0.05,
    clip: float = 1.0,
    delta: float = DELTA,
    confidence: float = 0.999,
    seed: int = 0,
) -> TrainingAuditResult:
    """``DdgClient``/``DdgServer``: client 0's coordinate ``j`` is ``C/sqrt(d)`` or 0 (its coin;
    the update's norm stays within ``C``, so no clipping couples the coordinates). The release
    is the average times ``clients / gamma`` (an integer sum); attacked with the threshold,
    bytes and residue (mod 1) attacks; claim = the round's event."""
    from renyi.accountants import make_accountant
    from renyi.federated.channels import IdentityKey, Roster
    from renyi.federated.ddg import DdgClient, DdgServer

    gen = np.random.default_rng(seed)
    y0, y1 = [], []
    v = clip / math.sqrt(dimension)
    claim = math.nan
    with _quiet():
        for r in range(check_int("runs", runs, 1)):
            coin = gen.random(dimension) < 0.5
            ids = [IdentityKey(f"c{i}") for i in range(clients)]
            roster = Roster.of(ids)
            updates = np.zeros((clients, dimension))
            updates[0] = v * coin
            cs = [
                DdgClient(
                    ids[i],
                    roster,
                    updates[i],
                    clip_norm=clip,
                    gamma=gamma,
                    local_sigma=local_sigma,
                    rng=np.random.default_rng(seed * 1000 + r * clients + i),
                )
                for i in range(clients)
            ]
            server = DdgServer(
                [c.name for c in cs],
                clip_norm=clip,
                gamma=gamma,
                local_sigma=local_sigma,
                dimension=dimension,
            )
            session = bytes(r.to_bytes(2, "big") * 8)
            directory = {c.name: c.join(session) for c in cs}
            masked = {c.name: c.masked(directory) for c in cs}
            release = server.aggregate(masked) * clients / gamma
            y0.append(release[~coin])
            y1.append(release[coin])
            claim = float(make_accountant("rdp").compose(server.event).epsilon(delta).epsilon)
    return audit_release_samples(
        np.concatenate(y0),
        np.concatenate(y1),
        claimed_epsilon=claim,
        delta=delta,
        confidence=confidence,
        lattice=1.0,
        details={"path": "DdgClient/DdgServer", "clients": clients, "runs": runs},
    )


# --------------------------------------------------------------------------- registry
PATHS: dict[str, Callable[..., TrainingAuditResult]] = {
    "accumulate": audit_accumulate,
    "capture-mean": lambda **kw: audit_capture("mean", **kw),
    "capture-sum": lambda **kw: audit_capture("sum", **kw),
    "capture-class-weighted": lambda **kw: audit_capture("class-weighted", **kw),
    "capture-ignore-index": lambda **kw: audit_capture("ignore-index", **kw),
    "poisson": lambda **kw: audit_sampler("poisson", **kw),
    "fixed-size": lambda **kw: audit_sampler("fixed-size", **kw),
    "balls-in-bins": lambda **kw: audit_sampler("random-allocation", **kw),
    "shuffle": lambda **kw: audit_sampler("shuffle", **kw),
    "correlated-tree": lambda **kw: audit_correlated("tree", **kw),
    "correlated-banded": lambda **kw: audit_correlated("banded", **kw),
    "correlated-blt": lambda **kw: audit_correlated("blt", **kw),
    "individual": audit_individual,
    "user-level-uls": lambda **kw: audit_user_level("ULS", **kw),
    "user-level-els": lambda **kw: audit_user_level("ELS", **kw),
    "fedavg": audit_fedavg,
    "gopa": audit_gopa,
    "ddg": audit_ddg,
    "hf": audit_hf_trainer,
}


def audit_path(name: str, **kwargs: Any) -> TrainingAuditResult:
    """Run the harness of path ``name`` (one of :data:`PATHS`) with its default budget."""
    if name not in PATHS:
        raise fail("path", name, f"one of {', '.join(PATHS)}")
    return PATHS[name](**kwargs)
