"""Per-example gradients and norms (ghost rules, per-layer and whole-model vmap) against an
independent batch-of-one loop: ``loss_i.backward()`` on each example alone, plain autograd.

Every supported layer is checked on random shapes (hypothesis), then small models end to end.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from renyi.dpsgd.clipping import ClippedGradientEngine  # noqa: E402
from renyi.dpsgd.ghost import ghost_layer_grads, supports_ghost  # noqa: E402
from renyi.dpsgd.grad_sample import (  # noqa: E402
    UnsupportedModelError,
    layer_per_example_grads,
    per_example_grads,
)

pytestmark = pytest.mark.torch

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def smooth_loss(out: Tensor, target: Tensor) -> Tensor:
    """A non-linear per-example loss of any output shape: one value per example."""
    o = out.flatten(1)
    return (torch.tanh(o) * target.flatten(1)).sum(1) + 0.1 * (o * o).sum(1)


def loop_grads(model: nn.Module, loss_fn: Any, x: Any, y: Tensor) -> list[dict[str, Tensor]]:
    """Reference: each example alone through the model, plain autograd, float64 copies."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    xs = x if isinstance(x, tuple) else (x,)
    res = []
    for i in range(y.shape[0]):
        out = model(*(t[i : i + 1] for t in xs))
        loss = loss_fn(out, y[i : i + 1])
        loss = loss.sum() if loss.ndim else loss
        g = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        res.append(
            {
                n: (torch.zeros_like(p) if gi is None else gi).double()
                for (n, p), gi in zip(params.items(), g, strict=True)
            }
        )
    return res


def record_call(layer: nn.Module, x: Tensor, target: Tensor) -> tuple[Any, Tensor]:
    """The call record the engine builds: input and dL/d(output) of the summed loss."""
    out = layer(x)
    b = torch.autograd.grad(smooth_loss(out, target).sum(), out)[0]
    return [((x,), {}, [b])], out


def assert_close(a: Tensor, b: Tensor, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Equal up to float32 rounding: relative to the largest entry, plus a small floor."""
    a, b = a.double(), b.double()
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = float(b.abs().max()) if b.numel() else 0.0
    assert float((a - b).abs().max()) <= rtol * scale + atol, (a, b)


# ---------------------------------------------------------------- random layers
@st.composite
def linear_case(draw: Any) -> tuple[nn.Module, Tensor]:
    d_in, d_out = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    mid = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    layer = nn.Linear(d_in, d_out, bias=draw(st.booleans()))
    return layer, torch.randn(draw(st.integers(1, 4)), *mid, d_in)


@st.composite
def conv_case(draw: Any) -> tuple[nn.Module, Tensor]:
    two_d = draw(st.booleans())
    groups = draw(st.sampled_from([1, 2]))
    c_in, c_out = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 3))
    ndim = 2 if two_d else 1
    k = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(ndim))
    size = tuple(draw(st.integers(4, 7)) for _ in range(ndim))
    padding_mode = draw(st.sampled_from(["zeros", "zeros", "reflect", "circular", "replicate"]))
    padding: Any = draw(st.sampled_from(["int", "valid", "same"]))
    stride: Any = tuple(draw(st.integers(1, 2)) for _ in range(ndim))
    if padding == "same":
        stride = 1
    elif padding == "int":
        padding = tuple(draw(st.integers(0, 1)) for _ in range(ndim))
    kind = nn.Conv2d if two_d else nn.Conv1d
    layer = kind(
        c_in,
        c_out,
        k,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=draw(st.booleans()),
        padding_mode=padding_mode,
    )
    x = torch.randn(draw(st.integers(1, 3)), c_in, *size)
    try:
        layer(x)
    except RuntimeError:  # kernel larger than the (padded) input: not a case
        from hypothesis import assume

        assume(False)
    return layer, x


@st.composite
def embedding_case(draw: Any) -> tuple[nn.Module, Tensor]:
    num, dim = draw(st.integers(2, 8)), draw(st.integers(1, 4))
    layer = nn.Embedding(num, dim, padding_idx=draw(st.sampled_from([None, 0])))
    shape = draw(st.lists(st.integers(1, 5), min_size=0, max_size=2))
    # few distinct tokens so that repeated indices within an example are common
    return layer, torch.randint(0, num, (draw(st.integers(1, 4)), *shape))


@st.composite
def norm_case(draw: Any) -> tuple[nn.Module, Tensor]:
    batch = draw(st.integers(1, 4))
    if draw(st.booleans()):
        # at least 2 normalised values (with 1, x - mean is pure rounding noise)
        shape = tuple(draw(st.lists(st.integers(2, 4), min_size=1, max_size=2)))
        layer: nn.Module = nn.LayerNorm(shape, bias=draw(st.booleans()))
        lead = draw(st.lists(st.integers(1, 3), min_size=0, max_size=1))
        x = torch.randn(batch, *lead, *shape)
    else:
        groups = draw(st.integers(1, 3))
        channels = groups * draw(st.integers(1, 2))
        layer = nn.GroupNorm(groups, channels)
        spatial = draw(st.lists(st.integers(2, 4), min_size=1, max_size=2))
        x = torch.randn(batch, channels, *spatial)
    with torch.no_grad():  # move the affine parameters away from their (1, 0) initial values
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer, x


CASES = st.one_of(linear_case(), conv_case(), embedding_case(), norm_case())


def check_layer(layer: nn.Module, x: Tensor, seed: int) -> None:
    torch.manual_seed(seed)
    assert supports_ghost(layer)
    target = torch.randn_like(layer(x))
    calls, _ = record_call(layer, x, target)
    names = [n for n, p in layer.named_parameters() if p.requires_grad]
    batch = x.shape[0]
    ref = loop_grads(layer, smooth_loss, x, target)
    weights = {n: torch.rand(batch, dtype=torch.float64) for n in names}
    rule = ghost_layer_grads(layer, calls, names, batch)
    sq = rule.sq_norms()
    summed = rule.weighted_sum(weights)
    per_layer = layer_per_example_grads(layer, (x,), {}, calls[0][2], names, batch)
    full, _ = per_example_grads(layer, smooth_loss, x, target)
    for n in names:
        want = torch.stack([r[n] for r in ref])
        assert_close(per_layer[n], want)  # per-layer vmap
        assert_close(full[n], want)  # whole-model vmap
        assert_close(sq[n], want.flatten(1).pow(2).sum(1))  # ghost norms
        want_sum = sum(w * r[n] for w, r in zip(weights[n], ref, strict=True))
        assert_close(summed[n], want_sum)  # ghost book-keeping sum


@SETTINGS
@given(case=linear_case(), seed=st.integers(0, 2**16))
def test_linear_layer_matches_loop(case: Any, seed: int) -> None:
    check_layer(*case, seed)


@SETTINGS
@given(case=conv_case(), seed=st.integers(0, 2**16))
def test_conv_layer_matches_loop(case: Any, seed: int) -> None:
    check_layer(*case, seed)


@SETTINGS
@given(case=embedding_case(), seed=st.integers(0, 2**16))
def test_embedding_layer_matches_loop(case: Any, seed: int) -> None:
    check_layer(*case, seed)


@SETTINGS
@given(case=norm_case(), seed=st.integers(0, 2**16))
def test_norm_layers_match_loop(case: Any, seed: int) -> None:
    check_layer(*case, seed)


@pytest.mark.parametrize(
    ("strategy", "groups", "padding"),
    [("bmm", 1, 1), ("bmm", 2, 0), ("grouped", 1, 0), ("gram", 1, 1), ("gram", 2, 1)],
)
def test_every_conv_strategy_is_exact(
    strategy: str, groups: int, padding: int, monkeypatch: Any
) -> None:
    """The timed choice between the three conv rules must not matter: force each one."""
    from renyi.dpsgd import ghost

    monkeypatch.setattr(ghost._ConvGrads, "_choose", lambda self: strategy)
    torch.manual_seed(3)
    layer = nn.Conv2d(
        2 * groups, 4, (3, 2), stride=(2, 1), padding=padding, dilation=(1, 2), groups=groups
    )
    x = torch.randn(6, 2 * groups, 7, 6)[2:]  # a slice: storage offset != 0
    target = torch.randn_like(layer(x))
    calls, _ = record_call(layer, x, target)
    ref = loop_grads(layer, smooth_loss, x, target)
    rule = ghost.ghost_layer_grads(layer, calls, ["weight", "bias"], 4)
    w = torch.rand(4, dtype=torch.float64)
    sq = rule.sq_norms()
    summed = rule.weighted_sum({"weight": w, "bias": w})
    for n in ["weight", "bias"]:
        assert_close(sq[n], torch.stack([r[n].pow(2).sum() for r in ref]))
        assert_close(summed[n], sum(wi * r[n] for wi, r in zip(w, ref, strict=True)))


def test_gram_path_for_long_sequences_matches_loop() -> None:
    """Linear on [B, T, d] with 2 T^2 < d p uses the Gram matrices (Li et al. 2022)."""
    from renyi.dpsgd import ghost

    torch.manual_seed(0)
    layer = nn.Linear(20, 16)
    x = torch.randn(3, 4, 20)
    target = torch.randn(3, 4, 16)
    calls, _ = record_call(layer, x, target)
    rule = ghost.ghost_layer_grads(layer, calls, ["weight", "bias"], 3)
    assert rule.use_gram  # type: ignore[attr-defined]
    ref = loop_grads(layer, smooth_loss, x, target)
    sq = rule.sq_norms()
    for n in ["weight", "bias"]:
        assert_close(sq[n], torch.stack([r[n].pow(2).sum() for r in ref]))


# ---------------------------------------------------------------- whole models
class SeqModel(nn.Module):
    """Embedding -> LayerNorm -> (Conv1d -> GroupNorm) and Linear heads on token sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 8, padding_idx=0)
        self.ln = nn.LayerNorm(8)
        self.conv = nn.Conv1d(8, 6, 3, padding="same")
        self.gn = nn.GroupNorm(2, 6)
        self.fc = nn.Linear(8, 4)
        self.head = nn.Linear(6, 4)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.ln(self.emb(tokens))  # [B, T, 8]
        c = self.gn(torch.relu(self.conv(h.transpose(1, 2))))  # [B, 6, T]
        return self.fc(h).mean(dim=1) + self.head(c.mean(dim=2))


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2, padding=1),
        nn.GroupNorm(2, 4),
        nn.Tanh(),
        nn.Conv2d(4, 6, 3),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(6, 4),
    )


def models() -> list[tuple[str, nn.Module, Tensor, Tensor]]:
    torch.manual_seed(1)
    return [
        (
            "mlp",
            nn.Sequential(nn.Linear(10, 16), nn.ReLU(inplace=True), nn.Linear(16, 4)),
            torch.randn(6, 10),
            torch.randint(0, 4, (6,)),
        ),
        ("cnn", small_cnn(), torch.randn(5, 1, 9, 9), torch.randint(0, 4, (5,))),
        ("seq", SeqModel(), torch.randint(0, 12, (6, 7)), torch.randint(0, 4, (6,))),
    ]


@pytest.mark.parametrize("name", ["mlp", "cnn", "seq"])
@pytest.mark.parametrize("mode", ["ghost", "vmap"])
def test_models_per_example_norms_and_clipped_sums(name: str, mode: str) -> None:
    _, model, x, y = next(m for m in models() if m[0] == name)
    loss = nn.CrossEntropyLoss()
    ref = loop_grads(model, loss, x, y)
    engine = ClippedGradientEngine(model, loss, max_grad_norm=1.0, mode=mode)  # type: ignore[arg-type]
    assert engine.mode == mode
    norms = engine.per_example_norms(x, y)
    for n, v in norms.items():
        assert_close(v, torch.stack([r[n].norm() for r in ref]))
    total = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in ref])
    c = float(total.median())  # about half the examples are clipped
    engine = ClippedGradientEngine(model, loss, max_grad_norm=c, mode=mode)  # type: ignore[arg-type]
    sums, losses, got_norms = engine.clipped_grad_sum(x, y)
    assert_close(got_norms, total)
    factors = torch.clamp(c / total, max=1.0)
    for n in sums:
        want = sum(f * r[n] for f, r in zip(factors, ref, strict=True))
        assert_close(sums[n], want, rtol=1e-4)
    with torch.no_grad():
        want_losses = torch.stack([loss(model(x[i : i + 1]), y[i : i + 1]) for i in range(len(y))])
    assert_close(losses, want_losses)


def test_ghost_equals_vmap_on_models() -> None:
    for _, model, x, y in models():
        loss = nn.CrossEntropyLoss()
        a = ClippedGradientEngine(model, loss, max_grad_norm=0.3, mode="ghost")
        b = ClippedGradientEngine(model, loss, max_grad_norm=0.3, mode="vmap")
        sa, la, na = a.clipped_grad_sum(x, y)
        sb, lb, nb = b.clipped_grad_sum(x, y)
        assert_close(na, nb)
        assert_close(la, lb)
        for n in sa:
            assert_close(sa[n], sb[n])


def test_hybrid_uses_vmap_for_layers_without_ghost_rule() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Linear(5, 6),
        nn.PReLU(6),
        nn.InstanceNorm1d(6, affine=True),  # per-example statistics: allowed, no ghost rule
        nn.Flatten(),
        nn.Linear(36, 3),
    )
    x, y = torch.randn(4, 6, 5), torch.randint(0, 3, (4,))
    with pytest.raises(UnsupportedModelError, match="PReLU"):
        ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.2, mode="ghost")
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.2)
    assert engine.mode == "hybrid"
    ref = loop_grads(model, nn.CrossEntropyLoss(), x, y)
    total = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in ref])
    sums, _, norms = engine.clipped_grad_sum(x, y)
    assert_close(norms, total)
    factors = torch.clamp(0.2 / total, max=1.0)
    for n in sums:
        assert_close(sums[n], sum(f * r[n] for f, r in zip(factors, ref, strict=True)))


def test_module_called_twice_and_shared_weights() -> None:
    """A layer applied twice (summed per example) and weights tied across modules (layer by
    layer: the tied weight's norm has the cross terms of its two uses)."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.out = nn.Linear(4, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.out(torch.tanh(self.fc(torch.tanh(self.fc(x)))))

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x: Tensor) -> Tensor:
            return self.b(torch.tanh(self.a(x)))

    torch.manual_seed(4)
    x, y = torch.randn(5, 4), torch.randint(0, 2, (5,))
    for model, mode in [(Twice(), "ghost"), (Tied(), "ghost")]:
        engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.1)
        assert engine.mode == mode
        ref = loop_grads(model, nn.CrossEntropyLoss(), x, y)
        total = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in ref])
        sums, _, norms = engine.clipped_grad_sum(x, y)
        assert_close(norms, total)
        factors = torch.clamp(0.1 / total, max=1.0)
        for n in sums:
            assert_close(sums[n], sum(f * r[n] for f, r in zip(factors, ref, strict=True)))


def test_tuple_inputs_and_frozen_parameters() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 4)
            self.b = nn.Linear(2, 4)

        def forward(self, x: Tensor, z: Tensor) -> Tensor:
            return self.a(x) * torch.sigmoid(self.b(z))

    torch.manual_seed(5)
    model = TwoInputs()
    model.b.bias.requires_grad_(False)
    x, z, y = torch.randn(4, 3), torch.randn(4, 2), torch.randint(0, 4, (4,))
    ref = loop_grads(model, nn.CrossEntropyLoss(), (x, z), y)
    for mode in ["ghost", "vmap"]:
        engine = ClippedGradientEngine(
            model,
            nn.CrossEntropyLoss(),
            max_grad_norm=1e6,
            mode=mode,  # type: ignore[arg-type]
        )
        sums, _, _ = engine.clipped_grad_sum((x, z), y)
        assert "b.bias" not in sums
        for n in sums:  # nothing clipped: the plain gradient of the summed loss
            assert_close(sums[n], sum(r[n] for r in ref))


def test_recurrent_and_attention_layers_have_their_own_rules() -> None:
    class Rnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(4, 5, batch_first=True)
            self.fc = nn.Linear(5, 3)

        def forward(self, x: Tensor) -> Tensor:
            _, (h, c) = self.rnn(x)  # states are [layers, B, H]: the decomposed forward
            return self.fc(h[-1] + c[-1])

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.att = nn.MultiheadAttention(4, 2, batch_first=True)
            self.fc = nn.Linear(4, 3)

        def forward(self, x: Tensor) -> Tensor:
            return self.fc(self.att(x, x, x)[0].mean(dim=1))

    torch.manual_seed(6)
    x, y = torch.randn(3, 6, 4), torch.randint(0, 3, (3,))
    for model in [Rnn(), Attention()]:
        engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.1)
        ref = loop_grads(model, nn.CrossEntropyLoss(), x, y)
        total = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in ref])
        sums, _, norms = engine.clipped_grad_sum(x, y)
        assert engine.mode == "ghost"  # no whole-model vmap fallback any more
        assert_close(norms, total)
        factors = torch.clamp(0.1 / total, max=1.0)
        for n in sums:
            assert_close(sums[n], sum(f * r[n] for f, r in zip(factors, ref, strict=True)))
    engine = ClippedGradientEngine(Rnn(), nn.CrossEntropyLoss(), max_grad_norm=1.0, mode="ghost")
    assert engine.mode == "ghost"


def test_engine_works_inside_no_grad() -> None:
    _, model, x, y = models()[1]
    for mode in ["ghost", "vmap"]:
        engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.5, mode=mode)  # type: ignore[arg-type]
        a, _, na = engine.clipped_grad_sum(x, y)
        with torch.no_grad():
            b, _, nb = engine.clipped_grad_sum(x, y)
        assert torch.equal(na, nb)
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_squared_norms_survive_float32_overflow_and_underflow() -> None:
    from renyi.dpsgd.ghost import _sq

    x = torch.tensor(
        [[1e20, 1e20, 0.0], [1e-30, 2e-30, 0.0], [0.0, 0.0, 0.0], [3.0, 4.0, 0.0]],
        dtype=torch.float32,
    ).reshape(4, 3, 1)
    got = _sq(x, (1, 2))
    want = (x.double() ** 2).sum(dim=(1, 2))  # float64 reference: no overflow at 1e40
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, rtol=1e-6, atol=0.0)
    assert float(got[0]) == pytest.approx(2e40, rel=1e-6) and float(got[1]) > 0
    assert torch.isnan(_sq(torch.tensor([[float("nan"), 1.0]]), (1,))).all()


@pytest.mark.peers
def test_per_example_norms_agree_with_opacus_grad_samples() -> None:
    """Peer oracle: Opacus's hook-based per-sample gradients (GradSampleModule) on models of
    every ghost-supported layer type give the same per-example norms."""
    opacus = pytest.importorskip("opacus")
    import warnings

    for name, model, x, y in models():
        if name == "seq":
            # Opacus 1.6 gives the padding row (padding_idx=0) a per-sample gradient that the
            # true gradient never has (our norms match the batch-of-one loop there, see
            # test_models_per_example_norms_and_clipped_sums): compare without padding tokens
            x = x.clamp_min(1)
        for m in model.modules():  # Opacus's hooks refuse in-place ops on layer outputs
            if isinstance(m, nn.ReLU):
                m.inplace = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gsm = opacus.GradSampleModule(model, loss_reduction="sum")
            loss = nn.functional.cross_entropy(gsm(x), y, reduction="sum")
            loss.backward()
        theirs = {n: p.grad_sample.detach().clone() for n, p in model.named_parameters()}
        gsm._close()
        model.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.grad_sample = None
        ours = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=1.0)
        norms = ours.per_example_norms(x, y)
        for n, g in theirs.items():
            assert_close(norms[n], g.flatten(1).double().norm(dim=1))


def clipped_reference(model: nn.Module, x: Any, y: Tensor, c: float) -> tuple[Tensor, dict]:
    ref = loop_grads(model, nn.CrossEntropyLoss(), x, y)
    total = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in ref])
    factors = torch.clamp(c / total, max=1.0)
    sums = {n: sum(f * r[n] for f, r in zip(factors, ref, strict=True)) for n in ref[0]}
    return total, sums


def test_embedding_with_max_norm_in_ghost_mode() -> None:
    """max_norm renormalises rows in place during the forward pass; the gradient (and so the
    ghost rule) is unaffected. (torch's vmap cannot batch embedding_renorm_.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(6, 3, max_norm=0.5), nn.Flatten(), nn.Linear(15, 2))
    x, y = torch.randint(0, 6, (4, 5)), torch.randint(0, 2, (4,))
    model(x)  # the first forward renormalises; the reference then sees the same weights
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.3, mode="ghost")
    sums, _, norms = engine.clipped_grad_sum(x, y)
    total, want = clipped_reference(model, x, y, 0.3)
    assert_close(norms, total)
    for n in sums:
        assert_close(sums[n], want[n])


def test_vmap_chunk_size_gives_the_same_result() -> None:
    _, model, x, y = models()[1]
    a = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.2, mode="vmap")
    b = ClippedGradientEngine(
        model, nn.CrossEntropyLoss(), max_grad_norm=0.2, mode="vmap", chunk_size=2
    )
    sa, _, na = a.clipped_grad_sum(x, y)
    sb, _, nb = b.clipped_grad_sum(x, y)
    assert_close(na, nb)
    for n in sa:
        assert_close(sa[n], sb[n])


def test_hybrid_fallback_layer_called_with_keyword_arguments() -> None:
    class Scale(nn.Module):  # no ghost rule: per-layer vmap with a batched keyword argument
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3))

        def forward(self, x: Tensor, *, shift: Tensor) -> Tensor:
            return x * self.w + shift

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = Scale()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.fc(torch.tanh(self.scale(x, shift=x**2)))

    torch.manual_seed(8)
    model, x, y = Model(), torch.randn(5, 3), torch.randint(0, 2, (5,))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.2)
    assert engine.mode == "hybrid"
    sums, _, norms = engine.clipped_grad_sum(x, y)
    total, want = clipped_reference(model, x, y, 0.2)
    assert_close(norms, total)
    for n in sums:
        assert_close(sums[n], want[n])


class TimeCumsum(nn.Module):
    """A layer without a ghost rule that works along the time axis of ``[T, B, d]``: per-layer
    vmap must call it on each example in that layout (``[T, 1, d]``), not ``[1, T, d]``."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x: Tensor) -> Tensor:
        return torch.cumsum(x, dim=0) * self.w


class SeqFirstHybrid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(3, 5), TimeCumsum(5), nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, T, 3]
        h = self.mid(torch.tanh(self.inp(x.transpose(0, 1))))  # [T, B, 5]
        return self.out(h.mean(0))


@pytest.mark.parametrize("steps", [5, 4])  # 4 == B: the layout is learned by the check
def test_hybrid_vmap_layer_is_called_in_its_own_sequence_first_layout(steps: int) -> None:
    """On main: raw error / wrong grouping for a layer without a rule on ``[T, B, d]``."""
    torch.manual_seed(9)
    model = SeqFirstHybrid().double()
    x, y = torch.randn(4, steps, 3).double(), torch.randint(0, 2, (4,))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.3)
    sums, _, norms = engine.clipped_grad_sum(x, y)
    assert engine.mode == "hybrid"
    ref = loop_grads(model, nn.CrossEntropyLoss(), x, y)
    total = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in r.values())) for r in ref])
    assert_close(norms, total, rtol=1e-9, atol=1e-12)
    factors = torch.clamp(0.3 / total, max=1.0)
    for n in sums:
        want = sum(f * r[n] for f, r in zip(factors, ref, strict=True))
        assert_close(sums[n], want, rtol=1e-5, atol=1e-12)  # the clipping margin is 1e-6
