"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.composition`."""

from renyi.analysis.composition import *  # noqa: F403
from renyi.analysis.composition import __all__ as __all__
