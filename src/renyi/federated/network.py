"""Network DP for random-walk DP-SGD on the complete graph (Cyffers & Bellet, AISTATS 2022).

The model walks from party to party: at each of ``T`` steps the current holder makes a
clipped noisy gradient step on its local data and sends the model to a uniformly random
party. **Network DP** (Cyffers & Bellet 2022, Definition 3): for every pair of distinct
parties ``v != u``, the messages party ``v`` sends and receives are (ε, δ)-DP with respect to
a change of ``u``'s whole local dataset (replace-one at the party level).

Notation: ``n`` parties, ``T`` steps, ``K`` the maximum number of contributions of one party
(enforced by the walk: after ``K`` gradient steps a party only adds noise), ``L`` the L2
sensitivity of one update before noise, ``sigma`` the noise standard deviation.

Accounting of :func:`network_dp_epsilon`, as in the authors' calibration:

* **Hidden contributions** (amplification by iteration, Feldman et al. 2018, used in
  Cyffers & Bellet 2022, Theorem 5): RDP of order ``alpha``
  ``2 K L² alpha ln(n) / (sigma² n)``, valid for ``sigma >= L sqrt(2 alpha (alpha - 1))``,
  converted with ``ln(1/delta)/(alpha - 1)`` (Mironov 2017, Prop. 3); we minimise over the
  valid orders in closed form.
* **Spotted contributions** (the walk passes through ``v`` just before or after ``u``): at most
  ``K_s = ceil(2K/n + sqrt(6 K ln(1/delta) / n))`` except with probability ``delta`` (Chernoff
  bound), each a Gaussian mechanism, composed with the better of basic composition and
  advanced composition (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Thm 3.20).
* The two parts compose basically: ``epsilon = epsilon_hidden + epsilon_spotted``.

``convention="paper"`` follows the authors' script: the target δ is applied to each part
(the reference values n = 2000, T = 20000, δ = 1e-6 come from it) and the local baseline
uses advanced composition only. The δ actually proven is then the union bound
``delta_total`` (about 2.2 δ), which the result reports. The default ``convention="union"``
divides δ among the parts so that ``delta_total <= delta`` and composes the local baseline
with the better of basic and advanced composition (basic wins for K = 12, ε = 10).

Baselines at the same (ε, δ): **local DP** (every message is public: advanced composition
over the ``K`` contributions of a party, classic Gaussian per step) and **central DP**
(Bassily, Smith & Thakurta 2014, Theorem 2.1: ``sigma = 16 L sqrt(T ln(2/δ) ln(1.25 T/(δ n)))
/ (n ε)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize

from renyi._validation import check_delta, check_int, check_nonnegative, check_positive, fail
from renyi.analysis.closed_forms import classic_gaussian_constant, gaussian_delta, gaussian_epsilon
from renyi.analysis.composition import compose_advanced, drv_epsilon
from renyi.federated.aggregation import gaussian_noise
from renyi.random import get_source

__all__ = [
    "BREAST_CANCER_FEATURES",
    "NetworkDpAccount",
    "WalkResult",
    "central_sigma",
    "contribution_cap",
    "local_dp_epsilon",
    "local_sigma",
    "network_dp_epsilon",
    "network_sigma",
    "random_walk_sgd",
    "random_walk_sgd_parallel",
    "spotted_contributions",
    "walk_experiment",
]

Convention = Literal["union", "paper"]
"""``paper``: the authors' script (target δ per part; local baseline by advanced composition
only). ``union``: δ split so the union bound is at most δ; best of basic/advanced composition."""
PerStep = Literal["classic", "analytic"]


def contribution_cap(steps: int, parties: int, slack: float = 1.2) -> int:
    """``K = ceil(slack * T / n)``, the contributions allowed per party (the walk enforces it).

    >>> contribution_cap(20000, 2000)
    12
    """
    t = check_int("steps", steps, 1)
    n = check_int("parties", parties, 2)
    s = check_positive("slack", slack)
    return max(1, math.ceil(s * t / n - 1e-12))


def spotted_contributions(contributions: int, parties: int, delta: float) -> int:
    """``K_s = ceil(2K/n + sqrt(6 K ln(1/delta) / n))`` (Cyffers & Bellet 2022, Lemma 3).

    With probability at least ``1 - delta`` a given party is visited right before or after
    another's contribution at most ``K_s`` times.

    >>> spotted_contributions(12, 2000, 1e-6)
    1
    """
    k = check_int("contributions", contributions, 1)
    n = check_int("parties", parties, 2)
    d = check_delta(delta)
    return math.ceil(2.0 * k / n + math.sqrt(6.0 * k * math.log(1.0 / d) / n))


def _per_step_epsilon(
    sigma: float, lipschitz: float, delta_step: float, per_step: PerStep
) -> float:
    """ε of one Gaussian step with noise ``sigma`` and sensitivity ``L`` at ``delta_step``."""
    mu = lipschitz / sigma
    if per_step == "analytic":
        return gaussian_epsilon(mu, delta_step)
    eps0 = classic_gaussian_constant(delta_step) * mu  # Dwork & Roth Thm A.1 (eps0 < 1)
    if eps0 < 1.0 or float(gaussian_delta(mu, eps0)) <= delta_step:
        return eps0
    return gaussian_epsilon(mu, delta_step)  # classic bound not proven here: use the exact one


def _composed(k: int, eps0: float, delta_prime: float) -> float:
    # basic composition or DRV (Dwork & Roth 2014, Thm 3.20), whichever is smaller; the
    # callers count delta_prime in their delta either way (conservative when basic wins)
    return compose_advanced(eps0, 0.0, k, delta_prime).epsilon


def local_dp_epsilon(
    sigma: float,
    *,
    contributions: int,
    delta: float,
    lipschitz: float = 1.0,
    convention: Convention = "union",
    per_step: PerStep = "classic",
) -> tuple[float, float]:
    """``(epsilon, delta_total)`` of one party's ``K`` public noisy contributions (local DP).

    ``paper``: advanced composition (Dwork & Roth 2014, Thm 3.20) with slack δ/K and
    per-step δ/K (total ``δ (1 + 1/K)``), as the authors' baseline; ``union``: the better of
    basic and advanced composition, slack δ/2 and per-step δ/(2K) (total δ).
    """
    s = check_positive("sigma", sigma)
    k = check_int("contributions", contributions, 1)
    d = check_delta(delta)
    lip = check_positive("lipschitz", lipschitz)
    if convention not in ("union", "paper"):
        raise fail("convention", convention, "'union' or 'paper'")
    dp, ds = (d / k, d / k) if convention == "paper" else (d / 2, d / (2 * k))
    eps0 = _per_step_epsilon(s, lip, ds, per_step)
    if convention == "paper":
        return drv_epsilon(eps0, k, dp), dp + k * ds
    return _composed(k, eps0, dp), dp + k * ds


@dataclass(frozen=True)
class NetworkDpAccount:
    """Network-DP guarantee of random-walk DP-SGD: ``epsilon`` at ``delta_total``.

    ``epsilon_hidden`` (amplification by iteration, best order ``order``) plus
    ``epsilon_spotted`` (``spotted`` direct observations); ``delta_total`` is the union bound
    over the RDP conversion, the spotted tail bound and the spotted compositions.
    """

    epsilon: float
    epsilon_hidden: float
    epsilon_spotted: float
    order: float
    spotted: int
    contributions: int
    delta: float
    delta_total: float
    sigma: float


def _hidden_epsilon(
    sigma: NDArray[np.float64], k: int, n: int, lip: float, delta_rdp: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    a = 2.0 * k * lip * lip * math.log(n) / n  # RDP = a alpha / sigma²
    b = math.log(1.0 / delta_rdp)
    alpha_max = 0.5 + np.sqrt(0.25 + sigma**2 / (2.0 * lip * lip))  # sigma = L sqrt(2a(a-1))
    alpha_opt = 1.0 + np.sqrt(b * sigma**2 / a)  # minimiser of a alpha/sigma² + b/(alpha-1)
    alpha = np.minimum(alpha_max, alpha_opt)
    return a * alpha / sigma**2 + b / (alpha - 1.0), alpha


def _deltas(d: float, k: int, k_s: int, split: Convention) -> tuple[float, float, float, float]:
    """(delta_rdp, delta_tail, delta_prime, delta_step) for the hidden/spotted parts."""
    if split == "paper":
        return d, d, d / k, d / k
    return d / 4, d / 4, d / 4, d / (4 * k_s)


def network_dp_epsilon(
    sigma: float,
    *,
    parties: int,
    steps: int,
    delta: float,
    lipschitz: float = 1.0,
    contributions: int | None = None,
    convention: Convention = "union",
    per_step: PerStep = "classic",
) -> NetworkDpAccount:
    """Network-DP ε of random-walk DP-SGD with noise ``sigma`` (module docstring).

    >>> acc = network_dp_epsilon(3.1, parties=2000, steps=20000, delta=1e-6,
    ...                          convention="paper")
    >>> acc.epsilon < 10
    True
    """
    s = check_positive("sigma", sigma)
    n = check_int("parties", parties, 2)
    t = check_int("steps", steps, 1)
    d = check_delta(delta)
    lip = check_positive("lipschitz", lipschitz)
    if convention not in ("union", "paper"):
        raise fail("convention", convention, "'union' or 'paper'")
    if per_step not in ("classic", "analytic"):
        raise fail("per_step", per_step, "'classic' or 'analytic'")
    k = (
        contribution_cap(t, n)
        if contributions is None
        else check_int("contributions", contributions, 1)
    )
    d_tail0 = d if convention == "paper" else d / 4
    k_s = spotted_contributions(k, n, d_tail0)
    d_rdp, d_tail, d_prime, d_step = _deltas(d, k, k_s, convention)
    hidden, alpha = _hidden_epsilon(np.array(s), k, n, lip, d_rdp)
    eps0 = _per_step_epsilon(s, lip, d_step, per_step)
    spotted = _composed(k_s, eps0, d_prime)
    return NetworkDpAccount(
        epsilon=float(hidden) + spotted,
        epsilon_hidden=float(hidden),
        epsilon_spotted=spotted,
        order=float(alpha),
        spotted=k_s,
        contributions=k,
        delta=d,
        delta_total=d_rdp + d_tail + d_prime + k_s * d_step,
        sigma=s,
    )


def _smallest_sigma(eps_of_sigma: object, target: float) -> float:
    """Smallest sigma with ``eps(sigma) <= target`` for a decreasing ``eps`` (verified)."""
    f = eps_of_sigma  # type: ignore[assignment]

    def g(log_s: float) -> float:
        return float(f(math.exp(log_s))) - target  # type: ignore[operator]

    lo, hi = -5.0, 5.0
    while g(lo) <= 0.0:
        lo -= 5.0
        if lo < -700:
            raise fail("epsilon", target, "a value the accounting can exceed")
    while g(hi) > 0.0:
        hi += 5.0
        if hi > 700:
            raise fail("epsilon", target, "a value reachable with finite noise")
    sigma = math.exp(optimize.brentq(g, lo, hi, xtol=1e-13))
    step = sigma * 1e-12
    while float(f(sigma)) > target:  # type: ignore[operator]  # verify, nudge to more noise
        sigma += step
        step *= 2.0
    return sigma


def network_sigma(
    epsilon: float,
    delta: float,
    *,
    parties: int,
    steps: int,
    lipschitz: float = 1.0,
    contributions: int | None = None,
    convention: Convention = "union",
    per_step: PerStep = "classic",
) -> float:
    """Smallest ``sigma`` with :func:`network_dp_epsilon` ``<= epsilon`` (verified).

    Equivalent to the authors' search over the budget split between the hidden and the
    spotted parts, solved exactly (their script steps sigma by 15% and stops the split at a
    5% tolerance, hence its slightly larger values: 3.07 and 27.46 where this gives 3.04
    and 25.89 for n = 2000, T = 20000, δ = 1e-6, ε = 10 and 1, ``convention="paper"``).
    """
    e = check_positive("epsilon", epsilon)

    def eps(s: float) -> float:
        return network_dp_epsilon(
            s,
            parties=parties,
            steps=steps,
            delta=delta,
            lipschitz=lipschitz,
            contributions=contributions,
            convention=convention,
            per_step=per_step,
        ).epsilon

    return _smallest_sigma(eps, e)


def local_sigma(
    epsilon: float,
    delta: float,
    *,
    parties: int,
    steps: int,
    lipschitz: float = 1.0,
    contributions: int | None = None,
    convention: Convention = "union",
    per_step: PerStep = "classic",
) -> float:
    """Smallest ``sigma`` with :func:`local_dp_epsilon` ``<= epsilon`` (local DP baseline).

    >>> round(local_sigma(10.0, 1e-6, parties=2000, steps=20000, convention="paper"), 2)
    14.68
    """
    e = check_positive("epsilon", epsilon)
    k = (
        contribution_cap(steps, parties)
        if contributions is None
        else check_int("contributions", contributions, 1)
    )

    def eps(s: float) -> float:
        return local_dp_epsilon(
            s,
            contributions=k,
            delta=delta,
            lipschitz=lipschitz,
            convention=convention,
            per_step=per_step,
        )[0]

    return _smallest_sigma(eps, e)


def central_sigma(
    epsilon: float, delta: float, *, parties: int, steps: int, lipschitz: float = 1.0
) -> float:
    """Bassily, Smith & Thakurta 2014 (Theorem 2.1) noise for central DP-SGD.

    ``sigma = 16 L sqrt(T ln(2/δ) ln(1.25 T / (δ n))) / (n ε)``.

    >>> round(central_sigma(10.0, 1e-6, parties=2000, steps=20000), 3)
    1.742
    """
    e = check_positive("epsilon", epsilon)
    d = check_delta(delta)
    n = check_int("parties", parties, 2)
    t = check_int("steps", steps, 1)
    lip = check_positive("lipschitz", lipschitz)
    ratio = 1.25 * t / (d * n)
    if ratio <= 1.0:
        raise fail("steps", t, f"steps > 0.8 * delta * parties = {0.8 * d * n:g} (log term > 0)")
    inner = t * math.log(2.0 / d) * math.log(ratio)
    return 16.0 * lip * math.sqrt(inner) / (n * e)


# --------------------------------------------------------------------------- the walk


@dataclass(frozen=True)
class WalkResult:
    """Final and iterate-averaged models of a walk, and how often each party contributed."""

    theta: NDArray[np.float64]
    theta_avg: NDArray[np.float64]
    contributions: NDArray[np.int64]
    path: NDArray[np.int64]


def _logistic_grad(
    theta: NDArray[np.float64], x: NDArray[np.float64], y: NDArray[np.float64]
) -> NDArray[np.float64]:
    # labels in {-1, +1}; gradient of the mean log(1 + exp(-y x.theta)) over the local rows
    margin = y * (x @ theta)
    w = -y * np.exp(-np.logaddexp(0.0, margin))  # -y sigmoid(-margin), stable
    return (w[:, None] * x).mean(axis=0)


def random_walk_sgd(
    features: ArrayLike,
    labels: ArrayLike,
    owner: ArrayLike,
    *,
    steps: int,
    sigma: float,
    clip_norm: float,
    learning_rate: float,
    contributions: int | None,
    after_cap: Literal["noise", "skip"] = "noise",
    weight_decay: float = 0.0,
    rng: np.random.Generator | None = None,
) -> WalkResult:
    """Random-walk DP-SGD for logistic regression on the complete graph (numpy).

    ``owner[i]`` is the party holding row ``i``; labels in ``{0, 1}`` or ``{-1, +1}``. At each
    step the current party clips the gradient of its local logistic loss to ``clip_norm``,
    adds ``N(0, sigma² I)`` and steps; the model then moves to a uniformly random party. A
    party that has made ``contributions`` gradient steps afterwards adds noise only
    (``after_cap="noise"``, needed by the network-DP analysis) or passes the model on
    (``"skip"``, the local-DP baseline); ``contributions=None`` means no cap (central).
    Under replace-one neighbouring one update has sensitivity ``2 * clip_norm``: calibrate
    ``sigma`` with ``lipschitz = 2 * clip_norm``.
    """
    x = np.asarray(features, dtype=np.float64)
    yl = np.asarray(labels, dtype=np.float64)
    own = np.asarray(owner)
    if x.ndim != 2 or yl.shape != (x.shape[0],) or own.shape != (x.shape[0],):
        raise fail("features", x.shape, "(N, d) with labels and owner of shape (N,)")
    if not np.issubdtype(own.dtype, np.integer) or own.min() < 0:
        raise fail("owner", "array", "non-negative integer party indices")
    y = np.where(yl > 0, 1.0, -1.0)
    t = check_int("steps", steps, 1)
    s = check_positive("sigma", sigma)
    c = check_positive("clip_norm", clip_norm)
    lr = check_positive("learning_rate", learning_rate)
    wd = check_nonnegative("weight_decay", weight_decay)
    cap = None if contributions is None else check_int("contributions", contributions, 1)
    if after_cap not in ("noise", "skip"):
        raise fail("after_cap", after_cap, "'noise' or 'skip'")
    n = int(own.max()) + 1
    order = np.argsort(own, kind="stable")
    starts = np.searchsorted(own[order], np.arange(n + 1))
    src = get_source(rng)
    path = src.integers_below(np.full(t, n, dtype=np.int64)).astype(np.int64)
    noise = gaussian_noise(s, (t, x.shape[1]), rng)
    theta = np.zeros(x.shape[1])
    total = np.zeros(x.shape[1])
    count = np.zeros(n, dtype=np.int64)
    for step in range(t):  # the walk is sequential by nature
        v = int(path[step])
        if cap is None or count[v] < cap:
            rows = order[starts[v] : starts[v + 1]]
            g = _logistic_grad(theta, x[rows], y[rows]) if rows.size else np.zeros_like(theta)
            norm = float(np.linalg.norm(g))
            if norm > c:
                g = g * (c / norm)
            theta = theta - lr * (g + wd * theta + noise[step])
            count[v] += 1
        elif after_cap == "noise":
            theta = theta - lr * (wd * theta + noise[step])
        else:
            theta = theta - lr * wd * theta
        total += theta
    return WalkResult(theta=theta, theta_avg=total / t, contributions=count, path=path)


def random_walk_sgd_parallel(
    features: ArrayLike,
    labels: ArrayLike,
    *,
    runs: int,
    steps: int,
    sigma: float,
    clip_norm: float,
    learning_rate: float,
    contributions: int | None,
    after_cap: Literal["noise", "skip"] = "noise",
    rng: np.random.Generator | None = None,
) -> NDArray[np.float64]:
    """``runs`` independent walks at once when every party holds exactly one row.

    Same algorithm as :func:`random_walk_sgd` (row ``i`` is party ``i``), vectorised over the
    runs; returns the final models, shape ``(runs, d)``. With ``runs=1`` and the same ``rng``
    state it reproduces :func:`random_walk_sgd` exactly.
    """
    x = np.asarray(features, dtype=np.float64)
    yl = np.asarray(labels, dtype=np.float64)
    if x.ndim != 2 or yl.shape != (x.shape[0],):
        raise fail("features", x.shape, "(n, d) with labels of shape (n,)")
    y = np.where(yl > 0, 1.0, -1.0)
    r = check_int("runs", runs, 1)
    t = check_int("steps", steps, 1)
    s = check_positive("sigma", sigma)
    c = check_positive("clip_norm", clip_norm)
    lr = check_positive("learning_rate", learning_rate)
    cap = None if contributions is None else check_int("contributions", contributions, 1)
    if after_cap not in ("noise", "skip"):
        raise fail("after_cap", after_cap, "'noise' or 'skip'")
    n, d = x.shape
    src = get_source(rng)
    paths = np.empty((r, t), dtype=np.int64)
    noise = np.empty((r, t, d))
    for i in range(r):  # draw in the same order as r sequential calls of random_walk_sgd
        paths[i] = src.integers_below(np.full(t, n, dtype=np.int64))
        noise[i] = gaussian_noise(s, (t, d), rng)
    theta = np.zeros((r, d))
    count = np.zeros((r, n), dtype=np.int64)
    rows = np.arange(r)
    for step in range(t):  # sequential in the steps, vectorised over the runs
        v = paths[:, step]
        active = np.ones(r, dtype=bool) if cap is None else count[rows, v] < cap
        xv, yv = x[v], y[v]
        margin = yv * np.einsum("rd,rd->r", xv, theta)
        g = (-yv * np.exp(-np.logaddexp(0.0, margin)))[:, None] * xv
        norm = np.linalg.norm(g, axis=1, keepdims=True)
        g = np.where(norm > c, g * (c / np.maximum(norm, c)), g)
        upd = np.where(active[:, None], g + noise[:, step], 0.0)
        if after_cap == "noise":
            upd = np.where(active[:, None], upd, noise[:, step])
        theta = theta - lr * upd
        count[rows, v] += active
    return theta


BREAST_CANCER_FEATURES = ("worst radius", "worst texture", "worst concave points")
"""Features of the real task, fixed in advance (clinical size, texture and shape)."""


def walk_experiment(
    epsilons: ArrayLike = (1.0, 3.0, 10.0),
    *,
    delta: float = 1e-6,
    steps_per_party: int = 10,
    learning_rate: float = 0.001,
    runs: int = 100,
    modes: tuple[str, ...] = ("local", "network", "central"),
    convention: Convention = "union",
    rng: np.random.Generator | None = None,
) -> dict[str, object]:
    """Test accuracy vs ε of local, network and central random-walk DP-SGD on a real task.

    Task: scikit-learn's bundled Wisconsin breast-cancer data (569 patients), malignant vs
    benign, from :data:`BREAST_CANCER_FEATURES` plus an intercept; 80% of the patients are
    the parties (one record each), 20% are held out. Standardisation uses the training
    statistics, treated as public (a demonstration, not part of the guarantee). Rows are
    scaled to L2 norm 1/2, so every logistic gradient has norm <= 1/2 and clipping at 1/2 is
    a no-op that keeps each step a contraction; the replace-one sensitivity of a step is
    ``L = 1``. For each ε the three noise levels are calibrated at ``L = 1`` and ``runs``
    walks of ``steps_per_party * n`` steps are averaged (accuracy of the final model). The
    small default learning rate keeps the model in the near-linear regime of the logistic
    loss, where the accumulated gradient signal is not damped while the noise keeps adding.
    Needs scikit-learn.
    """
    from sklearn.datasets import load_breast_cancer

    eps_arr = np.atleast_1d(np.asarray(epsilons, dtype=np.float64))
    for e in eps_arr.tolist():
        check_positive("epsilons", e)
    check_delta(delta)
    spp = check_int("steps_per_party", steps_per_party, 1)
    r = check_int("runs", runs, 1)
    for m in modes:
        if m not in ("local", "network", "central"):
            raise fail("modes", m, "a subset of ('local', 'network', 'central')")
    data = load_breast_cancer()
    cols = [list(data.feature_names).index(f) for f in BREAST_CANCER_FEATURES]
    x = data.data[:, cols].astype(np.float64)
    y = data.target.astype(np.float64)
    src = get_source(rng)
    perm = np.argsort(src.words(x.shape[0]).astype(np.float64), kind="stable")
    n = int(0.8 * x.shape[0])
    tr, te = perm[:n], perm[n:]
    x = (x - x[tr].mean(axis=0)) / x[tr].std(axis=0)
    x = np.hstack([x, np.ones((x.shape[0], 1))])
    x = 0.5 * x / np.linalg.norm(x, axis=1, keepdims=True)
    steps = spp * n
    k = contribution_cap(steps, n)
    calibrate = {
        "local": lambda e: local_sigma(e, delta, parties=n, steps=steps, convention=convention),
        "network": lambda e: network_sigma(e, delta, parties=n, steps=steps, convention=convention),
        "central": lambda e: central_sigma(e, delta, parties=n, steps=steps),
    }
    acc: dict[str, list[float]] = {m: [] for m in modes}
    sig: dict[str, list[float]] = {m: [] for m in modes}
    for e in eps_arr.tolist():
        for mode in modes:
            s = calibrate[mode](e)
            thetas = random_walk_sgd_parallel(
                x[tr],
                y[tr],
                runs=r,
                steps=steps,
                sigma=s,
                clip_norm=0.5,
                learning_rate=learning_rate,
                contributions=None if mode == "central" else k,
                after_cap="skip" if mode == "local" else "noise",
                rng=rng,
            )
            scores = np.mean(((x[te] @ thetas.T) > 0) == (y[te] > 0)[:, None], axis=0)
            acc[mode].append(float(np.mean(scores)))
            sig[mode].append(s)
    return {
        "task": "breast_cancer",
        "epsilons": eps_arr.tolist(),
        "delta": float(delta),
        "parties": n,
        "steps": steps,
        "contributions": k,
        "runs": r,
        "convention": convention,
        "accuracy": acc,
        "sigma": sig,
    }
