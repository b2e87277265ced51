"""Where the batch is: the batch dimension of every tensor a layer is called with.

Per-example gradients need to know, for each layer call, which dimension of its input and of
its output gradient indexes the examples. Most models are batch-first (``[B, ...]``), but
PyTorch's own defaults are not: ``nn.TransformerEncoderLayer``, ``nn.MultiheadAttention`` and
the RNNs take ``[T, B, d]`` unless ``batch_first=True``, and a ``nn.Linear`` applied to such a
tensor sees the batch in dimension 1. Guessing the batch dimension from sizes alone is unsafe
(``T == B`` happens under Poisson sampling, and a wrong guess would clip mixtures of examples
instead of examples), so :class:`BatchLayout` decides it like this:

* a dimension *learned* by the independence check, which runs the model on a batch of ``k``
  examples and on ``m != k`` copies of one example: the one dimension of a layer's tensor whose
  size changes from ``k * s`` to ``m * s`` is its batch dimension (:func:`example_block`);
* otherwise (no check has seen this call yet) the only leading dimension (0 or 1, never a
  feature dimension) whose size is the batch size;
* otherwise :class:`LayoutError` (ambiguous, e.g. ``[T, B, d]`` with ``T == B`` before any
  check): the engine then runs the check on this batch, which learns it, or refuses.

The model's own inputs are batched along dim 0, or along dim 1 for tensors of two or more
dimensions when the user says ``batch_first=False`` (Opacus's meaning of the flag).

Example:
    >>> example_block((7, 3, 5), (7, 2, 5), 3, 2)  # [T, B, d]: batch in dim 1
    (1, 1)
    >>> example_block((3 * 4, 8), (2 * 4, 8), 3, 2)  # [B*T, d] flattened batch-major
    (0, 4)
    >>> example_block((4, 4), (4, 4), 3, 2) is None  # the same in both runs: not batched
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from renyi.dpsgd.grad_sample import UnsupportedModelError

__all__ = ["BatchLayout", "LayoutError", "example_block", "input_batch_dim"]

#: A recorded call: (positional args, keyword args, gradient of each tensor output).
Call = tuple[tuple[Any, ...], dict[str, Any], list[Tensor | None]]


class LayoutError(UnsupportedModelError):
    """The batch dimension of a layer's tensor cannot be told from its shape."""


class _Mismatch(Exception):
    """Shapes of the two runs are not related by a batch dimension."""


def example_block(
    big: Sequence[int], small: Sequence[int], k: int, m: int
) -> tuple[int, int] | None:
    """The batch dimension of a tensor seen in a run of ``k`` examples (shape ``big``) and in a
    run of ``m`` examples (shape ``small``): ``(dim, s)`` with ``big[dim] == k * s`` and
    ``small[dim] == m * s`` (``s > 1``: examples flattened batch-major with other positions),
    all other sizes equal; ``None`` if the shapes are equal (the tensor is not batched).

    Raises:
        ValueError: the shapes are related in no such way.
    """
    big, small = tuple(big), tuple(small)
    if big == small:
        return None
    if len(big) != len(small):
        raise ValueError(f"shapes {big} and {small} have different dimensions")
    diff = [d for d in range(len(big)) if big[d] != small[d]]
    if len(diff) == 1:
        d = diff[0]
        if big[d] % k == 0 and small[d] % m == 0 and big[d] // k == small[d] // m:
            return d, big[d] // k
    raise ValueError(f"shapes {big} and {small} differ by more than a batch dimension")


def input_batch_dim(t: Tensor, batch_first: bool) -> int:
    """Batch dimension of a model input: 0, or 1 for ``batch_first=False`` and ``ndim >= 2``."""
    return 0 if batch_first or t.ndim < 2 else 1


def _slots(call: Call) -> list[tuple[str, Any]]:
    args, kwargs, gouts = call
    out: list[tuple[str, Any]] = [(f"arg{i}", a) for i, a in enumerate(args)]
    out += [(f"kw:{k}", v) for k, v in kwargs.items()]
    out += [(f"out{i}", g) for i, g in enumerate(gouts)]
    return out


class BatchLayout:
    """Batch dimension of every tensor of every layer call, learned by the check (see the
    module docstring). Keys: ``(layer name, call index, slot)``, slot ``"arg<i>"``,
    ``"kw:<name>"`` or ``"out<i>"`` (the gradient of tensor output ``i``)."""

    def __init__(self, batch_first: bool = True) -> None:
        self.batch_first = bool(batch_first)
        self.learned: dict[tuple[str, int, str], int | None] = {}
        #: without a check to learn from: break ties by ``batch_first`` (else LayoutError)
        self.guess_ties = False

    # ------------------------------------------------------------------ learning
    def learn(
        self,
        layer: str,
        batched: Sequence[Mapping[str, tuple[int, ...]]],
        alone: Sequence[Mapping[str, tuple[int, ...]]],
        k: int,
        m: int,
    ) -> None:
        """Learn from the shapes of each call (``{slot: shape}``) in a run of ``k`` examples
        and one of ``m`` copies of an example. Calls or slots that do not match are left
        unlearned (the comparison of the check then decides)."""
        for occ, (big, small) in enumerate(zip(batched, alone, strict=False)):
            for slot, shape in big.items():
                if slot not in small:
                    continue
                try:
                    found = example_block(shape, small[slot], k, m)
                except ValueError:
                    continue
                self.learned[(layer, occ, slot)] = None if found is None else found[0]

    @staticmethod
    def shapes(call: Call) -> dict[str, tuple[int, ...]]:
        """``{slot: shape}`` of the tensors of one call."""
        return {s: tuple(t.shape) for s, t in _slots(call) if isinstance(t, Tensor)}

    # ------------------------------------------------------------------ use
    def dim(
        self, layer: str, occ: int, slot: str, t: Tensor, batch: int, fixed: bool = False
    ) -> int | None:
        """The batch dimension of ``t`` (``None``: not batched, or along dim 0 (possibly
        flattened batch-major with other positions), as the rules expect). ``fixed``: the
        layer takes the batch in dim 0 only (convolutions, GroupNorm: dim 1 is channels)."""
        key = (layer, occ, slot)
        if key in self.learned:
            d = self.learned[key]
            if d is None or d == 0:
                return None
            if d < t.ndim and int(t.shape[d]) == batch:
                return d
            raise LayoutError(
                f"layer {layer!r} was called with a tensor of shape {tuple(t.shape)} ({slot}) "
                f"whose dimension {d} (the batch dimension when the model was checked) is not "
                f"the batch size {batch}"
            )
        if fixed or t.ndim < 2 or int(t.shape[1]) != batch:
            return None
        if t.ndim == 2 and t.is_floating_point():
            return None  # [N, features]: dimension 1 is a feature dimension
        if int(t.shape[0]) != batch:
            self.learned[key] = 1  # unambiguous: remembered for batches where T == B
            return 1
        if self.guess_ties:
            return None if self.batch_first else 1
        raise LayoutError(
            f"layer {layer!r} was called with a tensor of shape {tuple(t.shape)} ({slot}): "
            f"both dimension 0 and 1 have the batch size {batch}, so which one holds the "
            "examples cannot be told from the shape"
        )

    def to_batch_first(
        self, layer: str, calls: Sequence[Call], batch: int, fixed: bool = False
    ) -> list[Call]:
        """The calls with every batched tensor's batch dimension moved to dimension 0."""
        out: list[Call] = []
        for occ, call in enumerate(calls):
            args, kwargs, gouts = call

            def move(slot: str, t: Any, occ: int = occ) -> Any:
                if not isinstance(t, Tensor):
                    return t
                d = self.dim(layer, occ, slot, t, batch, fixed)
                return t if d is None else t.movedim(d, 0)

            out.append(
                (
                    tuple(move(f"arg{i}", a) for i, a in enumerate(args)),
                    {k: move(f"kw:{k}", v) for k, v in kwargs.items()},
                    [move(f"out{i}", g) for i, g in enumerate(gouts)],
                )
            )
        return out

    def batch_dims(self, layer: str, occ: int, call: Call, batch: int) -> dict[str, int | None]:
        """``{slot: batch dimension}`` of one call (``None``: not batched)."""
        res: dict[str, int | None] = {}
        for slot, t in _slots(call):
            if not isinstance(t, Tensor):
                continue
            d = self.dim(layer, occ, slot, t, batch)
            if d is None:
                d = 0 if t.ndim > 0 and int(t.shape[0]) == batch else None
            res[slot] = d
        return res

    def needs_learning(
        self, layer: str, calls: Sequence[Call], batch: int, fixed: bool = False
    ) -> bool:
        """Whether some tensor's batch dimension is ambiguous or changed (a check decides)."""
        try:
            for occ, call in enumerate(calls):
                for slot, t in _slots(call):
                    if isinstance(t, Tensor):
                        self.dim(layer, occ, slot, t, batch, fixed)
        except LayoutError:
            return True
        return False


def select_rows(t: Tensor, dim: int, index: Tensor) -> Tensor:
    """Rows ``index`` of ``t`` along ``dim``."""
    return t.index_select(dim, index.to(t.device))


def is_batched_input(t: Any, batch: int, batch_first: bool) -> bool:
    """Whether a model input ``t`` holds one entry per example along its batch dimension."""
    if not isinstance(t, Tensor) or t.ndim == 0:
        return False
    d = input_batch_dim(t, batch_first)
    return int(t.shape[d]) == batch


def output_batch_dim(t: Tensor, batch: int, batch_first: bool) -> int:
    """Batch dimension of a model output: the only leading dimension (0, or 1 unless it is the
    feature dimension of a ``[B, C]`` output) of size ``batch``; ``batch_first`` breaks a tie
    (``[T, B, V]`` with ``T == B``); dim 0 (possibly flattened batch-major) otherwise."""
    cands = [d for d in (0, 1) if d < t.ndim and int(t.shape[d]) == batch]
    if t.ndim == 2 and t.is_floating_point():
        cands = [d for d in cands if d == 0]
    if len(cands) == 2:
        return 0 if batch_first else 1
    return cands[0] if cands else 0


def per_example_rows(t: Tensor, batch: int, batch_first: bool) -> Tensor:
    """``t`` as ``[batch, -1]``: one flattened row per example."""
    d = output_batch_dim(t, batch, batch_first)
    return t.movedim(d, 0).reshape(batch, -1)
