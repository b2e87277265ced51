"""``peft``'s LyCORIS adapters (LoHa, LoKr) on both ``renyi.dpsgd`` paths: the ``PrivacyEngine``
capture path (``loss.backward()``) and :class:`renyi.dpsgd.hf.DPTrainer`.

What they draw: every LoHa/LoKr layer's forward in training mode calls ``torch.rand(1) >
module_dropout`` (one gate for the whole batch, drawn even with ``module_dropout=0``) and, with
``rank_dropout > 0``, ``torch.rand(out_features)`` (one row mask for the whole batch). Neither
shape depends on the batch, so each example's output is a function of that example and draws
independent of the data: per-example clipping is sound given the draws.

Defect found on main (each test of the first two groups failed there): the layers own their
parameters and have no per-example rule, so the engine recomputes each example's gradient
with ``torch.func.vmap`` over the layer, which refused the draw (``randomness="error"``):
both adapters were refused with "draws random numbers ... inside a layer that owns
parameters", even with all dropouts at 0 (a false refusal). Now the draws of each such layer
call are recorded (:class:`renyi.dpsgd.replay.RandomTape`) and given back whole to the
per-example recomputation; LoHa's ``HadaWeight`` (a custom ``autograd.Function`` that
``torch.func`` cannot transform) is differentiated one example at a time. A draw with a row per
example inside such a layer is still refused (last test).

Deterministic (seeded draws, no statistical test): no false alarms. Tiny Llama from
``test_dpsgd_review4`` (d 16, 2 layers, vocab 40, 8 tokens, batch 6): nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from torch import Tensor, nn  # noqa: E402

from renyi.dpsgd.capture import PerExampleCapture  # noqa: E402
from renyi.dpsgd.grad_sample import UnsupportedModelError  # noqa: E402
from test_dpsgd_losses_hf import leave_one_out as hf_leave_one_out  # noqa: E402
from test_dpsgd_review4 import (  # noqa: E402
    B,
    _batch,
    _llama,
    _quiet_and_cheap,  # noqa: F401  (module fixture: one thread, quiet transformers)
    trainer_leave_one_out,
)

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore::renyi.errors.InsecureRandomnessWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TARGETS = ["q_proj", "v_proj"]
CONFIGS: dict[str, Callable[..., Any]] = {
    "loha": lambda **kw: peft.LoHaConfig(r=4, target_modules=TARGETS, **kw),
    "lokr": lambda **kw: peft.LoKrConfig(r=4, target_modules=TARGETS, **kw),
}


def _adapted(kind: str, **kw: Any) -> nn.Module:
    torch.manual_seed(1)
    model = peft.get_peft_model(_llama(), CONFIGS[kind](**kw))
    with torch.no_grad():  # a factor starts at 0 (the identity): move every factor
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p), alpha=0.1)
    return model


class _Seeded(nn.Module):
    """The model with the global generator seeded at each forward: the batch and each of its
    examples run alone draw the same LyCORIS gates and masks (their shapes do not depend on
    the batch), so a batch-of-one loop is an exact oracle also with the dropouts on."""

    def __init__(self, model: nn.Module, seed: int) -> None:
        super().__init__()
        self.model, self.seed = model, seed

    def forward(self, **kw: Tensor) -> Any:
        torch.manual_seed(self.seed)
        return self.model(**kw)


def _loop_and_captured(model: nn.Module, batch: dict[str, Tensor]) -> tuple[dict, dict]:
    """Sum of each example's own gradient (plain autograd, one example at a time) and the
    capture path's unclipped sum, float64 per parameter."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    want = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    for i in range(B):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        loss = model(**one).loss
        if not loss.requires_grad:  # every adapter gated off in this forward
            continue
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for n, g in zip(params, grads, strict=True):
            if g is not None:
                want[n] += g.double()
    cap = PerExampleCapture(model, max_grad_norm=1e6)
    try:
        model(**batch).loss.backward()
        got, n, _ = cap.pop_clipped_sum()
    finally:
        cap.remove()
    assert n == B

    def name(k: str) -> str:  # the _Seeded wrapper's prefix, if any
        return k.removeprefix("model.")

    assert {name(k) for k in got} == {name(k) for k in params}
    return {name(k): v for k, v in want.items()}, {name(k): v.double() for k, v in got.items()}


def _assert_close(want: dict, got: dict) -> None:
    scale = max(float(v.abs().max()) for v in want.values())
    assert scale > 0
    for n, w in want.items():
        assert float((got[n] - w).abs().max()) <= 1e-5 * scale, n


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_lycoris_adapters_train_on_both_paths_and_equal_a_batch_of_one_loop(
    kind: str, tmp_path: Path
) -> None:
    """Default config (all dropouts 0, the gate ``torch.rand(1) > 0`` still drawn). On main:
    refused on both paths ("draws random numbers ... inside a layer that owns parameters").
    Now leave-one-out with noise off stays below C (C = the median per-example norm) on the
    capture path and in DPTrainer, and the unclipped captured sum equals a batch-of-one loop
    for every adapter tensor."""
    batch = _batch()
    assert hf_leave_one_out(_adapted(kind), batch) <= 1.0
    assert trainer_leave_one_out(lambda: _adapted(kind), batch, tmp_path) <= 1.0
    model = _adapted(kind)
    want, got = _loop_and_captured(model, batch)
    for n, w in want.items():  # every adapter tensor gets a gradient
        assert float(w.abs().max()) > 0, n
    _assert_close(want, got)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_module_and_rank_dropout_draws_are_replayed_exactly(kind: str) -> None:
    """``module_dropout=0.5, rank_dropout=0.5``: the gate switches some adapters off for the
    whole batch, the rank mask zeroes rows of the others (LoKr: rescaled). The draws are the
    same for the batch and for each example alone (seeded), so the captured sum must equal
    the loop of batch-of-one gradients with those draws, and leave-one-out stays below C
    (on main: refused). Seed 6 leaves three of the four adapters on (checked)."""
    batch = _batch()
    extra = {"rank_dropout_scale": True} if kind == "lokr" else {}
    model = _Seeded(_adapted(kind, module_dropout=0.5, rank_dropout=0.5, **extra), seed=6)
    want, got = _loop_and_captured(model, batch)
    on = [n for n, w in want.items() if float(w.abs().max()) > 0]
    assert on and len(on) < len(want)  # some gates on, some off: the draws matter
    _assert_close(want, got)
    assert hf_leave_one_out(model, batch) <= 1.0


class _NoisyLinear(nn.Module):
    """A layer with parameters and no per-example rule that draws a row per example (its own
    dropout on the input): the per-layer recomputation cannot give each example its row."""

    def __init__(self, n_in: int = 4, n_out: int = 3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.dropout(x, 0.5, training=True) @ self.weight.T


class _MatMul(torch.autograd.Function):
    """``x @ w.T`` as an old-style Function (no ``setup_context``, as peft's ``HadaWeight``):
    ``torch.func`` cannot transform it."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return x @ w.T

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
        x, w = ctx.saved_tensors
        return g @ w, g.T @ x


class _NoisyFunctionLinear(_NoisyLinear):
    def forward(self, x: Tensor) -> Tensor:
        return _MatMul.apply(nn.functional.dropout(x, 0.5, training=True), self.weight)


class _GatedFunctionLinear(_NoisyLinear):
    def forward(self, x: Tensor) -> Tensor:
        return _MatMul.apply(x, self.weight) * (torch.rand(1) > 0.3)


class _GatedLinear(_NoisyLinear):
    """The same layer with one gate for the whole batch (LyCORIS's module_dropout)."""

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T * (torch.rand(1) > 0.3)


def test_a_per_example_draw_inside_a_layer_is_refused_a_shared_one_is_exact() -> None:
    """Guard of the replay: the recomputation runs with ``randomness="same"``, which would
    give every example the first example's dropout mask; a draw whose shape has a row per
    example must be refused with our error (never a silently shared mask), while a shared
    gate gives each example's own gradient (batch-of-one loop with the same seed)."""
    torch.manual_seed(0)
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    for noisy_layer in (_NoisyLinear(), _NoisyFunctionLinear()):  # vmap / one at a time
        noisy = nn.Sequential(noisy_layer)
        cap = PerExampleCapture(noisy, max_grad_norm=1e6)
        try:
            ((noisy(x) - y) ** 2).sum().backward()
            with pytest.raises(UnsupportedModelError, match="cannot be given back to each example"):
                cap.pop_clipped_sum()
        finally:
            cap.remove()
    for gated in (
        nn.Sequential(_GatedLinear(), nn.Tanh(), _GatedLinear(3, 3)),
        nn.Sequential(_GatedFunctionLinear(), nn.Tanh(), _GatedLinear(3, 3)),
    ):
        _check_gated(gated, x, y)


def _check_gated(gated: nn.Module, x: Tensor, y: Tensor) -> None:
    for seed in range(4):  # gates on and off across the seeds
        want = torch.zeros(3, 4, dtype=torch.float64)
        for i in range(5):
            torch.manual_seed(seed)
            loss = ((gated(x[i : i + 1]) - y[i : i + 1]) ** 2).sum()
            want += torch.autograd.grad(loss, gated[0].weight)[0].double()
        cap = PerExampleCapture(gated, max_grad_norm=1e6)
        try:
            torch.manual_seed(seed)
            ((gated(x) - y) ** 2).sum().backward()
            got, _, _ = cap.pop_clipped_sum()
        finally:
            cap.remove()
        assert torch.allclose(got["0.weight"].double(), want, rtol=1e-5, atol=1e-6)


class _LateGate(_NoisyLinear):
    draws = False
    function = False

    def forward(self, x: Tensor) -> Tensor:
        y = _MatMul.apply(x, self.weight) if self.function else x @ self.weight.T
        return y * (torch.rand(1) > 0.3) if self.draws else y


@pytest.mark.parametrize("function", [False, True])
def test_a_layer_that_starts_drawing_later_is_refused_never_given_fresh_draws(
    function: bool,
) -> None:
    """A layer that drew nothing at its first recorded call is not recorded again (the
    recording costs Python per operator); if it starts drawing, the recomputation must
    refuse (vmap: ``randomness="error"``; one example at a time: an empty tape), never draw
    new numbers that differ from the batch's."""
    torch.manual_seed(0)
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    layer = _LateGate()
    layer.function = function
    model = nn.Sequential(layer)
    cap = PerExampleCapture(model, max_grad_norm=1e6)
    try:
        ((model(x) - y) ** 2).sum().backward()
        cap.pop_clipped_sum()
        layer.draws = True
        ((model(x) - y) ** 2).sum().backward()
        with pytest.raises(UnsupportedModelError, match="draws random numbers"):
            cap.pop_clipped_sum()
    finally:
        cap.remove()
