"""The capture path's oneDNN products (``renyi.dpsgd._onednn``) against float64 references."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from renyi.dpsgd import _onednn  # noqa: E402
from renyi.dpsgd.capture import PerExampleCapture  # noqa: E402

ONEDNN = torch.backends.mkldnn.is_available()


@pytest.mark.parametrize(("n", "o", "d"), [(40, 32, 24), (40, 2, 24), (40, 24, 3), (1, 16, 16)])
@pytest.mark.parametrize("into", [False, True])
def test_mm_t_equals_float64(n: int, o: int, d: int, into: bool) -> None:
    """``b^T a`` to float32 rounding, on strided inputs too, written into ``out`` when given;
    the narrow shapes take ``torch.mm``."""
    g = torch.Generator().manual_seed(n + o + d)
    b = torch.randn(o, n, generator=g).t()  # a transposed view, as the rules pass
    a = torch.randn(n, d, generator=g)
    want = b.double().t() @ a.double()
    out = torch.full((o, d), float("nan")) if into else None
    got = _onednn.mm_t(b, a, out=out)
    assert got.dtype == torch.float32 and got.shape == (o, d)
    if into:
        assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_applies_only_where_it_should() -> None:
    x = torch.randn(4, 3)
    assert _onednn.applies(x, None) == ONEDNN
    assert not _onednn.applies(x.double())
    assert not _onednn.applies(x[:0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _onednn.applies(x)
    old = _onednn.ENABLED
    try:
        _onednn.ENABLED = False
        assert not _onednn.applies(x)
    finally:
        _onednn.ENABLED = old


@pytest.mark.skipif(not ONEDNN, reason="torch built without oneDNN")
@pytest.mark.parametrize("seq", [False, True])
def test_capture_sums_equal_with_and_without_onednn(seq: bool) -> None:
    """The capture path's clipped sums of an MLP (2-D and sequence Linear rules, the user's
    backward through the detached oneDNN maps) equal a float64 batch-of-one loop."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 32), nn.Tanh(), nn.Linear(32, 40), nn.Tanh())
    head = nn.Linear(40, 3)
    net = nn.Sequential(model, head)
    x = torch.randn(6, 5, 24) if seq else torch.randn(6, 24)
    y = torch.randint(0, 3, (6,))

    def loss_of(m: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        out = m(xs)
        if seq:
            out = out.mean(dim=1)
        return nn.functional.cross_entropy(out, ys, reduction="sum")

    clip = 0.5
    ref64 = [torch.zeros_like(p, dtype=torch.float64) for p in net.parameters()]
    net64 = copy.deepcopy(net).double()
    for i in range(len(x)):
        net64.zero_grad()
        loss_of(net64, x[i : i + 1].double(), y[i : i + 1]).backward()
        grads = [p.grad for p in net64.parameters()]
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        scale = min(1.0, clip / float(norm))
        for r, gr in zip(ref64, grads, strict=True):
            r += scale * gr
    for enabled in (True, False):
        _onednn.ENABLED = enabled
        cap = PerExampleCapture(net, max_grad_norm=clip)
        try:
            loss_of(net, x, y).backward()
            sums, count, _ = cap.pop_clipped_sum()
        finally:
            cap.remove()
            _onednn.ENABLED = True
        assert count == len(x)
        for (name, _), want in zip(net.named_parameters(), ref64, strict=True):
            torch.testing.assert_close(sums[name].double(), want, rtol=1e-5, atol=1e-6)
