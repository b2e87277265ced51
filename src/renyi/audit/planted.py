"""A catalogue of planted bugs: each a small switch in a test-only copy of a training path.

Every entry re-introduces one defect, on top of renyi's real code, without touching it: a
wrapper on one method of one optimizer instance, a loss, a sampler method, or a test-only
copy of a capture. Each is run through the same harness audit as the correct path
(:mod:`renyi.audit.harness`, same confidence) and must be caught: the audited lower bound
exceeds the claim. Two of them are defects found in renyi itself by held-out review (the
``-0.0`` release and the capture's mean assumption under a class-weighted loss); they stay
here as planted bugs after the fix, so the audit keeps being tested against them.

:data:`PLANTED` maps a name to a :class:`PlantedBug`; :data:`NOT_CAUGHT` lists bugs the
audit cannot catch, with why.

Example:
    >>> bug = PLANTED["noise-over-batch-twice"]
    >>> r = bug.audit(seed=0)
    >>> r.passed  # the audit refutes the claim: caught
    False
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from renyi._validation import fail
from renyi.audit.harness import DiracTask, audit_accumulate, audit_capture, audit_sampler
from renyi.audit.training import TrainingAuditResult

__all__ = [
    "NOT_CAUGHT",
    "PLANTED",
    "MeanAssumingCapture",
    "PlantedBug",
    "plant",
]


@dataclass(frozen=True)
class PlantedBug:
    """One catalogued bug.

    Attributes:
        name: its key in :data:`PLANTED`.
        description: what the bug does.
        origin: where this class of bug was seen.
        caught_by: which part of the audit exposes it.
        run: ``run(seed, **kwargs)`` audits the harness path with the bug planted.
        patch: ``patch(optimizer)`` plants it in a ready :class:`DPOptimizer` (what
            ``renyi audit train --planted`` uses), or None when it lives elsewhere.
    """

    name: str
    description: str
    origin: str
    caught_by: str
    run: Callable[..., TrainingAuditResult]
    patch: Callable[[Any], None] | None = None

    def audit(self, seed: int = 0, **kwargs: Any) -> TrainingAuditResult:
        """The harness audit with the bug planted (caught when ``passed`` is False)."""
        return self.run(seed=seed, **kwargs)


# --------------------------------------------------------------------------- patches
def _noise_over_batch_twice(opt: Any) -> None:
    """The noise divided by the batch size before the sum is (so twice in all)."""
    release = opt.release_noisy_sum
    batch = float(opt.expected_batch_size)

    def planted(flat: Any) -> Any:
        return flat + (release(flat) - flat) / batch

    opt.release_noisy_sum = planted


def _noise_reused(opt: Any) -> None:
    """The noise vector drawn at the first step and added again at every step (released on
    the lattice by :func:`renyi.noise.snap`, so only the reuse is wrong)."""
    from renyi import noise

    kept: list[Any] = []

    def planted(flat: Any) -> Any:
        if not kept:
            kept.append(opt.draw_noise())
        return noise.snap(flat, kept[0], opt.noise_std())

    opt.release_noisy_sum = planted


def _negative_zero(opt: Any) -> None:
    """A coordinate whose clipped sum is just below zero and whose release rounds to zero is
    released as ``-0.0`` (the sign of the input survives the rounding)."""
    import torch

    release = opt.release_noisy_sum

    def planted(flat: Any) -> Any:
        out = release(flat)
        neg = (out == 0) & (flat < 0)
        return torch.where(neg, torch.full_like(out, -0.0), out)

    opt.release_noisy_sum = planted


def _residue(opt: Any) -> None:
    """Lattice noise added to the raw clipped sum: the release keeps ``sum mod g``."""
    import torch

    release = opt.release_noisy_sum

    def planted(flat: Any) -> Any:
        return flat + release(torch.zeros_like(flat))

    opt.release_noisy_sum = planted


def _clip_twice_c(opt: Any) -> None:
    """The clipping engine clips at ``2 C`` while the noise and the accountant use ``C``
    (e.g. a clipping norm set on a copy of the engine, or ``C`` read from a config twice)."""
    opt.engine.max_grad_norm = 2.0 * opt.max_grad_norm


def _half_noise_odd_steps(opt: Any) -> None:
    """Half the noise at every other step (a schedule, a flag or a buffer that alternates),
    released on the lattice: only the scale is wrong, and only half the time."""
    from renyi import noise

    calls = [0]

    def planted(flat: Any) -> Any:
        calls[0] += 1
        std = opt.noise_std() / (2.0 if calls[0] % 2 else 1.0)
        return noise.gaussian(flat, std, rng=opt.random_source)

    opt.release_noisy_sum = planted


def _gaussian_canaries(patch: Callable[[Any], None]) -> Callable[..., TrainingAuditResult]:
    """The per-column audit with Gaussian canaries only, 400 steps (76,800 releases). The
    mu-GDP test of the releases catches both bugs below; the ``(epsilon, delta)`` bound alone
    misses half the noise at odd steps (0.33 vs 0.59), and clipping at 2 C with the 200 steps
    and three canary groups of the default per-column audit (0.45 vs 0.59)."""

    def run(seed: int, **kw: Any) -> TrainingAuditResult:
        kw.setdefault("steps", 400)
        return audit_accumulate(seed=seed, patch=patch, groups=("gaussian",), **kw)

    return run


def _realised_batch(opt: Any) -> None:
    """The noisy sum divided by the realised number of examples instead of the fixed
    expected batch size (leaks the batch size, hence membership)."""
    accumulate = opt.accumulate
    seen = [0]

    def counting(inputs: Any, targets: Any) -> Any:
        seen[0] += len(targets)
        return accumulate(inputs, targets)

    def scale_grad() -> None:
        n = max(seen[0], 1)
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(n)
        seen[0] = 0

    opt.accumulate = counting
    opt.scale_grad = scale_grad


def _skip_clip_layer(layer: str | None) -> Callable[[Any], None]:
    """Clipping skipped for the parameters of ``layer`` (None: the module owning the last
    trainable parameter): their per-example gradients are summed unclipped (the other
    layers are clipped as usual)."""

    def patch(opt: Any) -> None:
        import torch

        from renyi.dpsgd.grad_sample import per_example_losses

        engine = opt.engine
        inner = engine.clipped_grad_sum
        named = [(n, p) for n, p in engine.model.named_parameters() if p.requires_grad]
        prefix = layer if layer is not None else named[-1][0].rsplit(".", 1)[0]
        skipped = [(n, p) for n, p in named if n.startswith(prefix + ".")]

        def planted(inputs: Any, targets: Any) -> Any:
            sums, losses, norms = inner(inputs, targets)
            if len(targets):  # the layer's unclipped sum: one backward of the summed loss
                with torch.enable_grad():
                    total = per_example_losses(engine.loss_fn, engine.model(inputs), targets)
                    grads = torch.autograd.grad(total.sum(), [p for _, p in skipped])
                for (name, _), g in zip(skipped, grads, strict=True):
                    sums[name] = g.detach().to(sums[name].dtype)
            return sums, losses, norms

        engine.clipped_grad_sum = planted

    return patch


def _weighted_sampler(factor: float, share: float) -> Callable[[Any], None]:
    """Opacus #813's class of bug: a weighted sampler draws the first ``share`` of the
    examples ``factor`` times as often as the rest, while the accountant is told the
    uniform rate q."""

    def patch(private: Any) -> None:
        sampler = private.sampler
        n = sampler.num_samples
        heavy = round(share * n)
        q = float(sampler.sample_rate)

        def sample_mask() -> Any:
            import torch

            u = sampler.random_source.uniform(n)
            rate = torch.full((n,), q, dtype=u.dtype)
            rate[:heavy] = min(1.0, factor * q)
            return u < rate

        sampler.sample_mask = sample_mask

    return patch


def _batch_weighted_loss() -> tuple[Any, Callable[[Any], None]]:
    """A per-example loss weighted by a statistic of the whole batch: each example's
    cross-entropy divided by the batch's largest input norm (the others' gradients change
    when one large example joins). Returns the loss and the optimizer patch that sets the
    statistic from each accumulated batch."""
    from torch import nn

    ce = nn.CrossEntropyLoss(reduction="none")
    largest = [1.0]

    class BatchScaled(nn.Module):
        def forward(self, outputs: Any, targets: Any) -> Any:
            return ce(outputs, targets) / largest[0]

    def patch(opt: Any) -> None:
        accumulate = opt.accumulate

        def planted(inputs: Any, targets: Any) -> Any:
            norms = inputs.reshape(len(inputs), -1).norm(dim=1)
            largest[0] = float(norms.max()) if len(inputs) else 1.0
            return accumulate(inputs, targets)

        opt.accumulate = planted

    return BatchScaled(), patch


class MeanAssumingCapture:
    """Test-only copy of a ``loss.backward()`` capture that assumes the loss is the plain mean
    of per-example losses (as renyi's capture did before the fix, and as Opacus's hooks do):
    example ``i``'s gradient is taken as ``B`` times its share of the captured output
    gradient. A class-weighted mean or a token mean over the batch's non-ignored tokens
    divides by a batch-dependent total instead, so adding one example rescales everyone
    else's (unclipped) gradient: sensitivity above ``C``.

    Implements the capture interface of :class:`~renyi.dpsgd.optimizer.DPOptimizer`
    (``sensitivity``, ``pop_clipped_sum``, ``zero_grad``, ``remove``) with the public
    :class:`~renyi.dpsgd.clipping.ClippedGradientEngine` on the per-example objective
    ``<model(x_i), g_i>``.
    """

    def __init__(self, model: Any, *, max_grad_norm: float, loss_reduction: str = "mean") -> None:
        from renyi.dpsgd.clipping import ClippedGradientEngine

        def inner(outputs: Any, grads: Any) -> Any:
            return (outputs * grads).reshape(outputs.shape[0], -1).sum(dim=1)

        self.engine = ClippedGradientEngine(model, inner, max_grad_norm=max_grad_norm)
        self.reduction = loss_reduction
        self._inputs: Any = None
        self._out_grad: Any = None
        self._handle = model.register_forward_hook(self._hook)

    @property
    def sensitivity(self) -> float:
        return float(self.engine.sensitivity)

    def _hook(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if not torch.is_grad_enabled() or not output.requires_grad:
            return
        self._inputs = args[0].detach()

        def keep(g: Any) -> None:
            self._out_grad = g.detach()

        output.register_hook(keep)

    def pop_clipped_sum(self) -> Any:
        from renyi.dpsgd.capture import MissingGradientError

        if self._inputs is None or self._out_grad is None:
            raise MissingGradientError("nothing captured")
        x, g = self._inputs, self._out_grad
        scale = float(len(x)) if self.reduction == "mean" else 1.0
        sums, _, norms = self.engine.clipped_grad_sum(x, g * scale)
        self._inputs = self._out_grad = None
        return sums, len(x), norms

    def zero_grad(self) -> None:
        self._inputs = self._out_grad = None

    def remove(self) -> None:
        self._handle.remove()


# --------------------------------------------------------------------------- catalogue
def _two_block(seed: int, **kw: Any) -> TrainingAuditResult:
    task = DiracTask(192, two_blocks=True, canary_scale=6.0)
    return audit_accumulate(seed=seed, task=task, patch=_skip_clip_layer("canary"), **kw)


def _batch_weight_run(seed: int, **kw: Any) -> TrainingAuditResult:
    loss, patch = _batch_weighted_loss()
    kw.setdefault("sigma", 2.0)
    return audit_accumulate(
        seed=seed, single=True, task=DiracTask(background=16), loss_fn=loss, patch=patch, **kw
    )


def _mean_capture_run(loss: str) -> Callable[..., TrainingAuditResult]:
    def run(seed: int, **kw: Any) -> TrainingAuditResult:
        return audit_capture(loss, seed=seed, capture_factory=MeanAssumingCapture, **kw)

    return run


PLANTED: dict[str, PlantedBug] = {
    b.name: b
    for b in (
        PlantedBug(
            "clip-skip-layer",
            "clipping skipped for one layer (its per-example gradients summed unclipped)",
            "per-layer clipping bugs; Opacus' hooks miss layers without a grad sampler",
            "canary releases (threshold)",
            _two_block,
            _skip_clip_layer(None),
        ),
        PlantedBug(
            "noise-over-batch-twice",
            "the noise divided by the batch size before the sum is (noise B times too small)",
            "a common DP-SGD port error (noise added to the mean with the sum's scale)",
            "canary releases (threshold)",
            lambda seed, **kw: audit_accumulate(seed=seed, patch=_noise_over_batch_twice, **kw),
            _noise_over_batch_twice,
        ),
        PlantedBug(
            "realised-batch-size",
            "the noisy sum divided by the realised batch size, not the fixed expected one",
            "the external audit of Opacus v0.9-1.5.4 (opacus #819); docs/style.md",
            "noise scale of the pure-noise coordinates (one canary per step)",
            lambda seed, **kw: audit_accumulate(
                seed=seed,
                single=True,
                task=DiracTask(background=1, spare=64),
                patch=_realised_batch,
                **kw,
            ),
            _realised_batch,
        ),
        PlantedBug(
            "batch-weight-loss",
            "each example's loss weighted by a statistic of the whole batch (1 / the batch's "
            "largest input norm)",
            "loss normalisation by batch statistics",
            "the background examples' direction (one canary per step)",
            _batch_weight_run,
            None,
        ),
        PlantedBug(
            "sampler-rate",
            "a weighted sampler draws half of the examples 16 times as often (every step) "
            "while the accountant is told the uniform rate q = 1/16",
            "Opacus #813 (WeightedRandomSampler under DPDataLoader)",
            "canary releases per step (Poisson sampler path)",
            lambda seed, **kw: audit_sampler(
                "poisson", seed=seed, patch=_weighted_sampler(16.0, 0.5), **kw
            ),
            None,
        ),
        PlantedBug(
            "noise-reused",
            "the noise vector drawn once and added again at every step",
            "a cached noise buffer (e.g. a generator re-seeded each step)",
            "canary releases (the same noise recurs in the held-out half)",
            lambda seed, **kw: audit_accumulate(seed=seed, patch=_noise_reused, **kw),
            _noise_reused,
        ),
        PlantedBug(
            "negative-zero",
            "a release that rounds to zero keeps the sign of a slightly negative input (-0.0)",
            "renyi.noise before issue 22 (attack epsilon 8.8 vs 4.38)",
            "exact bytes of the sign canaries' releases",
            lambda seed, **kw: audit_accumulate(seed=seed, patch=_negative_zero, **kw),
            _negative_zero,
        ),
        PlantedBug(
            "residue",
            "lattice noise added to the raw clipped sum: the release keeps sum mod g",
            "GOPA before issue 22 (K * estimate mod g = sum(X) mod g; epsilon 6 from one release)",
            "lattice residue of the residue canaries' releases",
            lambda seed, **kw: audit_accumulate(seed=seed, patch=_residue, **kw),
            _residue,
        ),
        PlantedBug(
            "capture-mean-class-weighted",
            "loss.backward() capture assuming a plain mean, under a class-weighted "
            "CrossEntropyLoss",
            "renyi's capture before issue 27 (1.385 C); Opacus' hooks alike",
            "the background examples' direction (one canary per step)",
            _mean_capture_run("class-weighted"),
            None,
        ),
        PlantedBug(
            "clip-at-2c",
            "per-example gradients clipped at 2 C while the noise and the accountant use C "
            "(true epsilon 1.35 for a claimed 0.59 at sigma 4)",
            "held-out review of issue 27 (not in the issue's list)",
            "mu-GDP test of the canary releases (and the (epsilon, delta) bound at 400 steps)",
            _gaussian_canaries(_clip_twice_c),
            _clip_twice_c,
        ),
        PlantedBug(
            "half-noise-odd-steps",
            "half the noise at every other step",
            "held-out review of issue 27 (not in the issue's list)",
            "mu-GDP test of the canary releases (the (epsilon, delta) bound stays below)",
            _gaussian_canaries(_half_noise_odd_steps),
            _half_noise_odd_steps,
        ),
        PlantedBug(
            "capture-mean-ignore-index",
            "loss.backward() capture assuming a plain mean, under a token mean over the "
            "batch's non-ignored tokens",
            "renyi's capture before issue 27 (1.064 C)",
            "the background examples' direction (one canary per step)",
            _mean_capture_run("ignore-index"),
            None,
        ),
    )
}

#: Bugs this audit cannot catch, and why.
NOT_CAUGHT: dict[str, str] = {
    "predictable-noise": "noise from a fixed or guessable seed has exactly the claimed "
    "distribution; only an attacker who knows the seed gains, and no audit of the outputs' "
    "distribution can see it (DPOptimizer refuses noise sources it does not vouch for)",
    "small-rate-error": "a sampling rate misreported by a few tens of percent changes one "
    "step's epsilon by less than the sampling error of any feasible number of releases",
    "accounting-undercount": "an accountant that under-counts a long subsampled run (e.g. "
    "forgets one epoch): the one-run lower bound of a subsampled multi-step run is far below "
    "the claim (docs/audit.md), so an under-count by less than that gap is invisible",
    "timing": "work that depends on secret values shows in time, not in the released values; "
    "renyi.audit.timing compares neighbouring inputs' times instead",
}


def plant(name: str, optimizer: Any) -> None:
    """Plant bug ``name`` in a ready DP optimizer (for ``renyi audit train --planted``)."""
    if name not in PLANTED:
        raise fail("planted", name, f"one of {', '.join(PLANTED)}")
    patch = PLANTED[name].patch
    if patch is None:
        raise fail(
            "planted",
            name,
            "a bug that lives in the optimizer (this one lives in the loss, the sampler or "
            "the capture: run its harness audit, renyi.audit.planted.PLANTED[name].audit())",
        )
    patch(optimizer)
