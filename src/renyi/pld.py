"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.pld`."""

from renyi.analysis.pld import *  # noqa: F403
from renyi.analysis.pld import __all__ as __all__
