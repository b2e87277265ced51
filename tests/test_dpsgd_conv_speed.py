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

from renyi.dpsgd import _conv_kernels, _onednn, ghost  # noqa: E402

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
    # shapes for the ``direct`` kernel's blocks (float64: 8 or 4 output channels a vector;
    # 8, 4, 2 or 1 kernel taps a block): 8 taps, 9 (one at a time), 6 (two), the benchmark
    # CNN's first convolution, a Conv1d
    (lambda: nn.Conv2d(2, 8, (2, 4), stride=(1, 2), padding=(1, 0), dilation=(2, 1)), (5, 2, 7, 9)),
    (lambda: nn.Conv2d(3, 12, 3, padding="same", bias=False), (5, 3, 5, 6)),
    (lambda: nn.Conv2d(2, 16, (2, 3), stride=2, padding_mode="circular", padding=1), (5, 2, 7, 6)),
    (lambda: nn.Conv2d(1, 16, 8, stride=2, padding=3), (5, 1, 16, 16)),
    (lambda: nn.Conv1d(2, 16, 3, stride=2, dilation=2), (5, 2, 13)),
]


def _case(i: int) -> tuple[nn.Module, Tensor]:
    make, shape = CASES[i]
    torch.manual_seed(10 + i)
    layer = make().double()
    return layer, torch.randn(*shape, dtype=torch.float64)


def _strategies(layer: nn.Module) -> list[str]:
    one_group = layer.groups == 1
    direct = one_group and layer.out_channels % 4 == 0 and _conv_kernels.conv_pe_kernel(True, 1, 4)  # type: ignore[operator]
    return ["bmm", "gram"] + (["grouped"] if one_group else []) + (["direct"] if direct else [])


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


# -- the convolution's input gradient by one product and a scatter (_onednn.conv2d) ---------

_NUMBA = _conv_kernels.available()

# (layer, input shape): stride, dilation, integer / "same" (odd total: one more at the
# bottom/right) / "valid" padding, rectangular kernels, inputs the last stride does not cover
INPUT_CASES = [
    (lambda: nn.Conv2d(16, 32, 4, stride=2), (3, 16, 13, 13)),  # the benchmark CNN's conv2
    (lambda: nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2)), (4, 3, 9, 8)),
    (lambda: nn.Conv2d(2, 4, (4, 3), padding="same", dilation=(1, 2)), (2, 2, 7, 6)),
    (
        lambda: nn.Conv2d(3, 2, 3, stride=3, padding="valid", dilation=(2, 1), bias=False),
        (2, 3, 10, 11),
    ),
    (lambda: nn.Conv2d(1, 3, 8, stride=2, padding=3), (2, 1, 12, 12)),
]


def _input_case(i: int, dtype: torch.dtype) -> tuple[nn.Conv2d, Tensor]:
    make, shape = INPUT_CASES[i]
    torch.manual_seed(20 + i)
    return make().to(dtype), torch.randn(*shape, dtype=dtype)


def _torch_input_grad(layer: nn.Conv2d, x: Tensor, g: Tensor) -> Tensor:
    x = x.detach().clone().requires_grad_()
    out = layer._conv_forward(x, layer.weight.detach(), _detached(layer.bias))
    (dx,) = torch.autograd.grad(out, x, g)
    return dx


def _detached(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


@pytest.mark.skipif(not _NUMBA, reason="numba not installed")
@pytest.mark.parametrize("case", range(len(INPUT_CASES)))
def test_input_gradient_by_product_and_scatter_equals_autograd_in_float64(case: int) -> None:
    """``conv2d_input_grad`` (the columns ``g W`` by ``torch.mm`` in float64, scattered back
    by the compiled kernel, padding cut off) equals torch's input gradient to rounding."""
    layer, x = _input_case(case, torch.float64)
    g = torch.randn_like(layer(x))
    got = _onednn.conv2d_input_grad(
        g, layer.weight.detach(), (x.shape[2], x.shape[3]), layer.stride, layer.dilation,
        _onednn._zero_pads(layer),
    )  # fmt: skip
    torch.testing.assert_close(got, _torch_input_grad(layer, x, g), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not (_NUMBA and _onednn.applies(torch.ones(1))), reason="no numba/oneDNN")
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", range(len(INPUT_CASES)))
def test_detached_conv2d_forward_and_input_gradient_in_float32(
    case: int, channels_last: bool
) -> None:
    """The capture path's detached Conv2d: torch's forward (same bits), the oneDNN input
    gradient (equal to torch's to float32 rounding, in the input's memory format), no
    gradient for the parameters, and a clear error when differentiated twice."""
    layer, x = _input_case(case, torch.float32)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    xg = x.clone().requires_grad_()
    out = ghost.detached_forward(layer)(xg)
    assert type(out.grad_fn).__name__ == "_Conv2dBackward"
    assert torch.equal(out, layer(x))
    g = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, xg, g, retain_graph=True)
    want = _torch_input_grad(layer.double(), x.double(), g.double())
    torch.testing.assert_close(dx.double(), want, rtol=1e-5, atol=1e-5)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert dx.is_contiguous(memory_format=fmt)
    assert layer.weight.grad is None
    (dx2,) = torch.autograd.grad(out, xg, g, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dx2.sum(), xg)


class _OwnForward(nn.Conv2d):
    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return super()._conv_forward(x, 2 * weight, bias)


@pytest.mark.parametrize(
    "setup",
    ["float64", "groups", "reflect", "no grad", "unbatched", "autocast", "disabled", "no numba",
     "subclass"],
)  # fmt: skip
def test_other_convolutions_take_torch_s_backward(setup: str, monkeypatch: Any) -> None:
    """Everywhere the product-and-scatter path does not apply, the detached forward is the
    layer's own ``_conv_forward`` with torch's backward, and gives torch's gradient."""
    dtype = torch.float64 if setup == "float64" else torch.float32
    layer: nn.Conv2d = nn.Conv2d(4, 6, 3, padding=1, groups=2 if setup == "groups" else 1)
    if setup == "reflect":
        layer = nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect")
    if setup == "subclass":
        layer = _OwnForward(4, 6, 3, padding=1)
    layer = layer.to(dtype)
    x = torch.randn(*((4, 5, 5) if setup == "unbatched" else (2, 4, 5, 5)), dtype=dtype)
    if setup == "disabled":
        monkeypatch.setattr(_onednn, "ENABLED", False)
    if setup == "no numba":
        monkeypatch.setattr(_conv_kernels, "available", lambda: False)
    xg = x.clone().requires_grad_(setup != "no grad")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=setup == "autocast"):
        out = ghost.detached_forward(layer)(xg)
        want = layer._conv_forward(x, layer.weight.detach(), _detached(layer.bias))
    assert type(out.grad_fn).__name__ != "_Conv2dBackward"
    torch.testing.assert_close(out, want)
    if setup != "no grad":
        g = torch.randn_like(out)
        (dx,) = torch.autograd.grad(out, xg, g)
        x2 = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=setup == "autocast"):
            out2 = layer._conv_forward(x2, layer.weight.detach(), _detached(layer.bias))
        torch.testing.assert_close(dx, torch.autograd.grad(out2, x2, g)[0])


# -- the compiled per-example kernel (``direct``) in float32 and where it does not apply ------


@pytest.mark.parametrize(
    ("make", "shape"),
    [
        (lambda: nn.Conv2d(16, 32, 4, stride=2), (7, 16, 13, 13)),  # 16 lanes, 8-tap blocks
        (lambda: nn.Conv2d(1, 16, 8, stride=2, padding=3), (7, 1, 28, 28)),
        (lambda: nn.Conv2d(3, 8, 3, dilation=2, padding=1), (7, 3, 9, 8)),  # 8 lanes, 1 tap
    ],
)
def test_direct_kernel_in_float32_equals_the_batched_product(
    make: Any, shape: tuple[int, ...], monkeypatch: Any
) -> None:
    """float32's vector widths (16 and 8 output channels), against ``bmm`` on the same
    float32 data: norms and clipped sums to float32 rounding, per-example gradients too."""
    if _conv_kernels.conv_pe_kernel(False, 1, 8) is None:
        pytest.skip("llvmlite missing")
    torch.manual_seed(3)
    layer = make()
    x = torch.randn(*shape)
    target = torch.randn_like(layer(x))
    calls = _calls(layer, [x], target)
    names = [n for n, _ in layer.named_parameters()]
    w = torch.rand(shape[0], dtype=torch.float64)
    res = {}
    for strategy in ("bmm", "direct"):
        monkeypatch.setattr(ghost._ConvGrads, "_choose", lambda self, s=strategy: s)
        rule = ghost.ghost_layer_grads(layer, calls, names, shape[0])
        assert rule._direct_kernel() is not None
        res[strategy] = (
            rule.sq_norms(),
            rule.weighted_sum(dict.fromkeys(names, w)),
            rule._weight_per_example(),
        )
    (sq0, sum0, pe0), (sq1, sum1, pe1) = res["bmm"], res["direct"]
    for n in names:
        torch.testing.assert_close(sq1[n], sq0[n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sum1[n], sum0[n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pe1, pe0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("setup", ["no kernel", "compiling", "switched off", "channels", "groups"])
def test_direct_kernel_is_not_a_candidate_where_it_does_not_apply(
    setup: str, monkeypatch: Any
) -> None:
    """No compiled kernel (llvmlite missing), code traced by ``torch.compile``, the kernel
    switched off, output channels not a multiple of a vector width, several groups: the
    strategy is chosen among torch's kernels and gives their values."""
    monkeypatch.setattr(ghost, "_CONV_STRATEGY", {})
    if setup == "no kernel":
        monkeypatch.setattr(_conv_kernels, "conv_pe_kernel", lambda *a: None)
    if setup == "compiling":
        monkeypatch.setattr(_onednn, "_compiling", lambda: True)
    if setup == "switched off":
        monkeypatch.setattr(_conv_kernels, "ENABLED", False)
    o, groups = (6, 1) if setup == "channels" else (8, 2 if setup == "groups" else 1)
    layer = nn.Conv2d(4, o, 3, groups=groups).double()
    x = torch.randn(3, 4, 6, 6, dtype=torch.float64)
    g = torch.randn(3, o, 4, 4, dtype=torch.float64)
    rule = ghost.ghost_layer_grads(layer, [((x,), {}, [g])], ["weight"], 3)
    assert rule._direct_kernel() is None and rule.strategy != "direct"
    monkeypatch.setattr(ghost._ConvGrads, "_choose", lambda self: "bmm")
    want = ghost.ghost_layer_grads(layer, [((x,), {}, [g])], ["weight"], 3)
    torch.testing.assert_close(rule.sq_norms()["weight"], want.sq_norms()["weight"])


def test_a_shape_timed_with_the_kernel_takes_bmm_where_it_no_longer_applies(
    monkeypatch: Any,
) -> None:
    """The strategy cache is keyed by shapes, dtype and device: a shape that chose ``direct``
    and is met again while the kernel does not apply (torch.compile tracing, switched off)
    takes ``bmm`` instead of calling a missing kernel."""
    layer = nn.Conv2d(2, 8, 3).double()
    x = torch.randn(3, 2, 5, 5, dtype=torch.float64)
    g = torch.randn(3, 8, 3, 3, dtype=torch.float64)
    rule = ghost.ghost_layer_grads(layer, [((x,), {}, [g])], ["weight"], 3)
    if rule._direct_kernel() is None:
        pytest.skip("llvmlite missing")
    monkeypatch.setattr(ghost, "_CONV_STRATEGY", dict.fromkeys(ghost._CONV_STRATEGY, "direct"))
    want = ghost.ghost_layer_grads(layer, [((x,), {}, [g])], ["weight"], 3)
    assert want.strategy == "direct"
    monkeypatch.setattr(_conv_kernels, "ENABLED", False)
    rule = ghost.ghost_layer_grads(layer, [((x,), {}, [g])], ["weight"], 3)
    assert rule.strategy == "bmm"
    torch.testing.assert_close(rule.sq_norms()["weight"], want.sq_norms()["weight"])
