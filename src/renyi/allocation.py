"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.allocation`."""

from renyi.analysis.allocation import *  # noqa: F403
from renyi.analysis.allocation import __all__ as __all__
