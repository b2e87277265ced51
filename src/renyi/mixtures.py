"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.mixtures`."""

from renyi.analysis.mixtures import *  # noqa: F403
from renyi.analysis.mixtures import __all__ as __all__
