"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.closed_forms`."""

from renyi.analysis.closed_forms import *  # noqa: F403
from renyi.analysis.closed_forms import __all__ as __all__
