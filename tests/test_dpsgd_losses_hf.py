"""Hugging Face models' built-in losses on the ``loss.backward()`` path.

``outputs = model(input_ids=..., attention_mask=..., labels=...)``;
``outputs.loss.backward()``: the causal-LM loss averages over the batch's non-ignored tokens
(``ForCausalLMLoss``), the sequence-classification loss over the batch. Leave-one-out
sensitivity of the released clipped sum (noise off, dropout 0) must be at most ``C``
(``C`` = median per-example norm, so that about half of the examples are not clipped).
Models are built from small configs with random weights: nothing is downloaded.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from renyi.dpsgd.capture import PerExampleCapture  # noqa: E402

pytestmark = pytest.mark.torch

B, T, VOCAB = 6, 7, 40


def _released(model: Any, cap: PerExampleCapture, batch: dict[str, Any]) -> tuple[Any, Any]:
    model(**batch).loss.backward()
    sums, n, norms = cap.pop_clipped_sum()
    assert n == batch["input_ids"].shape[0]
    return torch.cat([v.double().flatten() for v in sums.values()]), norms


def leave_one_out(model: Any, batch: dict[str, Any]) -> float:
    cap = PerExampleCapture(model, max_grad_norm=1e6)
    try:
        _, norms = _released(model, cap, batch)
        c = float(norms.double().median())
        cap.max_grad_norm = c
        full, _ = _released(model, cap, batch)
        worst = 0.0
        for j in range(B):
            keep = torch.tensor([i for i in range(B) if i != j])
            part, _ = _released(model, cap, {k: v[keep] for k, v in batch.items()})
            worst = max(worst, float((full - part).norm()) / c)
    finally:
        cap.remove()
    return worst


def _batch(labels: Any) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    for i in range(B):
        mask[i, T - i :] = 0  # right padding, 0..5 pad tokens
    out = {"input_ids": ids, "attention_mask": mask}
    if labels == "lm":
        lab = ids.clone()
        lab[mask == 0] = -100
        out["labels"] = lab
    else:
        out["labels"] = torch.randint(0, 2, (B,), generator=g)
    return out


def _gpt2(kind: str) -> Any:
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=16,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=kind == "lm-tied",
        pad_token_id=0,
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind.startswith("lm"):
            model = transformers.GPT2LMHeadModel(cfg)
        else:
            model = transformers.GPT2ForSequenceClassification(cfg)
    # position embeddings are called on [1, T] positions shared by the batch: frozen here
    model.transformer.wpe.weight.requires_grad_(False)
    return model.double()


def _bert_mlm(hidden: int = 16, layers: int = 2) -> Any:
    """BERT's masked-LM head shares the word embeddings (and holds its decoder's bias)."""
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.BertForMaskedLM(cfg)
    return model.double()


def _mlm_batch() -> dict[str, Any]:
    batch = _batch("lm")
    batch["labels"][:, ::2] = -100  # every other token masked out of the loss
    batch["position_ids"] = torch.arange(T).expand(B, T)  # per example (not broadcast)
    return batch


@pytest.mark.parametrize("kind", ["lm", "cls", "lm-tied"])
def test_gpt2_built_in_losses_leave_one_out_at_most_c(kind: str) -> None:
    model = _gpt2(kind)
    assert leave_one_out(model, _batch(kind.removesuffix("-tied"))) <= 1.0


def test_bert_masked_lm_with_tied_embeddings_leave_one_out_at_most_c() -> None:
    assert leave_one_out(_bert_mlm(), _mlm_batch()) <= 1.0


@pytest.mark.parametrize("kind", ["gpt2", "gpt2-tied", "bert-mlm-tied"])
def test_full_fine_tuning_equals_a_batch_of_one_loop(kind: str) -> None:
    """Every GPT-2 and BERT layer has a ghost rule (``Conv1D`` as an affine map with its
    weight stored ``[in, out]``), and the LM heads' weight tied to the input embedding gets
    the sum of both uses (the norm's cross terms included): the captured clipped sum equals
    clipping each example's own gradient of its own loss (the mean over its own tokens), in
    float64."""
    torch.manual_seed(1)
    if kind.startswith("gpt2"):
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB,
            n_positions=8,
            n_embd=8,
            n_layer=1,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=kind == "gpt2-tied",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transformers.GPT2LMHeadModel(cfg).double()
        batch = _batch("lm")
        batch["position_ids"] = torch.arange(T).expand(B, T)  # per example (not broadcast)
    else:
        model = _bert_mlm(hidden=8, layers=1)
        batch = _mlm_batch()
    tied = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert (len(tied) > len(dict(model.named_parameters()))) == kind.endswith("tied")
    c = 0.5
    cap = PerExampleCapture(model, max_grad_norm=c)
    try:
        assert cap.mode == "ghost"
        model(**batch).loss.backward()
        got, _, _ = cap.pop_clipped_sum()
    finally:
        cap.remove()
    params = dict(model.named_parameters())
    want = {k: torch.zeros_like(p) for k, p in params.items()}
    for i in range(B):
        loss = model(**{k: v[i : i + 1] for k, v in batch.items()}).loss
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        g = [
            torch.zeros_like(p) if x is None else x
            for x, p in zip(grads, params.values(), strict=True)
        ]
        norm = float(torch.sqrt(sum((x**2).sum() for x in g)))
        w = min(1.0, c / (norm * (1 + 1e-6)))
        for k, x in zip(params, g, strict=True):
            want[k] += w * x
    assert sorted(got) == sorted(want)
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=1e-9, atol=1e-12), k
