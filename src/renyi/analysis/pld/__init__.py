"""Privacy loss distributions (PLDs): tight numerical accounting with rigorous error bars.

For a pair of output distributions ``(P, Q)`` of a mechanism on neighbouring datasets the
*privacy loss* is ``L = log(P(x) / Q(x))`` with ``x ~ P`` (``L = +inf`` where ``Q(x) = 0``).
The mechanism's privacy profile is the hockey-stick divergence

    delta(eps) = E[(1 - exp(eps - L))_+] + P[L = +inf]

(Koskela, Jälkö & Honkela 2020, Eq. (5); Gopi, Lee & Wutschitz 2021, Prop. 2.9), and the
privacy loss of a composition is the sum of the independent losses, so composing means
convolving PLDs (Sommer, Meiser & Mohammadi 2019, Thm. 1; Koskela et al. 2020, Sec. 3).

This module stores a PLD on the uniform grid ``{k h}`` (``h`` is the *value discretisation
interval*) twice:

* the **pessimistic** side rounds every loss *up* to the grid and moves truncated tails to
  ``+inf``; it stochastically dominates the true PLD, so its ``delta(eps)`` is an upper bound
  for every ``eps`` and stays one under composition (Meiser & Mohammadi 2018, Thm. 5;
  Doroshenko et al. 2022, Sec. 3);
* the **optimistic** side rounds losses *down* and deletes truncated mass; its ``delta(eps)``
  is a lower bound.

Bin masses of continuous mechanisms are exact CDF differences of the output distribution
(the loss is monotone in the output), computed in log space and widened by a bound on the
library's round-off, so the bounds are rigorous rather than "close". Composition uses the FFT
on an *exponentially tilted* copy of the masses (``p_i exp(lam L_i)``, which commutes with
convolution): the FFT's round-off then stays relative to the Chernoff bound
``exp(-lam eps) E[exp(lam L)]`` at the ``eps`` of interest instead of to the largest mass,
which is what keeps ``delta = 1e-12`` meaningful after ``10^6`` steps. Every numerical error
(FFT round-off, cyclic aliasing, the base masses' own errors) is tracked as a bound on the
weighted norm ``sum_i |e_i| exp(lam L_i)`` and added to (upper) or subtracted from (lower)
every ``delta`` reported; tails outside the FFT window are bounded by Chernoff's inequality
and charged to ``+inf``. The true ``delta(eps)`` therefore always lies in the reported
``[lower, upper]``.

Neighbouring relation: a PLD describes one ordered pair ``(P, Q)``. For add/remove-one
neighbours of a subsampled mechanism the two orders differ; build both (``direction="remove"``
and ``"add"``), compose each, and report the larger ``delta``/``epsilon`` (what
:class:`renyi.accountants.PldAccountant` does).

Example
-------
>>> pld = PrivacyLossDistribution.gaussian(1.0).self_compose(10)
>>> lo, est, hi = pld.delta_for_epsilon(1.0)
>>> lo <= est <= hi
True
"""

from renyi.analysis.pld._errors import PldGridError
from renyi.analysis.pld._numerics import DEFAULT_MAX_BINS, Direction
from renyi.analysis.pld.distribution import PldBounds, PrivacyLossDistribution

__all__ = ["DEFAULT_MAX_BINS", "Direction", "PldBounds", "PldGridError", "PrivacyLossDistribution"]
