"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.curves`."""

from renyi.analysis.curves import *  # noqa: F403
from renyi.analysis.curves import __all__ as __all__
