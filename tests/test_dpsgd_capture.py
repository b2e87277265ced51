"""``loss.backward(); optimizer.step()``: per-example clipping captured by hooks.

The captured clipped sums must equal the engine's own (``accumulate``) on the same batch for
every kind of layer; micro-batches add up; a forward without backward, a no-grad forward or a
call of a submodule alone is not captured; nothing captured is our error; a model that mixes
examples is refused before anything is returned.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
from torch import Tensor, nn  # noqa: E402

from renyi.dpsgd.capture import MissingGradientError, PerExampleCapture  # noqa: E402
from renyi.dpsgd.clipping import ClippedGradientEngine  # noqa: E402
from renyi.dpsgd.grad_sample import UnsupportedModelError  # noqa: E402
from renyi.dpsgd.independence import ExampleMixingError  # noqa: E402

pytestmark = pytest.mark.torch


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 5)
        self.rnn = nn.LSTM(5, 4, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(self.emb(x))
        return self.fc(out.mean(1))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.enc(self.emb(x)).mean(1))


class PReLUNet(nn.Module):  # a layer without a rule: per-layer vmap
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(4, 6), nn.PReLU(), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Tensor]]] = {
    "mlp_inplace_relu": (
        lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3)),
        lambda n: torch.randn(n, 4),
    ),
    "cnn": (
        lambda: nn.Sequential(
            nn.Conv2d(1, 2, 3), nn.GroupNorm(1, 2), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)
        ),
        lambda n: torch.randn(n, 1, 6, 6),
    ),
    "lstm": (LSTMNet, lambda n: torch.randint(0, 12, (n, 5))),
    "transformer": (Transformer, lambda n: torch.randint(0, 12, (n, 6))),
    "hybrid": (PReLUNet, lambda n: torch.randn(n, 4)),
    "rmsnorm": (
        lambda: nn.Sequential(nn.Linear(4, 6), nn.RMSNorm(6), nn.Tanh(), nn.Linear(6, 3)),
        lambda n: torch.randn(n, 4),
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_captured_sums_equal_the_engine_on_the_same_batch(name: str, reduction: str) -> None:
    make, data = MODELS[name]
    torch.manual_seed(0)
    model = make().double()
    x = data(5)
    x = x.double() if x.is_floating_point() else x
    y = torch.randint(0, 3, (5,))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.3)
    want, _, want_norms = engine.clipped_grad_sum(x, y)
    cap = PerExampleCapture(model, max_grad_norm=0.3, loss_reduction=reduction)  # type: ignore[arg-type]
    try:
        loss = nn.functional.cross_entropy(model(x), y, reduction=reduction)
        loss.backward()
        sums, n, norms = cap.pop_clipped_sum()
    finally:
        cap.remove()
    assert n == 5 and cap.mode == engine.mode
    assert torch.allclose(norms, want_norms, rtol=1e-9)
    for k in want:
        assert torch.allclose(sums[k], want[k], rtol=1e-9, atol=1e-12), k
    # hooks removed: the model is plain again
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_micro_batches_add_up_and_uncaptured_passes_are_ignored() -> None:
    torch.manual_seed(1)
    model = LSTMNet().double()
    x, y = torch.randint(0, 12, (6, 5)), torch.randint(0, 3, (6,))
    engine = ClippedGradientEngine(model, nn.CrossEntropyLoss(), max_grad_norm=0.2)
    want, _, _ = engine.clipped_grad_sum(x, y)
    cap = PerExampleCapture(model, max_grad_norm=0.2)
    try:
        model(x[:2])  # a forward without backward: dropped
        for part in (slice(0, 4), slice(4, 6)):
            nn.functional.cross_entropy(model(x[part]), y[part]).backward()
            with torch.no_grad():
                model(x)  # evaluation under no_grad: not captured
            model.rnn(model.emb(x[:1]))  # a submodule alone: not captured
        sums, n, _ = cap.pop_clipped_sum()
        assert n == 6
        for k in want:
            assert torch.allclose(sums[k], want[k], rtol=1e-9, atol=1e-12), k
        with pytest.raises(MissingGradientError, match="no forward and backward"):
            cap.pop_clipped_sum()
        model(x)  # forward, no backward
        with pytest.raises(MissingGradientError):
            cap.pop_clipped_sum()
        nn.functional.cross_entropy(model(x), y).backward()
        cap.zero_grad()
        with pytest.raises(MissingGradientError):
            cap.pop_clipped_sum()
    finally:
        cap.remove()


def test_mixing_model_is_refused_before_the_sums_are_returned() -> None:
    class Mix(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 3)

        def forward(self, x: Tensor) -> Tensor:
            h = self.fc1(x)
            return self.fc2(h - h.mean(0))

    torch.manual_seed(2)
    model = Mix()
    cap = PerExampleCapture(model, max_grad_norm=1.0)
    x, y = torch.randn(1, 4), torch.tensor([1])  # one example: padded for the check
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ExampleMixingError, match="before layer 'fc2'"):
        cap.pop_clipped_sum()
    cap.remove()


def test_frozen_parameters_are_ignored_and_clipping_norm_is_settable() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    model[0].requires_grad_(False)
    cap = PerExampleCapture(model, max_grad_norm=1.0)
    cap.max_grad_norm = 1e-3
    assert cap.sensitivity == 1e-3
    x, y = torch.randn(4, 4), torch.randint(0, 3, (4,))
    nn.functional.cross_entropy(model(x), y).backward()
    sums, n, norms = cap.pop_clipped_sum()
    cap.remove()
    assert n == 4
    assert sorted(sums) == ["2.bias", "2.weight"]
    total = torch.sqrt(sum(v.double().pow(2).sum() for v in sums.values()))
    assert float(total) <= 4 * 1e-3 * (1 + 1e-6)
    assert bool((norms > 1e-3).all())


@pytest.mark.parametrize("name", ["mlp_inplace_relu", "cnn", "lstm", "transformer"])
def test_one_backward_forms_no_weight_gradient(name: str) -> None:
    """The user's backward back-propagates input gradients only: the per-example norms and
    the clipped sum come from each layer's input and output gradient (book-keeping), so a
    weight gradient formed by autograd would be thrown away. Parameters get a zero ``.grad``
    (what is released comes from the clipped sums at ``step()``), and the sums equal the
    engine's ``accumulate()`` path."""
    make, data = MODELS[name]
    torch.manual_seed(7)
    model = make().double()
    x = data(6)
    x = x.double() if x.is_floating_point() else x
    y = torch.randint(0, 3, (6,))
    want, _, _ = ClippedGradientEngine(
        model, nn.CrossEntropyLoss(), max_grad_norm=0.3
    ).clipped_grad_sum(x, y)
    cap = PerExampleCapture(model, max_grad_norm=0.3)
    try:
        nn.functional.cross_entropy(model(x), y).backward()
        for n, p in model.named_parameters():
            assert p.grad is not None and not bool(p.grad.any()), n
        sums, _, _ = cap.pop_clipped_sum()
    finally:
        cap.remove()
    for k in want:
        assert torch.allclose(sums[k], want[k], rtol=1e-9, atol=1e-12), k


def test_a_parameter_used_outside_its_module_is_refused_at_every_step() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.head = nn.Linear(4, 3)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(self.fc(x) @ self.fc.weight)  # fc.weight used twice

    torch.manual_seed(8)
    model = Tied().double()
    cap = PerExampleCapture(model, max_grad_norm=1.0, self_check=False)
    try:
        for _ in range(3):  # not only on the checked steps
            x, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 3, (5,))
            nn.functional.cross_entropy(model(x), y).backward()
            with pytest.raises(UnsupportedModelError, match=r"'fc\.weight' received a gradient"):
                cap.pop_clipped_sum()
    finally:
        cap.remove()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before make_private", "after make_private"])
def test_torch_compile_gives_the_same_clipped_sums(where: str) -> None:
    """``torch.compile`` around the model or around the capture's module: dynamo falls back
    to eager code around the capture's hooks (graph breaks), and the sums are the uncompiled
    ones (about 25 s of compilation: slow suite)."""

    def make() -> nn.Module:
        torch.manual_seed(9)
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))

    def sums(root: nn.Module, compile_after: bool) -> dict[str, Tensor]:
        cap = PerExampleCapture(root, max_grad_norm=0.1)
        try:
            call = torch.compile(root) if compile_after else root
            nn.functional.cross_entropy(call(x), y).backward()
            return {k.removeprefix("_orig_mod."): v for k, v in cap.pop_clipped_sum()[0].items()}
        finally:
            cap.remove()

    want = sums(make(), False)
    if where == "before make_private":
        got = sums(torch.compile(make()), False)  # type: ignore[arg-type]
    else:
        got = sums(make(), True)
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-7), k
