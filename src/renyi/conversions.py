"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.conversions`."""

from renyi.analysis.conversions import *  # noqa: F403
from renyi.analysis.conversions import __all__ as __all__
