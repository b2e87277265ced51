"""Matplotlib figures of renyi's comparisons (optional extra ``plot``).

matplotlib is imported inside each function, so ``import renyi.plots`` works without it; a
call without it raises :class:`ImportError` saying how to install it. Figures are written to
``path`` (format from the extension, e.g. ``.png``, ``.pdf``, ``.svg``) and the path is
returned. The figures are built with ``matplotlib.figure.Figure`` directly, so no pyplot
state or GUI backend is involved (safe on servers and inside notebooks).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from renyi._validation import fail
from renyi.analysis.composition import GaussianCompositionComparison, NoiseComparison

__all__ = ["plot_composition_comparison", "plot_noise_vs_queries", "plot_tradeoff"]

_STYLES: dict[str, dict[str, Any]] = {
    "book_advanced": {"color": "tab:red", "linestyle": "--"},
    "advanced": {"color": "tab:red"},
    "zcdp_bun_steinke": {"color": "tab:orange", "linestyle": "--"},
    "zcdp_optimal": {"color": "tab:orange"},
    "rdp_fixed_order": {"color": "tab:green", "linestyle": "--"},
    "rdp_optimal": {"color": "tab:green"},
    "exact": {"color": "black", "linewidth": 2.0},
    "laplace_sequential": {"color": "tab:blue", "linewidth": 3.0, "alpha": 0.6},
    "laplace_vectorised": {"color": "tab:orange", "linestyle": "--"},
    "gaussian_advanced": {"color": "tab:red"},
    "gaussian_vectorised": {"color": "tab:blue", "linestyle": "--"},
    "gaussian_zcdp": {"color": "tab:orange"},
    "gaussian_rdp": {"color": "tab:green", "linestyle": ":"},
    "gaussian_exact": {"color": "black", "linewidth": 2.0},
}


def _figure(**kwargs: Any) -> Any:
    """A matplotlib Figure not attached to pyplot (no backend or global state touched)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "renyi.plots needs matplotlib: pip install 'renyi[plot]' (or pip install matplotlib)"
        ) from exc
    return Figure(**kwargs)


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    return out


def plot_composition_comparison(
    result: GaussianCompositionComparison, path: str | os.PathLike[str], *, log_scale: bool = True
) -> Path:
    """Plot epsilon vs number of Gaussian releases for every method of the comparison.

    The figure of the "Variants of Differential Privacy" book chapter (advanced composition,
    zCDP, RDP at a fixed order) plus rigorous advanced composition, optimal conversions and the
    exact epsilon (analytic Gaussian, the ground truth). ``log_scale`` puts epsilon on a
    logarithmic axis, which keeps the tight methods distinguishable next to advanced
    composition.

    Example:
        >>> from renyi.analysis.composition import compare_gaussian_composition
        >>> r = compare_gaussian_composition(200.0, 1e-5, 50)
        >>> import tempfile, os
        >>> p = plot_composition_comparison(r, os.path.join(tempfile.mkdtemp(), "c.png"))
        >>> p.exists()
        True
    """
    if not isinstance(result, GaussianCompositionComparison):
        raise fail("result", result, "a GaussianCompositionComparison")
    fig = _figure(figsize=(8, 5))
    ax = fig.subplots()
    for name, label in result.METHODS:
        if name == "rdp_fixed_order":
            label = f"{label[:-1]} α={result.order:g})"
        ax.plot(result.k, getattr(result, name), label=label, **_STYLES.get(name, {}))
    ax.set_xlabel("Number of Gaussian releases k")
    ax.set_ylabel(f"ε at δ = {result.delta:g}")
    ax.set_title(f"Composition of the Gaussian mechanism (σ = {result.sigma:g}, sensitivity 1)")
    if log_scale:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_noise_vs_queries(
    result: NoiseComparison, path: str | os.PathLike[str], *, log_scale: bool = True
) -> Path:
    """Plot the noise needed for k queries: sequential vs vectorised (two panels).

    Left: Laplace noise scale under pure DP (sequential composition and the vectorised query
    coincide). Right: Gaussian noise variance under ``(epsilon, delta)``-DP: advanced
    composition (the book's split), the vectorised query (classic Gaussian), sequential
    composition in zCDP or RDP, and the exact analytic-Gaussian calibration.

    Example:
        >>> from renyi.analysis.composition import vectorised_vs_sequential_noise
        >>> r = vectorised_vs_sequential_noise(20, 0.1, 1e-5)
        >>> import tempfile, os
        >>> p = plot_noise_vs_queries(r, os.path.join(tempfile.mkdtemp(), "n.png"))
        >>> p.exists()
        True
    """
    if not isinstance(result, NoiseComparison):
        raise fail("result", result, "a NoiseComparison")
    fig = _figure(figsize=(11, 4.5))
    left, right = fig.subplots(1, 2)
    for name, label in result.LAPLACE:
        left.plot(result.k, getattr(result, name), label=label, **_STYLES.get(name, {}))
    left.set_title(f"Laplace mechanism, total ε = {result.epsilon:g}")
    left.set_xlabel("Number of queries k")
    left.set_ylabel("Noise scale b per query")
    for name, label in result.GAUSSIAN:
        right.plot(result.k, getattr(result, name), label=label, **_STYLES.get(name, {}))
    right.set_title(f"Gaussian mechanism, total (ε, δ) = ({result.epsilon:g}, {result.delta:g})")
    right.set_xlabel("Number of queries k")
    right.set_ylabel("Noise variance σ² per query")
    if log_scale:
        right.set_yscale("log")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("Vectorised vs sequential composition")
    return _save(fig, path)


def plot_tradeoff(
    curves: Any, path: str | os.PathLike[str], *, gaussian_mu: float | None = None, title: str = ""
) -> Path:
    """Membership-inference trade-off: TPR upper bound against FPR (log-log), one line per
    :class:`renyi.tradeoff.TradeoffCurve`, with the μ-GDP curve and the diagonal for
    reference."""
    import numpy as np

    fig = _figure(figsize=(5.5, 4.5))
    ax = fig.subplots()
    for c in curves:
        ax.plot(c.fpr, c.tpr, label=f"{c.accountant}: TPR upper bound")
    fpr = np.geomspace(1e-6, 1.0, 200)
    if gaussian_mu is not None and np.isfinite(gaussian_mu):
        from renyi.tradeoff import gaussian_tradeoff_tpr

        ax.plot(fpr, gaussian_tradeoff_tpr(gaussian_mu, fpr), ":", label=f"{gaussian_mu:.3g}-GDP")
    ax.plot(fpr, fpr, "k--", lw=0.8, label="random guess")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate (any attack, at most)")
    ax.set_title(title or "membership inference trade-off")
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)
