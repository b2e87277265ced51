"""Figures of audits: the attack's ROC curve against the DP trade-off curve of the claim.

matplotlib is imported inside the function (optional extra ``plot``); figures are built with
``matplotlib.figure.Figure`` directly (no pyplot state) and written to ``path``.

Example:
    >>> import numpy as np, tempfile, os
    >>> from renyi.audit.blackbox import audit_samples
    >>> rng = np.random.default_rng(0)
    >>> r = audit_samples(rng.laplace(0, 1, 4000), 1 + rng.laplace(0, 1, 4000), claimed_epsilon=1.0)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     os.path.exists(plot_roc(r, os.path.join(d, "roc.png")))
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from renyi._validation import fail
from renyi.audit.blackbox import AuditResult
from renyi.audit.stats import tradeoff_curve

__all__ = ["plot_roc", "plot_tradeoff"]


def plot_roc(
    result: AuditResult,
    path: str | os.PathLike[str],
    *,
    claimed_epsilon: float | None = None,
    log_scale: bool = True,
    title: str | None = None,
) -> Path:
    """Plot each attack's held-out ROC curve and the claim's DP trade-off region.

    The claim ``(epsilon, delta)`` (``claimed_epsilon`` or ``result.claimed_epsilon``, at
    ``result.delta``) allows true-positive rates up to ``1 - f(FPR)`` where ``f`` is
    :func:`~renyi.audit.stats.tradeoff_curve` (Kairouz, Oh & Viswanath 2015, Thm. 2.1): an ROC
    point above that line (beyond sampling error) contradicts the claim. Also marks the
    curve of the audited lower bound. Returns the written path.
    """
    if not isinstance(result, AuditResult):
        raise fail("result", type(result).__name__, "an AuditResult")
    claim = claimed_epsilon if claimed_epsilon is not None else result.claimed_epsilon
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("plot_roc needs matplotlib: pip install 'renyi[plot]'") from exc
    fig: Any = Figure(figsize=(6.0, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    lo = 1.0 / (2.0 * max(result.trials, 1))
    grid = np.concatenate([[0.0], np.geomspace(lo / 10, 1.0, 400)])
    if claim is not None:
        bound = 1.0 - tradeoff_curve(claim, result.delta, grid)
        ax.plot(grid, bound, color="black", lw=2, label=f"claim ({claim:.3g}, {result.delta:g})-DP")
    lb = result.epsilon_lower
    if np.isfinite(lb):
        lb_curve = 1.0 - tradeoff_curve(lb, result.delta, grid)
        ax.plot(grid, lb_curve, color="tab:red", ls="--", label=f"audited lower bound eps={lb:.3g}")
    for a in result.attacks:
        ax.plot(a.roc_fpr, a.roc_tpr, lw=1.2, label=f"{a.attack} (eps >= {a.epsilon:.3g})")
    ax.plot(grid, grid, color="grey", lw=0.8, ls=":", label="chance")
    if log_scale:
        ax.set_xscale("log")
        ax.set_xlim(lo / 10, 1.0)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    verdict = "" if result.passed is None else (" — PASS" if result.passed else " — FAIL")
    ax.set_title(title or f"attack ROC vs DP trade-off curve{verdict}")
    ax.legend(loc="lower right", fontsize=8)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    return out


def plot_tradeoff(result: Any, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """One figure: the attack's ROC against the claim's trade-off curve (item 5 of issue 27).

    For a :class:`~renyi.audit.training.TrainingAuditResult`: the empirical ROC of the
    canaries' scores (one run) or every attack's held-out ROC (independent releases); the
    claimed curve (TPR upper bounds from :func:`renyi.tradeoff.tradeoff_curve` of the run's
    accountant when the result carries it, else the ``(ε, δ)`` region of the claim); and,
    for one run, the Gaussian curve of the largest μ the guesses refute. A one-run ROC above
    the claimed curve is a hint, not a proof (the proof is the bound, which accounts for
    sampling); the figure shows where the attack stands. Returns the written path.
    """
    from renyi.audit.training import TrainingAuditResult
    from renyi.tradeoff import gaussian_tradeoff_tpr

    if not isinstance(result, TrainingAuditResult):
        raise fail("result", type(result).__name__, "a TrainingAuditResult")
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("plot_tradeoff needs matplotlib: pip install 'renyi[plot]'") from exc
    fig: Any = Figure(figsize=(6.0, 5.0))
    ax = fig.add_subplot(1, 1, 1)
    grid = np.geomspace(1e-5, 1.0, 400)
    if result.claim_curve is not None:
        cf, ct = result.claim_curve
        ax.plot(cf, ct, color="black", lw=2, label="claimed trade-off (TPR bound)")
    else:
        bound = 1.0 - tradeoff_curve(result.epsilon_claimed, result.delta, grid)
        ax.plot(
            grid,
            bound,
            color="black",
            lw=2,
            label=f"claim ({result.epsilon_claimed:.3g}, {result.delta:g})-DP",
        )
    if result.roc is not None:
        f, t = result.roc
        ax.step(f, t, where="post", color="tab:blue", lw=1.2, label="canary scores (ROC)")
    if result.audit is not None:
        for a in result.audit.attacks:
            ax.plot(a.roc_fpr, a.roc_tpr, lw=1.0, label=f"{a.attack} (eps >= {a.epsilon:.3g})")
    if result.mu_lower_bound:
        mu = result.mu_lower_bound
        ax.plot(
            grid,
            gaussian_tradeoff_tpr(mu, grid),
            color="tab:red",
            ls="--",
            label=f"refuted: {mu:.3g}-GDP (eps {result.epsilon_gdp or 0:.3g})",
        )
    ax.plot(grid, grid, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xscale("log")
    ax.set_xlim(1e-5, 1.0)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    verdict = "PASS" if result.passed else "FAIL"
    ax.set_title(
        title
        or f"eps >= {result.epsilon_lower_bound:.3g} vs claimed {result.epsilon_claimed:.3g}: "
        f"{verdict}"
    )
    ax.legend(loc="upper left", fontsize=7)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    return out
