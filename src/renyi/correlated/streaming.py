"""Correlated noise ``R z`` one step at a time, with memory bounded by the strategy, not by T.

Step ``t`` of training adds row ``t`` of ``R Z`` (``R C = I``, see
:mod:`renyi.correlated.strategies`), where each row of ``Z`` is a fresh standard normal vector
over all parameters. The generators here take that fresh vector ``z_t`` (from the caller's
noise source: the secure source in training) and return ``y_t = (R Z)_t`` without ever
forming a T × T matrix:

* banded Toeplitz, b bands: ``y_t = z_t − Σ_{m<b} c_m y_{t−m}`` — the last ``b − 1`` outputs;
* BLT with d buffers: ``y_t = z_t − Σ_i ω_i S_i``, then ``S_i ← θ_i S_i + y_t`` — d buffers;
* tree (square, online): ``y_n = z_n − Σ_{l < lowbit level of n} node_l`` — one per level;
* banded inverse (``C⁻¹`` with b bands,
  :class:`~renyi.correlated.strategies.BandedInverseStrategy`): ``y_t = Σ_{j<b} r_j z_{t−j}``
  — the last ``b − 1`` fresh vectors, or **none** when the
  caller can regenerate ``z_s`` from a counter (``regenerate=``, e.g.
  :meth:`renyi.noise.CounterNoise.standard_normal` at ``step=s``): the same arithmetic in
  the same order, so bit-identical outputs with O(1) vectors of state;
* identity (DP-SGD): ``y_t = z_t``, returned as is (no copy, no arithmetic: bit for bit).

They work on numpy arrays and torch tensors alike (only ``+``, ``*``, ``copy``/``clone``), so
this module does not import torch. :mod:`renyi.correlated.exactness` bounds the rounding error
of this arithmetic (in float64) and gives the exact rows of ``R``: change the arithmetic here
and the bound there together. Their state (:meth:`StreamingNoise.state_dict`) is what
a checkpoint must carry for resume to continue the same noise sequence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from renyi._validation import check_int, fail
from renyi.correlated.strategies import (
    BandedInverseStrategy,
    BandedToeplitzStrategy,
    BltStrategy,
    Strategy,
    TreeStrategy,
)

__all__ = ["StreamingNoise", "streaming_noise"]


def _copy(x: Any) -> Any:
    return x.clone() if hasattr(x, "clone") else x.copy()


def _axpy(y: Any, a: float, x: Any) -> None:
    """In place: ``y += a·x`` (torch: one fused ``add_``; numpy: ``+=``)."""
    if hasattr(y, "add_"):
        y.add_(x, alpha=a)
    else:
        y += a * x


class StreamingNoise(ABC):
    """Stateful generator of the rows of ``R Z``: call :meth:`next` once per step."""

    def __init__(self) -> None:
        self.step = 0

    @abstractmethod
    def _next(self, z: Any) -> Any: ...

    def next(self, z: Any) -> Any:
        """``y_t`` for this step from the fresh standard normal ``z_t`` (may reuse ``z``)."""
        y = self._next(z)
        self.step += 1
        return y

    @property
    @abstractmethod
    def buffers(self) -> int:
        """Vectors of the size of ``z`` kept between steps."""

    def _state(self) -> list[Any]:
        return []

    def _load(self, vectors: list[Any]) -> None:
        if vectors:
            raise fail("state['vectors']", len(vectors), "no vectors (this noise is stateless)")

    def state_dict(self) -> dict[str, Any]:
        """Step counter and the kept vectors (copies), for an exact resume."""
        return {"step": self.step, "vectors": [_copy(v) for v in self._state()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of a generator of the same strategy."""
        step = check_int("state['step']", state.get("step"), 0)
        self._load([_copy(v) for v in state.get("vectors", [])])
        self.step = step


class _Identity(StreamingNoise):
    def _next(self, z: Any) -> Any:
        return z

    @property
    def buffers(self) -> int:
        return 0


class _Banded(StreamingNoise):
    def __init__(self, coefs: tuple[float, ...]) -> None:
        super().__init__()
        self.coefs = coefs
        self.history: deque[Any] = deque(maxlen=len(coefs) - 1)  # newest first

    def _next(self, z: Any) -> Any:
        y = z
        for m, prev in enumerate(self.history, start=1):
            _axpy(y, -self.coefs[m], prev)
        self.history.appendleft(_copy(y))
        return y

    @property
    def buffers(self) -> int:
        return len(self.coefs) - 1

    def _state(self) -> list[Any]:
        return list(self.history)

    def _load(self, vectors: list[Any]) -> None:
        if len(vectors) > len(self.coefs) - 1:
            raise fail("state['vectors']", len(vectors), f"at most {len(self.coefs) - 1}")
        self.history = deque(vectors, maxlen=len(self.coefs) - 1)


class _Blt(StreamingNoise):
    def __init__(self, thetas: tuple[float, ...], omegas: tuple[float, ...]) -> None:
        super().__init__()
        self.thetas = thetas
        self.omegas = omegas
        self.sums: list[Any] = []

    def _next(self, z: Any) -> Any:
        y = z
        for om, s in zip(self.omegas, self.sums, strict=False):
            _axpy(y, -om, s)
        if not self.sums:
            self.sums = [_copy(y) for _ in self.thetas]
        else:
            for th, s in zip(self.thetas, self.sums, strict=True):
                s *= th
                s += y
        return y

    @property
    def buffers(self) -> int:
        return len(self.thetas)

    def _state(self) -> list[Any]:
        return list(self.sums)

    def _load(self, vectors: list[Any]) -> None:
        if len(vectors) not in (0, len(self.thetas)):
            raise fail("state['vectors']", len(vectors), f"0 or {len(self.thetas)}")
        self.sums = vectors


class _Tree(StreamingNoise):
    def __init__(self) -> None:
        super().__init__()
        self.levels: dict[int, Any] = {}  # node noise per set bit of the step count

    def _next(self, z: Any) -> Any:
        n = self.step + 1
        top = (n & -n).bit_length() - 1
        keep = _copy(z)
        y = z
        for level in range(top):
            _axpy(y, -1.0, self.levels.pop(level))
        self.levels[top] = keep
        return y

    @property
    def buffers(self) -> int:
        return len(self.levels)

    def _state(self) -> list[Any]:
        return [self.levels[k] for k in sorted(self.levels)]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        step = check_int("state['step']", state.get("step"), 0)
        vectors = [_copy(v) for v in state.get("vectors", [])]
        bits = [k for k in range(step.bit_length()) if step >> k & 1]
        if len(vectors) != len(bits):
            raise fail("state['vectors']", len(vectors), f"{len(bits)} (set bits of step)")
        self.levels = dict(zip(bits, vectors, strict=True))
        self.step = step


class _BandedInverse(StreamingNoise):
    """``y_t = Σ_{j<b} r_j z_{t−j}`` keeping the last ``b − 1`` fresh vectors."""

    def __init__(self, coefs: tuple[float, ...]) -> None:
        super().__init__()
        self.coefs = coefs
        self.history: deque[Any] = deque(maxlen=len(coefs) - 1)  # fresh z, newest first

    def _next(self, z: Any) -> Any:
        keep = _copy(z)
        y = z
        if self.coefs[0] != 1.0:
            y *= self.coefs[0]
        for j, past in enumerate(self.history, start=1):
            _axpy(y, self.coefs[j], past)
        if self.history.maxlen:
            self.history.appendleft(keep)
        return y

    @property
    def buffers(self) -> int:
        return len(self.history)

    def _state(self) -> list[Any]:
        return list(self.history)

    def _load(self, vectors: list[Any]) -> None:
        if len(vectors) > len(self.coefs) - 1:
            raise fail("state['vectors']", len(vectors), f"at most {len(self.coefs) - 1}")
        self.history = deque(vectors, maxlen=len(self.coefs) - 1)


class _RegeneratedBandedInverse(StreamingNoise):
    """:class:`_BandedInverse` with no stored vectors: ``z_{t−j}`` comes again from
    ``regenerate(t − j)`` (the caller's counter-based source), in the same order."""

    def __init__(self, coefs: tuple[float, ...], regenerate: Callable[[int], Any]) -> None:
        super().__init__()
        self.coefs = coefs
        self.regenerate = regenerate

    def _next(self, z: Any) -> Any:
        y = z
        if self.coefs[0] != 1.0:
            y *= self.coefs[0]
        for j in range(1, min(len(self.coefs), self.step + 1)):
            _axpy(y, self.coefs[j], self.regenerate(self.step - j))
        return y

    @property
    def buffers(self) -> int:
        return 0


def streaming_noise(
    strategy: Strategy, *, regenerate: Callable[[int], Any] | None = None
) -> StreamingNoise:
    """The bounded-memory generator of ``R z`` for ``strategy`` (banded, BLT, tree, identity,
    banded inverse).

    ``regenerate(step)`` — the fresh vector ``z_step`` drawn again (a counter-based source):
    the banded-inverse filter then keeps no vectors. The other filters' states are their
    own past *outputs* (infinite impulse responses of the fresh noise), which no counter
    regenerates without replaying the run: they keep their buffers whatever ``regenerate``.

    Raises:
        PrivacyParameterError: a strategy with no bounded-memory form (dense, Honaker).
    """
    if isinstance(strategy, BandedInverseStrategy):
        coefs = strategy.inverse_coefficients
        return (
            _BandedInverse(coefs)
            if regenerate is None
            else _RegeneratedBandedInverse(coefs, regenerate)
        )
    if isinstance(strategy, BandedToeplitzStrategy):
        if strategy.bands == 1:
            return _Identity()
        return _Banded(strategy.coefficients)
    if isinstance(strategy, BltStrategy):
        return _Blt(strategy.thetas, strategy.omegas)
    if isinstance(strategy, TreeStrategy):
        return _Tree()
    raise fail(
        "strategy",
        getattr(strategy, "name", strategy),
        "a streamable strategy ('dpsgd', 'banded', 'blt' or 'tree')",
    )
