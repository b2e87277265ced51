"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.events`."""

from renyi.analysis.events import *  # noqa: F403
from renyi.analysis.events import __all__ as __all__
