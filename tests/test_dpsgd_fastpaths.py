"""The fast paths of the DP-SGD step against independent references.

* ``nn.Linear`` on ``[B, d]`` inputs (``ghost._LinearGrads``): the engine's clipped summed
  gradient equals a batch-of-one autograd loop, clipped and summed, on random MLPs (with and
  without biases); the other layers and call patterns keep their previous rules.
* ``SecureRandomSource.normal``: on the same words, the normals of ``renyi.random``.
* ``DPOptimizer``: the noise is added as ``summed + sigma C z`` and the finiteness check does
  not mistake a float32 overflow of the squared norm for a non-finite gradient.
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from renyi import random as rr  # noqa: E402
from renyi.dpsgd import ghost  # noqa: E402
from renyi.dpsgd.clipping import CLIP_MARGIN, ClippedGradientEngine  # noqa: E402
from renyi.dpsgd.grad_sample import UnsupportedModelError  # noqa: E402
from renyi.dpsgd.optimizer import DPOptimizer, NonFiniteLossError  # noqa: E402
from renyi.dpsgd.sampler import PoissonSampler, SecureRandomSource, SeededRandomSource  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, RenyiError  # noqa: E402

pytestmark = pytest.mark.torch
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _quiet_insecure() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)


def reference_clipped_sum(
    model: nn.Module,
    loss_fn: Any,
    x: Tensor,
    y: Tensor,
    c: float,
    magnitude: dict[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Each example alone through the model (plain autograd), clipped to ``c``, summed.

    Clipped as the engine documents: norms are taken ``(1 + CLIP_MARGIN)`` times larger.
    If ``magnitude`` is given it receives, per parameter, the sum of the absolute clipped
    terms: the scale of the round-off of any order of summation (a sum that cancels is
    only accurate relative to its terms, not to itself).
    """
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    total = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    mag = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    for i in range(x.shape[0]):
        loss = loss_fn(model(x[i : i + 1]), y[i : i + 1]).sum()
        g = torch.autograd.grad(loss, list(params.values()))
        norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in g))
        factor = min(1.0, c / (norm * (1 + CLIP_MARGIN))) if norm > 0 else 1.0
        for n, v in zip(params, g, strict=True):
            total[n] += factor * v.double()
            mag[n] += (factor * v.double()).abs()
    if magnitude is not None:
        magnitude.update(mag)
    return total


@st.composite
def mlp_case(draw: Any) -> tuple[nn.Module, Tensor, Tensor, float]:
    widths = draw(st.lists(st.integers(1, 9), min_size=2, max_size=4))
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(widths)):
        if i:
            layers.append(draw(st.sampled_from([nn.ReLU(), nn.Tanh()])))
        layers.append(nn.Linear(d_in, d_out, bias=draw(st.booleans())))
    batch = draw(st.integers(1, 7))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    model = nn.Sequential(*layers)
    x = draw(st.sampled_from([0.1, 1.0, 30.0])) * torch.randn(batch, widths[0])
    y = torch.randn(batch, widths[-1])
    c = draw(st.sampled_from([1e-3, 0.1, 1.0, 1e3]))
    return model, x, y, c


def mse_per_example(out: Tensor, target: Tensor) -> Tensor:
    return ((out - target) ** 2).sum(dim=1) + torch.sin(out).sum(dim=1)


def _assert_close(got: Tensor, want: Tensor, rtol: float, magnitude: Tensor | None = None) -> None:
    got, want = got.double(), want.double()
    ref = want.abs() if magnitude is None else torch.maximum(want.abs(), magnitude.double())
    scale = float(ref.max()) if want.numel() else 0.0
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= rtol * scale + 1e-300, (got, want)


@SETTINGS
@given(case=mlp_case())
def test_linear_fast_path_clipped_sum_matches_the_loop_float64(
    case: tuple[nn.Module, Tensor, Tensor, float],
) -> None:
    model, x, y, c = case
    model = model.double()
    x, y = x.double(), y.double()
    engine = ClippedGradientEngine(model, mse_per_example, max_grad_norm=c)
    assert engine.mode == "ghost"
    got, _, _ = engine.clipped_grad_sum(x, y)
    want = reference_clipped_sum(model, mse_per_example, x, y, c)
    assert list(got) == list(want)
    for n in want:
        _assert_close(got[n], want[n], 1e-10)


@SETTINGS
@given(case=mlp_case())
def test_linear_fast_path_clipped_sum_matches_the_loop_float32(
    case: tuple[nn.Module, Tensor, Tensor, float],
) -> None:
    model, x, y, c = case
    engine = ClippedGradientEngine(model, mse_per_example, max_grad_norm=c)
    got, _, _ = engine.clipped_grad_sum(x, y)
    magnitude: dict[str, Tensor] = {}
    want = reference_clipped_sum(model, mse_per_example, x, y, c, magnitude)
    for n in want:
        assert got[n].dtype == torch.float32
        # float32 round-off is relative to the summed terms (found by hypothesis: a bias sum
        # of 3.1e-6 from terms clipped to C = 1e-3 came out 7e-5 off relative to itself)
        _assert_close(got[n], want[n], 1e-5, magnitude[n])
    # the clipped sum of one example has norm min(||g||, C)
    one, _, norms = engine.clipped_grad_sum(x[:1], y[:1])
    total = math.sqrt(sum(float(v.double().pow(2).sum()) for v in one.values()))
    assert total <= c * (1 + 1e-6)
    assert math.isclose(total, min(float(norms[0]), c), rel_tol=1e-4, abs_tol=1e-30)


def _record(layer: nn.Linear, *inputs: Tensor) -> list[Any]:
    calls = []
    for x in inputs:
        out = layer(x)
        b = torch.autograd.grad((out**2).sum(), out)[0]
        calls.append(((x,), {}, [b]))
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_which_linear_rule_is_used(bias: bool) -> None:
    """The 2-D rule only for one call on [B, d]; sequences and repeated calls go to the
    batch-first sequence rule, which agrees with the general (position-axis) rule."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 3, bias=bias)
    names = ["weight", "bias"] if bias else ["weight"]
    flat = ghost.ghost_layer_grads(layer, _record(layer, torch.randn(5, 4)), names, 5)
    assert isinstance(flat, ghost._LinearGrads)
    xs = torch.randn(5, 7, 4)
    seq_calls = _record(layer, xs)
    seq = ghost.ghost_layer_grads(layer, seq_calls, names, 5)
    assert isinstance(seq, ghost._SeqLinearGrads)
    twice = _record(layer, torch.randn(5, 4), torch.randn(5, 4))
    assert isinstance(ghost.ghost_layer_grads(layer, twice, names, 5), ghost._SeqLinearGrads)
    general_seq = ghost._OuterProductGrads(
        xs.reshape(5, 1, 7, 4).transpose(2, 3),
        seq_calls[0][2][0].reshape(5, 1, 7, 3).transpose(2, 3),
        layer.weight.shape,
        names,
    )
    w = dict.fromkeys(names, torch.rand(5, dtype=torch.float64))
    for n in names:
        _assert_close(seq.sq_norms()[n], general_seq.sq_norms()[n], 1e-6)
        _assert_close(seq.weighted_sum(w)[n], general_seq.weighted_sum(w)[n], 1e-6)
    seq.use_gram = not seq.use_gram  # both norm methods agree
    for n in names:
        _assert_close(seq.sq_norms()[n], general_seq.sq_norms()[n], 1e-6)
    # both rules give the same norms and sums on the same call
    x = torch.randn(5, 4)
    calls = _record(layer, x)
    fast = ghost.ghost_layer_grads(layer, calls, names, 5)
    general = ghost._OuterProductGrads(
        x.reshape(5, 1, 1, 4).transpose(2, 3),
        calls[0][2][0].reshape(5, 1, 1, 3).transpose(2, 3),
        layer.weight.shape,
        names,
    )
    w = dict.fromkeys(names, torch.rand(5, dtype=torch.float64))
    for n in names:
        _assert_close(fast.sq_norms()[n], general.sq_norms()[n], 1e-6)
        _assert_close(fast.weighted_sum(w)[n], general.weighted_sum(w)[n], 1e-6)


class _TwiceLinear(nn.Module):
    """One Linear applied twice (an RNN-cell pattern): per-example gradients add up."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.fc(torch.tanh(self.fc(x)))))


def test_repeated_and_sequence_linear_calls_still_match_the_loop() -> None:
    torch.manual_seed(1)
    for model, x in [
        (_TwiceLinear(), torch.randn(6, 4)),
        (nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)), torch.randn(6, 3, 4)),
    ]:
        y = torch.randn(*x.shape[:-1], 2)
        loss = lambda o, t: ((o - t) ** 2).flatten(1).sum(1)  # noqa: E731
        engine = ClippedGradientEngine(model, loss, max_grad_norm=0.5)
        assert engine.mode == "ghost"
        got, _, _ = engine.clipped_grad_sum(x, y)
        want = reference_clipped_sum(model, loss, x, y, 0.5)
        for n in want:
            _assert_close(got[n], want[n], 1e-5)


def test_unsupported_layers_fall_back_or_are_refused_as_before() -> None:
    prelu = nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2))
    assert ClippedGradientEngine(prelu, nn.CrossEntropyLoss(), max_grad_norm=1.0).mode == "hybrid"
    with pytest.raises(UnsupportedModelError, match="ghost"):
        ClippedGradientEngine(prelu, nn.CrossEntropyLoss(), max_grad_norm=1.0, mode="ghost")
    with pytest.raises(UnsupportedModelError, match="BatchNorm"):
        ClippedGradientEngine(
            nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), nn.MSELoss(), max_grad_norm=1.0
        )
    torch.manual_seed(2)
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    engine = ClippedGradientEngine(prelu, nn.CrossEntropyLoss(), max_grad_norm=0.3)
    got, _, _ = engine.clipped_grad_sum(x, y)
    want = reference_clipped_sum(prelu, nn.CrossEntropyLoss(reduction="none"), x, y, 0.3)
    for n in want:
        _assert_close(got[n], want[n], 1e-5)


# ---------------------------------------------------------------- secure normals
@pytest.mark.parametrize("shape", [(0,), (1,), (2,), (7,), (3, 5), (4, 0), (10_001,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_secure_normal_equals_renyi_noise_on_the_same_words(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    from renyi import noise

    src = SecureRandomSource()
    src.source = rr.GeneratorSource(np.random.default_rng(7))
    z = src.normal(shape, dtype)
    assert z.dtype == dtype and tuple(z.shape) == shape
    ref = noise.standard_normal(
        math.prod(shape), rng=rr.GeneratorSource(np.random.default_rng(7)), torch_kernel=True
    )
    # renyi.noise's full-precision sampler, bit for bit (then rounded to dtype)
    np.testing.assert_array_equal(z.numpy(), ref.reshape(shape).to(dtype).numpy())


def test_secure_normal_other_dtypes_tails_and_tampering() -> None:
    from renyi import noise
    from renyi.errors import PrivacyParameterError

    z = SecureRandomSource().normal((2, 3), torch.float16)
    assert z.dtype == torch.float16 and z.shape == (2, 3)
    # the extreme words: u1 = 2^-64 gives the largest raw radius sqrt(128 ln 2), angle ~0
    zeros = noise._SourceBits(lambda n: np.zeros(n, dtype=np.uint64), "gaussian")
    top = noise._raw_normals(zeros, 0, 1, np)
    assert math.isclose(float(top[0]), math.sqrt(128 * math.log(2)), rel_tol=1e-12)
    src = SecureRandomSource()

    class _Words(rr.RandomSource):
        secure = True

        def words(self, n: int) -> Any:
            return np.zeros(n, dtype=np.uint64)

    src.source = _Words()  # a tampered source is refused, not used
    with pytest.raises(PrivacyParameterError, match="allow_predictable_noise"):
        src.normal((1,), torch.float64)


# ---------------------------------------------------------------- optimizer
class _FixedNoise:
    secure = False

    def __init__(self, z: Tensor) -> None:
        self.z = z

    def normal(self, shape: Any, dtype: torch.dtype) -> Tensor:
        return self.z.clone().to(dtype).reshape(tuple(shape))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _optimizer(model: nn.Module, source: Any, sigma: float = 1.3, clip: float = 0.7) -> Any:
    sampler = PoissonSampler(200, 0.05, 5, random_source=SeededRandomSource(0))
    return DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=sigma,
        max_grad_norm=clip,
        sampler=sampler,
        accountant=None,
        random_source=source,
        allow_predictable_noise=True,  # the fixed-noise stand-in is refused otherwise
    )


def _assert_noised_grads(model: nn.Module, summed: dict[str, Tensor], z: Tensor) -> None:
    """Each ``.grad`` is ``(clipped sum + sigma C z) / (q n)`` with the fixed noise ``z`` (in
    parameter order), sigma 1.3, C 0.7, q n = 10."""
    offset = 0
    for name, p in model.named_parameters():
        noise = z[offset : offset + p.numel()].view(p.shape)
        offset += p.numel()
        want = (summed[name] + 1.3 * 0.7 * noise) / 10.0  # q n = 10
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-6)


def test_noisy_gradient_is_clipped_sum_plus_sigma_c_z_over_qn() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
    total = sum(p.numel() for p in model.parameters())
    z = torch.randn(total)
    opt = _optimizer(model, _FixedNoise(z))
    x, y = torch.randn(9, 5), torch.randint(0, 3, (9,))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.7)
    summed, _, _ = engine.clipped_grad_sum(x, y)
    opt.zero_grad()
    opt.accumulate(x[:4], y[:4])  # two micro-batches of one logical batch
    opt.accumulate(x[4:], y[4:])
    opt.pre_step()
    _assert_noised_grads(model, summed, z)


def test_finite_check_survives_float32_overflow_of_the_squared_norm() -> None:
    model = nn.Linear(4, 2)
    opt = _optimizer(model, _FixedNoise(torch.zeros(10)))
    big = {n: torch.full_like(p, 1e20) for n, p in model.named_parameters()}
    assert not math.isfinite(float(torch.linalg.vector_norm(big["weight"])))
    opt.add_clipped_sum(big, num_examples=10**30)  # finite, and within num_examples * C
    with pytest.raises(RenyiError, match="did not clip"):
        opt.add_clipped_sum(big, num_examples=10)
    for bad in (math.nan, math.inf):
        sums = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        sums["bias"][0] = bad
        with pytest.raises(NonFiniteLossError, match="bias"):
            opt.add_clipped_sum(sums, num_examples=1)


def test_engine_sums_are_not_shared_between_steps() -> None:
    """The optimizer keeps the engine's fresh tensors without copying: no aliasing."""
    torch.manual_seed(4)
    model = nn.Linear(3, 2)
    opt = _optimizer(model, _FixedNoise(torch.zeros(8)))
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    opt.zero_grad()
    opt.accumulate(x, y)
    first = {n: t.clone() for n, t in opt._summed.items()}
    opt.step()
    opt.zero_grad()
    opt.accumulate(x, y)
    # the first step's gradients (views of the noise buffer) did not write into these sums
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.7)
    want, _, _ = engine.clipped_grad_sum(x, y)
    for n in want:
        torch.testing.assert_close(opt._summed[n], want[n])
        assert not torch.equal(first[n], opt._summed[n]) or torch.equal(first[n], want[n])


def test_the_engine_uses_the_two_dimensional_rule_for_an_mlp(monkeypatch: Any) -> None:
    built: list[int] = []
    original = ghost._LinearGrads.__init__

    def spy(self: Any, a: Tensor, b: Tensor, names: Any) -> None:
        built.append(a.shape[1])
        original(self, a, b, names)

    monkeypatch.setattr(ghost._LinearGrads, "__init__", spy)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=1.0)
    engine.clipped_grad_sum(torch.randn(8, 6), torch.randint(0, 2, (8,)))
    assert sorted(built[-3:]) == [4, 5, 6]  # the last call; the first also runs the self-check


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mlp_case())
def test_capture_total_norm_path_matches_the_loop_float64(
    case: tuple[nn.Module, Tensor, Tensor, float],
) -> None:
    """The loss.backward() path takes the per-example total norm of plain Linear layers in
    one pass (``ghost.linear_total_sq``), never forming per-parameter norms: its norms and
    clipped sums equal a batch-of-one autograd loop (layers with and without biases)."""
    from renyi.dpsgd.capture import PerExampleCapture

    model, x, y, c = case
    model, x, y = model.double(), x.double(), y.double()
    cap = PerExampleCapture(model, max_grad_norm=c)
    try:
        mse_per_example(model(x), y).sum().backward()
        got, n, norms = cap.pop_clipped_sum()
    finally:
        cap.remove()
    assert n == x.shape[0]
    want = reference_clipped_sum(model, mse_per_example, x, y, c)
    for name in want:
        _assert_close(got[name], want[name], 1e-10)
    for i in range(x.shape[0]):
        g = torch.autograd.grad(
            mse_per_example(model(x[i : i + 1]), y[i : i + 1]).sum(),
            [p for p in model.parameters()],
        )
        norm = math.sqrt(sum(float(v.pow(2).sum()) for v in g))
        assert math.isclose(float(norms[i]), norm, rel_tol=1e-12, abs_tol=1e-300)


@pytest.mark.parametrize("scale", [1e-22, 1.0, 1e21], ids=["tiny", "plain", "huge"])
def test_capture_total_norm_path_float32_range_edges(scale: float) -> None:
    """float32 norms out of range (below 1e-15, or squares past float32's range) take the
    per-layer float64 recomputation: the capture's norms equal those of the engine's
    per-parameter path and a float64 batch-of-one loop."""
    from renyi.dpsgd.capture import PerExampleCapture

    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3, bias=False), nn.Linear(3, 2))
    x = scale * torch.randn(4, 6)
    cap = PerExampleCapture(model, max_grad_norm=1.0)
    try:
        model(x).sum().backward()  # linear in the output: finite at every scale
        _, _, norms = cap.pop_clipped_sum()
    finally:
        cap.remove()
    ref = ClippedGradientEngine(model, lambda o, t: o.sum(dim=1), max_grad_norm=1.0)
    ref_norms = ref.per_example_norms(x, torch.zeros(4))
    ref_total = torch.stack(list(ref_norms.values())).pow(2).sum(dim=0).sqrt()
    assert torch.isfinite(norms).all() and torch.isfinite(ref_total).all()
    assert torch.allclose(norms.double(), ref_total, rtol=1e-5, atol=0.0)
    m64 = copy.deepcopy(model).double()
    per = []
    for i in range(4):
        out = m64(x[i : i + 1].double()).sum()
        g = torch.autograd.grad(out, list(m64.parameters()))
        per.append(math.sqrt(sum(float(v.pow(2).sum()) for v in g)))
    assert torch.allclose(norms.double(), torch.tensor(per, dtype=torch.float64), rtol=1e-4)


def test_clipped_sums_come_in_one_flat_buffer_noised_without_a_copy() -> None:
    """The engine writes a step's clipped sums as consecutive slices of one flat buffer (the
    Linear products straight into it, another rule's result copied in); the optimizer noises
    that buffer as it is. The noisy gradient is still sum + sigma C z over q n, exactly as
    on the concatenating path; views that are not the consecutive slices of one buffer in
    parameter order are concatenated as before."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(5, 6), nn.LayerNorm(6), nn.Linear(6, 3))
    names = [n for n, _ in model.named_parameters()]
    total = sum(p.numel() for p in model.parameters())
    z = torch.randn(total)
    opt = _optimizer(model, _FixedNoise(z))
    x, y = torch.randn(9, 5), torch.randint(0, 3, (9,))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.7)
    summed, _, _ = engine.clipped_grad_sum(x, y)
    base = summed[names[0]]._base
    assert base is not None and base.numel() == total
    assert all(summed[n]._base is base for n in names)
    opt.zero_grad()
    opt.accumulate(x, y)
    flat = opt._flat_sum(opt._summed, torch.float32)
    assert flat is not None and flat.data_ptr() == opt._summed[names[0]].data_ptr()
    opt.pre_step()
    _assert_noised_grads(model, summed, z)
    # not one buffer in parameter order: swapped slices, a gap, a foreign tensor
    buf = torch.zeros(total)
    sizes = [p.numel() for p in model.parameters()]
    views = dict(zip(names, buf.split(sizes), strict=True))
    params = list(model.parameters())
    shaped = {n: v.view(p.shape) for (n, v), p in zip(views.items(), params, strict=True)}
    assert opt._flat_sum(shaped) is not None
    swapped = dict(shaped)
    swapped[names[0]], swapped[names[2]] = shaped[names[2]], shaped[names[0]]
    assert opt._flat_sum(swapped) is None
    shifted = dict(shaped)  # one slice at the wrong offset of the same buffer
    shifted[names[1]] = buf[1 : 1 + sizes[1]].view(shaped[names[1]].shape)
    assert opt._flat_sum(shifted) is None
    longer = torch.zeros(total + 1)  # a buffer with more than the sums
    part = dict(zip(names, longer[:total].split(sizes), strict=True))
    assert (
        opt._flat_sum({n: v.view(p.shape) for (n, v), p in zip(part.items(), params, strict=True)})
        is None
    )
    foreign = dict(shaped)
    foreign[names[1]] = shaped[names[1]].clone()
    assert opt._flat_sum(foreign) is None
    assert opt._flat_sum({**shaped, "extra": buf[:1]}) is None
