"""The LSTM recurrence of the decomposed layers and the shared output gradients of its maps.

``decomposed._LSTMScan`` runs the LSTM recurrence from the recorded input projection in a
loop of batched operations (numpy's ``tanh`` on CPU) and back-propagates through time by
hand; its outputs and the gradients it returns (the gate gradients at the input projection,
the initial states' gradients) must equal plain autograd through torch's LSTM-cell equations,
in float64 to 1e-12, with either ``tanh``. ``ghost.SharedOutputGrads`` computes the Gram
matrices and bias gradients of output gradients that two maps share (an LSTM's input and
hidden maps) once; the norms and clipped sums must equal those of the maps computed
separately and those of explicit per-example gradients.

With numba installed the recurrences (LSTM, GRU) run as compiled loops
(``renyi.dpsgd._scan_kernels``): their forward and backward must equal the same autograd
reference in float64 to 1e-12, and the float32 activations (vectorisable
``exp``/``sigmoid``/``tanh``) stay within a few ulp of the exact functions on a dense grid.
Every recurrent kind on the capture path (``loss.backward()``) equals the engine's own
backward, with the compiled kernels and with the torch loops.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
import numpy as np  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from renyi.dpsgd import _onednn, _scan_kernels, decomposed, ghost  # noqa: E402
from renyi.dpsgd.clipping import ClippedGradientEngine  # noqa: E402

pytestmark = pytest.mark.torch


def _reference(
    gi: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, b_hh: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """torch's LSTM equations (``nn.LSTM`` documentation) step by step under autograd."""
    h, c, outs = h0, c0, []
    for t in range(gi.shape[1]):
        z = gi[:, t] + h @ w_hh.t() + (0 if b_hh is None else b_hh)
        i, f, g, o = z.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, dim=1), h, c


needs_numba = pytest.mark.skipif(not _scan_kernels.available(), reason="numba not installed")


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("numpy_tanh", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("seeded", ["all", "h_n"])
def test_lstm_scan_equals_autograd_in_float64(
    kernels: bool, numpy_tanh: bool, bias: bool, seeded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decomposed, "_NUMPY_TANH", numpy_tanh)
    monkeypatch.setattr(decomposed, "_USE_KERNELS", kernels)
    g = torch.Generator().manual_seed(3)
    b, t, hid = 4, 6, 5
    dt = torch.float64

    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return (scale * torch.randn(*shape, generator=g, dtype=dt)).requires_grad_()

    gi, h0, c0 = rnd(b, t, 4 * hid, scale=2.0), rnd(b, hid), rnd(b, hid)
    w_hh = torch.randn(4 * hid, hid, generator=g, dtype=dt)
    b_hh = torch.randn(4 * hid, generator=g, dtype=dt) if bias else None
    ref = _reference(gi, h0, c0, w_hh, b_hh)
    got = decomposed._LSTMScan.apply(gi, h0, c0, w_hh, b_hh)
    for r, o in zip(ref, got, strict=True):
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)
    # upstream gradients on every output, or only on h_n (the others arrive as zeros/None)
    ups = [torch.randn(r.shape, generator=g, dtype=dt) for r in ref]
    pick = range(3) if seeded == "all" else (1,)
    want = torch.autograd.grad([ref[k] for k in pick], [gi, h0, c0], [ups[k] for k in pick])
    have = torch.autograd.grad([got[k] for k in pick], [gi, h0, c0], [ups[k] for k in pick])
    for r, o in zip(want, have, strict=True):
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)
        assert o.dtype == dt


def _case(dt: torch.dtype, bias: bool) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    b, t, hid = 5, 9, 6
    gi = 2 * torch.randn(b, t, 4 * hid, generator=g, dtype=dt)
    h0, c0 = torch.randn(b, hid, generator=g, dtype=dt), torch.randn(b, hid, generator=g, dtype=dt)
    w_hh = torch.randn(4 * hid, hid, generator=g, dtype=dt)
    b_hh = torch.randn(4 * hid, generator=g, dtype=dt) if bias else None
    ups = (
        torch.randn(b, t, hid, generator=g, dtype=dt),
        torch.randn(b, hid, generator=g, dtype=dt),
        torch.randn(b, hid, generator=g, dtype=dt),
    )
    return gi, h0, c0, w_hh, b_hh, *ups  # type: ignore[return-value]


@needs_numba
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("upstream", ["all", "h_n", "outputs"])
def test_compiled_kernels_equal_autograd_in_float64(bias: bool, upstream: str) -> None:
    """The compiled forward (float64: the C library's exp/tanh) and backward against plain
    autograd through torch's LSTM-cell equations; gradients given at every output, at
    ``h_n`` only, or at the output sequence only (the others None, as autograd passes them)."""
    dt = torch.float64
    gi, h0, c0, w_hh, b_hh, g_out, g_h, g_c = _case(dt, bias)
    hs, acts, cs, tcs, h_n, prev = decomposed._compiled_forward(gi, h0, c0, w_hh, b_hh)
    leaves = [t.clone().requires_grad_() for t in (gi, h0, c0)]
    ref = _reference(*leaves, w_hh, b_hh)
    torch.testing.assert_close(hs, ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(h_n, ref[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(cs[-1], ref[2], rtol=0, atol=1e-12)
    torch.testing.assert_close(tcs, torch.tanh(cs[1:]), rtol=0, atol=1e-12)
    assert torch.equal(prev, decomposed._previous_states(h0, hs, None))
    ups = {"all": (g_out, g_h, g_c), "h_n": (None, g_h, None), "outputs": (g_out, None, None)}
    given = ups[upstream]
    pick = [k for k in range(3) if given[k] is not None]
    want = torch.autograd.grad([ref[k] for k in pick], leaves, [given[k] for k in pick])
    *have, step = decomposed._compiled_backward(acts, cs, tcs, w_hh, *given)
    assert step is not None
    torch.testing.assert_close(step[0], have[0].sum(dim=1), rtol=0, atol=1e-12)
    for r, o in zip(want, have, strict=True):
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)
        assert o.dtype == dt
    # the torch loops give the same gates and gradients
    t_hs, t_acts, t_cs, t_tcs = decomposed._torch_forward(gi, h0, c0, w_hh, b_hh)
    for a, b in ((t_hs, hs), (t_acts, acts), (t_cs, cs), (t_tcs, tcs)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for a, b in zip(decomposed._torch_backward(acts, cs, tcs, w_hh, *given), have, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@needs_numba
def test_compiled_float32_scan_matches_float64_autograd() -> None:
    """The float32 path users run (compiled forward with the vectorised activations,
    compiled backward) through ``_LSTMScan``, against autograd in float64."""
    gi, h0, c0, w_hh, b_hh, g_out, g_h, g_c = _case(torch.float64, True)
    ref_leaves = [t.clone().requires_grad_() for t in (gi, h0, c0)]
    ref = _reference(*ref_leaves, w_hh, b_hh)
    want = torch.autograd.grad(ref, ref_leaves, [g_out, g_h, g_c])
    leaves = [t.float().requires_grad_() for t in (gi, h0, c0)]
    got = decomposed._LSTMScan.apply(*leaves, w_hh.float(), b_hh.float())  # type: ignore[union-attr]
    for r, o in zip(ref, got, strict=True):
        assert o.dtype == torch.float32
        torch.testing.assert_close(o.double(), r, rtol=0, atol=2e-6)
    have = torch.autograd.grad(got, leaves, [u.float() for u in (g_out, g_h, g_c)])
    for r, o in zip(want, have, strict=True):
        torch.testing.assert_close(o.double(), r, rtol=2e-5, atol=2e-5)


def _ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in units of the float32 spacing at ``exact``."""
    spacing = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


@needs_numba
def test_float32_activations_within_three_ulp() -> None:
    """``exp``, ``sigmoid`` and ``tanh`` of the compiled float32 forward on a dense grid
    (measured: at most 1.2, 2.5 and 1.8 ulp) and at the edges: NaN stays NaN, infinities
    saturate, exp is clamped to float32's normal range."""
    lin = np.linspace(-100.0, 100.0, 400_001)
    tiny = 10.0 ** np.linspace(-30.0, 1.0, 20_001)
    x = np.concatenate([lin, tiny, -tiny]).astype(np.float32)
    x64 = x.astype(np.float64)
    out = np.empty_like(x)
    xe = np.clip(x, np.float32(-87.0), np.float32(88.0))
    _scan_kernels.exp32(xe, out)
    assert _ulps(out, np.exp(xe.astype(np.float64))).max() <= 3
    _scan_kernels.sigmoid32(x, out)
    exact = 1.0 / (1.0 + np.exp(-x64))
    normal = exact > 1e-37  # below, exp(-x) is clamped: sigmoid ~1e-38 instead of smaller
    assert _ulps(out[normal], exact[normal]).max() <= 3
    assert np.abs(out - exact).max() <= 3 * 2.0**-24  # 3 ulp of 1
    _scan_kernels.tanh32(x, out)
    assert _ulps(out, np.tanh(x64)).max() <= 3
    edge = np.array([np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    res = {}
    for name in ("exp32", "sigmoid32", "tanh32"):
        o = np.empty_like(edge)
        getattr(_scan_kernels, name)(edge, o)
        res[name] = o
    assert all(np.isnan(o[0]) for o in res.values())
    assert list(res["sigmoid32"][1:]) == [1.0, pytest.approx(0.0, abs=1e-37), 0.5]
    assert list(res["tanh32"][1:]) == [1.0, -1.0, 0.0]
    assert res["exp32"][3] == 1.0


def test_numpy_tanh_equals_torch_tanh_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(5)
    gi = 3 * torch.randn(8, 7, 24, generator=g)
    h0, c0 = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
    w_hh, b_hh = torch.randn(24, 6, generator=g), torch.randn(24, generator=g)
    outs = {}
    for flag in (True, False):
        monkeypatch.setattr(decomposed, "_NUMPY_TANH", flag)
        outs[flag] = decomposed._LSTMScan.apply(gi, h0, c0, w_hh, b_hh)
    for a, b in zip(outs[True], outs[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _seq_maps(
    shared: bool, names: tuple[str, ...]
) -> tuple[list[ghost._SeqLinearGrads], Tensor, list[Tensor]]:
    g = torch.Generator().manual_seed(11)
    b, t, d1, d2, o = 5, 7, 3, 4, 8
    dt = torch.float64
    xs = [torch.randn(b, t, d, generator=g, dtype=dt) for d in (d1, d2)]
    grad = torch.randn(b, t, o, generator=g, dtype=dt)
    common = ghost.SharedOutputGrads(grad) if shared else None
    maps = [ghost._SeqLinearGrads(x, grad, names, common) for x in xs]
    return maps, grad, xs


@pytest.mark.parametrize("names", [("weight", "bias"), ("weight",)])
def test_shared_output_grads_equal_separate_maps_and_per_example_gradients(
    names: tuple[str, ...],
) -> None:
    shared, grad, xs = _seq_maps(True, names)
    alone, _, _ = _seq_maps(False, names)
    w = torch.rand(grad.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for m_s, m_a, x in zip(shared, alone, xs, strict=True):
        assert m_s.use_gram
        per_example = torch.einsum("bto,btd->bod", grad, x)
        sq_s, sq_a = m_s.sq_norms(), m_a.sq_norms()
        torch.testing.assert_close(sq_s["weight"], per_example.pow(2).sum(dim=(1, 2)))
        torch.testing.assert_close(sq_s["weight"], sq_a["weight"])
        weights = {n: w for n in names}
        sum_s, sum_a = m_s.weighted_sum(weights), m_a.weighted_sum(weights)
        torch.testing.assert_close(sum_s["weight"], torch.einsum("b,bod->od", w, per_example))
        torch.testing.assert_close(sum_s["weight"], sum_a["weight"])
        if "bias" in names:
            torch.testing.assert_close(sq_s["bias"], grad.sum(dim=1).pow(2).sum(dim=1))
            torch.testing.assert_close(sum_s["bias"], sum_a["bias"])


class _LSTMHead(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.rnn = nn.LSTM(3, 4, bias=bias, batch_first=True)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(x)
        return self.fc(out.mean(dim=1))


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_maps_share_their_gate_gradients_and_match_batch_of_one(bias: bool) -> None:
    """The engine shares the gate gradients between ``weight_ih`` and ``weight_hh`` (one
    Gram matrix) and its clipped sum equals a float64 batch-of-one loop over torch's own
    ``nn.LSTM``."""
    torch.manual_seed(0)
    model = _LSTMHead(bias).double()
    x, y = torch.randn(5, 6, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    made: list[ghost.SharedOutputGrads] = []
    real = ghost.SharedOutputGrads.__init__

    def spy(self: ghost.SharedOutputGrads, b: Tensor, sums: Any = None) -> None:
        made.append(self)
        real(self, b, sums)

    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.05)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ghost.SharedOutputGrads, "__init__", spy)
        sums, _, norms = engine.clipped_grad_sum(x, y)
    assert engine.mode == "ghost" and made  # (the first batch's independence check makes more)
    want = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(x.shape[0]):
        model.zero_grad()
        nn.CrossEntropyLoss()(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}  # type: ignore[union-attr]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        torch.testing.assert_close(norms[i], norm, rtol=1e-9, atol=1e-12)
        scale = torch.clamp(0.05 / (norm * (1 + 1e-6)), max=1.0)
        for n in want:
            want[n] += scale * grads[n]
    for n in want:
        torch.testing.assert_close(sums[n], want[n], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "rows"])
def test_input_linear_equals_float64_linear(bias: bool, layout: str) -> None:
    """The capture path's affine maps (``_onednn.linear``: oneDNN in float32 on the
    CPU) against ``F.linear`` in float64: outputs and input gradients to float32 rounding,
    no gradient for the detached weight; a non-contiguous input and a row block of a packed
    weight (attention's ``in_proj_weight``) included."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 5, 7, generator=g)
    if layout == "transposed":
        x = torch.randn(5, 6, 7, generator=g).transpose(0, 1)
    w_all = torch.randn(24, 7, generator=g)
    w = w_all[8:16] if layout == "rows" else w_all[:8].clone()
    b = torch.randn(8, generator=g) if bias else None
    assert _onednn.applies(x, w, b) == torch.backends.mkldnn.is_available()
    xr = x.clone().requires_grad_()
    y = _onednn.linear(xr, w, b)
    up = torch.randn(y.shape, generator=g)
    (dx,) = torch.autograd.grad(y, xr, up)
    x64 = x.double().requires_grad_()
    y64 = nn.functional.linear(x64, w.double(), None if b is None else b.double())
    (dx64,) = torch.autograd.grad(y64, x64, up.double())
    assert y.dtype == torch.float32 and dx.dtype == torch.float32
    torch.testing.assert_close(y.double(), y64, rtol=0, atol=1e-5)
    torch.testing.assert_close(dx.double(), dx64, rtol=0, atol=1e-5)
    # float64, autocast and empty batches take F.linear
    assert not _onednn.applies(x.double(), w.double(), None)
    assert not _onednn.applies(x[:0], w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _onednn.applies(x, w, b)


def _captured(
    model: nn.Module, x: Tensor, y: Tensor, clip: float
) -> tuple[dict[str, Tensor], int, Tensor]:
    """``(sums, n, norms)`` of ``cross_entropy(model(x), y).backward()`` on the capture path
    (what ``PrivacyEngine`` runs), the hooks removed afterwards."""
    from renyi.dpsgd.capture import PerExampleCapture

    cap = PerExampleCapture(model, max_grad_norm=clip)
    try:
        nn.functional.cross_entropy(model(x), y).backward()
        return cap.pop_clipped_sum()
    finally:
        cap.remove()


class _TextNet(nn.Module):
    """Embedding, LSTM and attention: the decomposed layers on the capture path."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.rnn = nn.LSTM(6, 5, batch_first=True)
        self.att = nn.MultiheadAttention(5, 1, batch_first=True)
        self.fc = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        out, (h, _) = self.rnn(self.emb(x))
        att, _ = self.att(out, out, out)
        return self.fc(att.mean(dim=1) + h[-1])


def test_float32_capture_path_matches_float64_engine() -> None:
    """The path users run, in float32 (compiled LSTM scan, oneDNN affine maps): the clipped
    sums of ``loss.backward()`` equal the float64 engine's on the same batch to float32
    rounding."""

    torch.manual_seed(5)
    model = _TextNet()
    x, y = torch.randint(0, 11, (6, 7)), torch.randint(0, 3, (6,))
    ref = _TextNet()
    ref.load_state_dict(model.state_dict())
    want, _, want_norms = ClippedGradientEngine(
        ref.double(), nn.CrossEntropyLoss(), max_grad_norm=0.3
    ).clipped_grad_sum(x, y)
    sums, n, norms = _captured(model, x, y, 0.3)
    assert n == 6
    torch.testing.assert_close(norms.double(), want_norms, rtol=1e-4, atol=1e-6)
    for k in want:
        torch.testing.assert_close(sums[k].double(), want[k], rtol=1e-4, atol=1e-6)


class _WideNet(nn.Module):
    """An embedding into an LSTM or GRU with 16 features and hidden units: every own float32
    kernel takes whole tiles (the scans' products, the Gram matrices of the norms, the
    clipped sums)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 16)
        self.rnn = (nn.LSTM if kind == "LSTM" else nn.GRU)(16, 16, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(self.emb(x))
        return self.fc(out[:, -1] + out.mean(dim=1))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_float32_capture_path_on_whole_tiles_matches_float64_engine(kind: str) -> None:
    """As the test above, at sizes where the own float32 kernels (on AVX-512 CPUs) compute
    the scans' products, the per-example norms' Gram matrices and the clipped sums: norms
    and clipped sums equal the float64 engine's to float32 rounding."""
    torch.manual_seed(6)
    model = _WideNet(kind)
    x, y = torch.randint(0, 11, (5, 8)), torch.randint(0, 3, (5,))
    ref = _WideNet(kind)
    ref.load_state_dict(model.state_dict())
    want, _, want_norms = ClippedGradientEngine(
        ref.double(), nn.CrossEntropyLoss(), max_grad_norm=0.3
    ).clipped_grad_sum(x, y)
    sums, n, norms = _captured(model, x, y, 0.3)
    assert n == 5
    torch.testing.assert_close(norms.double(), want_norms, rtol=1e-4, atol=1e-6)
    for k in want:
        torch.testing.assert_close(sums[k].double(), want[k], rtol=1e-4, atol=1e-6)


class _Recurrent(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind == "LSTM":
            self.rnn: nn.RNNBase = nn.LSTM(3, 4, batch_first=True)
        elif kind == "GRU":
            self.rnn = nn.GRU(3, 4, batch_first=True)
        else:
            self.rnn = nn.RNN(3, 4, batch_first=True, nonlinearity=kind)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(x)
        return self.fc(out[:, -1] + out.mean(dim=1))


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "tanh", "relu"])
def test_recurrent_layers_on_the_capture_path_equal_the_engine(
    kind: str, kernels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``loss.backward()`` under the capture hooks (the PrivacyEngine path) for every
    recurrent kind: no parameter gets an autograd gradient from the fused kernels (an Elman
    RNN's ``weight_hh`` did, and the capture refused it as a use outside its module), and the
    clipped sums equal the engine's own backward on the same batch in float64."""

    monkeypatch.setattr(decomposed, "_USE_KERNELS", kernels)
    torch.manual_seed(6)
    model = _Recurrent(kind).double()
    x, y = torch.randn(5, 6, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    want, _, want_norms = ClippedGradientEngine(
        model, nn.CrossEntropyLoss(), max_grad_norm=0.3
    ).clipped_grad_sum(x, y)
    sums, n, norms = _captured(model, x, y, 0.3)
    assert n == 5
    torch.testing.assert_close(norms, want_norms, rtol=1e-9, atol=1e-12)
    for k in want:
        torch.testing.assert_close(sums[k], want[k], rtol=1e-9, atol=1e-12)


def _gru_reference(
    gi: Tensor, e: Tensor, h0: Tensor, w_hh: Tensor, b_hh: Tensor | None
) -> tuple[Tensor, Tensor]:
    """torch's GRU equations step by step under autograd; ``e`` (zeros) is added to the
    hidden projection, so its gradient is the hidden map's output gradient."""
    h, outs = h0, []
    for t in range(gi.shape[1]):
        gh = h @ w_hh.t() + (0 if b_hh is None else b_hh) + e[:, t]
        r_i, z_i, n_i = gi[:, t].chunk(3, dim=1)
        r_h, z_h, n_h = gh.chunk(3, dim=1)
        r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
        n = torch.tanh(n_i + r * n_h)
        h = (1 - z) * n + z * h
        outs.append(h)
    return torch.stack(outs, dim=1), h


def _gru_case(dt: torch.dtype, bias: bool) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(9)
    b, t, hid = 5, 8, 6
    gi = 2 * torch.randn(b, t, 3 * hid, generator=g, dtype=dt)
    h0 = torch.randn(b, hid, generator=g, dtype=dt)
    w_hh = torch.randn(3 * hid, hid, generator=g, dtype=dt)
    b_hh = torch.randn(3 * hid, generator=g, dtype=dt) if bias else None
    ups = (
        torch.randn(b, t, hid, generator=g, dtype=dt),
        torch.randn(b, hid, generator=g, dtype=dt),
    )
    return gi, h0, w_hh, b_hh, *ups  # type: ignore[return-value]


@needs_numba
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("upstream", ["all", "h_n", "outputs"])
def test_compiled_gru_scan_equals_autograd_in_float64(bias: bool, upstream: str) -> None:
    """The compiled GRU forward and backward against autograd in float64: outputs, ``h_n``,
    and the gradients at the input projection, at the hidden projection (through the slot
    tensor) and at ``h_0``."""
    dt = torch.float64
    gi, h0, w_hh, b_hh, g_out, g_h = _gru_case(dt, bias)
    leaves = [gi.clone().requires_grad_(), torch.zeros_like(gi).requires_grad_()]
    leaves.append(h0.clone().requires_grad_())
    ref = _gru_reference(*leaves, w_hh, b_hh)
    mine = [gi.clone().requires_grad_(), h0.clone().requires_grad_()]
    slot = decomposed._GateSlot.apply(mine[0])
    got = decomposed._GRUScan.apply(mine[0], slot, mine[1], w_hh, b_hh)
    for r, o in zip(ref, got, strict=True):
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)
    given = {"all": (g_out, g_h), "h_n": (None, g_h), "outputs": (g_out, None)}[upstream]
    pick = [k for k in range(2) if given[k] is not None]
    want = torch.autograd.grad([ref[k] for k in pick], leaves, [given[k] for k in pick])
    have = torch.autograd.grad(
        [got[k] for k in pick], [mine[0], slot, mine[1]], [given[k] for k in pick]
    )
    for r, o in zip(want, have, strict=True):
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)
    # the hidden map's gradient differs from the input map's in the n block (factor r)
    assert not torch.allclose(have[0], have[1])


@needs_numba
def test_compiled_gru_float32_matches_float64_autograd() -> None:
    gi, h0, w_hh, b_hh, g_out, g_h = _gru_case(torch.float64, True)
    leaves = [gi.clone().requires_grad_(), torch.zeros_like(gi).requires_grad_()]
    leaves.append(h0.clone().requires_grad_())
    ref = _gru_reference(*leaves, w_hh, b_hh)
    want = torch.autograd.grad(ref, leaves, [g_out, g_h])
    mine = [gi.float().requires_grad_(), h0.float().requires_grad_()]
    slot = decomposed._GateSlot.apply(mine[0])
    got = decomposed._GRUScan.apply(mine[0], slot, mine[1], w_hh.float(), b_hh.float())  # type: ignore[union-attr]
    for r, o in zip(ref, got, strict=True):
        torch.testing.assert_close(o.double(), r, rtol=0, atol=2e-6)
    have = torch.autograd.grad(got, [mine[0], slot, mine[1]], [g_out.float(), g_h.float()])
    for r, o in zip(want, have, strict=True):
        torch.testing.assert_close(o.double(), r, rtol=2e-5, atol=2e-5)


@needs_numba
@pytest.mark.parametrize("dt", [torch.float64, torch.float32])
@pytest.mark.parametrize("packed", [False, True])
def test_backward_scan_sums_the_gate_gradients_over_the_steps(
    dt: torch.dtype, packed: bool
) -> None:
    """The compiled LSTM backward's per-example sums of the gate gradients (the bias
    gradients the engine uses, :func:`decomposed.step_sums`) equal ``dz.sum(1)`` in float64
    (float32: within the ``T u sum_t |dz_t|`` bound of its float32 additions), and their
    squared norms equal the float64 sums of squares; packed masks (zero gate gradients at
    invalid steps) included; none formed when not asked for."""
    gi, h0, c0, w_hh, b_hh, g_out, g_h, g_c = _case(dt, True)
    valid = torch.ones(5, 9, dtype=torch.bool)
    valid[1, 6:] = False
    valid[3, :4] = False
    mask = valid if packed else None
    _, acts, cs, tcs, *_ = decomposed._compiled_forward(gi, h0, c0, w_hh, b_hh, mask)
    dz, dh, dc, step = decomposed._compiled_backward(acts, cs, tcs, w_hh, g_out, g_h, g_c, mask)
    assert step is not None
    sums, sq = step
    assert sums.dtype == sq.dtype == torch.float64 and sums.shape == (5, 24) and sq.shape == (5,)
    want = dz.double().sum(dim=1)
    if dt == torch.float64:
        torch.testing.assert_close(sums, want, rtol=0, atol=1e-13)
    else:
        bound = 9 * 2.0**-24 * dz.double().abs().sum(dim=1)
        assert bool((sums - want).abs().le(bound).all())
        assert not torch.equal(sums, torch.zeros_like(sums))
    torch.testing.assert_close(sq, sums.pow(2).sum(dim=1), rtol=1e-15, atol=0)
    again = decomposed._compiled_backward(acts, cs, tcs, w_hh, g_out, g_h, g_c, mask, False)
    assert again[3] is None
    for a, b in zip(again[:3], (dz, dh, dc), strict=True):
        assert torch.equal(a, b)


def test_step_sums_are_dropped_when_the_gradients_change() -> None:
    """:func:`decomposed.step_sums` hands back what the kernel attached, and nothing once the
    tensor was changed in place (autograd accumulating a second gradient into the buffer) or
    for another tensor (a view, a copy)."""
    b = torch.randn(3, 4, 5)
    sums = (b.double().sum(dim=1), b.double().sum(dim=1).pow(2).sum(dim=1))
    assert decomposed.step_sums(b) is None
    decomposed.attach_step_sums(b, sums)
    assert decomposed.step_sums(b) is sums
    assert decomposed.step_sums(b.view(3, 4, 5)) is None
    assert decomposed.step_sums(b.clone()) is None
    b.add_(1.0)
    assert decomposed.step_sums(b) is None


@needs_numba
@pytest.mark.parametrize("packed", [False, True])
def test_gru_backward_scan_sums_both_maps_gradients_over_the_steps(packed: bool) -> None:
    """The compiled GRU backward attaches to its gradients at the input and hidden maps
    their per-example sums over the steps and squared norms (float64, equal to ``.sum(1)``;
    3H = 18 columns, not a multiple of the kernel's four partial sums)."""
    gi, h0, w_hh, b_hh, g_out, _ = _gru_case(torch.float64, True)
    valid = torch.ones(5, 8, dtype=torch.bool)
    valid[2, 5:] = False
    gi = gi.requires_grad_()
    slot = decomposed._GateSlot.apply(gi)
    out, _ = decomposed._GRUScan.apply(gi, slot, h0, w_hh, b_hh, valid if packed else None)
    dgi, dgh = torch.autograd.grad(out, [gi, slot], g_out)
    for g in (dgi, dgh):
        got = decomposed.step_sums(g)
        assert got is not None
        torch.testing.assert_close(got[0], g.sum(dim=1), rtol=0, atol=1e-13)
        torch.testing.assert_close(got[1], got[0].pow(2).sum(dim=1), rtol=1e-15, atol=0)
    assert not torch.allclose(dgi, dgh)


class _GateNet(nn.Module):
    """An LSTM (whose gate gradients both maps share) or a GRU, read at every output and at
    ``h_n``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.rnn = (nn.LSTM if kind == "LSTM" else nn.GRU)(3, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        out, h = self.rnn(x)
        h = h[0] if isinstance(h, tuple) else h
        return self.fc(out.mean(dim=1) + h[0])


@needs_numba
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("clip", [1e12, 0.05])
def test_capture_path_with_the_scans_bias_sums_equals_batch_of_one(
    clip: float, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path users run (capture hooks, ``loss.backward()``) with the bias gradients and
    their norms taken from the compiled backward scan (checked: the engine was handed them):
    float64 per-example norms and clipped sums equal a batch-of-one loop over the same
    model, and the engine's own re-reduction of the gate gradients (switched off) gives the
    same."""
    torch.manual_seed(11)
    model = _GateNet(kind).double()
    x, y = torch.randn(6, 7, 3, dtype=torch.float64), torch.randint(0, 2, (6,))
    given: list[bool] = []
    real = ghost.SharedOutputGrads.__init__

    def spy(self: ghost.SharedOutputGrads, b: Tensor, sums: Any = None) -> None:
        given.append(sums is not None)
        real(self, b, sums)

    monkeypatch.setattr(ghost.SharedOutputGrads, "__init__", spy)
    sums, n, norms = _captured(model, x, y, clip)
    assert n == 6 and given and all(given)
    params = dict(model.named_parameters())
    want = {k: torch.zeros_like(p) for k, p in params.items()}
    for i in range(6):
        loss = nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, list(params.values()))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        torch.testing.assert_close(norms[i], norm, rtol=1e-10, atol=1e-13)
        scale = torch.clamp(clip / (norm * (1 + 1e-6)), max=1.0)
        for k, g in zip(params, grads, strict=True):
            want[k] += scale * g
    for k in want:
        torch.testing.assert_close(sums[k], want[k], rtol=1e-9, atol=1e-13)
    given.clear()
    monkeypatch.setattr(decomposed, "_GATE_SUMS", False)
    off, _, off_norms = _captured(model, x, y, clip)
    assert not any(given)
    torch.testing.assert_close(off_norms, norms, rtol=1e-12, atol=0)
    for k in want:
        torch.testing.assert_close(off[k], sums[k], rtol=1e-12, atol=1e-15)


@needs_numba
def test_scans_write_the_previous_states_of_packed_sequences() -> None:
    """The state before each step that the LSTM and GRU kernels write (the hidden map's
    recorded input) equals :func:`decomposed._previous_states` of their outputs, with and
    without a packed mask (valid steps first, as in a forward direction, or last, as in a
    reversed one: ``h_0`` after the invalid steps)."""
    gi, h0, c0, w_hh, b_hh = _case(torch.float32, True)[:5]
    valid = torch.ones(5, 9, dtype=torch.bool)
    valid[1, 6:] = False
    valid[3, :4] = False
    for mask in (None, valid):
        hs, *_, prev = decomposed._compiled_forward(gi, h0, c0, w_hh, b_hh, mask)
        assert torch.equal(prev, decomposed._previous_states(h0, hs, mask))
        g3 = gi[:, :, : 3 * 6].contiguous()
        prevs: list[Tensor] = []
        out, _ = decomposed._GRUScan.apply(
            g3, torch.zeros_like(g3), h0, w_hh[: 3 * 6], b_hh[: 3 * 6], mask, prevs
        )  # type: ignore[index]
        assert torch.equal(prevs[0], decomposed._previous_states(h0, out, mask))


class _PackedWithState(nn.Module):
    """Packed sequences (unsorted lengths) into a bidirectional LSTM/GRU whose initial
    state depends on the example (so the reversed direction starts from a non-zero state
    after its padding), using the outputs and the final states."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        cls = nn.LSTM if kind == "LSTM" else nn.GRU
        self.rnn = cls(3, 4, batch_first=True, bidirectional=True)
        self.init = nn.Linear(3, 4)
        self.fc = nn.Linear(16, 2)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        h0 = torch.tanh(self.init(x[:, 0])).unsqueeze(0).repeat(2, 1, 1)
        hx = (h0, 0.5 * h0) if isinstance(self.rnn, nn.LSTM) else h0
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, h = self.rnn(packed, hx)
        h = h[0] if isinstance(h, tuple) else h
        padded, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return self.fc(torch.cat([padded.sum(1), h[0], h[1]], dim=1))


@pytest.mark.parametrize("kernels", [True, False])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_packed_sequences_with_initial_states_match_each_example_alone(
    kind: str, kernels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed sequences through the compiled scans (masks: states kept past each example's
    length, outputs zero; the reversed direction reads its initial state after the padding)
    and through the torch loops: per-example gradients equal torch's own module run on one
    example at a time, in float64."""
    monkeypatch.setattr(decomposed, "_USE_KERNELS", kernels)
    torch.manual_seed(8)
    model = _PackedWithState(kind).double()
    x = torch.randn(5, 6, 3, dtype=torch.float64)
    lengths, y = torch.tensor([6, 2, 1, 5, 3]), torch.randint(0, 2, (5,))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=1e12)
    sums, _, norms = engine.clipped_grad_sum((x, lengths), y)
    params = dict(model.named_parameters())
    want = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(5):
        out = model(x[i : i + 1], lengths[i : i + 1])
        grads = torch.autograd.grad(nn.CrossEntropyLoss()(out, y[i : i + 1]), list(params.values()))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        torch.testing.assert_close(norms[i], norm, rtol=1e-9, atol=1e-12)
        for n, g in zip(params, grads, strict=True):
            want[n] += g
    for n in want:
        torch.testing.assert_close(sums[n], want[n], rtol=1e-9, atol=1e-12)


@pytest.mark.skipif(not _scan_kernels.available(), reason="numba not installed")
def test_kernels_are_defined_without_a_writable_numba_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read-only install run by a user without a writable cache directory: numba finds no
    cache locator and raises RuntimeError when a ``cache=True`` function is defined, which
    made ``import renyi.dpsgd`` fail. The kernels are then defined uncached (compiled once
    per process). Only the definitions run here (no compilation)."""
    import importlib

    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # numba < 0.61: private
    monkeypatch.setattr(impl, "_locator_classes", [])
    try:
        uncached = importlib.reload(_scan_kernels)
        for fn in (uncached.lstm_forward, uncached.gru_backward, uncached.tanh32):
            assert isinstance(fn._cache, caching.NullCache)
    finally:
        monkeypatch.undo()
        importlib.reload(_scan_kernels)
    assert not isinstance(_scan_kernels.tanh32._cache, caching.NullCache)


@needs_numba
@pytest.mark.parametrize(
    "shape",
    [
        (64, 64, 256),  # the benchmark's forward: full 64-column panels, 4-row tiles
        (64, 256, 64),  # its backward
        (7, 33, 200),  # a row tail (7 = 4 + 3), panels, 16-column tiles, scalar columns
        (3, 5, 13),  # rows and columns below a tile
        (2, 0, 70),  # nothing to sum: zeros
    ],
)
def test_own_float32_products_are_float32_dot_products(shape: tuple[int, int, int]) -> None:
    """The scans' own float32 products (:func:`_scan_kernels.matmul32`, register tiles, used
    on AVX-512 CPUs instead of OpenBLAS) and the clipped sums' (``matmul_tn32``) against
    the float64 product: each entry is a
    float32 dot product summed in order, so within ``K u sum_k |a_ik b_kj|`` (``u =
    2**-24``, the bound for a sum of ``K`` rounded terms); a missing or repeated term, a
    wrong stride or a tile written to the wrong place is off by about ``|a_ik b_kj|``."""
    m, k, n = shape
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = (k + 1) * 2.0**-24 * (np.abs(a64) @ np.abs(b64))
    c = np.full((m, n), np.nan, dtype=np.float32)
    _scan_kernels.matmul32(a, b, c)
    assert np.all(np.abs(c - a64 @ b64) <= bound)
    if k > 1:  # the tiles read a's rows as vectors: strided rows are refused
        with pytest.raises(ValueError, match="contiguous"):
            _scan_kernels.matmul32(a[:, ::2], b[: (k + 1) // 2], c)
    # a^T b: the clipped sums' kernel, a given as [K, M] (passes of 128 rows of k), with
    # no scaling (one weight 1) and with a weight per group of rows (2, 3 or 5 groups: the
    # b-entries scaled, fl(b s), before their products)
    at = np.ascontiguousarray(a.T)
    c = np.full((m, n), np.nan, dtype=np.float32)
    _scan_kernels.matmul_tn32(at, b, c, np.ones(1, dtype=np.float32))
    assert np.all(np.abs(c - a64 @ b64) <= bound)
    if k:
        groups = next(g for g in (2, 3, 5, 1) if k % g == 0)
        w = rng.uniform(0.1, 1.0, groups).astype(np.float32)
        s = np.repeat(w, k // groups)
        scaled = (b * s[:, None]).astype(np.float64)  # fl(b s), as the kernel rounds it
        c = np.full((m, n), np.nan, dtype=np.float32)
        _scan_kernels.matmul_tn32(at, b, c, w)
        assert np.all(
            np.abs(c - a64 @ scaled) <= (k + 1) * 2.0**-24 * (np.abs(a64) @ np.abs(scaled))
        )


@needs_numba
@pytest.mark.parametrize(
    "shape",
    [
        (3, 32, 256),  # an LSTM's gate gradients: whole 4 x 4 blocks, K a multiple of 16
        (2, 9, 37),  # a row tail (9 = 8 + 1) and a k tail (37 = 32 + 5)
        (2, 3, 5),  # below a tile
    ],
)
def test_own_grams_are_float32_dot_products(shape: tuple[int, int, int]) -> None:
    """The per-example Gram matrices of the norms (:func:`_scan_kernels.grams32`, the
    upper triangle by 4 x 4 tiles, mirrored) against float64: within ``(K + 1) u |x_i|
    |x_j|`` and exactly symmetric; through ``ghost._grams`` (which chooses the kernel)
    too."""
    batch, steps, k = shape
    x = torch.randn(batch, steps, k, generator=torch.Generator().manual_seed(2))
    want = torch.bmm(x.double(), x.double().transpose(1, 2))
    bound = (k + 1) * 2.0**-24 * torch.bmm(x.double().abs(), x.double().abs().transpose(1, 2))
    g = torch.full((batch, steps, steps), float("nan"))
    _scan_kernels.grams32(x.numpy(), g.numpy())
    for got in (g, ghost._grams(x)):
        assert got.dtype == torch.float32
        assert bool(((got.double() - want).abs() <= bound).all())
        assert torch.equal(got, got.transpose(1, 2))


@needs_numba
def test_gram_dots_equal_float64_products_past_float32_range() -> None:
    """The per-example ``sum_ij ga[i, j] gb[i, j]`` of two float32 Gram matrices in float64
    (``_scan_kernels.gram_dots``, through ``ghost._gram_dots``): equal to torch's float64
    product and sum to float64 rounding, finite where the products pass float32's range
    (entries 1e30 x 1e30), NaN where an entry is NaN."""
    g = torch.Generator().manual_seed(4)
    ga = torch.randn(3, 9, 9, generator=g) * 1e30
    gb = torch.randn(3, 9, 9, generator=g) * 1e30
    gb[2, 4, 5] = float("nan")
    want = (ga.double() * gb.double()).sum(dim=(1, 2))
    got = ghost._gram_dots(ga, gb)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got[:2], want[:2], rtol=1e-12, atol=0.0)
    assert bool(torch.isfinite(got[:2]).all()) and bool(torch.isnan(got[2]))
    out = torch.empty(3, dtype=torch.float64)
    _scan_kernels.gram_dots(ga.numpy(), gb.numpy(), out.numpy())
    torch.testing.assert_close(out[:2], want[:2], rtol=1e-12, atol=0.0)


@needs_numba
def test_clipped_sums_by_own_kernel_equal_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sequence maps' clipped sums ``sum_i w_i b_i^T a_i`` by the own kernel
    (LSTM-shaped: ``[B, T, 4H]`` gate gradients, ``[B, T, H]`` inputs, ``B T = 300``, more
    than two passes of 128) against float64, and the cases it leaves to oneDNN/torch (rows
    not whole tiles, float64, kernels off)."""
    g = torch.Generator().manual_seed(5)
    b = torch.randn(6, 50, 256, generator=g)
    a = torch.randn(6, 50, 64, generator=g)
    w = torch.rand(6, generator=g)
    aw = (a * w[:, None, None]).double().reshape(-1, 64)  # w rounded in as the kernel does
    want = b.double().reshape(-1, 256).t() @ aw
    bound = 301 * 2.0**-24 * (b.double().reshape(-1, 256).abs().t() @ aw.abs())
    b2, a2 = b.reshape(-1, 256), a.reshape(-1, 64)
    assert ghost._own_tn_applies(b2, a2) == _scan_kernels.OWN_PRODUCTS
    assert not ghost._own_tn_applies(b2[:, :255].contiguous(), a2)  # o not a multiple of 4
    assert not ghost._own_tn_applies(b2, torch.randn(300, 256))  # d past 128: oneDNN
    assert not ghost._own_tn_applies(b2.double(), a2.double())
    got = ghost._weight_sum(b, a, w)
    assert got.dtype == torch.float32
    assert bool(((got.double() - want).abs() <= bound).all())
    monkeypatch.setattr(_scan_kernels, "OWN_PRODUCTS", False)
    assert not ghost._own_tn_applies(b2, a2)
    torch.testing.assert_close(ghost._weight_sum(b, a, w).double(), want, rtol=1e-5, atol=1e-3)


@needs_numba
@pytest.mark.parametrize("own", [True, False])
def test_float32_scans_with_own_products_match_float64_autograd(
    own: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LSTM and GRU scans in float32 at hidden size 64 (so the forward's ``[B, 64] x
    [64, 4H]`` and the backward's ``[B, 4H] x [4H, 64]`` products take the full-panel tiles),
    with the own products and with BLAS, against autograd in float64. On a CPU without
    AVX-512 both runs take BLAS."""
    monkeypatch.setattr(_scan_kernels, "OWN_PRODUCTS", own and _scan_kernels.OWN_PRODUCTS)
    assert _scan_kernels.own_products(np.float32, 1) == (own and _scan_kernels._has_avx512())
    assert not _scan_kernels.own_products(np.float64, 1)
    assert not _scan_kernels.own_products(np.float32, 2)
    g = torch.Generator().manual_seed(11)
    b, t, hid = 6, 5, 64
    for gates in (4, 3):
        gi = torch.randn(b, t, gates * hid, generator=g, dtype=torch.float64)
        h0 = torch.randn(b, hid, generator=g, dtype=torch.float64)
        w_hh = torch.randn(gates * hid, hid, generator=g, dtype=torch.float64) / 8
        b_hh = torch.randn(gates * hid, generator=g, dtype=torch.float64)
        g_out = torch.randn(b, t, hid, generator=g, dtype=torch.float64)
        ref_in = [gi.clone().requires_grad_(), h0.clone().requires_grad_()]
        mine = [gi.float().requires_grad_(), h0.float().requires_grad_()]
        if gates == 4:
            c0 = torch.randn(b, hid, generator=g, dtype=torch.float64)
            ref = _reference(ref_in[0], ref_in[1], c0, w_hh, b_hh)[0]
            got = decomposed._LSTMScan.apply(*mine, c0.float(), w_hh.float(), b_hh.float())[0]  # type: ignore[index]
            wrt = mine
        else:
            ref = _gru_reference(ref_in[0], torch.zeros_like(gi), ref_in[1], w_hh, b_hh)[0]
            slot = decomposed._GateSlot.apply(mine[0])
            got = decomposed._GRUScan.apply(mine[0], slot, mine[1], w_hh.float(), b_hh.float())[0]  # type: ignore[index]
            wrt = [mine[0], mine[1]]
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=5e-6)
        want = torch.autograd.grad(ref, ref_in, g_out)
        have = torch.autograd.grad(got, wrt, g_out.float())
        for r, o in zip(want, have, strict=True):
            torch.testing.assert_close(o.double(), r, rtol=2e-5, atol=2e-5)
