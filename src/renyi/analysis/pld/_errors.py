"""Errors of the PLD package: a loss that does not fit the grid."""

from __future__ import annotations

import math
from typing import Any

from renyi.errors import PrivacyParameterError


class PldGridError(PrivacyParameterError):
    """The privacy loss does not fit a grid of at most 2**22 points at the requested
    ``value_discretization_interval`` (or not in floating point at all).

    ``needed`` is the smallest interval that fits (``inf`` if none does): callers that may
    choose the grid (e.g. :class:`renyi.accountants.PldAccountant`) retry with it.
    """

    def __init__(self, message: str, needed: float) -> None:
        super().__init__(message)
        self.needed = needed


def _grid_error(name: str, value: Any, needed: float, what: str) -> PldGridError:
    if math.isfinite(needed):
        expected = f"a value >= {needed:.3g} for {what}"
    else:
        expected = f"{what} whose privacy loss fits in floating point (use the RDP accountant)"
    return PldGridError(f"{name}={value!r} is invalid: expected {expected}", needed)


class _NumericGuard:
    """Turns an arithmetic failure (overflow, division by zero) at an extreme parameter
    into our error naming that parameter, instead of a raw traceback."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None and issubclass(kind, OverflowError | ZeroDivisionError | MemoryError):
            raise _grid_error(self.name, self.value, math.inf, "a value") from exc
