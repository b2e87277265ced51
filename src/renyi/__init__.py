"""renyi: differential privacy built around Rényi differential privacy.

The layers, lowest first (each importable on its own; see docs/architecture.md):

* :mod:`renyi.analysis` — the analysis core: event → curve / PLD (divergences, closed
  forms, guarantees as values, conversions, composition, amplification by sampling,
  privacy loss distributions, events that own their analyses).
* :mod:`renyi.accountants`, :mod:`renyi.calibration` — accountants that compose events.
* :mod:`renyi.budget`, :mod:`renyi.ledger` — budgets that refuse, and a durable record.
* :mod:`renyi.mechanisms`, :mod:`renyi.noise` — secure, lattice-safe noise for releases.
* :mod:`renyi.dpsgd` (needs PyTorch), :mod:`renyi.correlated`, :mod:`renyi.federated`,
  :mod:`renyi.audit`.
"""

from renyi.accountants import (
    ApproxDpAccountant,
    PldAccountant,
    RdpAccountant,
    ZcdpAccountant,
)
from renyi.accountants import epsilon_report as epsilon
from renyi.analysis.closed_forms import (
    gaussian_delta,
    gaussian_epsilon,
    gaussian_log_delta,
    gaussian_mu,
    gaussian_rdp,
    laplace_rdp,
    randomized_response_rdp,
)
from renyi.analysis.curves import (
    DEFAULT_ORDERS,
    ApproxDp,
    DpConversion,
    PureDp,
    RdpCurve,
    Zcdp,
    post_process,
)
from renyi.analysis.divergence import (
    gaussian_divergence,
    laplace_divergence,
    numerical_renyi_divergence,
    renyi_divergence,
)
from renyi.analysis.pld import PldBounds, PrivacyLossDistribution
from renyi.analysis.subsampling import (
    amplify_approx_dp_poisson,
    amplify_approx_dp_without_replacement,
    poisson_subsampled_gaussian_rdp,
    poisson_subsampled_rdp,
    sampled_without_replacement_gaussian_rdp,
)
from renyi.errors import (
    BudgetExceededError,
    EmptyAccountantError,
    InsecureRandomnessWarning,
    OrderAtGridEdgeWarning,
    PrivacyParameterError,
    RenyiError,
    RenyiWarning,
    UnsupportedEventError,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ORDERS",
    "ApproxDp",
    "ApproxDpAccountant",
    "BudgetExceededError",
    "DpConversion",
    "EmptyAccountantError",
    "InsecureRandomnessWarning",
    "OrderAtGridEdgeWarning",
    "PldAccountant",
    "PldBounds",
    "PrivacyLossDistribution",
    "PrivacyParameterError",
    "PureDp",
    "RdpAccountant",
    "RdpCurve",
    "RenyiError",
    "RenyiWarning",
    "UnsupportedEventError",
    "Zcdp",
    "ZcdpAccountant",
    "__version__",
    "amplify_approx_dp_poisson",
    "amplify_approx_dp_without_replacement",
    "epsilon",
    "gaussian_delta",
    "gaussian_divergence",
    "gaussian_epsilon",
    "gaussian_log_delta",
    "gaussian_mu",
    "gaussian_rdp",
    "laplace_divergence",
    "laplace_rdp",
    "numerical_renyi_divergence",
    "poisson_subsampled_gaussian_rdp",
    "poisson_subsampled_rdp",
    "post_process",
    "randomized_response_rdp",
    "renyi_divergence",
    "sampled_without_replacement_gaussian_rdp",
]
