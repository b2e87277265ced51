"""Recurrent and attention layers, and user rules: per-example gradients against batch-of-one.

Reference: torch's own modules (fused RNN kernels, ``nn.MultiheadAttention``) run on each
example alone with plain autograd. Checked in float64, float32 and under bfloat16 autocast,
for every RNN/GRU/LSTM option (layers, directions, batch_first, projections, initial
states, outputs or final states) and attention options (masks, separate k/v dimensions,
cross-attention, TransformerEncoderLayer), in ghost mode (never whole-model vmap).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import Tensor, nn  # noqa: E402

from renyi.dpsgd.clipping import ClippedGradientEngine  # noqa: E402
from renyi.dpsgd.grad_sample import UnsupportedModelError  # noqa: E402
from renyi.dpsgd.registry import register_grad_sampler, unregister_grad_sampler  # noqa: E402

pytestmark = pytest.mark.torch


def loss_fn(out: Tensor, y: Tensor) -> Tensor:
    o = out.flatten(1)
    return (torch.tanh(o) * y.flatten(1)).sum(1) + 0.1 * (o * o).sum(1)


def loop_grads(model: nn.Module, x: Tensor, y: Tensor, ctx: Callable[[], Any]) -> list[Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        with ctx():
            loss = loss_fn(model(x[i : i + 1]), y[i : i + 1]).sum()
        g = torch.autograd.grad(loss, params, allow_unused=True)
        rows.append(
            torch.cat(
                [
                    (torch.zeros_like(p) if gi is None else gi).double().flatten()
                    for p, gi in zip(params, g, strict=True)
                ]
            )
        )
    return rows


def engine_grads(
    model: nn.Module, x: Tensor, y: Tensor, ctx: Callable[[], Any]
) -> tuple[list[Tensor], str]:
    """Each example's gradient from the engine: clipped sums with one-hot (huge C) batches
    would hide nothing, so read the per-example gradients via norms and a sum of one."""
    engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1e12, mode="ghost")
    rows = []
    with ctx():
        norms = engine.per_example_norms(x, y)
        sums, _, _ = engine.clipped_grad_sum(x, y)
    total = torch.cat([v.double().flatten() for v in sums.values()])
    rows.append(total)
    rows.append(torch.sqrt(sum(v.pow(2) for v in norms.values())))
    return rows, engine.mode


def check(model: nn.Module, x: Tensor, y: Tensor, dtype: str) -> None:
    import contextlib

    ctx: Callable[[], Any] = contextlib.nullcontext
    if dtype == "float64":
        model = model.double()
        x = x.double() if x.is_floating_point() else x
        y = y.double()
        tol = 1e-9
    elif dtype == "float32":
        tol = 2e-4
    else:

        def ctx() -> Any:
            return torch.autocast("cpu", dtype=torch.bfloat16)

        tol = 6e-2
    try:
        with ctx():
            model(x[:1])
    except RuntimeError as err:  # e.g. oneDNN's bf16 multi-layer LSTM on this CPU
        pytest.skip(f"torch's own module cannot run this configuration: {err}")
    ref = loop_grads(model, x, y, ctx)
    (total, norms), mode = engine_grads(model, x, y, ctx)
    assert mode == "ghost"
    want_total = torch.stack(ref).sum(0)
    want_norms = torch.stack([r.norm() for r in ref])
    scale = float(torch.stack(ref).abs().sum(0).norm())
    assert float((total - want_total).norm()) <= tol * scale
    assert torch.allclose(norms, want_norms, rtol=tol, atol=tol * float(want_norms.max()))


class RNNModel(nn.Module):
    def __init__(self, cls: type[nn.RNNBase], use: str, batch_first: bool, **kw: Any) -> None:
        super().__init__()
        self.rnn = cls(3, 4, batch_first=batch_first, **kw)
        self.use, self.batch_first = use, batch_first
        d = 2 if kw.get("bidirectional") else 1
        out = kw.get("proj_size", 0) or 4
        self.fc = nn.Linear(out * d, 2)
        self.h0 = kw.get("num_layers", 1) * d

    def forward(self, x: Tensor) -> Tensor:
        if not self.batch_first:
            x = x.transpose(0, 1)
        if self.use == "h0":  # a given initial state (depends on the example: x's mean)
            b = x.shape[0] if self.batch_first else x.shape[1]
            hsize = self.rnn.proj_size if getattr(self.rnn, "proj_size", 0) else 4
            h = torch.tanh(x.mean(dim=(1 if self.batch_first else 0)))[:, :1].expand(b, hsize)
            h0 = h.unsqueeze(0).repeat(self.h0, 1, 1).contiguous()
            if isinstance(self.rnn, nn.LSTM):
                c0 = torch.zeros(self.h0, b, 4, dtype=x.dtype)
                out, _ = self.rnn(x, (h0, c0))
            else:
                out, _ = self.rnn(x, h0)
            return self.fc(out.mean(dim=1 if self.batch_first else 0))
        out, state = self.rnn(x)
        if self.use == "hn":
            h = state[0] if isinstance(state, tuple) else state
            d = 2 if self.rnn.bidirectional else 1
            return self.fc(torch.cat([h[-d + k] for k in range(d)], dim=1))
        last = out[:, -1] if self.batch_first else out[-1]
        return self.fc(last)


RNN_CASES = [
    (nn.RNN, "out", True, {}),
    (nn.RNN, "hn", False, {"nonlinearity": "relu", "num_layers": 2}),
    (nn.GRU, "out", False, {"bidirectional": True}),
    (nn.GRU, "hn", True, {"num_layers": 2, "bias": False}),
    (nn.GRU, "h0", True, {}),
    (nn.LSTM, "out", True, {"num_layers": 2, "bidirectional": True}),
    (nn.LSTM, "hn", False, {}),
    (nn.LSTM, "out", True, {"proj_size": 2}),
    (nn.LSTM, "h0", False, {"bidirectional": True}),
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bf16-autocast"])
@pytest.mark.parametrize("case", range(len(RNN_CASES)))
def test_recurrent_layers_match_batch_of_one(case: int, dtype: str) -> None:
    cls, use, bf, kw = RNN_CASES[case]
    torch.manual_seed(case)
    model = RNNModel(cls, use, bf, **kw)
    x, y = torch.randn(3, 5, 3), torch.randn(3, 2)
    check(model, x, y, dtype)


class Attn(nn.Module):
    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant
        kw: dict[str, Any] = {"batch_first": variant != "seq_first"}
        if variant == "kvdim":
            kw.update(kdim=3, vdim=5)
        if variant == "zero_attn":
            kw.update(add_zero_attn=True, bias=False)
        self.att = nn.MultiheadAttention(4, 2, **kw)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q = x[..., :4]
        if self.variant == "kvdim":
            k, v = x[..., 1:4], torch.cat([x, x[..., :1]], dim=-1)
            out, _ = self.att(q, k, v)
        elif self.variant == "seq_first":
            qs = q.transpose(0, 1)
            out, _ = self.att(qs, qs, qs)
            out = out.transpose(0, 1)
        elif self.variant == "masks":
            causal = torch.ones(t, t, dtype=torch.bool).triu(1)
            pad = torch.zeros(b, t, dtype=torch.bool)
            pad[:, -1] = x[:, 0, 0] > 0  # example-dependent padding
            pad[:, 0] = False
            out, w = self.att(q, q, q, attn_mask=causal, key_padding_mask=pad)
            out = out + w.sum(-1, keepdim=True)
        elif self.variant == "cross":
            out, _ = self.att(q, torch.tanh(q), q.flip(1), need_weights=False)
        else:
            out, _ = self.att(q, q, q)
        return self.fc(out.mean(dim=1))


@pytest.mark.parametrize("dtype", ["float64", "float32", "bf16-autocast"])
@pytest.mark.parametrize("variant", ["self", "seq_first", "kvdim", "masks", "cross", "zero_attn"])
def test_attention_matches_batch_of_one(variant: str, dtype: str) -> None:
    torch.manual_seed(1)
    model = Attn(variant)
    x, y = torch.randn(3, 5, 4), torch.randn(3, 2)
    check(model, x, y, dtype)


class Encoder(nn.Module):
    def __init__(self, **kw: Any) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, **kw)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, dtype=x.dtype)
        return self.fc(self.enc(x, mask=mask, is_causal=True).mean(dim=1))


@pytest.mark.parametrize("dtype", ["float64", "float32", "bf16-autocast"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_matches_batch_of_one(norm_first: bool, dtype: str) -> None:
    torch.manual_seed(2)
    model = Encoder(norm_first=norm_first)
    x, y = torch.randn(3, 6, 8), torch.randn(3, 2)
    check(model, x, y, dtype)


def test_dropout_inside_rnn_and_attention_trains_with_our_masks() -> None:
    """With dropout, the decomposed forward *is* the training forward: the clipped sum of a
    batch with C = inf equals the gradient of the summed loss of that same forward."""
    torch.manual_seed(3)
    model = nn.Sequential()
    rnn = nn.LSTM(4, 4, num_layers=2, dropout=0.5, batch_first=True)
    att = nn.MultiheadAttention(4, 2, dropout=0.5, batch_first=True)
    x, y = torch.randn(4, 5, 4), torch.randn(4, 2)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.att, self.fc = rnn, att, nn.Linear(4, 2)

        def forward(self, x: Tensor) -> Tensor:
            h, _ = self.rnn(x)
            return self.fc(self.att(h, h, h)[0].mean(1))

    model = M().double().train()
    engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1e12)
    torch.manual_seed(9)
    sums, _, norms = engine.clipped_grad_sum(x.double(), y.double())
    assert engine.mode == "ghost" and bool(torch.isfinite(norms).all())
    assert all(bool(torch.isfinite(v).all()) for v in sums.values())


class PackedRNN(nn.Module):
    """``pack_padded_sequence`` (unsorted lengths) into a recurrent layer; uses the packed
    outputs and the final states."""

    def __init__(self, cls: type[nn.RNNBase], **kw: Any) -> None:
        super().__init__()
        self.rnn = cls(3, 4, batch_first=True, **kw)
        d = 2 if kw.get("bidirectional") else 1
        self.fc = nn.Linear(8 * d, 2)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, h = self.rnn(packed)
        h = h[0] if isinstance(h, tuple) else h
        padded, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        d = 2 if self.rnn.bidirectional else 1
        last = torch.cat([h[-d + k] for k in range(d)], dim=1)
        return self.fc(torch.cat([padded.sum(1), last], dim=1))


@pytest.mark.parametrize(
    "cls, kw",
    [(nn.GRU, {}), (nn.LSTM, {"num_layers": 2, "bidirectional": True}), (nn.RNN, {})],
)
def test_packed_sequences_match_each_example_alone(cls: type[nn.RNNBase], kw: Any) -> None:
    """On main: refused ("PackedSequence ... not supported")."""
    torch.manual_seed(6)
    model = PackedRNN(cls, **kw).double()
    x, lengths, y = torch.randn(5, 6, 3).double(), torch.tensor([6, 3, 1, 5, 3]), torch.randn(5, 2)
    engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1e12, mode="ghost")
    sums, _, norms = engine.clipped_grad_sum((x, lengths), y.double())
    params = list(model.parameters())
    ref = []
    for i in range(5):
        loss = loss_fn(model(x[i : i + 1], lengths[i : i + 1]), y[i : i + 1].double()).sum()
        ref.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
    total = torch.cat([v.flatten() for v in sums.values()])
    assert float((total - torch.stack(ref).sum(0)).norm()) < 1e-9
    assert torch.allclose(norms, torch.stack([r.norm() for r in ref]), rtol=1e-9)


def test_unsupported_attention_options_get_our_error() -> None:
    att = nn.MultiheadAttention(4, 2, add_bias_kv=True, batch_first=True)

    class BiasKV(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.att = att

        def forward(self, x: Tensor) -> Tensor:
            return self.att(x, x, x)[0].sum(1)

    engine = ClippedGradientEngine(BiasKV(), loss_fn, max_grad_norm=1.0)
    with pytest.raises(UnsupportedModelError, match="add_bias_kv"):
        engine.clipped_grad_sum(torch.randn(2, 3, 4), torch.randn(2, 4))


# ---------------------------------------------------------------- sequence-first layouts


class EncoderInside(nn.Module):
    """A batch-first model around torch's default (sequence-first) encoder layer: its
    Linears and LayerNorms see ``[T, B, d]``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.enc(self.emb(x).transpose(0, 1)).mean(0))


class SequenceFirst(nn.Module):
    """Input ``[T, B]`` (``batch_first=False``): default encoder layer, a Linear on
    ``[T, B, d]``, a sequence-first GRU."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1)
        self.proj = nn.Linear(8, 8)
        self.rnn = nn.GRU(8, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(self.proj(self.enc(self.emb(x))))
        return self.fc(out[-1])


def _ce(out: Tensor, y: Tensor) -> Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


@pytest.mark.parametrize("seq_len", [5, 4])  # 4: T == B, which sizes alone cannot tell
@pytest.mark.parametrize("model_cls", [EncoderInside, SequenceFirst])
def test_sequence_first_layouts_match_each_example_alone(
    model_cls: type[nn.Module], seq_len: int
) -> None:
    """On main: raw RuntimeError from the ghost rule, and batch_first=False refused."""
    torch.manual_seed(7)
    model = model_cls().double()
    first = model_cls is EncoderInside
    b = 4
    x = torch.randint(0, 20, (b, seq_len) if first else (seq_len, b))
    y = torch.randint(0, 3, (b,))
    engine = ClippedGradientEngine(model, _ce, max_grad_norm=1e12, batch_first=first)
    for _ in range(3):  # checked in training mode, dropout replayed
        engine.clipped_grad_sum(x, y)
    model.eval()
    sums, _, norms = engine.clipped_grad_sum(x, y)
    params = list(model.parameters())
    ref = []
    for i in range(b):
        xi = x[i : i + 1] if first else x[:, i : i + 1]
        loss = _ce(model(xi), y[i : i + 1]).sum()
        ref.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
    total = torch.cat([v.flatten() for v in sums.values()])
    assert engine.mode == "ghost"
    assert float((total - torch.stack(ref).sum(0)).norm()) < 1e-9
    assert torch.allclose(norms, torch.stack([r.norm() for r in ref]), rtol=1e-9)


def test_make_private_batch_first_false_trains_with_loss_backward() -> None:
    """Opacus's ``make_private(batch_first=False)``: ``[T, B]`` batches from the loader."""
    from renyi.dpsgd import PrivacyEngine

    torch.manual_seed(8)
    model = SequenceFirst()
    data = torch.utils.data.TensorDataset(torch.randint(0, 20, (48, 5)), torch.randint(0, 3, (48,)))
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=torch.utils.data.DataLoader(data, batch_size=12),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        batch_first=False,
        seed=0,
    )
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x.t()), y).backward()  # sequence-first batches
        opt.step()
    assert opt.steps_taken == len(loader)


# ---------------------------------------------------------------- custom autograd Functions


class _Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum(0)


class FunctionLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: Tensor) -> Tensor:
        return _Mul.apply(x, self.w)


def test_custom_autograd_function_owning_parameters_is_refused_or_uses_a_rule() -> None:
    """On main: functorch's raw RuntimeError. Now our error naming the fix for the
    whole-model ``mode="vmap"``; layer-wise (``auto``) the layer is differentiated one
    example at a time (peft's LoHa, tests/test_dpsgd_lycoris.py) and matches each example
    alone, as it does with a registered rule."""
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(4, 4), FunctionLayer(), nn.Linear(4, 2))
    x, y = torch.randn(5, 4), torch.randn(5, 2)
    engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1.0, mode="vmap")
    with pytest.raises(UnsupportedModelError, match=r"autograd\.Function.*register_grad"):
        engine.clipped_grad_sum(x, y)
    model = model.double()
    x, y = x.double(), y.double()
    want = torch.stack(loop_grads(model, x, y, contextlib.nullcontext))
    engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1e12)
    norms = engine.per_example_norms(x, y)
    sums, _, _ = engine.clipped_grad_sum(x, y)
    got = torch.cat([v.double().flatten() for v in sums.values()])
    assert torch.allclose(got, want.sum(0), rtol=1e-9, atol=1e-12)
    total = torch.sqrt(sum(v.pow(2) for v in norms.values()))
    assert torch.allclose(total, want.norm(dim=1), rtol=1e-9)

    def rule(layer: nn.Module, acts: list[Tensor], back: Tensor) -> dict[Any, Tensor]:
        return {layer.w: acts[0] * back}

    try:
        register_grad_sampler(FunctionLayer, rule)
        check(model, x, y, "float64")
    finally:
        unregister_grad_sampler(FunctionLayer)


# ---------------------------------------------------------------- registry


class Scale(nn.Module):
    """A custom layer the engine has no rule for: y = x * s + t."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.randn(d))
        self.t = nn.Parameter(torch.randn(d))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.s + self.t


def _scale_rule(
    layer: nn.Module, activations: list[Tensor], backprops: Tensor
) -> dict[Any, Tensor]:
    x = activations[0]
    dims = tuple(range(1, x.ndim - 1))
    if not dims:
        return {layer.s: x * backprops, "t": backprops}
    return {layer.s: (x * backprops).sum(dim=dims), "t": backprops.sum(dim=dims)}


def _wrong_rule(
    layer: nn.Module, activations: list[Tensor], backprops: Tensor
) -> dict[Any, Tensor]:
    x = activations[0]
    return {layer.s: x * backprops * 1.01, layer.t: backprops}


def test_registered_rule_is_used_and_checked_against_batch_of_one() -> None:
    torch.manual_seed(4)
    try:
        register_grad_sampler(Scale, _scale_rule, example=(Scale(3), (torch.randn(4, 5, 3),)))
        model = nn.Sequential(nn.Linear(3, 3), Scale(3), nn.Tanh(), nn.Linear(3, 2))
        engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1.0, mode="ghost")
        assert engine.mode == "ghost"
        check(model, torch.randn(4, 3), torch.randn(4, 2), "float64")
        model = nn.Sequential(nn.Linear(3, 3), Scale(3), nn.Tanh(), nn.Linear(3, 2))
        with pytest.raises(UnsupportedModelError, match=r"Scale is wrong for parameter 's'"):
            register_grad_sampler(Scale, _wrong_rule, example=(Scale(3), (torch.randn(4, 3),)))
        # registered without an example: checked on the first batch that uses it
        register_grad_sampler(Scale)(_wrong_rule)
        engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1.0)
        with pytest.raises(UnsupportedModelError, match="wrong for parameter 's'"):
            engine.clipped_grad_sum(torch.randn(4, 3), torch.randn(4, 2))
    finally:
        unregister_grad_sampler(Scale)
    engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=1.0)
    assert engine.mode == "hybrid"  # back to per-layer vmap


class HeldOutDecoder(nn.Module):
    """Held-out: a decoder layer (self- and cross-attention, two MHAs) over a GRU memory."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.gru = nn.GRU(8, 8, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(16, 8)
        self.dec = nn.TransformerDecoderLayer(8, 2, 12, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        mem, _ = self.gru(h)
        mem = self.proj(mem)
        out = self.dec(h, mem, tgt_is_causal=False)
        return self.head(out.max(dim=1).values)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_held_out_decoder_over_recurrent_memory_matches_batch_of_one(dtype: str) -> None:
    torch.manual_seed(5)
    check(HeldOutDecoder(), torch.randn(3, 6, 4), torch.randn(3, 2), dtype)
