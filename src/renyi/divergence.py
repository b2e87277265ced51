"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.divergence`."""

from renyi.analysis.divergence import *  # noqa: F403
from renyi.analysis.divergence import __all__ as __all__
