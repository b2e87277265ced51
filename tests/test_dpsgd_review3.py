"""Held-out review of the DP-SGD speed wave (issue 24) on the path users run.

Every case goes through ``PrivacyEngine().make_private(...)`` and the user's own
``loss.backward(); optimizer.step()``; the vector under test is what the optimizer hands to
``release_noisy_sum`` (the clipped sum, before the noise: its sensitivity is what the noise
is calibrated to). Leave-one-out: removing one example moves that vector by at most ``C``
(the engine clips to ``C / (1 + CLIP_MARGIN)``, so every measured value is below ``C``; a
rescaled or leaked example would show as a value above it). Deterministic: no statistical
test here, so no false alarms.

Defects these tests found on main (each failed there):

* a parameter added to the wrapped optimizer after ``make_private``
  (``optimizer.original_optimizer.add_param_group``) was stepped with its raw gradient —
  neither clipped nor noised;
* an LSTM (packed sequences, the compiled scan) or an Elman RNN fed huge inputs (1e30, in
  one example) was refused as "gradient norm is not finite" although every per-example
  gradient is finite: the float32 Gram matrix of the inputs overflowed (inf, and inf * 0 =
  NaN where the gate gradients vanish);
* a NaN in one example's data was refused as "the loss mixes the examples" (naming a second,
  innocent example): the loss probe read 0 * NaN in a batched backward as a dependency;
* a Linear with a strided or expanded bias (a parametrization's) computed a wrong forward
  under ``make_private``: oneDNN's product read the bias as dense;
* cross-entropy with uint8 class targets (torch accepts them) raised torch's raw scatter
  error on the capture path (the closed-form seed used them as an index);
* on torch < 2.4 (pyproject allows 2.2) every capture-path backward raised torch's TypeError
  (``torch.is_autocast_enabled("cpu")`` takes no device there).
"""

from __future__ import annotations

import copy
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import Tensor, nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from renyi.dpsgd import PrivacyEngine, _onednn, _scan_kernels, decomposed  # noqa: E402
from renyi.dpsgd.grad_sample import NonFiniteGradientError  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402

pytestmark = pytest.mark.torch
C = 0.05
CE = nn.CrossEntropyLoss()


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)
    warnings.simplefilter("ignore", UserWarning)


def _private(model: nn.Module, x: Tensor, y: Tensor, **kwargs: Any) -> tuple[Any, Any]:
    params = [p for p in model.parameters() if p.requires_grad]
    module, opt, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(params, lr=0.1),
        data_loader=DataLoader(TensorDataset(x, y), batch_size=max(1, len(x))),
        noise_multiplier=1.0,
        max_grad_norm=C,
        seed=0,
        **kwargs,
    )
    opt.unlink_data_loaders()  # batches chosen by the tests, not drawn from the loader
    return module, opt


def released(
    make: Callable[[], nn.Module],
    state: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    keep: list[int] | None = None,
    *,
    autocast: torch.dtype | None = None,
    scaler: bool = False,
    loss: Callable[[Tensor, Tensor], Tensor] = CE,
) -> Tensor:
    """The clipped sum handed to the noise release for the batch ``x[keep]`` (float64), the
    loss ``loss(outputs, targets)`` over the outputs' last dimension (token-level outputs
    flattened)."""
    model = make()
    model.load_state_dict(state)
    module, opt = _private(model, x, y)
    seen: list[Tensor] = []
    release = opt.release_noisy_sum

    def spy(flat: Tensor) -> Tensor:
        seen.append(flat.detach().double().clone())
        return release(flat)

    opt.release_noisy_sum = spy
    idx = torch.arange(len(x)) if keep is None else torch.tensor(keep, dtype=torch.long)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        out = module(x[idx])
        value = loss(out.reshape(-1, out.shape[-1]), y[idx].reshape(-1))
    if scaler:
        amp = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        amp.scale(value).backward()
        amp.step(opt)
    else:
        value.backward()
        opt.step()
    assert len(seen) == 1
    return seen[0]


def leave_one_out(make: Callable[[], nn.Module], x: Tensor, y: Tensor, **kw: Any) -> float:
    """max over j of ||sum(batch) - sum(batch without j)|| / C (noise excluded)."""
    torch.manual_seed(0)
    state = make().state_dict()
    full = released(make, state, x, y, **kw)
    assert bool(torch.isfinite(full).all())
    worst = 0.0
    for j in range(len(x)):
        part = released(make, state, x, y, [i for i in range(len(x)) if i != j], **kw)
        worst = max(worst, float((full - part).norm()) / C)
    assert worst > 0.5  # C binds: an example's whole clipped gradient moves the sum
    return worst


# ----------------------------------------------------------------------------- models

T, D, H = 5, 3, 4


class RNNClassifier(nn.Module):
    """An RNN classifier; the last input channel marks the valid steps (lengths)."""

    def __init__(self, kind: str, packed: bool = True, seq_first: bool = False) -> None:
        super().__init__()
        cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
        self.rnn = cls(D, H, num_layers=2, bidirectional=True, batch_first=not seq_first)
        self.head = nn.Linear(4 * H, 3)
        self.packed, self.seq_first = packed, seq_first

    def forward(self, x: Tensor) -> Tensor:
        lengths = x[:, :, -1].sum(1).long().clamp_min(1)
        z = x[:, :, :-1].transpose(0, 1) if self.seq_first else x[:, :, :-1]
        bf = not self.seq_first
        if self.packed:
            z = pack_padded_sequence(z, lengths, batch_first=bf, enforce_sorted=False)
        out, hn = self.rnn(z)
        if self.packed:
            out, _ = pad_packed_sequence(out, batch_first=bf, total_length=T)
        h = hn[0] if isinstance(hn, tuple) else hn  # [layers * 2, B, H]
        pooled = out.sum(0 if self.seq_first else 1)
        return self.head(torch.cat([pooled, h[-1], h[-2]], dim=1))


def sequences(lengths: list[int], seed: int = 2) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(len(lengths), T, D + 1)
    for i, n in enumerate(lengths):
        x[i, :n, :D] = torch.randn(n, D, generator=g)
        x[i, :n, D] = 1.0
    return x


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3)
    )


def _labels(n: int) -> Tensor:
    return torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(9))


# ------------------------------------------------------------------ defects found on main


def test_parameter_added_to_the_wrapped_optimizer_after_set_up_is_refused() -> None:
    """A layer frozen at ``make_private``, unfrozen and added to the wrapped optimizer
    later: on main the wrapped optimizer stepped it with its raw (unclipped, unnoised)
    gradient from the user's backward. Now the step is refused and nothing moves."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    for p in model[2].parameters():
        p.requires_grad_(False)
    x, y = torch.randn(6, 5), _labels(6)
    module, opt = _private(model, x, y)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model[2].parameters():
        p.requires_grad_(True)
    opt.original_optimizer.add_param_group({"params": list(model[2].parameters())})
    opt.zero_grad()
    CE(module(x), y).backward()
    assert model[2].weight.grad is not None  # the raw gradient the wrapped step would use
    with pytest.raises(PrivacyParameterError, match="added after set-up"):
        opt.step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    with pytest.raises(PrivacyParameterError, match="no new groups"):
        opt.add_param_group({"params": []})  # the DP optimizer's own method: refused as before


@pytest.mark.parametrize(("kind", "packed"), [("lstm", True), ("rnn", False)])
def test_huge_inputs_to_a_recurrent_layer_are_clipped_not_refused(kind: str, packed: bool) -> None:
    """One example's inputs at 1e30 (its gates saturate: its gradients are finite): on main
    the float32 Gram matrix of the inputs overflowed and the step was refused as "gradient
    norm is not finite". Now the Grams are redone in float64; the released sum is finite
    and leave-one-out stays below C."""
    x = sequences([1, T, 3, 2])
    x[1, :, :D] *= 1e30
    model = RNNClassifier(kind, packed=packed)
    ref = copy.deepcopy(model).double()  # the huge example's own gradient, float64 autograd
    g = torch.autograd.grad(CE(ref(x[1:2].double()), _labels(4)[1:2]), list(ref.parameters()))
    assert all(bool(torch.isfinite(v).all()) for v in g)
    assert leave_one_out(lambda: RNNClassifier(kind, packed=packed), x, _labels(4)) <= 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_example_is_refused_as_non_finite(bad: float) -> None:
    """NaN/inf in one example's data: refused with our NonFiniteGradientError naming that
    example (on main, a NaN behind a ReLU was refused as "the loss mixes the examples",
    naming a second, innocent example); nothing is released."""
    x, y = torch.randn(6, 5), _labels(6)
    x[2, 1] = bad
    torch.manual_seed(0)
    model = mlp()
    module, opt = _private(model, x, y)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    with pytest.raises(NonFiniteGradientError, match="batch index 2"):
        CE(module(x), y).backward()
        opt.step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert opt.steps_taken == 0


def test_capture_path_runs_on_torch_before_2_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyproject allows torch >= 2.2, whose ``torch.is_autocast_enabled()`` takes no device
    (it answers for CUDA; ``is_autocast_cpu_enabled()`` for the CPU). Emulated here: on main
    every ``loss.backward()`` on the capture path raised torch's TypeError (the engine's
    book-keeping asked ``is_autocast_enabled("cpu")``). The released sums are unchanged,
    with and without CPU autocast."""
    x, y = torch.randn(5, 5, generator=torch.Generator().manual_seed(7)), _labels(5)
    torch.manual_seed(0)
    state = mlp().state_dict()
    want = {a: released(mlp, state, x, y, autocast=a) for a in (None, torch.bfloat16)}
    real = torch.is_autocast_enabled

    def before_2_4(*args: Any) -> bool:
        """torch 2.3's signature as renyi's code sees it (torch's own calls are served)."""
        if args and sys._getframe(1).f_globals.get("__name__", "").startswith("renyi."):
            raise TypeError("is_autocast_enabled() takes 0 positional arguments but 1 was given")
        return bool(real(*args)) if args else bool(real("cuda"))

    monkeypatch.setattr(torch, "is_autocast_enabled", before_2_4)
    monkeypatch.setattr(torch, "is_autocast_cpu_enabled", lambda: bool(real("cpu")))
    for a, sums in want.items():
        assert torch.equal(released(mlp, state, x, y, autocast=a), sums)


class StridedBias(nn.Module):
    """A Linear whose bias is a strided Parameter, and one whose bias is a parametrization
    returning an expanded (zero-stride) tensor (one shared bias value)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(20, 24), nn.Linear(24, 24)
        self.a.bias = nn.Parameter(torch.randn(48)[::2])
        nn.utils.parametrize.register_parametrization(self.b, "bias", _SharedBias())
        self.head = nn.Linear(24, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


class _SharedBias(nn.Module):
    def forward(self, b: Tensor) -> Tensor:
        return b[:1].expand_as(b)


def test_linear_with_a_strided_or_expanded_bias_computes_its_own_forward() -> None:
    """oneDNN's product reads the bias as a dense vector whatever its strides: on main the
    private model's forward differed from the plain model's by up to 0.68 (a strided bias)
    and 0.25 (a parametrization's expanded bias) — silently wrong logits, losses and
    updates. Now the forward equals the plain one to float32 rounding, the released sum
    equals the one by torch's kernels, and leave-one-out stays below C."""
    x, y = torch.randn(5, 20, generator=torch.Generator().manual_seed(8)), _labels(5)
    torch.manual_seed(0)
    model = StridedBias()
    plain = copy.deepcopy(model)
    module, _ = _private(model, x, y)
    torch.testing.assert_close(module(x), plain(x), rtol=1e-5, atol=1e-5)
    state = plain.state_dict()
    fast = released(StridedBias, state, x, y)
    _onednn.ENABLED = False
    try:
        slow = released(StridedBias, state, x, y)
    finally:
        _onednn.ENABLED = True
    assert float((fast - slow).abs().max()) <= 1e-5 * float(slow.abs().max())
    assert leave_one_out(StridedBias, x, y) <= 1.0


@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_with_uint8_targets_equals_int64_targets(weighted: bool) -> None:
    """torch's cross-entropy takes uint8 (Byte) class targets, e.g. labels kept as a numpy
    uint8 array. On main the closed-form seed of the capture path raised torch's raw
    "scatter(): Expected dtype int32/int64 for index" (before the wave: trained); its class
    weights would have been indexed by the uint8 targets as a mask. Now the released sum
    equals the one with int64 targets, with and without class weights, token-level too."""
    weight = torch.tensor([0.5, 1.0, 2.0]) if weighted else None
    loss = nn.CrossEntropyLoss(weight=weight)
    x, y = torch.randn(5, 5, generator=torch.Generator().manual_seed(10)), _labels(5)
    torch.manual_seed(0)
    for make, xs, ys in (
        (mlp, x, y),
        (_TokenModel, torch.randint(0, 7, (5, 4)), torch.randint(0, 3, (5, 4))),
    ):
        state = make().state_dict()
        want = released(make, state, xs, ys, loss=loss)
        got = released(make, state, xs, ys.to(torch.uint8), loss=loss)
        assert torch.equal(got, want)


class _TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(7, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.emb(x)))


# --------------------------------------------------------- checked and found sound on main


@pytest.mark.parametrize(
    ("kind", "seq_first"), [("lstm", False), ("gru", True), ("rnn", False), ("lstm", True)]
)
def test_recurrent_leave_one_out_and_kernels_off(kind: str, seq_first: bool) -> None:
    """Bidirectional 2-layer RNNs on packed sequences of lengths 1 and T, using outputs and
    h_n: leave-one-out below C; the compiled scans and the torch loops (numba "missing":
    the module's switch) release the same sum to float32 rounding; batch of one clipped."""
    x, y = sequences([1, T, 3, 1]), _labels(4)

    def make() -> nn.Module:
        return RNNClassifier(kind, seq_first=seq_first)

    assert leave_one_out(make, x, y) <= 1.0
    torch.manual_seed(0)
    state = make().state_dict()
    fast = released(make, state, x, y)
    old = decomposed._USE_KERNELS
    decomposed._USE_KERNELS = False
    try:
        slow = released(make, state, x, y)
    finally:
        decomposed._USE_KERNELS = old
    assert float((fast - slow).abs().max()) <= 1e-5 * float(slow.abs().max())
    one = released(make, state, x, y, [1])
    assert float(one.norm()) <= C


class Variants(nn.Module):
    """oneDNN's inputs as users write them: a strided (non-contiguous) input, a zero-stride
    (expanded) one on a sequence, a Linear called twice, a weight tied to another layer's,
    and a Parameter that is a transposed (non-contiguous) tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(20, 20), nn.Linear(20, 20), nn.Linear(20, 24)
        self.b.weight = self.a.weight
        self.c.weight = nn.Parameter(0.2 * torch.randn(20, 24).t())
        self.head = nn.Linear(24, 3)

    def forward(self, x: Tensor) -> Tensor:
        strided = torch.cat([x, x], 1)[:, ::2]
        h = torch.tanh(self.a(strided))
        h = torch.tanh(self.a(h)) + torch.tanh(self.b(h))
        seq = h[:, None, :].expand(-1, 3, -1)  # zero stride on the sequence dimension
        return self.head(torch.tanh(self.c(seq)).sum(1))


def test_onednn_path_equals_torch_kernels_on_awkward_inputs() -> None:
    """The oneDNN products against torch's (``_onednn.ENABLED = False``, and oneDNN
    switched off by ``torch.backends.mkldnn.flags``): the same released sum to float32
    rounding; leave-one-out below C."""
    x, y = torch.randn(5, 20, generator=torch.Generator().manual_seed(3)), _labels(5)
    torch.manual_seed(0)
    state = Variants().state_dict()
    fast = released(Variants, state, x, y)
    _onednn.ENABLED = False
    try:
        plain = released(Variants, state, x, y)
    finally:
        _onednn.ENABLED = True
    with torch.backends.mkldnn.flags(enabled=False):
        off = released(Variants, state, x, y)
    assert torch.equal(off, plain)
    assert float((fast - plain).abs().max()) <= 1e-5 * float(plain.abs().max())
    assert leave_one_out(Variants, x, y) <= 1.0


class Mixed(nn.Module):
    """float64 and float32 layers in one model, a frozen weight in between."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 8).double()
        self.b = nn.Linear(8, 8)
        self.b.weight.requires_grad_(False)
        self.c = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x.double())).float())))


def test_flat_buffer_with_mixed_dtypes_and_a_frozen_weight_equals_the_loop() -> None:
    """The released vector is, in the optimizer's parameter order, the batch-of-one loop's
    clipped gradients summed (in float64), for a model whose parameters have two
    dtypes (no common flat buffer) and a frozen weight between trainable ones."""
    from renyi.dpsgd.clipping import CLIP_MARGIN

    x, y = torch.randn(5, 5, generator=torch.Generator().manual_seed(4)), _labels(5)
    torch.manual_seed(0)
    state = Mixed().state_dict()
    got = released(Mixed, state, x, y)
    ref = Mixed()
    ref.load_state_dict(state)
    params = [p for p in ref.parameters() if p.requires_grad]
    want = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    for i in range(len(x)):
        g = torch.autograd.grad(CE(ref(x[i : i + 1]), y[i : i + 1]), params)
        flat = torch.cat([v.double().flatten() for v in g])
        want += flat * min(1.0, C / (float(flat.norm()) * (1 + CLIP_MARGIN)))
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("scaler", [False, True])
def test_autocast_and_grad_scaler_leave_one_out(scaler: bool) -> None:
    """float16 autocast on the CPU, with and without a GradScaler: leave-one-out below C."""
    x, y = torch.randn(5, 5, generator=torch.Generator().manual_seed(5)), _labels(5)
    assert leave_one_out(mlp, x, y, autocast=torch.float16, scaler=scaler) <= 1.0


@pytest.mark.skipif(not _scan_kernels.available(), reason="numba not installed")
def test_lstm_float32_kernel_never_nan_where_torch_is_finite() -> None:
    """The compiled float32 LSTM forward on gates of magnitude up to 1e4 and +-inf: never
    NaN where torch's own float32 sigmoid/tanh (torch's LSTM equations, step by step) give
    a number, and within float32 rounding of them (saturated gates agree to 1e-37)."""
    g = torch.Generator().manual_seed(6)
    scale = torch.tensor([1.0, 30.0, 1e4, 1.0])[:, None, None]
    gi = torch.randn(4, 6, 4 * H, generator=g) * scale
    gi[3, 2, ::2], gi[3, 2, 1::2] = math.inf, -math.inf
    w, b = 0.5 * torch.randn(4 * H, H, generator=g), torch.randn(4 * H, generator=g)
    h = c = torch.zeros(4, H)
    out, _, _ = decomposed._LSTMScan.apply(gi, h, c, w, b)
    ref = []
    for t in range(6):
        i, f, gg, o = (gi[:, t] + h @ w.t() + b).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        ref.append(h)
    want = torch.stack(ref, dim=1)
    assert bool(torch.isfinite(want).all())
    assert bool(torch.isfinite(out).all())
    assert float((out - want).abs().max()) <= 1e-6


@pytest.mark.slow
def test_compiled_model_releases_the_same_sum() -> None:
    """``torch.compile`` of the model (the module wrapper, and ``Module.compile()``): the
    capture path releases the same clipped sum as the eager model (oneDNN is bypassed while
    dynamo traces). Slow: inductor compiles for several seconds on the CPU."""
    x, y = torch.randn(6, 20, generator=torch.Generator().manual_seed(11)), _labels(6)

    def make() -> nn.Module:
        return nn.Sequential(
            nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3)
        )

    torch.manual_seed(0)
    state = make().state_dict()
    eager = released(make, state, x, y)

    def compiled_in_place() -> nn.Module:
        model = make()
        model.compile()
        return model

    def wrapped() -> nn.Module:
        return torch.compile(make())  # type: ignore[return-value]

    got = released(compiled_in_place, state, x, y)
    assert float((got - eager).abs().max()) <= 1e-5 * float(eager.abs().max())
    prefixed = {"_orig_mod." + k: v for k, v in state.items()}
    got = released(wrapped, prefixed, x, y)
    assert float((got - eager).abs().max()) <= 1e-5 * float(eager.abs().max())
