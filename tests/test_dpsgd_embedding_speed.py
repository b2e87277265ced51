"""The embedding's compiled per-example norms and clipped sum (renyi.dpsgd._embedding_kernels)
against a batch-of-one autograd loop in float64, and torch's fallback path; plain Linear
layers' compiled norms (renyi.dpsgd._linear_kernels) against float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from renyi.dpsgd import _embedding_kernels, _linear_kernels
from renyi.dpsgd.ghost import _LinearGrads, ghost_layer_grads, linear_total_sq
from renyi.errors import PrivacyParameterError

pytestmark = pytest.mark.skipif(not _embedding_kernels.available(), reason="numba missing")


def _tokens(batch: int, steps: int, num: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Indices with many repeats within each example (a few tokens drawn often)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, num, (batch, steps), generator=g)
    common = torch.randint(0, num, (batch, 3), generator=g)
    pick = torch.randint(0, 3, (batch, steps), generator=g)
    rep = torch.rand(batch, steps, generator=g) < 0.6
    idx = torch.where(rep, common.gather(1, pick), idx)
    idx[0, :] = idx[0, 0]  # one example of a single token
    return idx.to(dtype)


def _reference(
    emb: nn.Embedding, idx: torch.Tensor, b: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example squared norms and ``sum_i w_i g_i`` by autograd, one example at a time."""
    sq, total = [], torch.zeros_like(emb.weight)
    for i in range(idx.shape[0]):
        emb.zero_grad()
        (emb(idx[i : i + 1]) * b[i : i + 1]).sum().backward()
        g = emb.weight.grad.detach().clone()
        sq.append((g.double() ** 2).sum())
        total += w[i].to(g.dtype) * g
    return torch.stack(sq), total


def _rule(emb: nn.Embedding, idx: torch.Tensor, b: torch.Tensor, parts: int = 1):
    """The ghost rule over ``parts`` calls of the layer, splitting the positions."""
    batch = idx.shape[0]
    calls = [((x,), {}, [g]) for x, g in zip(idx.chunk(parts, 1), b.chunk(parts, 1), strict=True)]
    return ghost_layer_grads(emb, calls, ["weight"], batch)


class _Spy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for name in ("sq_norms", "weighted_sum"):
            inner = getattr(_embedding_kernels, name)

            def wrapped(*args, _inner=inner):  # type: ignore[no-untyped-def]
                self.calls += 1
                return _inner(*args)

            monkeypatch.setattr(_embedding_kernels, name, wrapped)


@pytest.mark.parametrize("padding_idx", [None, 3, -2])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("parts", [1, 2])
def test_kernel_equals_batch_of_one_loop_float64(
    monkeypatch: pytest.MonkeyPatch, padding_idx: int | None, index_dtype: torch.dtype, parts: int
) -> None:
    torch.manual_seed(0)
    batch, steps, num, dim = 7, 12, 9, 5
    emb = nn.Embedding(num, dim, padding_idx=padding_idx).double()
    idx = _tokens(batch, steps, num, seed=1, dtype=index_dtype)
    if padding_idx is not None:
        idx[1, ::3] = emb.padding_idx  # padding at several positions
    b = torch.randn(batch, steps, dim, dtype=torch.float64)
    w = torch.rand(batch, dtype=torch.float64)
    ref_sq, ref_sum = _reference(emb, idx, b, w)
    spy = _Spy(monkeypatch)
    rule = _rule(emb, idx, b, parts)
    sq = rule.sq_norms()["weight"]
    total = rule.weighted_sum({"weight": w})["weight"]
    assert spy.calls == 2  # the compiled path ran
    torch.testing.assert_close(sq, ref_sq, rtol=1e-13, atol=0.0)
    torch.testing.assert_close(total, ref_sum, rtol=1e-13, atol=1e-15)
    if padding_idx is not None:
        assert torch.all(total[emb.padding_idx] == 0)


def test_fallback_equals_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    emb = nn.Embedding(11, 6, padding_idx=0).double()
    idx = _tokens(5, 9, 11, seed=2, dtype=torch.int64)
    b = torch.randn(5, 9, 6, dtype=torch.float64)
    w = torch.rand(5, dtype=torch.float64)
    on = _rule(emb, idx, b)
    sq_on, sum_on = on.sq_norms()["weight"], on.weighted_sum({"weight": w})["weight"]
    monkeypatch.setattr(_embedding_kernels, "ENABLED", False)
    spy = _Spy(monkeypatch)
    off = _rule(emb, idx, b)
    sq_off, sum_off = off.sq_norms()["weight"], off.weighted_sum({"weight": w})["weight"]
    assert spy.calls == 0
    torch.testing.assert_close(sq_on, sq_off, rtol=1e-13, atol=0.0)
    torch.testing.assert_close(sum_on, sum_off, rtol=1e-13, atol=1e-15)


def test_float32_against_float64() -> None:
    torch.manual_seed(2)
    batch, steps, num, dim = 16, 32, 50, 64  # the benchmark's layout, smaller
    emb = nn.Embedding(num, dim)
    idx = _tokens(batch, steps, num, seed=3, dtype=torch.int64)
    b = torch.randn(batch, steps, dim)
    w = torch.rand(batch)
    ref_sq, ref_sum = _reference(emb.double(), idx, b.double(), w.double())
    rule = _rule(emb.float(), idx, b)
    sq = rule.sq_norms()["weight"]
    total = rule.weighted_sum({"weight": w})["weight"]
    assert sq.dtype == torch.float64 and total.dtype == torch.float32
    # float32 entries, products and sums in float64: rounding of float64 only
    torch.testing.assert_close(sq, ref_sq, rtol=1e-12, atol=0.0)
    # float32 sums of at most B * T terms
    torch.testing.assert_close(total.double(), ref_sum, rtol=0.0, atol=batch * steps * 2e-7 * 4)


def test_cancelling_rows_give_zero_norm() -> None:
    """Two positions of one token with opposite gradients: exactly zero."""
    emb = nn.Embedding(4, 16)
    idx = torch.tensor([[2, 1, 2], [0, 0, 3]])
    row = torch.randn(16) * 1e3
    b = torch.zeros(2, 3, 16)
    b[0, 0], b[0, 2] = row, -row
    b[1, 0], b[1, 1] = row, -row
    b[1, 2] = 1.0
    sq = _rule(emb, idx, b).sq_norms()["weight"]
    assert sq[0].item() == 0.0 and sq[1].item() == 16.0


@pytest.mark.parametrize("enabled", [True, False])
def test_out_of_range_indices_are_refused(monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    """The kernels check indices before touching a row; both paths raise our error (torch's
    unique over example * num + index would put an index past the table into another
    example's keys)."""
    monkeypatch.setattr(_embedding_kernels, "ENABLED", enabled)
    b = np.ones((2, 3, 4), dtype=np.float32)
    for bad in (-1, 5):
        idx = np.array([[0, 1, 2], [3, bad, 4]], dtype=np.int64)
        out = np.full(2, 7.0)
        assert _embedding_kernels.sq_norms(idx, b, -1, 5, out) == _embedding_kernels.BAD_INDEX
        assert np.all(out == 7.0)
        rows = np.full((5, 4), 7.0, dtype=np.float32)
        w = np.ones(2, dtype=np.float32)
        assert (
            _embedding_kernels.weighted_sum(idx, b, w, -1, 5, rows) == _embedding_kernels.BAD_INDEX
        )
        assert np.all(rows == 7.0)
        rule = _rule(nn.Embedding(5, 4), torch.from_numpy(idx), torch.from_numpy(b))
        with pytest.raises(PrivacyParameterError, match="embedding indices"):
            rule.sq_norms()
        with pytest.raises(PrivacyParameterError, match="embedding indices"):
            rule.weighted_sum({"weight": torch.ones(2)})


def test_non_finite_gradients_propagate() -> None:
    emb = nn.Embedding(4, 3, padding_idx=1)
    idx = torch.tensor([[0, 2], [1, 3]])
    b = torch.ones(2, 2, 3)
    b[0, 1, 0] = float("nan")
    b[1, 0, 0] = float("inf")  # at the padding position: 0 * inf = NaN, as torch's mask
    sq = _rule(emb, idx, b).sq_norms()["weight"]
    assert torch.isnan(sq).all()


# ---------------------------------------------------------------- plain Linear layers' norms
def _linear_layers(scale: float = 1.0) -> list[_LinearGrads]:
    g = torch.Generator().manual_seed(7)
    shapes = [(9, 5, ("weight", "bias")), (7, 3, ("weight",)), (4, 6, ("bias",))]
    return [
        _LinearGrads(
            scale * torch.randn(6, d, generator=g), scale * torch.randn(6, o, generator=g), names
        )
        for d, o, names in shapes
    ]


def _exact_total(layers: list[_LinearGrads]) -> torch.Tensor:
    total = torch.zeros(6, dtype=torch.float64)
    for g in layers:
        sa = (g.a.double() ** 2).sum(1)
        sb = (g.b.double() ** 2).sum(1)
        total += (sa * sb if "weight" in g.names else 0) + (sb if "bias" in g.names else 0)
    return total


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e25], ids=["tiny", "plain", "huge"])
def test_linear_total_sq_kernel_exact_range(monkeypatch: pytest.MonkeyPatch, scale: float) -> None:
    """float32 entries squared in float64: the exact squares at every float32 scale (torch's
    float32 norms would underflow/overflow there and be redone in float64)."""
    layers = _linear_layers(scale)
    calls = []
    inner = _linear_kernels.linear_sq_add
    monkeypatch.setattr(_linear_kernels, "linear_sq_add", lambda *a: calls.append(1) or inner(*a))
    got = linear_total_sq(layers)
    assert len(calls) == len(layers)
    torch.testing.assert_close(got, _exact_total(layers), rtol=1e-13, atol=0.0)
    monkeypatch.setattr(_linear_kernels, "ENABLED", False)
    calls.clear()
    off = linear_total_sq(layers)
    assert not calls
    torch.testing.assert_close(off, got, rtol=1e-6, atol=0.0)


def test_linear_total_sq_kernel_fallbacks_and_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    inner = _linear_kernels.linear_sq_add
    monkeypatch.setattr(_linear_kernels, "linear_sq_add", lambda *a: calls.append(1) or inner(*a))
    layers = _linear_layers()
    strided = [_LinearGrads(layers[0].a.t().contiguous().t(), layers[0].b, ("weight", "bias"))]
    doubled = [_LinearGrads(g.a.double(), g.b.double(), g.names) for g in layers]
    for case in (strided, doubled):
        torch.testing.assert_close(linear_total_sq(case), _exact_total(case), rtol=1e-6, atol=0.0)
    assert not calls  # non-contiguous and float64 inputs take torch's path
    layers[1].a[2, 0] = float("nan")
    layers[2].b[4, 1] = float("inf")
    got = linear_total_sq(layers)
    assert calls
    assert torch.isnan(got[2]) and torch.isinf(got[4])
    assert torch.isfinite(got[[0, 1, 3, 5]]).all()
