"""Audit the training a user runs: canaries through the real path, a lower bound beside the claim.

An accountant's ε is a proof about a *model* of the code (clip, sum, add N(0, σ²C²), divide
by a fixed batch size, sample at rate q). This module measures the code as it runs, with the
user's model, loss, optimizer, sampler and accountant, and reports a high-confidence lower
bound on ε next to the ε the run claims. Two kinds of evidence:

**One run** (:func:`audit_training`, Steinke, Nasr & Jagielski 2023; Mahloujifar, Melis &
Chaudhuri 2025). :class:`GradientCanaries` hooks a :class:`~renyi.dpsgd.optimizer.DPOptimizer`
(any subclass: ``make_private``, ``PrivacyEngine``, correlated noise, ...) without changing
its code:

* *white-box gradient canaries at the clipped-sum stage*: ``m`` canaries, each a virtual
  example whose clipped gradient is ``v e_j`` in its own coordinate ``j`` of the flat
  parameter vector, each in the data with probability 1/2 (the one-run coin), and, when in,
  joining each step as the run's sampler says (Poisson at rate ``q``; once per epoch for
  balls-in-bins and shuffling; its partition's steps for cyclic Poisson), are added to the
  clipped sum that :meth:`~renyi.dpsgd.optimizer.DPOptimizer.release_noisy_sum` releases;
* *the release is checked*: every released update (``p.grad`` handed to the wrapped torch
  optimizer, times the fixed batch size) is recorded at the canary coordinates. A white-box
  auditor also knows the other examples' clipped sum at those coordinates (it is recorded at
  the insertion point and subtracted: it does not depend on the canaries' coins).

Three kinds of canary, each its own one-run experiment (Bonferroni over kinds):

* ``"gaussian"``: ``v = C`` (the sensitivity). Score: the log-likelihood ratio of the claimed
  mechanism summed over the run (``log(1 - p + p exp(x/σ² - 1/(2σ²)))`` per step of
  participation probability ``p``, ``x`` the release at the coordinate in units of C).
* ``"sign"``: ``v = -2^-24 C``, just below zero. Score: how many releases at the coordinate
  were ``-0.0``. A release whose bytes depend only on its lattice index never shows the sign
  of a zero, so these canaries are invisible to a correct path.
* ``"residue"``: ``v = C/3``, off every power-of-two lattice. Score: how many releases
  minus the known clipped sum were off the noise lattice ``g = renyi.noise.lattice_step(σC)``.
  A release ``g round((s + v)/g + σZ/g)`` is always on the lattice; ``s + v + g K`` is not.

The canaries are ranked by score (ties in random order) and the top ``k`` guessed "in", for
``k`` on a small grid. Each guess count gives (i) the ``(ε, δ)`` lower bound of Steinke et
al. (Thm 3.1: valid for any mechanism, :func:`renyi.audit.stats.one_run_epsilon_lower_bound`),
reported as ``epsilon_lower_bound``; (ii) the f-DP test of Mahloujifar et al. against the
run's claimed trade-off curve (:func:`renyi.tradeoff.tradeoff_curve` of the optimizer's
accountant): ``fdp_claim_refuted``; and (iii) the largest μ-GDP the guesses refute,
``mu_lower_bound``, with ``epsilon_gdp`` its ε at δ (an ε bound among Gaussian-shaped
mechanisms only, labelled so). The claim passes when ``epsilon_lower_bound <= epsilon_claimed``
and the claimed curve is not refuted; all tests together hold at ``confidence``.

**Many independent releases** (:func:`audit_release_samples`): where a path's releases for
the canary coordinates are independent draws (a frozen model, fresh noise each step, canaries
in coordinates nothing else touches), the canaries' in and out releases are two samples of
the step's mechanism, audited with the held-out attacks of :mod:`renyi.audit.blackbox`
(threshold, exact bytes, lattice residue). This is how the test suite audits every training
path and catches the planted bugs of :mod:`renyi.audit.planted` (see
:mod:`renyi.audit.harness`): far more power per second than one run, at the price of the
independence assumption, which a correct path satisfies and whose violation (noise reused,
say) is itself a defect.

Example:
    >>> import torch
    >>> from torch.utils.data import TensorDataset
    >>> from renyi.dpsgd import make_private
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <...>
    >>> data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    >>> model = torch.nn.Linear(8, 2)
    >>> private = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
    ...     loss_fn=torch.nn.CrossEntropyLoss(), noise_multiplier=1.0, delta=1e-5,
    ...     batch_size=64, epochs=1, max_grad_norm=1.0, seed=0)
    >>> def train():
    ...     for x, y in private.data_loader:
    ...         private.optimizer.zero_grad(); private.optimizer.accumulate(x, y)
    ...         private.optimizer.step()
    >>> r = audit_training(private.optimizer, train, canaries=16, delta=1e-5, seed=0)
    >>> r.passed, r.epsilon_lower_bound <= r.epsilon_claimed
    (True, True)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_delta, check_int, check_range, fail
from renyi.audit.blackbox import AuditResult, audit_samples
from renyi.audit.fdp import (
    curve_inverse_tradeoff,
    fdp_refutes,
    gdp_mu_lower_bound,
    gdp_samples_mu_lower_bound,
)
from renyi.audit.stats import one_run_epsilon_lower_bound

__all__ = [
    "KINDS",
    "GradientCanaries",
    "TrainingAuditResult",
    "add_example_canaries",
    "audit_one_run_scores",
    "audit_release_samples",
    "audit_training",
    "example_scores",
    "one_run_roc",
]

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
#: the canary kinds of :class:`GradientCanaries`
KINDS = ("gaussian", "sign", "residue")
#: fractions of the canaries guessed "in" (top scores), Bonferroni over them
GUESS_FRACTIONS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
_SIGN_VALUE = -(2.0**-24)  # in units of C: strictly inside (-g/2, 0) for any sigma >= 2^-19
_RESIDUE_VALUE = 1.0 / 3.0  # in units of C: a multiple of no power of two above 2^-54


def _check_conf(confidence: Any) -> float:
    return check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)


@dataclass(frozen=True)
class TrainingAuditResult:
    """An audit of a training path: a lower bound on ε beside the ε the run claims.

    Attributes:
        method: ``"one-run"`` (:func:`audit_training`) or ``"releases"``
            (:func:`audit_release_samples`).
        epsilon_lower_bound: high-confidence lower bound on the run's ε at ``delta`` (valid
            for any mechanism; Steinke et al. 2023 for one run, held-out Clopper-Pearson for
            independent releases).
        epsilon_claimed: the ε the run claims at ``delta`` (its accountant's, or given).
        delta, confidence: as asked; every test of the audit together holds at
            ``confidence`` (Bonferroni).
        canaries: canaries inserted (all kinds).
        passed: ``epsilon_lower_bound <= epsilon_claimed`` and the claimed trade-off curve
            not refuted.
        mu_lower_bound, epsilon_gdp: the largest μ-GDP the guesses refute (one run,
            Mahloujifar et al. 2025; independent releases with a Gaussian claim, a held-out
            threshold test) and its ε at ``delta`` (a bound among mechanisms with a
            Gaussian trade-off curve only).
        fdp_claim_refuted: whether the evidence refutes the claimed trade-off curve
            (``None``: no curve available for the claim).
        details: counts behind the bounds (per kind: canaries, guesses, correct; steps).
        roc: the empirical ROC ``(fpr, tpr)`` of the Gaussian canaries' scores (for plots).
        claim_curve: the claim's TPR upper bounds ``(fpr, tpr)`` (for plots).
        audit: the black-box audit behind a ``"releases"`` result.
    """

    method: str
    epsilon_lower_bound: float
    epsilon_claimed: float
    delta: float
    confidence: float
    canaries: int
    passed: bool
    mu_lower_bound: float | None = None
    epsilon_gdp: float | None = None
    fdp_claim_refuted: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)
    roc: tuple[FloatArray, FloatArray] | None = field(default=None, repr=False)
    claim_curve: tuple[FloatArray, FloatArray] | None = field(default=None, repr=False)
    audit: AuditResult | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (keys of ``renyi audit train --json``)."""
        return {
            "method": self.method,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "epsilon_claimed": self.epsilon_claimed,
            "delta": self.delta,
            "confidence": self.confidence,
            "canaries": self.canaries,
            "passed": self.passed,
            "mu_lower_bound": self.mu_lower_bound,
            "epsilon_gdp": self.epsilon_gdp,
            "fdp_claim_refuted": self.fdp_claim_refuted,
            "details": _jsonable(self.details),
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# --------------------------------------------------------------------------- one run
def one_run_roc(scores: ArrayLike, included: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Empirical ROC ``(fpr, tpr)`` of thresholding ``scores`` to guess ``included``.

    Example:
        >>> fpr, tpr = one_run_roc([0.1, 0.9, 0.4, 0.8], [False, True, False, True])
        >>> float(np.trapezoid(tpr, fpr))
        1.0
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included, dtype=bool).reshape(-1)
    if s.shape != inc.shape or s.size == 0:
        raise fail("scores", s.shape, f"one score per canary ({inc.size})")
    order = np.argsort(-s, kind="stable")
    hits = inc[order]
    n1, n0 = max(int(inc.sum()), 1), max(int((~inc).sum()), 1)
    tpr = np.concatenate([[0.0], np.cumsum(hits) / n1])
    fpr = np.concatenate([[0.0], np.cumsum(~hits) / n0])
    return fpr, tpr


def _ranked(scores: FloatArray, gen: np.random.Generator) -> NDArray[np.int64]:
    """Canary indices by descending score, ties in a random order (independent of the coins)."""
    jitter = gen.permutation(scores.size)
    return np.lexsort((jitter, -scores))


def audit_one_run_scores(
    scores: Mapping[str, tuple[ArrayLike, ArrayLike]],
    *,
    delta: float,
    claimed_epsilon: float,
    confidence: float = 0.95,
    claim_curve: tuple[ArrayLike, ArrayLike] | None = None,
    guess_fractions: Sequence[float] = GUESS_FRACTIONS,
    rng: np.random.Generator | None = None,
    details: Mapping[str, Any] | None = None,
) -> TrainingAuditResult:
    """One-run bounds from canary scores: ``scores[kind] = (scores, included)``.

    For every kind and every ``k = fraction * m`` the top-``k`` canaries are guessed "in"
    (ties broken at random); each guess count is tested by Steinke et al. 2023 (Thm 3.1, at
    ``delta``) and, with ``claim_curve`` (TPR upper bounds of the claim), by the f-DP test of
    Mahloujifar et al. 2025; the confidence is split evenly over all these tests. The
    μ-GDP lower bound is the largest over the same guesses.

    Example:
        >>> gen = np.random.default_rng(0)
        >>> inc = gen.random(2000) < 0.5
        >>> s = inc * 1.0 + gen.normal(size=2000)  # one Gaussian step, mu = 1
        >>> r = audit_one_run_scores({"gaussian": (s, inc)}, delta=1e-5,
        ...                          claimed_epsilon=4.38, rng=gen)
        >>> r.passed, 0.0 < r.epsilon_lower_bound < 4.38
        (True, True)
    """
    d = check_delta(delta)
    conf = _check_conf(confidence)
    claim = check_range("claimed_epsilon", claimed_epsilon, 0.0, math.inf)
    fracs = tuple(float(f) for f in guess_fractions)
    if not fracs or any(not (0.0 < f <= 1.0) for f in fracs):
        raise fail("guess_fractions", guess_fractions, "fractions in (0, 1]")
    if not scores:
        raise fail("scores", scores, "at least one kind of canary with scores")
    gen = rng if rng is not None else np.random.default_rng()
    f_inv = None if claim_curve is None else curve_inverse_tradeoff(*claim_curve)
    tests = len(scores) * len(fracs) * (2 if f_inv is not None else 1)
    each = 1.0 - (1.0 - conf) / tests
    best_eps, best_mu, refuted = 0.0, 0.0, False
    per_kind: dict[str, Any] = {}
    total = 0
    roc = None
    for kind, (sc, inc_) in scores.items():
        s = np.asarray(sc, dtype=np.float64).reshape(-1)
        inc = np.asarray(inc_, dtype=bool).reshape(-1)
        if s.shape != inc.shape or s.size < 2 or not np.isfinite(s).all():
            raise fail(f"scores[{kind!r}]", s.shape, "finite scores, one per canary (>= 2)")
        m = s.size
        total += m
        order = _ranked(s, gen)
        correct = np.cumsum(inc[order])
        rows = []
        for f in fracs:
            k = max(1, min(m, round(f * m)))
            c = int(correct[k - 1])
            eps = one_run_epsilon_lower_bound(m, k, c, d, each)
            mu = gdp_mu_lower_bound(m, k, c, each)
            hit = bool(f_inv is not None and fdp_refutes(m, k, c, f_inv, each))
            rows.append({"guesses": k, "correct": c, "epsilon": eps, "mu": mu, "refutes": hit})
            best_eps, best_mu, refuted = max(best_eps, eps), max(best_mu, mu), refuted or hit
        per_kind[kind] = {"canaries": m, "included": int(inc.sum()), "guesses": rows}
        if kind == "gaussian" or roc is None:
            roc = one_run_roc(s, inc)
    eps_gdp = 0.0
    if best_mu > 0:
        from renyi.analysis.closed_forms import gaussian_epsilon

        eps_gdp = float(gaussian_epsilon(best_mu, d)) * (1.0 - 1e-9)
    curve = None
    if claim_curve is not None:
        curve = (
            np.asarray(claim_curve[0], dtype=np.float64),
            np.asarray(claim_curve[1], dtype=np.float64),
        )
    return TrainingAuditResult(
        "one-run",
        best_eps,
        claim,
        d,
        conf,
        total,
        bool(best_eps <= claim and not refuted),
        best_mu,
        eps_gdp,
        None if f_inv is None else refuted,
        {**dict(details or {}), "kinds": per_kind},
        roc,
        curve,
    )


# --------------------------------------------------------------------------- releases
def audit_release_samples(
    y0: ArrayLike,
    y1: ArrayLike,
    *,
    claimed_epsilon: float,
    delta: float,
    confidence: float = 0.95,
    lattice: float | None = None,
    multiplier: float = 1.0,
    features: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None,
    details: Mapping[str, Any] | None = None,
    claimed_mu: float | None = None,
) -> TrainingAuditResult:
    """Audit independent releases: ``y0`` without the canary, ``y1`` with it.

    The canary releases are attacked with the held-out threshold and sign-of-zero attacks of
    :func:`renyi.audit.blackbox.audit_samples` (plus the lattice-residue attack when
    ``lattice`` is given: ``(multiplier * y) mod lattice``); every extra scalar feature in
    ``features[name] = (without, with)`` (e.g. the released noise's scale, or the release
    along the other examples' direction: what a batch-dependent normaliser moves) gets the
    threshold attack. The confidence is split evenly over the canary audit and the features,
    so the reported maximum holds at ``confidence`` when the releases are independent.

    ``claimed_mu``: when the claim is a Gaussian trade-off curve (one Gaussian step without
    amplification: ``mu = 1 / sigma``), the canary releases are also tested against mu-GDP
    (:func:`renyi.audit.fdp.gdp_samples_mu_lower_bound`, its own share of the confidence):
    ``fdp_claim_refuted`` and ``passed`` report it, ``mu_lower_bound`` is the refuted
    ``mu``. Far stronger than the ``(epsilon, delta)`` bound at small ``delta``: it sees a
    sensitivity twice the claimed one, or half the noise at every other step, with
    samples that leave the ``(epsilon, delta)`` bound below the claim.

    Example:
        >>> gen = np.random.default_rng(0)
        >>> r = audit_release_samples(gen.normal(size=4000), 1 + gen.normal(size=4000),
        ...                           claimed_epsilon=3.14, delta=1e-3)
        >>> r.passed
        True
    """
    d = check_delta(delta)
    conf = _check_conf(confidence)
    claim = check_range("claimed_epsilon", claimed_epsilon, 0.0, math.inf)
    extra = dict(features or {})
    mu_claim = None if claimed_mu is None else check_range("claimed_mu", claimed_mu, 0, math.inf)
    each = 1.0 - (1.0 - conf) / (1 + len(extra) + (mu_claim is not None))
    residue = None if lattice is None else (multiplier, float(lattice))
    main = audit_samples(
        y0,
        y1,
        claimed_epsilon=claim,
        delta=d,
        confidence=each,
        attacks=["threshold", "signzero"],
        residue=residue,
    )
    best, best_name = main.epsilon_lower, f"canary/{main.best.attack}"
    found: dict[str, float] = {a.attack: a.epsilon for a in main.attacks}
    for name, (f0, f1) in extra.items():
        r = audit_samples(
            f0, f1, claimed_epsilon=claim, delta=d, confidence=each, attacks=["threshold"]
        )
        found[name] = r.epsilon_lower
        if r.epsilon_lower > best:
            best, best_name = r.epsilon_lower, name
    y0a, y1a = np.asarray(y0), np.asarray(y1)
    mu_lb: float | None = None
    refuted: bool | None = None
    eps_gdp = 0.0
    gdp: dict[str, Any] = {}
    if mu_claim is not None:
        from renyi.analysis.closed_forms import gaussian_epsilon

        mu_lb, gdp = gdp_samples_mu_lower_bound(y0a, y1a, each)
        refuted = mu_lb > mu_claim
        eps_gdp = float(gaussian_epsilon(mu_lb, d)) * (1.0 - 1e-9) if mu_lb > 0 else 0.0
    return TrainingAuditResult(
        "releases",
        best,
        claim,
        d,
        conf,
        int(y0a.size + y1a.size),
        bool(best <= claim) and not refuted,
        mu_lower_bound=mu_lb,
        epsilon_gdp=None if mu_lb is None else eps_gdp,
        fdp_claim_refuted=refuted,
        details={
            **dict(details or {}),
            "samples_without": int(y0a.size),
            "samples_with": int(y1a.size),
            "best": best_name,
            "bounds": found,
            **({"gdp": {"claimed_mu": mu_claim, **gdp}} if mu_claim is not None else {}),
        },
        audit=main,
    )


# --------------------------------------------------------------------------- the probe
def _flat_params(optimizer: Any) -> list[Any]:
    """The trainable parameters in the order the optimizer flattens them (its public
    ``param_groups``, frozen ones skipped, as :class:`DPOptimizer` does)."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]


class GradientCanaries:
    """White-box gradient canaries at a DP optimizer's clipped-sum stage; records its releases.

    Installs by wrapping two bound methods of ``optimizer`` (a
    :class:`~renyi.dpsgd.optimizer.DPOptimizer` or subclass) on the instance: its
    ``release_noisy_sum(flat)`` (the canaries that take part in this step are added to the
    clipped sum ``flat`` there, and the other examples' sum at their coordinates is
    recorded) and its wrapped torch optimizer's ``step`` (the released gradient ``p.grad``
    is read there, times ``optimizer.expected_batch_size``). Use as a context manager around
    the user's training loop; nothing else changes.

    Args:
        optimizer: the DP optimizer.
        canaries, sign_canaries, residue_canaries: how many of each kind (module docstring);
            each takes its own coordinate (at most the number of parameters in all).
        participation: ``"sampler"`` (each canary that is in joins steps as the optimizer's
            sampler would sample an example: Poisson rate ``q``; one uniformly random step
            per epoch for the epoch samplers; its own partition's steps, at rate ``q``, for
            cyclic Poisson) or ``"every-step"`` (the adversary puts it in every batch: no
            amplification).
        rng: the audit's own randomness (coins, coordinates, participation).
    """

    def __init__(
        self,
        optimizer: Any,
        *,
        canaries: int = 1000,
        sign_canaries: int = 0,
        residue_canaries: int = 0,
        participation: str = "sampler",
        rng: np.random.Generator | None = None,
    ) -> None:
        if participation not in ("sampler", "every-step"):
            raise fail("participation", participation, "'sampler' or 'every-step'")
        for name in ("release_noisy_sum", "original_optimizer", "noise_std", "sampler"):
            if not hasattr(optimizer, name):
                raise fail("optimizer", type(optimizer).__name__, "a renyi DPOptimizer")
        counts = {
            "gaussian": check_int("canaries", canaries, 0),
            "sign": check_int("sign_canaries", sign_canaries, 0),
            "residue": check_int("residue_canaries", residue_canaries, 0),
        }
        self.optimizer = optimizer
        self.participation = participation
        self.gen = rng if rng is not None else np.random.default_rng()
        params = _flat_params(optimizer)
        self._sizes = [int(p.numel()) for p in params]
        total = sum(self._sizes)
        m = sum(counts.values())
        if m < 1 or m > total:
            raise fail("canaries", m, f"between 1 and the {total} trainable parameters")
        self.coordinates = np.sort(self.gen.choice(total, size=m, replace=False))
        self.gen.shuffle(self.coordinates)
        self.kind = np.repeat(np.array(list(counts)), list(counts.values()))
        unit = {"gaussian": 1.0, "sign": _SIGN_VALUE, "residue": _RESIDUE_VALUE}
        self.value = np.array([unit[k] for k in self.kind.tolist()])
        self.included = self.gen.random(m) < 0.5
        self.clip = float(optimizer.max_grad_norm)
        self.sigma = float(optimizer.noise_std()) / self.clip
        self._steps: list[tuple[FloatArray, FloatArray, BoolArray, float]] = []
        self._pending: tuple[FloatArray, BoolArray, float] | None = None
        self._installed = False
        self._epoch_slot: NDArray[np.int64] | None = None
        sampler = optimizer.sampler
        per_epoch = getattr(sampler, "steps_per_epoch", None)
        self._per_epoch = int(per_epoch) if isinstance(per_epoch, int) and per_epoch > 0 else None
        partitions = int(getattr(sampler, "partitions", 1) or 1)
        self._partition = self.gen.integers(0, partitions, size=m) if partitions > 1 else None
        self._partitions = partitions
        self._rate = float(getattr(sampler, "sample_rate", 1.0))
        self._step = 0

    # -- participation ------------------------------------------------------------------
    def _participating(self) -> tuple[BoolArray, float]:
        """Which canaries join this step, and the probability each had (for the score)."""
        m = self.coordinates.size
        t = self._step
        if self.participation == "every-step":
            return self.included.copy(), 1.0
        if self._per_epoch is not None:
            if t % self._per_epoch == 0 or self._epoch_slot is None:
                self._epoch_slot = self.gen.integers(0, self._per_epoch, size=m)
            return self.included & (self._epoch_slot == t % self._per_epoch), 1.0 / self._per_epoch
        coin = self.gen.random(m) < self._rate
        if self._partition is not None:
            coin &= self._partition == t % self._partitions
            return self.included & coin, self._rate  # 0 outside the partition: see scores
        return self.included & coin, self._rate

    # -- hooks ----------------------------------------------------------------------------
    def _release(self, flat: Any) -> Any:
        import torch

        if flat.numel() != sum(self._sizes):
            raise fail("flat clipped sum", flat.numel(), f"{sum(self._sizes)} entries")
        idx = torch.as_tensor(self.coordinates, device=flat.device)
        before = flat[idx].detach().to(torch.float64).cpu().numpy().copy()
        part, prob = self._participating()
        add = torch.as_tensor(self.value * self.clip * part, dtype=flat.dtype, device=flat.device)
        flat = flat.clone()
        flat[idx] = flat[idx] + add
        self._pending = (before, part, prob)
        return self._orig_release(flat)

    def _observe(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        if self._pending is not None:
            grads = []
            for p, size in zip(_flat_params(self.optimizer), self._sizes, strict=True):
                g = p.grad
                grads.append(
                    torch.zeros(size, dtype=torch.float64)
                    if g is None
                    else g.detach().reshape(-1).to(torch.float64).cpu()
                )
            flat = torch.cat(grads).numpy()[self.coordinates]
            released = flat * float(self.optimizer.expected_batch_size)
            before, part, prob = self._pending
            self._steps.append((released, before, part, prob))
            self._pending = None
            self._step += 1
        return self._orig_step(*args, **kwargs)

    def install(self) -> GradientCanaries:
        """Wrap the optimizer's release and its torch optimizer's step (idempotent)."""
        if not self._installed:
            self._orig_release = self.optimizer.release_noisy_sum
            self._orig_step = self.optimizer.original_optimizer.step
            self.optimizer.release_noisy_sum = self._release
            self.optimizer.original_optimizer.step = self._observe
            self._installed = True
        return self

    def remove(self) -> None:
        """Restore the optimizer's own methods."""
        if self._installed:
            del self.optimizer.release_noisy_sum
            del self.optimizer.original_optimizer.step
            self._installed = False

    def __enter__(self) -> GradientCanaries:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- scores ---------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Releases recorded so far."""
        return len(self._steps)

    def released(self) -> tuple[FloatArray, FloatArray, BoolArray]:
        """``(released, clipped_sum_without_canaries, participated)``, each ``(steps, m)``."""
        if not self._steps:
            raise fail("training", "no step released", "at least one optimizer step")
        x = np.stack([s[0] for s in self._steps])
        s = np.stack([s[1] for s in self._steps])
        part = np.stack([s[2] for s in self._steps])
        return x, s, part

    def scores(self) -> dict[str, tuple[FloatArray, BoolArray]]:
        """``{kind: (scores, included)}`` for :func:`audit_one_run_scores` (module docstring)."""
        x, s, _ = self.released()
        probs = np.array([p for *_, p in self._steps])
        out: dict[str, tuple[FloatArray, BoolArray]] = {}
        for kind in KINDS:
            sel = self.kind == kind
            if not sel.any():
                continue
            xs, ss = x[:, sel], s[:, sel]
            if kind == "gaussian":
                score = self._gaussian_scores((xs - ss) / self.clip, probs, sel)
            elif kind == "sign":
                score = ((xs == 0) & np.signbit(xs)).sum(axis=0).astype(np.float64)
            else:
                from renyi import noise

                g = noise.lattice_step(self.sigma * self.clip)
                u = (xs - ss) / g
                score = (np.abs(u - np.rint(u)) > 1e-6).sum(axis=0).astype(np.float64)
            out[kind] = (score, self.included[sel])
        return out

    def _gaussian_scores(self, z: FloatArray, probs: FloatArray, sel: BoolArray) -> FloatArray:
        """Log-likelihood ratio of participation vs absence under the claimed mechanism."""
        s2 = self.sigma**2
        lr = z / s2 - 0.5 / s2  # log N(z; 1, s^2) - log N(z; 0, s^2)
        if self.participation == "every-step":
            return np.asarray(z.sum(axis=0), dtype=np.float64)
        if self._per_epoch is not None:
            t = z.shape[0]
            total = np.zeros(z.shape[1])
            for start in range(0, t, self._per_epoch):
                block = lr[start : start + self._per_epoch]
                total += np.logaddexp.reduce(block, axis=0) - math.log(self._per_epoch)
            return total
        p = np.broadcast_to(probs[:, None], z.shape).copy()
        if self._partition is not None:  # a canary only joins its own partition's steps
            steps = np.arange(z.shape[0])[:, None]
            p = np.where(steps % self._partitions == self._partition[sel][None, :], p, 0.0)
        with np.errstate(divide="ignore"):  # p = 0 or 1: one of the two terms is -inf
            term = np.logaddexp(np.log1p(-p), np.log(p) + lr)
        return np.asarray(term.sum(axis=0), dtype=np.float64)


def _claim_of(optimizer: Any, delta: float, steps: int, participation: str) -> float:
    if participation == "every-step":
        from renyi.analysis.closed_forms import gaussian_epsilon

        return float(gaussian_epsilon(math.sqrt(steps) / float(optimizer.noise_multiplier), delta))
    return float(optimizer.epsilon(delta).epsilon)


def _claim_curve(optimizer: Any, steps: int, participation: str) -> tuple[Any, Any] | None:
    """TPR upper bounds of the claim (renyi.tradeoff), or None when unavailable."""
    from renyi.tradeoff import gaussian_tradeoff_tpr, tradeoff_curve

    grid = np.geomspace(1e-6, 1.0, 400)
    if participation == "every-step":
        mu = math.sqrt(steps) / float(optimizer.noise_multiplier)
        return grid, gaussian_tradeoff_tpr(mu, grid)
    acc = getattr(optimizer, "accountant", None)
    if acc is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            curve = tradeoff_curve(acc, grid)
    except Exception:  # an accountant without a privacy profile: no curve, Steinke only
        return None
    return curve.fpr, curve.tpr


def audit_training(
    optimizer: Any,
    train: Callable[[], Any],
    *,
    canaries: int = 1000,
    sign_canaries: int = 0,
    residue_canaries: int = 0,
    delta: float,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    participation: str = "sampler",
    extra_scores: Mapping[str, Callable[[], tuple[ArrayLike, ArrayLike]]] | None = None,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> TrainingAuditResult:
    """Run ``train()`` with :class:`GradientCanaries` on ``optimizer``; one-run bounds.

    ``train`` is the user's own loop (it must step ``optimizer``; ``Trainer(private).fit``
    is one). The claim is the optimizer's accountant's ε at ``delta`` after the run (with
    ``participation="every-step"``: ``T`` Gaussian steps without amplification), or
    ``claimed_epsilon``. ``extra_scores[kind]()`` is called after training and returns
    ``(scores, included)`` of more canaries of the same run (e.g. black-box canary
    examples: :func:`add_example_canaries`, :func:`example_scores`), audited as one more
    kind. Returns :func:`audit_one_run_scores`' result with the steps in ``details``.
    """
    d = check_delta(delta)
    gen = rng if rng is not None else np.random.default_rng(seed)
    probe = GradientCanaries(
        optimizer,
        canaries=canaries,
        sign_canaries=sign_canaries,
        residue_canaries=residue_canaries,
        participation=participation,
        rng=gen,
    )
    with probe:
        train()
    steps = probe.steps
    scores = probe.scores()
    for kind, get in (extra_scores or {}).items():
        scores[kind] = tuple(np.asarray(v) for v in get())  # type: ignore[assignment]
    if claimed_epsilon is None:
        claim = _claim_of(optimizer, d, steps, participation)
        curve = _claim_curve(optimizer, steps, participation)
    else:
        claim, curve = float(claimed_epsilon), None
    return audit_one_run_scores(
        scores,
        delta=d,
        claimed_epsilon=claim,
        confidence=confidence,
        claim_curve=curve,
        rng=gen,
        details={
            "steps": steps,
            "participation": participation,
            "noise_multiplier": probe.sigma,
            "max_grad_norm": probe.clip,
        },
    )


# --------------------------------------------------------------------------- black box
def add_example_canaries(
    dataset: Any, canaries: int, *, classes: int, rng: np.random.Generator
) -> tuple[Any, Any, Any, BoolArray]:
    """Black-box canary examples: ``canaries`` inputs of uniform random values in the range
    of ``dataset``'s inputs with uniformly random labels (mislabelled, out of distribution:
    the membership-inference canaries of Steinke et al. 2023, Sec. 6), each appended to a
    copy of the ``TensorDataset`` ``dataset`` with probability 1/2.

    Returns ``(augmented dataset, canary inputs, canary labels, included)``.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> d = TensorDataset(torch.rand(10, 3), torch.zeros(10, dtype=torch.long))
        >>> aug, x, y, inc = add_example_canaries(d, 4, classes=2,
        ...                                       rng=np.random.default_rng(0))
        >>> len(aug) == 10 + int(inc.sum()), tuple(x.shape)
        (True, (4, 3))
    """
    import torch
    from torch.utils.data import TensorDataset

    if not isinstance(dataset, TensorDataset) or len(dataset.tensors) != 2:
        raise fail("dataset", type(dataset).__name__, "a TensorDataset(inputs, targets)")
    m = check_int("canaries", canaries, 1)
    k = check_int("classes", classes, 2)
    xs, ys = dataset.tensors
    if len(xs) == 0:
        raise fail("dataset", "an empty dataset", "at least one example (the canaries' range)")
    lo, hi = float(xs.min()), float(xs.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise fail("dataset", "non-finite inputs", "finite inputs (the canaries' range)")
    u = torch.as_tensor(rng.random((m, *xs.shape[1:])), dtype=xs.dtype)
    cx = lo + (hi - lo) * u
    cy = torch.as_tensor(rng.integers(0, k, size=m), dtype=ys.dtype)
    inc = rng.random(m) < 0.5
    keep = torch.as_tensor(np.flatnonzero(inc))
    aug = TensorDataset(torch.cat([xs, cx[keep]]), torch.cat([ys, cy[keep]]))
    return aug, cx, cy, inc


def example_scores(model: Any, inputs: Any, targets: Any, loss_fn: Any = None) -> FloatArray:
    """Membership scores of canary examples from the final model: minus each one's loss
    (cross-entropy by default), computed without gradients in eval mode."""
    import torch

    fn = loss_fn if loss_fn is not None else torch.nn.CrossEntropyLoss(reduction="none")
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            losses = fn(model(inputs), targets)
    finally:
        model.train(was)
    return np.asarray(-losses.detach().to(torch.float64).cpu().numpy(), dtype=np.float64)
