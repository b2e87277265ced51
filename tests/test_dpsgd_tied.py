"""Tied weights: a parameter shared by several layers with per-example rules.

Example ``i``'s gradient of a tied parameter is the sum of its uses' gradients, so its norm
has cross terms (``||G_emb + G_head||^2 = ||G_emb||^2 + ||G_head||^2 + 2 <G_emb, G_head>``).
The reference is an independent batch-of-one autograd loop in float64, clipped by the closed
form ``g min(1, C / ||g||)``; the engine (``accumulate()``/``clipped_grad_sum``) and the
``loss.backward()`` capture must give the same clipped sums, and every other use of a shared
parameter outside the layers' forwards is refused at every step.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from renyi.dpsgd import ghost  # noqa: E402
from renyi.dpsgd.capture import PerExampleCapture  # noqa: E402
from renyi.dpsgd.clipping import ClippedGradientEngine  # noqa: E402
from renyi.dpsgd.grad_sample import UnsupportedModelError  # noqa: E402

pytestmark = pytest.mark.torch

V, D, B, T = 11, 6, 5, 4


class TinyLM(nn.Module):
    """Token embedding, a hidden map and an output head sharing weights as ``kind`` says."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.emb = nn.Embedding(V, D, padding_idx=0)
        self.emb2 = nn.Embedding(V, D)
        self.mid = nn.Linear(D, D)
        self.mid2 = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.norm2 = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        if kind == "embedding-head":  # GPT-2's and BERT's LM heads
            self.head.weight = self.emb.weight
        elif kind == "linear-linear":
            self.mid2.weight = self.mid.weight
        elif kind == "embedding-embedding":
            self.emb2.weight = self.emb.weight
        elif kind == "norm-norm":
            self.norm2.weight = self.norm.weight
        elif kind == "three-uses":
            self.head.weight = self.emb.weight
            self.emb2.weight = self.emb.weight

    def forward(self, ids: Tensor) -> Tensor:
        h = self.emb(ids) + 0.5 * self.emb2((ids * 3) % V)
        h = self.norm(torch.tanh(self.mid(h)))
        h = self.norm2(torch.tanh(self.mid2(h)))
        return self.head(h)  # [B, T, V]


def token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-example mean of the token cross-entropies."""
    ce = nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return ce.mean(dim=1)


def data(seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    ids[0, -2:] = 0  # padding tokens: the padding row gets no gradient from the embedding
    return ids, torch.randint(0, V, (B, T), generator=g)


def loop(model: nn.Module, ids: Tensor, y: Tensor, c: float) -> tuple[dict[str, Tensor], Tensor]:
    """Batch-of-one reference: every example's gradient, clipped, summed; and its norms."""
    params = dict(model.named_parameters())
    want = {n: torch.zeros_like(p) for n, p in params.items()}
    norms = []
    for i in range(ids.shape[0]):
        loss = token_loss(model(ids[i : i + 1]), y[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        g = [
            torch.zeros_like(p) if x is None else x
            for x, p in zip(grads, params.values(), strict=True)
        ]
        norm = math.sqrt(sum(float(x.pow(2).sum()) for x in g))
        norms.append(norm)
        w = min(1.0, c / (norm * (1 + 1e-6)))
        for n, x in zip(params, g, strict=True):
            want[n] += w * x
    return want, torch.tensor(norms, dtype=torch.float64)


def model_of(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyLM(kind).double()


KINDS = ["embedding-head", "linear-linear", "embedding-embedding", "norm-norm", "three-uses"]


@pytest.mark.parametrize("path", ["engine", "capture"])
@pytest.mark.parametrize("kind", KINDS)
def test_tied_parameters_equal_a_batch_of_one_loop(kind: str, path: str) -> None:
    model = model_of(kind)
    ids, y = data()
    _, norms = loop(model, ids, y, 1.0)
    c = float(norms.median())  # about half of the examples clipped
    want, want_norms = loop(model, ids, y, c)
    if path == "engine":
        engine = ClippedGradientEngine(model, token_loss, max_grad_norm=c)
        assert engine.mode == "ghost"  # layer by layer, never whole-model vmap
        got, _, got_norms = engine.clipped_grad_sum(ids, y)
    else:
        cap = PerExampleCapture(model, max_grad_norm=c)
        try:
            assert cap.mode == "ghost"
            token_loss(model(ids), y).mean().backward()
            got, _, got_norms = cap.pop_clipped_sum()
        finally:
            cap.remove()
    assert sorted(got) == sorted(want)
    torch.testing.assert_close(got_norms, want_norms, rtol=1e-10, atol=1e-12)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12, msg=n)


def test_cross_terms_from_factors_equal_the_materialised_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two ways to the cross terms: by ghost algebra from the factors (chosen when
    cheaper) and by forming both uses' per-example gradients (forced here)."""
    ids, y = data(1)
    results = []
    for cheap in (True, False):
        if not cheap:
            monkeypatch.setattr(ghost, "_ghost_cost", lambda f, g: math.inf)
        model = model_of("three-uses", 1)
        engine = ClippedGradientEngine(model, token_loss, max_grad_norm=1e9, self_check=False)
        results.append(engine.per_example_norms(ids, y)["emb.weight"])
    torch.testing.assert_close(results[0], results[1], rtol=1e-12, atol=1e-14)


def test_leave_one_out_sensitivity_of_a_tied_lm_is_at_most_c() -> None:
    model = model_of("embedding-head", 2)
    ids, y = data(2)
    c = 0.05
    engine = ClippedGradientEngine(model, token_loss, max_grad_norm=c)
    full, _, norms = engine.clipped_grad_sum(ids, y)
    assert bool((norms > c).all())
    for j in range(B):
        keep = [i for i in range(B) if i != j]
        part, _, _ = engine.clipped_grad_sum(ids[keep], y[keep])
        diff = math.sqrt(sum(float((full[k] - part[k]).pow(2).sum()) for k in full))
        assert c * (1 - 1e-6) < diff <= c * (1 + 1e-6)


class UsedOutside(TinyLM):
    """The tied weight also used directly in the parent's forward (a use no rule sees)."""

    def forward(self, ids: Tensor) -> Tensor:
        return super().forward(ids) + 0.1 * self.emb.weight.sum()


@pytest.mark.parametrize("path", ["engine", "capture"])
def test_another_use_of_a_tied_parameter_is_refused_at_every_step(path: str) -> None:
    torch.manual_seed(3)
    model = UsedOutside("embedding-head").double()
    ids, y = data(3)
    match = r"'emb\.weight' received a gradient from outside"
    if path == "engine":
        engine = ClippedGradientEngine(
            model, token_loss, max_grad_norm=1.0, self_check=False, mode="ghost"
        )
        for _ in range(3):  # without the independence check: every step
            with pytest.raises(UnsupportedModelError, match=match):
                engine.clipped_grad_sum(ids, y)
        # mode 'auto': whole-model vmap from then on, which is exact for any sharing
        engine = ClippedGradientEngine(model, token_loss, max_grad_norm=0.5, self_check=False)
        got, _, _ = engine.clipped_grad_sum(ids, y)
        assert engine.mode == "vmap"
        want, _ = loop(model, ids, y, 0.5)
        for n in want:
            torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12, msg=n)
        return
    cap = PerExampleCapture(model, max_grad_norm=1.0, self_check=False)
    try:
        for _ in range(3):
            token_loss(model(ids), y).mean().backward()
            with pytest.raises(UnsupportedModelError, match=match):
                cap.pop_clipped_sum()
    finally:
        cap.remove()


def test_sharing_with_a_module_without_a_rule_keeps_whole_model_vmap() -> None:
    class Holder(nn.Module):  # holds the tied weight and a parameter of its own
        def __init__(self, w: nn.Parameter) -> None:
            super().__init__()
            self.w = w
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x: Tensor) -> Tensor:
            return self.scale * x @ self.w.t()

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.holder = Holder(self.emb.weight)

        def forward(self, ids: Tensor) -> Tensor:
            return self.holder(self.emb(ids))

    torch.manual_seed(4)
    model = Model().double()
    ids, y = data(4)
    engine = ClippedGradientEngine(model, token_loss, max_grad_norm=0.5)
    assert engine.mode == "vmap"
    want, _ = loop(model, ids, y, 0.5)
    got, _, _ = engine.clipped_grad_sum(ids, y)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12, msg=n)
    cap = PerExampleCapture(model, max_grad_norm=0.5)
    try:
        token_loss(model(ids), y).mean().backward()
        got, _, _ = cap.pop_clipped_sum()
        for n in want:
            torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12, msg=n)
        token_loss(model(ids=ids), y).mean().backward()  # whole-model vmap: positional only
        with pytest.raises(UnsupportedModelError, match="positional"):
            cap.pop_clipped_sum()
    finally:
        cap.remove()
