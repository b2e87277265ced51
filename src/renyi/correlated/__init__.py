"""Correlated-noise private training: the matrix factorization mechanism (numpy/scipy only).

DP-SGD adds independent noise at every step; the matrix factorization mechanism adds noise
correlated across steps so that it cancels in the running sums the model depends on
(DP-FTRL / tree aggregation, Kairouz et al. 2021; banded and multi-epoch matrix
factorization, Choquette-Choo et al. 2023; BLTs, Dvijotham et al. 2024; McKenna 2024).

* :mod:`~renyi.correlated.workload` — the workload ``A`` (prefix sums, momentum, schedules);
* :mod:`~renyi.correlated.strategies` — strategy matrices ``C`` and their errors;
* :mod:`~renyi.correlated.sensitivity` — sensitivity under participation patterns;
* :mod:`~renyi.correlated.optimize` — strategy coefficients for given T and pattern;
* :mod:`~renyi.correlated.streaming` — the noise ``C⁻¹ z`` step by step, bounded memory;
* :mod:`~renyi.correlated.exactness` — the exact rows of ``C⁻¹`` and a proven bound on the
  streaming noise's rounding error (exact lattice releases);
* :mod:`~renyi.correlated.accounting` — the event each strategy and pattern costs, and σ
  calibrated for a target (ε, δ).

The PyTorch training path is :mod:`renyi.dpsgd.correlated`.
"""
