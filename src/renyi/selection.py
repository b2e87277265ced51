"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.selection`."""

from renyi.analysis.selection import *  # noqa: F403
from renyi.analysis.selection import __all__ as __all__
