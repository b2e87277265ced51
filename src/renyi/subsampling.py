"""Import path kept for compatibility: the code lives in :mod:`renyi.analysis.subsampling`."""

from renyi.analysis.subsampling import *  # noqa: F403
from renyi.analysis.subsampling import __all__ as __all__
