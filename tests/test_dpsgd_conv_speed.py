"""The convolution rule's fast paths against a batch-of-one loop, in float64.

``_ConvGrads`` forms per-example weight gradients in the layout its product writes them in
(features ``(kh, kw, C)`` for ``bmm`` with one group, ``[C, B, O, kh, kw]`` for ``grouped``),
chunk by chunk of examples with the norms of each chunk formed while in cache, and permutes
only the weighted sum into the weight's layout. Every strategy, forced, with chunks of one
and of several examples (the last one shorter), must give the loop's squared norms, clipped
sums and per-example gradients (for tied weights) to float64 rounding.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from renyi.dpsgd import ghost  # noqa: E402

pytestmark = pytest.mark.torch


def _loss(out: Tensor, target: Tensor) -> Tensor:
    o = out.flatten(1)
    return (torch.tanh(o) * target.flatten(1)).sum(1) + 0.1 * (o * o).sum(1)


def _loop(layer: nn.Module, xs: list[Tensor], target: Tensor) -> list[dict[str, Tensor]]:
    """Each example alone through every call of the layer (outputs summed), plain autograd."""
    params = dict(layer.named_parameters())
    res = []
    for i in range(target.shape[0]):
        out = sum(layer(x[i : i + 1]) for x in xs)
        g = torch.autograd.grad(_loss(out, target[i : i + 1]).sum(), list(params.values()))
        res.append(dict(zip(params, g, strict=True)))
    return res


def _calls(layer: nn.Module, xs: list[Tensor], target: Tensor) -> list[Any]:
    outs = [layer(x) for x in xs]
    grads = torch.autograd.grad(_loss(sum(outs), target).sum(), outs)
    return [((x,), {}, [g]) for x, g in zip(xs, grads, strict=True)]


def _check(layer: nn.Module, xs: list[Tensor], strategy: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(ghost._ConvGrads, "_choose", lambda self: strategy)
    torch.manual_seed(1)
    target = torch.randn_like(layer(xs[0]))
    batch = target.shape[0]
    ref = _loop(layer, xs, target)
    names = [n for n, _ in layer.named_parameters()]
    rule = ghost.ghost_layer_grads(layer, _calls(layer, xs, target), names, batch)
    assert isinstance(rule, ghost._ConvGrads) and rule.strategy == strategy
    w = torch.rand(batch, dtype=torch.float64)
    sq = rule.sq_norms()
    summed = rule.weighted_sum(dict.fromkeys(names, w))
    for n in names:
        want = torch.stack([r[n] for r in ref])
        torch.testing.assert_close(sq[n], want.flatten(1).pow(2).sum(1), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            summed[n], torch.tensordot(w, want, dims=1), rtol=1e-10, atol=1e-12
        )
    pe = rule._weight_per_example().reshape(batch, *layer.weight.shape)
    torch.testing.assert_close(pe, torch.stack([r["weight"] for r in ref]), rtol=1e-10, atol=1e-12)


# (layer, input shape): Conv1d/Conv2d, stride, dilation, padding (int, "same", non-zero
# modes), groups, with and without bias, several channels and one
CASES = [
    (lambda: nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2)), (5, 3, 7, 6)),
    (lambda: nn.Conv2d(1, 3, 4, stride=2, padding=1, bias=False), (5, 1, 9, 9)),
    (lambda: nn.Conv2d(4, 6, 3, groups=2, padding="same", padding_mode="reflect"), (5, 4, 5, 6)),
    (lambda: nn.Conv2d(2, 2, 2, dilation=2, padding=1, padding_mode="circular"), (5, 2, 6, 5)),
    (lambda: nn.Conv1d(3, 4, 3, stride=2, padding=2, bias=False), (5, 3, 11)),
    (
        lambda: nn.Conv1d(4, 4, 2, groups=4, dilation=3, padding_mode="replicate", padding=1),
        (5, 4, 9),
    ),
]


def _case(i: int) -> tuple[nn.Module, Tensor]:
    make, shape = CASES[i]
    torch.manual_seed(10 + i)
    layer = make().double()
    return layer, torch.randn(*shape, dtype=torch.float64)


def _strategies(layer: nn.Module) -> list[str]:
    return ["bmm", "gram"] + (["grouped"] if layer.groups == 1 else [])  # type: ignore[operator]


@pytest.mark.parametrize("chunk_bytes", [1, 2000, 1 << 20])  # 1 example, a few, the batch
@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_strategy_and_chunking_matches_the_loop(
    case: int, chunk_bytes: int, monkeypatch: Any
) -> None:
    monkeypatch.setattr(ghost, "_CONV_CHUNK_BYTES", chunk_bytes)
    layer, x = _case(case)
    for strategy in _strategies(layer):
        _check(layer, [x], strategy, monkeypatch)


@pytest.mark.parametrize("case", [0, 2, 4])
def test_a_layer_called_twice_sums_both_calls_per_example(case: int, monkeypatch: Any) -> None:
    """Weight sharing: the second call's product is added into each chunk (``baddbmm_``)."""
    monkeypatch.setattr(ghost, "_CONV_CHUNK_BYTES", 2000)
    layer, x = _case(case)
    for strategy in _strategies(layer):
        _check(layer, [x, torch.randn_like(x)], strategy, monkeypatch)


def test_batch_of_one(monkeypatch: Any) -> None:
    layer, x = _case(0)
    for strategy in _strategies(layer):
        _check(layer, [x[:1]], strategy, monkeypatch)


def test_the_chunks_hold_about_the_configured_bytes_of_patches(monkeypatch: Any) -> None:
    """On the CPU the pipeline runs in chunks of ``_CONV_CHUNK_BYTES`` of patches (the
    benchmark CNN's second convolution: [32, 16, 4, 4] on 13 x 13, 40 examples)."""
    layer = nn.Conv2d(16, 32, 4, stride=2)
    x = torch.randn(64, 16, 13, 13)
    target = torch.randn_like(layer(x))
    rule = ghost._ConvGrads(layer, _calls(layer, [x], target), ["weight", "bias"], 64)
    assert rule._chunk() == (1 << 20) // (25 * 256 * 4) == 40
    monkeypatch.setattr(ghost, "_CONV_CHUNK_BYTES", 1)
    assert rule._chunk() == 1


def test_float32_norms_fall_back_to_float64_in_chunks(monkeypatch: Any) -> None:
    """Norms formed chunk by chunk keep ``_sq``'s guarantee: a per-example gradient whose
    float32 norm overflows is recomputed in float64, never reported infinite or too small."""
    monkeypatch.setattr(ghost._ConvGrads, "_choose", lambda self: "bmm")
    monkeypatch.setattr(ghost, "_CONV_CHUNK_BYTES", 1)
    layer = nn.Conv2d(2, 3, 2)
    x = torch.randn(3, 2, 4, 4)
    x[1] *= 1e20  # example 1's gradient is ~1e20 * ~1: its float32 squared norm overflows
    g = torch.randn(3, 3, 3, 3)
    rule = ghost.ghost_layer_grads(layer, [((x,), {}, [g])], ["weight"], 3)
    sq = rule.sq_norms()["weight"]
    want = torch.stack(
        [
            torch.einsum(
                "ohw,chwkl->ockl", g[i].double(), x[i].double().unfold(1, 2, 1).unfold(2, 2, 1)
            )
            .pow(2)
            .sum()
            for i in range(3)
        ]
    )
    assert torch.isfinite(sq).all()
    torch.testing.assert_close(sq, want, rtol=1e-5, atol=0.0)


def test_output_gradients_with_a_graph_are_accepted(monkeypatch: Any) -> None:
    """``loss.backward(create_graph=True)`` hands the hooks output gradients that require
    grad: the chunked products write into preallocated tensors, which autograd refuses for
    such inputs unless they are detached first."""
    monkeypatch.setattr(ghost._ConvGrads, "_choose", lambda self: "bmm")
    layer, x = _case(0)
    target = torch.randn_like(layer(x))
    (x2, _, [g]) = _calls(layer, [x], target)[0]
    rule = ghost.ghost_layer_grads(layer, [(x2, {}, [g.requires_grad_()])], ["weight"], 5)
    want = ghost.ghost_layer_grads(layer, [(x2, {}, [g.detach()])], ["weight"], 5)
    torch.testing.assert_close(rule.sq_norms()["weight"], want.sq_norms()["weight"])
