"""Auditing DP-SGD with canaries: many runs, one run, and the white-box final step.

A *Dirac gradient canary* is an example whose gradient is ``G e_j`` (``G >= C``), pointing at
a coordinate ``j`` of the model that nothing else touches. After clipping it adds ``C e_j``
to the gradient sum whenever it is sampled, so coordinate ``j`` of the update is the clipped
contribution plus Gaussian noise: the worst case of the DP-SGD analysis (Nasr et al. 2021,
"Adversary instantiation", Sec. 4; Nasr et al. 2023, "Tight auditing"). Canaries in
different coordinates see independent noise, so one training run with ``m`` canaries gives
``m`` independent trials, each distributed exactly as the single-canary experiment.

Audits (each returns :class:`DpSgdAuditResult`: the lower bound, the claim, pass/fail):

* :func:`audit_final_step`: white-box, the adversary sees the last update and put the
  canaries in the last batch. Each observation is the Gaussian mechanism with ``mu = 1/sigma``,
  so the audited lower bound should approach the exact epsilon of one Gaussian step
  (Balle & Wang 2018): the gap measures the attack's power (and, against the RDP conversion,
  the accountant's slack).
* :func:`audit_many_runs`: train ``runs`` models, each canary included with probability
  1/2, observe the final model's canary coordinates and audit the two score samples with the
  threshold attack of :mod:`renyi.audit.blackbox` (held-out Clopper-Pearson).
* :func:`audit_one_run`: one training run with ``m`` canaries (each included with
  probability 1/2), guess the top-``k`` scores "in" and the bottom-``k`` "out" and convert the
  number of correct guesses with the theorem of Steinke, Nasr & Jagielski 2023
  (arXiv:2305.08846, Thm. 3.1; :func:`~renyi.audit.stats.one_run_epsilon_lower_bound`).

Trainers: :func:`reference_dpsgd` is a minimal numpy DP-SGD (Abadi et al. 2016, Alg. 1:
Poisson sampling, per-example clipping, sum, Gaussian noise, division by the fixed expected
batch size, SGD step) on logistic regression with canary coordinates, vectorised over runs,
with planted bugs for the test suite (``"half_noise"``: sigma/2; ``"no_clipping"``).
:func:`torch_final_step_scores` runs the same final-step experiment through
:class:`renyi.dpsgd.optimizer.DPOptimizer` (needs torch).

Example:
    >>> import numpy as np
    >>> r = audit_final_step(noise_multiplier=1.0, canaries=1000, repetitions=20,
    ...                      delta=1e-5, rng=np.random.default_rng(0))
    >>> r.passed, 0.0 < r.epsilon_lower < r.claimed_epsilon
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from renyi._validation import check_delta, check_int, check_positive, check_range, fail
from renyi.analysis.closed_forms import gaussian_epsilon, gaussian_rdp
from renyi.analysis.curves import DEFAULT_ORDERS, RdpCurve
from renyi.audit.blackbox import AuditResult, audit_samples
from renyi.audit.stats import one_run_epsilon_lower_bound

__all__ = [
    "BUGS",
    "DpSgdAuditResult",
    "accountant_epsilons",
    "audit_final_step",
    "audit_many_runs",
    "audit_one_run",
    "one_run_guesses",
    "reference_dpsgd",
    "torch_final_step_scores",
]

BUGS = ("half_noise", "no_clipping")
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
ScoreFn = Callable[[BoolArray, Any], FloatArray]


@dataclass(frozen=True)
class DpSgdAuditResult:
    """A DP-SGD audit: lower bound ≤ true epsilon ≤ claim (if the claim is right).

    Attributes:
        method: ``"final_step"``, ``"many_runs"`` or ``"one_run"``.
        epsilon_lower: the audited lower bound at ``delta`` (holds w.p. ``>= confidence``).
        delta, confidence: as requested.
        claimed_epsilon: the claim checked: by default the tightest accountant value.
        passed: ``epsilon_lower <= claimed_epsilon``.
        accountant: epsilon at ``delta`` for the audited release from each analysis of
            :func:`accountant_epsilons` (``"exact"``, ``"rdp"`` for full batches; ``"pld"``
            when asked for, and always with Poisson sampling).
        details: counts behind the bound (samples, guesses, ...).
    """

    method: str
    epsilon_lower: float
    delta: float
    confidence: float
    claimed_epsilon: float
    passed: bool
    accountant: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    audit: AuditResult | None = field(default=None, repr=False)

    @property
    def gap(self) -> float:
        """``claimed_epsilon - epsilon_lower`` (how far apart the sandwich's ends are)."""
        return self.claimed_epsilon - self.epsilon_lower

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary."""
        return {
            "method": self.method,
            "epsilon_lower": self.epsilon_lower,
            "delta": self.delta,
            "confidence": self.confidence,
            "claimed_epsilon": self.claimed_epsilon,
            "passed": self.passed,
            "gap": self.gap,
            "accountant": dict(self.accountant),
            "details": dict(self.details),
        }


def accountant_epsilons(
    noise_multiplier: float,
    steps: int,
    delta: float,
    *,
    sample_rate: float = 1.0,
    pld: bool = False,
) -> dict[str, float]:
    """Epsilon at ``delta`` of ``steps`` DP-SGD steps (Poisson rate ``sample_rate``) per analysis.

    Full batch (``sample_rate = 1``): ``"exact"``, the T-fold Gaussian mechanism is the
    Gaussian mechanism with ``mu = sqrt(T) / sigma`` (Dong, Roth & Su 2019, Cor. 3.3), exact
    epsilon by :func:`renyi.analysis.closed_forms.gaussian_epsilon` (Balle & Wang 2018, Thm. 8);
    ``"rdp"``, the RDP curve ``T alpha / (2 sigma^2)`` (Mironov 2017, Prop. 7) converted by
    :meth:`renyi.analysis.curves.RdpCurve.to_dp` (Balle et al. 2020, Thm. 21). ``"pld"`` (when
    ``pld=True``, always for ``sample_rate < 1``): the rigorous upper end of
    :class:`renyi.analysis.pld.PrivacyLossDistribution` for the (Poisson-subsampled) Gaussian, the
    larger of the add and remove directions.

    Example:
        >>> e = accountant_epsilons(1.0, 1, 1e-5)
        >>> e["exact"] < e["rdp"]
        True
    """
    s = check_positive("noise_multiplier", noise_multiplier)
    t = check_int("steps", steps, 1)
    d = check_delta(delta)
    q = check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    out: dict[str, float] = {}
    if q == 1.0:
        out["exact"] = float(gaussian_epsilon(math.sqrt(t) / s, d))
        curve = RdpCurve(DEFAULT_ORDERS, t * gaussian_rdp(s, DEFAULT_ORDERS))
        out["rdp"] = float(curve.to_dp(d).epsilon)
    if pld or q < 1.0:
        from renyi.analysis.pld import PrivacyLossDistribution as Pld

        if q == 1.0:
            dists = [Pld.gaussian(s)]
        else:
            dists = [Pld.subsampled_gaussian(q, s, direction=w) for w in ("add", "remove")]
        out["pld"] = max(float(p.self_compose(t).epsilon_for_delta(d).upper) for p in dists)
    return out


# ------------------------------------------------------------------ reference DP-SGD
def _check_bug(bug: str | None) -> str | None:
    if bug is not None and bug not in BUGS:
        raise fail("bug", bug, f"None or one of {BUGS}")
    return bug


def reference_dpsgd(
    included: BoolArray,
    *,
    noise_multiplier: float,
    max_grad_norm: float = 1.0,
    steps: int = 1,
    sample_rate: float = 1.0,
    learning_rate: float = 0.5,
    canary_norm: float | None = None,
    num_real: int = 32,
    real_dim: int = 4,
    bug: str | None = None,
    rng: np.random.Generator | None = None,
) -> FloatArray:
    """Train logistic regression with Dirac canaries by minimal numpy DP-SGD; canary scores.

    ``included`` is a boolean ``(runs, m)`` array: canary ``i`` of run ``r`` is in that run's
    dataset. Each run trains ``w`` in ``R^(real_dim + m)`` for ``steps`` steps: every example
    (``num_real`` fixed synthetic points with gradients in the first ``real_dim``
    coordinates, plus the included canaries, canary ``i`` with gradient
    ``-canary_norm e_(real_dim+i)``) joins a step's batch independently w.p. ``sample_rate``;
    per-example gradients are clipped to ``max_grad_norm`` (L2), summed, ``N(0, sigma^2 C^2
    I)`` is added, the sum is divided by the fixed expected batch size ``q (num_real + m)``
    and ``w -= learning_rate * g`` (Abadi et al. 2016, Alg. 1). Returns the canary
    coordinates of ``w_T - w_0`` rescaled by ``q (num_real + m) / (learning_rate C)``: a
    canary's score is (number of steps it was sampled) minus ``N(0, T sigma^2)``.

    ``bug="half_noise"`` adds noise of std ``sigma C / 2``; ``bug="no_clipping"`` skips
    clipping (the canary then contributes ``canary_norm``). Both are planted to be caught.

    Example:
        >>> s = reference_dpsgd(np.ones((2, 3), bool), noise_multiplier=1e-9,
        ...                     rng=np.random.default_rng(0))
        >>> np.round(s, 6).tolist()
        [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """
    inc = np.asarray(included)
    if inc.dtype != np.bool_ or inc.ndim != 2 or inc.size == 0:
        raise fail("included", f"<{inc.dtype} array of shape {inc.shape}>", "a 2-D bool array")
    sigma = check_positive("noise_multiplier", noise_multiplier)
    c = check_positive("max_grad_norm", max_grad_norm)
    t = check_int("steps", steps, 1)
    q = check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    lr = check_positive("learning_rate", learning_rate)
    g_can = 10.0 * c if canary_norm is None else check_positive("canary_norm", canary_norm)
    n = check_int("num_real", num_real, 0)
    dr = check_int("real_dim", real_dim, 1)
    bug = _check_bug(bug)
    gen = rng if rng is not None else np.random.default_rng()
    runs, m = inc.shape
    data_rng = np.random.default_rng(12345)  # the fixed, public synthetic dataset
    x = data_rng.normal(size=(n, dr))
    y = np.sign(x @ np.ones(dr) + 0.5 * data_rng.normal(size=n))
    w_real = np.zeros((runs, dr))
    w_can = np.zeros((runs, m))
    batch = q * (n + m)  # expected batch size, fixed before training
    noise_std = sigma * c * (0.5 if bug == "half_noise" else 1.0)
    for _ in range(t):
        # real examples: logistic-loss gradients -y x sigmoid(-y w.x), shape (runs, n, dr)
        margin = y[None, :] * (w_real @ x.T)
        coef = -y[None, :] * np.exp(-np.logaddexp(0.0, margin))
        grads = coef[:, :, None] * x[None, :, :]
        if bug != "no_clipping":
            norms = np.linalg.norm(grads, axis=2)
            grads = grads * np.minimum(1.0, c / np.maximum(norms, 1e-300))[:, :, None]
        take_real = gen.random((runs, n)) < q
        g_real = np.einsum("rn,rnd->rd", take_real.astype(np.float64), grads)
        # canaries: gradient -g_can e_i, clipped to norm C
        contrib = g_can if bug == "no_clipping" else min(g_can, c)
        take_can = inc & (gen.random((runs, m)) < q)
        g_c = -contrib * take_can
        g_real = g_real + noise_std * gen.standard_normal((runs, dr))
        g_c = g_c + noise_std * gen.standard_normal((runs, m))
        w_real -= lr * g_real / batch
        w_can -= lr * g_c / batch
    return np.asarray(w_can * batch / (lr * c), dtype=np.float64)


def torch_final_step_scores(
    included: BoolArray,
    *,
    noise_multiplier: float,
    max_grad_norm: float = 1.0,
    canary_norm: float | None = None,
    seed: int | None = None,
    optimizer_factory: Callable[..., Any] | None = None,
) -> FloatArray:
    """The white-box final-step experiment through :class:`renyi.dpsgd.optimizer.DPOptimizer`.

    For each row ``r`` of ``included`` (``(repetitions, m)`` bool), a linear model
    ``w in R^m`` (``torch.nn.Linear(m, 1, bias=False)``, zero-initialised) takes one
    DP-SGD step on the batch of included canaries (canary ``i``: input
    ``canary_norm e_i``, loss ``-<w, x>``, so its gradient is ``-canary_norm e_i``), with
    ``noise_multiplier`` and ``max_grad_norm`` and the expected batch size ``m``
    (``PoissonSampler(m, 1.0, 1)``). Returns ``w_1 m / (lr C)``: canary ``i``'s score is
    ``1[included] - N(0, sigma^2)`` when the optimizer is correct. ``seed`` seeds the noise
    (``None``: the secure source); ``optimizer_factory(**kwargs)`` replaces ``DPOptimizer``
    (to plant a bug in a subclass). Needs torch.
    """
    import torch

    from renyi.dpsgd.optimizer import DPOptimizer
    from renyi.dpsgd.sampler import PoissonSampler, make_random_source

    inc = np.asarray(included)
    if inc.dtype != np.bool_ or inc.ndim != 2 or inc.size == 0:
        raise fail("included", f"<{inc.dtype} array of shape {inc.shape}>", "a 2-D bool array")
    c = check_positive("max_grad_norm", max_grad_norm)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    g_can = 10.0 * c if canary_norm is None else check_positive("canary_norm", canary_norm)
    reps, m = inc.shape
    source = make_random_source(seed)
    factory = optimizer_factory if optimizer_factory is not None else DPOptimizer
    eye = torch.eye(m, dtype=torch.float64) * g_can
    lr = 1.0

    def loss_fn(outputs: Any, targets: Any) -> Any:
        return -(outputs.reshape(-1) * targets)

    out = np.empty((reps, m))
    for r in range(reps):
        model = torch.nn.Linear(m, 1, bias=False).double()
        with torch.no_grad():
            model.weight.zero_()
        opt = factory(
            torch.optim.SGD(model.parameters(), lr=lr),
            model=model,
            loss_fn=loss_fn,
            noise_multiplier=sigma,
            max_grad_norm=c,
            sampler=PoissonSampler(m, 1.0, 1, random_source=source),
            accountant=None,
            random_source=source,
        )
        opt.zero_grad()
        rows = torch.as_tensor(np.nonzero(inc[r])[0])  # may be empty: still a step
        opt.accumulate(eye[rows], torch.ones(rows.numel(), dtype=torch.float64))
        opt.step()
        out[r] = model.weight.detach().numpy().reshape(-1) * m / (lr * c)
    return out


# ------------------------------------------------------------------ audits
def _check_conf(confidence: Any) -> float:
    return check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)


def _claim(claimed_epsilon: float | None, accountant: dict[str, float], what: str) -> float:
    if claimed_epsilon is not None:
        return check_range("claimed_epsilon", claimed_epsilon, 0.0, math.inf)
    if not accountant:
        raise fail("claimed_epsilon", None, f"a claim ({what}: no closed-form accountant)")
    return min(accountant.values())


def _split_scores(scores: FloatArray, inc: BoolArray) -> tuple[FloatArray, FloatArray]:
    s = np.asarray(scores, dtype=np.float64)
    if s.shape != inc.shape or not np.isfinite(s).all():
        raise fail("scores", f"<array of shape {s.shape}>", f"finite scores of shape {inc.shape}")
    return s[~inc], s[inc]


def _threshold_audit(
    method: str,
    y0: FloatArray,
    y1: FloatArray,
    claim: float,
    delta: float,
    confidence: float,
    accountant: dict[str, float],
    details: dict[str, Any],
) -> DpSgdAuditResult:
    """Audit the score samples with the held-out threshold attack; ``details`` come first."""
    res = audit_samples(
        y0, y1, claimed_epsilon=claim, delta=delta, confidence=confidence, attacks=["threshold"]
    )
    return DpSgdAuditResult(
        method,
        res.epsilon_lower,
        delta,
        confidence,
        claim,
        bool(res.epsilon_lower <= claim),
        accountant,
        {
            **details,
            "samples_without": int(y0.size),
            "samples_with": int(y1.size),
            "set": res.best.set_description,
        },
        res,
    )


def audit_final_step(
    *,
    noise_multiplier: float,
    canaries: int = 1000,
    repetitions: int = 20,
    delta: float = 1e-5,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    scores_fn: ScoreFn | None = None,
    pld: bool = False,
    rng: np.random.Generator | None = None,
) -> DpSgdAuditResult:
    """White-box Dirac-canary audit of one DP-SGD step (the final one).

    ``repetitions`` steps, each with ``canaries`` Dirac canaries included independently with
    probability 1/2; every canary coordinate of the update is one observation, so the
    threshold attack of :func:`renyi.audit.blackbox.audit_samples` sees about
    ``repetitions * canaries / 2`` samples per side. The claim defaults to the exact epsilon
    of one Gaussian step (``mu = 1 / sigma``; the adversary put the canary in the final
    batch, so sampling does not amplify). ``scores_fn(included, rng)`` runs the step
    (default: :func:`reference_dpsgd` with one full-batch step; or wrap
    :func:`torch_final_step_scores` to audit :class:`~renyi.dpsgd.optimizer.DPOptimizer`).
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    m = check_int("canaries", canaries, 2)
    reps = check_int("repetitions", repetitions, 1)
    d = check_delta(delta)
    conf = _check_conf(confidence)
    gen = rng if rng is not None else np.random.default_rng()
    accountant = accountant_epsilons(sigma, 1, d, pld=pld)
    claim = _claim(claimed_epsilon, accountant, "final step")
    inc = gen.random((reps, m)) < 0.5
    if scores_fn is None:
        scores = reference_dpsgd(inc, noise_multiplier=sigma, steps=1, sample_rate=1.0, rng=gen)
    else:
        scores = scores_fn(inc, gen)
    y0, y1 = _split_scores(scores, inc)
    return _threshold_audit("final_step", y0, y1, claim, d, conf, accountant, {})


def audit_many_runs(
    *,
    noise_multiplier: float,
    steps: int = 1,
    sample_rate: float = 1.0,
    runs: int = 1000,
    canaries: int = 16,
    delta: float = 1e-5,
    confidence: float = 0.95,
    claimed_epsilon: float | None = None,
    bug: str | None = None,
    scores_fn: ScoreFn | None = None,
    pld: bool = False,
    rng: np.random.Generator | None = None,
) -> DpSgdAuditResult:
    """Many-runs canary audit of a whole DP-SGD training (final model observed).

    ``runs`` trainings (vectorised), each with ``canaries`` Dirac canaries included
    independently with probability 1/2 (each coordinate is an independent single-canary
    trial); the final model's canary coordinates are the scores, audited with the held-out
    threshold attack (Jagielski et al. 2020; Nasr et al. 2021). The default claim is the
    tightest value of :func:`accountant_epsilons` (exact for full batches; the PLD upper
    bound with ``sample_rate < 1``; ``pld=True`` adds the PLD value for full batches too).
    ``bug`` plants a bug in the reference trainer; ``scores_fn(included, rng)`` replaces it.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    t = check_int("steps", steps, 1)
    q = check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    n_runs = check_int("runs", runs, 1)
    m = check_int("canaries", canaries, 1)
    d = check_delta(delta)
    conf = _check_conf(confidence)
    gen = rng if rng is not None else np.random.default_rng()
    accountant = accountant_epsilons(sigma, t, d, sample_rate=q, pld=pld)
    claim = _claim(claimed_epsilon, accountant, f"sample_rate={q}")
    inc = gen.random((n_runs, m)) < 0.5
    if scores_fn is None:
        scores = reference_dpsgd(
            inc, noise_multiplier=sigma, steps=t, sample_rate=q, bug=_check_bug(bug), rng=gen
        )
    else:
        scores = scores_fn(inc, gen)
    y0, y1 = _split_scores(scores, inc)
    if min(y0.size, y1.size) < 4:
        raise fail("runs * canaries", n_runs * m, "enough runs for >= 4 samples per side")
    details = {"runs": n_runs, "canaries_per_run": m}
    return _threshold_audit("many_runs", y0, y1, claim, d, conf, accountant, details)


def one_run_guesses(scores: FloatArray, k_in: int, k_out: int) -> NDArray[np.int8]:
    """Guesses of the one-run audit: +1 for the ``k_in`` highest scores, -1 for the ``k_out``
    lowest, 0 (abstain) otherwise (Steinke, Nasr & Jagielski 2023, Alg. 1).

    Example:
        >>> one_run_guesses(np.array([0.3, 2.0, -1.0, 0.1]), 1, 1).tolist()
        [0, 1, -1, 0]
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    a = check_int("k_in", k_in, 0)
    b = check_int("k_out", k_out, 0)
    if a + b > s.size:
        raise fail("k_in + k_out", a + b, f"at most the number of canaries {s.size}")
    order = np.argsort(s, kind="stable")
    guess = np.zeros(s.size, dtype=np.int8)
    if b:
        guess[order[:b]] = -1
    if a:
        guess[order[s.size - a :]] = 1
    return guess


def audit_one_run(
    *,
    noise_multiplier: float,
    canaries: int = 1000,
    steps: int = 1,
    sample_rate: float = 1.0,
    delta: float = 1e-5,
    confidence: float = 0.95,
    guess_fractions: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2),
    claimed_epsilon: float | None = None,
    bug: str | None = None,
    scores_fn: ScoreFn | None = None,
    pld: bool = False,
    rng: np.random.Generator | None = None,
) -> DpSgdAuditResult:
    """One-run audit (Steinke, Nasr & Jagielski 2023): one training, ``canaries`` canaries.

    Each canary is included independently with probability 1/2; after one training run the
    auditor guesses "in" for the top ``k`` scores and "out" for the bottom ``k``. For each
    ``k = fraction * canaries`` in ``guess_fractions`` the number of correct guesses is
    converted by :func:`~renyi.audit.stats.one_run_epsilon_lower_bound` at confidence
    ``1 - (1 - confidence) / len(guess_fractions)`` (Bonferroni over the choices of ``k``), and
    the largest bound is reported. Default trainer and claim as in :func:`audit_many_runs`.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    m = check_int("canaries", canaries, 2)
    t = check_int("steps", steps, 1)
    q = check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
    d = check_delta(delta)
    conf = _check_conf(confidence)
    fracs = tuple(float(f) for f in guess_fractions)
    if not fracs or any(not (0.0 < f <= 0.5) for f in fracs):
        raise fail("guess_fractions", guess_fractions, "fractions in (0, 0.5]")
    gen = rng if rng is not None else np.random.default_rng()
    accountant = accountant_epsilons(sigma, t, d, sample_rate=q, pld=pld)
    claim = _claim(claimed_epsilon, accountant, f"sample_rate={q}")
    inc = gen.random((1, m)) < 0.5
    if scores_fn is None:
        scores = reference_dpsgd(
            inc, noise_multiplier=sigma, steps=t, sample_rate=q, bug=_check_bug(bug), rng=gen
        )
    else:
        scores = scores_fn(inc, gen)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if s.size != m or not np.isfinite(s).all():
        raise fail("scores", f"<array of {s.size} entries>", f"{m} finite scores")
    truth = np.where(inc[0], 1, -1)
    each = 1.0 - (1.0 - conf) / len(fracs)
    best = (0.0, 0, 0, 0)
    for f in fracs:
        k = max(1, int(f * m))
        guess = one_run_guesses(s, k, k)
        r = int((guess != 0).sum())
        v = int((guess == truth).sum())
        eps = one_run_epsilon_lower_bound(m, r, v, d, each)
        if eps > best[0] or best[1] == 0:
            best = (eps, k, r, v)
    eps, k, r, v = best
    return DpSgdAuditResult(
        "one_run",
        eps,
        d,
        conf,
        claim,
        bool(eps <= claim),
        accountant,
        {"canaries": m, "k": k, "guesses": r, "correct": v, "included": int(inc.sum())},
    )
