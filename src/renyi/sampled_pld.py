"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.sampled_pld`."""

from renyi.analysis.sampled_pld import *  # noqa: F403
from renyi.analysis.sampled_pld import __all__ as __all__
