"""The analysis core: what a mechanism costs, as numbers with proofs behind them.

Read in this order (each module imports only those above it):

* :mod:`~renyi.analysis.divergence` — Rényi divergences of distributions.
* :mod:`~renyi.analysis.closed_forms` — closed-form curves of the basic mechanisms.
* :mod:`~renyi.analysis.curves` — guarantees as values (RDP curve, zCDP, pure and approximate DP).
* :mod:`~renyi.analysis.conversions`, :mod:`~renyi.analysis.composition` — converting and
  composing guarantees.
* :mod:`~renyi.analysis.subsampling`, :mod:`~renyi.analysis.mixtures`,
  :mod:`~renyi.analysis.allocation`, :mod:`~renyi.analysis.selection` — amplification by
  sampling, mixtures, random allocation and private selection.
* :mod:`~renyi.analysis.pld`, :mod:`~renyi.analysis.sampled_pld`,
  :mod:`~renyi.analysis.allocation_pld` — privacy loss
  distributions with rigorous error bars.
* :mod:`~renyi.analysis.events` — events (what ran), each owning its analyses (RDP curve,
  zCDP ρ, PLD pair, (ε, δ) profile).

Above this package: :mod:`renyi.accountants` (compose events, answer ε or δ),
:mod:`renyi.calibration` (choose σ, steps or rate), :mod:`renyi.budget` and
:mod:`renyi.ledger` (refuse what does not fit, record what ran). The old flat paths
(``renyi.events``, ``renyi.pld``, …) re-export the public names.
"""
