"""Random draws of a forward pass, recorded and replayed per example.

The independence check (:mod:`renyi.dpsgd.independence`) compares each example's gradient
read off a batch with the same example run on its own. A model that draws random numbers in
its forward (dropout, ``F.dropout``, attention dropout, stochastic depth, ``randn_like``
sampling) would differ between the two runs by its random draws alone, so the check records
every draw of the batched run, at the level of torch's operators (every operator tagged
``torch.Tag.nondeterministic_seeded``), and gives each example's run that example's rows:
the batch dimension of each draw is the one whose size changes from ``k`` examples to ``m``
copies (:func:`renyi.dpsgd.layout.example_block`); a draw whose shape does not depend on the
batch (one mask for the whole batch) is replayed whole. Operators whose outputs depend on
their inputs get the recorded random part only (``native_dropout``: the mask;
``rrelu_with_noise``: the noise).

Example:
    >>> import torch
    >>> tape = RandomTape()
    >>> x = torch.ones(3, 4)
    >>> with tape.record():
    ...     a = torch.nn.functional.dropout(x, 0.5, training=True)
    >>> with tape.replay((1, 3, 2)):  # example 1 of the 3, as 2 copies
    ...     b = torch.nn.functional.dropout(x[:2], 0.5, training=True)
    >>> bool(torch.equal(b[0], a[1]) and torch.equal(b[1], a[1]))
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from renyi.dpsgd.grad_sample import UnsupportedModelError
from renyi.dpsgd.layout import example_block

__all__ = ["RandomTape", "ReplayError", "flat_tensors"]


class ReplayError(UnsupportedModelError):
    """The random draws of a batch cannot be matched to those of one example alone."""


def flat_tensors(out: Any) -> list[Tensor]:
    """The tensors of an operator's output (a tensor or a tuple/list of them), in order."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for o in out for t in flat_tensors(o)]
    return []


_RRELU = {torch.ops.aten.rrelu_with_noise.default, torch.ops.aten.rrelu_with_noise_.default}


class RandomTape:
    """The random draws of one forward pass, recorded at the level of torch's operators
    (every operator tagged ``nondeterministic_seeded``: bernoulli, dropout, rand, randn,
    normal, multinomial, ...), to be replayed in another run of the same model.

    ``record()``: run the batch and keep every draw. ``replay(None)``: draw exactly the same
    again (same shapes). ``replay((j, k, m))``: a run of ``m`` copies of example ``j`` of the
    recorded ``k``-example batch; each draw gets example ``j``'s rows (the batch dimension is
    found by :func:`~renyi.dpsgd.layout.example_block`; draws whose shape does not depend on
    the batch are replayed whole).

    Example:
        >>> import torch
        >>> tape = RandomTape()
        >>> x = torch.ones(3, 4)
        >>> with tape.record():
        ...     a = torch.nn.functional.dropout(x, 0.5, training=True)
        >>> with tape.replay((1, 3, 2)):
        ...     b = torch.nn.functional.dropout(x[:2], 0.5, training=True)
        >>> bool(torch.equal(b[0], a[1]) and torch.equal(b[1], a[1]))
        True
    """

    def __init__(self) -> None:
        self.draws: list[tuple[Any, list[Tensor]]] = []

    def __len__(self) -> int:
        return len(self.draws)

    @contextmanager
    def record(self) -> Iterator[None]:
        self.draws = []
        with _TapeMode(self, recording=True, rows=None):
            yield

    @contextmanager
    def replay(self, rows: tuple[int, int, int] | None) -> Iterator[None]:
        mode = _TapeMode(self, recording=False, rows=rows)
        with mode:
            yield
        if mode.pos != len(self.draws):
            raise ReplayError(
                f"the forward drew random numbers {len(self.draws)} times for the batch but "
                f"{mode.pos} times for an example on its own"
            )


class _TapeMode(TorchDispatchMode):
    def __init__(self, tape: RandomTape, recording: bool, rows: tuple[int, int, int] | None):
        super().__init__()
        self.tape, self.recording, self.rows, self.pos = tape, recording, rows, 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        outs = flat_tensors(out)
        if func in _RRELU:  # the noise argument is written in place
            outs = [*outs, args[1]]
        if self.recording:
            self.tape.draws.append((func, [t.detach().clone() for t in outs]))
            return out
        i = self.pos
        self.pos += 1
        if i >= len(self.tape.draws) or self.tape.draws[i][0] is not func:
            raise ReplayError(
                f"the forward's random draw #{i + 1} ({func}) for an example on its own does "
                "not correspond to the batch's"
            )
        for o, r in zip(outs, self.tape.draws[i][1], strict=True):
            o.copy_(self._rows_of(r, tuple(o.shape), func).to(o.dtype))
        if func is torch.ops.aten.native_dropout.default and len(outs) == 2:
            x, p = args[0], float(args[1])
            scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
            outs[0].copy_(x * outs[1] * scale)
        elif func in _RRELU:
            x = args[0]
            res = torch.where(x >= 0, x, x * outs[-1])
            if func is torch.ops.aten.rrelu_with_noise_.default:
                x.copy_(res)
            else:
                outs[0].copy_(res)
        return out

    def _rows_of(self, r: Tensor, shape: tuple[int, ...], func: Any) -> Tensor:
        if self.rows is None:
            if tuple(r.shape) != shape:
                raise ReplayError(f"random draw {func} changed shape: {tuple(r.shape)}, {shape}")
            return r
        j, k, m = self.rows
        try:
            found = example_block(tuple(r.shape), shape, k, m)
        except ValueError as err:
            raise ReplayError(
                f"the random draw {func} of shape {tuple(r.shape)} for {k} examples cannot be "
                f"matched to shape {shape} for {m}: {err}"
            ) from None
        if found is None:
            return r
        d, s = found
        block = r.narrow(d, j * s, s)
        return torch.cat([block] * m, dim=d)
