"""renyi.dpsgd.hf.DPTrainer: Hugging Face transformers (and peft) models trained with DP-SGD.

Tiny models from configs with random weights (GPT-2, BERT, Llama architectures), tokenisers
trained here on text CPython ships (``pydoc_data``): nothing is downloaded (HF_HUB_OFFLINE).
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from torch import nn  # noqa: E402

from renyi.accountants import make_accountant  # noqa: E402
from renyi.dpsgd.hf import (  # noqa: E402
    DPTrainer,
    LogitsForward,
    causal_lm_loss,
    per_example_loss_for,
    train_tokenizer,
)
from renyi.errors import PrivacyParameterError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore::renyi.errors.InsecureRandomnessWarning"),
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),  # peft
]

N, SEQ, BATCH = 64, 16, 8


@pytest.fixture(autouse=True, scope="module")
def _quiet_and_cheap() -> Iterator[None]:
    transformers.logging.set_verbosity_error()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # accelerate runs gc.collect() at every train(): after transformers' import that walks
    # a large heap each time; frozen objects are skipped (test speed only)
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def lines() -> list[str]:
    import pydoc_data.topics

    texts = pydoc_data.topics.topics.values()
    found = {ln.strip() for t in texts for ln in t.splitlines() if len(ln.strip()) > 30}
    return sorted(ln for ln in found if ln.isascii())[:400]


@pytest.fixture(scope="module")
def tokenizers(lines: list[str]) -> dict[str, Any]:
    return {
        "bpe": train_tokenizer(lines, vocab_size=300),
        "wordpiece": train_tokenizer(lines, vocab_size=300, kind="wordpiece"),
    }


class _Encoded(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, tok: Any, lines: list[str], labels: list[int] | None = None) -> None:
        self.rows = [dict(tok(ln, truncation=True, max_length=SEQ)) for ln in lines[:N]]
        for i, row in enumerate(self.rows):
            if labels is not None:
                row["labels"] = labels[i]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return dict(self.rows[i])


def _gpt2(tok: Any, *, lora: bool = True, tie: bool = True, dropout: float = 0.0) -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=len(tok),
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    if lora:
        lora_config = peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)
        model = peft.get_peft_model(model, lora_config)
    return model


def _llama(tok: Any) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _bert_config(tok: Any, **kw: Any) -> Any:
    return transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tok.pad_token_id,
        **kw,
    )


def _bert_mlm_lora(tok: Any) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(_bert_config(tok))
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["query", "value"]))


def _bert_classifier(tok: Any) -> nn.Module:
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(_bert_config(tok, num_labels=2))


def _family(name: str, toks: dict[str, Any], lines: list[str]) -> tuple[nn.Module, Any, Any]:
    """(model, dataset, collator) of a model family."""
    if name == "gpt2-lora":
        tok = toks["bpe"]
        return _gpt2(tok), _Encoded(tok, lines), _clm(tok)
    if name == "gpt2-lora-dropout":  # GPT-2's default dropout (0.1) everywhere
        tok = toks["bpe"]
        return _gpt2(tok, dropout=0.1), _Encoded(tok, lines), _clm(tok)
    if name == "llama-full":
        tok = toks["bpe"]
        return _llama(tok), _Encoded(tok, lines), _clm(tok)
    tok = toks["wordpiece"]
    if name == "bert-mlm-lora":
        collator = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=0.3)
        return _bert_mlm_lora(tok), _Encoded(tok, lines), collator
    labels = [int("(" in ln) for ln in lines[:N]]  # does the line show a call?
    return _bert_classifier(tok), _Encoded(tok, lines, labels), _padding(tok)


def _clm(tok: Any) -> Any:
    return transformers.DataCollatorForLanguageModeling(tok, mlm=False)


def _padding(tok: Any) -> Any:
    return transformers.DataCollatorWithPadding(tok)


def _args(tmp_path: Path, **kw: Any) -> Any:
    defaults: dict[str, Any] = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": BATCH,
        "max_steps": 3,
        "learning_rate": 1e-2,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
    }
    defaults.update(kw)
    return transformers.TrainingArguments(**defaults)


def _trainer(model: nn.Module, args: Any, data: Any, collator: Any, **kw: Any) -> DPTrainer:
    kw.setdefault("target_epsilon", 8.0)
    kw.setdefault("accountant", "rdp")
    kw.setdefault("noise_seed", 0)
    return DPTrainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=collator,
        target_delta=1e-5,
        max_grad_norm=1.0,
        **kw,
    )


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


FAMILIES = ["gpt2-lora", "llama-full", "bert-mlm-lora", "bert-cls-full"]


@pytest.mark.parametrize("family", [*FAMILIES, "gpt2-lora-dropout"])
def test_dptrainer_trains_each_family_and_reports_the_accountants_epsilon(
    family: str, tokenizers: dict[str, Any], lines: list[str], tmp_path: Path
) -> None:
    model, data, collator = _family(family, tokenizers, lines)
    before = _state(model)
    trainer = _trainer(model, _args(tmp_path), data, collator)
    trainer.train()
    dp = trainer.dp_optimizer
    assert dp is not None and dp.steps_taken == 3 == trainer.state.global_step
    # epsilon() is the accountant's value for the 3 Poisson steps at q = 8/64
    event = PoissonSampledEvent(BATCH / N, GaussianEvent(dp.noise_multiplier))
    oracle = make_accountant("rdp").compose(event, 3).epsilon(1e-5).epsilon
    assert trainer.epsilon() == oracle and oracle <= 8.0
    assert trainer.privacy_plan().steps == 3
    logged = [h for h in trainer.state.log_history if "epsilon" in h]
    assert logged and logged[-1]["epsilon"] == oracle
    assert not any("loss" in h for h in trainer.state.log_history)  # not private: not logged
    after = _state(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable
    for name in before:
        changed = not torch.equal(before[name], after[name])
        assert changed == (name in trainable), name  # frozen weights never move
    if "lora" in family:
        assert all("lora_" in n or "classifier" in n for n in trainable)


def test_per_example_loss_leave_one_out_sensitivity_at_most_c(
    tokenizers: dict[str, Any], lines: list[str]
) -> None:
    """Noise off: the clipped sum of a batch and of the batch without example j differ by at
    most C (the model's own batch-mean loss would weight each example by the batch)."""
    from renyi.dpsgd.clipping import ClippedGradientEngine

    tok = tokenizers["bpe"]
    model = _llama(tok)
    forward = LogitsForward(model)
    forward.keys = ("input_ids", "attention_mask")
    engine = ClippedGradientEngine(forward, per_example_loss_for(model), max_grad_norm=0.1)
    batch = _clm(tok)([dict(tok(ln, truncation=True, max_length=SEQ)) for ln in lines[:6]])
    inputs = (batch["input_ids"], batch["attention_mask"])
    full, _, norms = engine.clipped_grad_sum(inputs, batch["labels"])
    assert bool((norms > 0.1).all())  # every example is clipped
    for j in range(6):
        keep = [i for i in range(6) if i != j]
        part, _, _ = engine.clipped_grad_sum(tuple(t[keep] for t in inputs), batch["labels"][keep])
        diff = math.sqrt(sum(float((full[k] - part[k]).double().pow(2).sum()) for k in full))
        assert 0.1 * (1 - 1e-4) < diff <= 0.1 * (1 + 1e-6)


def test_causal_lm_loss_is_each_examples_mean_over_its_own_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    labels = torch.randint(0, 7, (3, 5), generator=g)
    labels[1, 2:] = -100
    alone = [float(causal_lm_loss(logits[i : i + 1], labels[i : i + 1])[0]) for i in range(3)]
    together = causal_lm_loss(logits, labels).tolist()
    assert together == pytest.approx(alone, rel=1e-6)
    expected = nn.functional.cross_entropy(logits[1, :1], labels[1, 1:2])  # one target token
    assert together[1] == pytest.approx(float(expected), rel=1e-6)


def test_gradient_accumulation_is_one_logical_poisson_batch(
    tokenizers: dict[str, Any], lines: list[str], tmp_path: Path
) -> None:
    """8 examples per step as one batch, or as 2 micro-batches of 4: the same Poisson
    batches, one noise draw and one accounted step each, the same parameters."""
    results = []
    for per_device, accumulation in ((8, 1), (4, 2)):
        model, data, collator = _family("gpt2-lora", tokenizers, lines)
        args = _args(
            tmp_path / f"ga{accumulation}",
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=accumulation,
        )
        trainer = _trainer(model, args, data, collator)
        trainer.train()
        dp = trainer.dp_optimizer
        assert dp is not None and dp.steps_taken == 3 == trainer.state.global_step
        assert sum(count for _, count in dp.accountant.history) == 3
        results.append((trainer.epsilon(), _state(model)))
    assert results[0][0] == results[1][0]
    for name, value in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], value, rtol=1e-5, atol=1e-6)


def test_checkpoint_resume_equals_the_uninterrupted_run(
    tokenizers: dict[str, Any], lines: list[str], tmp_path: Path
) -> None:
    def run(resume: str | None) -> tuple[float, dict[str, torch.Tensor], DPTrainer]:
        model, data, collator = _family("gpt2-lora", tokenizers, lines)
        args = _args(tmp_path / "run", max_steps=4, save_strategy="steps", save_steps=2)
        trainer = _trainer(model, args, data, collator)
        trainer.train(resume_from_checkpoint=resume)
        return trainer.epsilon(), _state(model), trainer

    eps, params, _ = run(None)
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert (checkpoint / "optimizer.pt").is_file()
    eps_resumed, params_resumed, trainer = run(str(checkpoint))
    dp = trainer.dp_optimizer
    assert dp is not None and dp.steps_taken == 4
    assert eps_resumed == eps
    for name, value in params.items():
        assert torch.equal(params_resumed[name], value), name


@pytest.mark.parametrize("family", ["gpt2", "bert-mlm"])
def test_full_fine_tuning_with_tied_embeddings_equals_a_batch_of_one_loop(
    family: str, tmp_path: Path
) -> None:
    """GPT-2's and BERT's LM heads share the input embedding: DPTrainer trains them, and the
    micro-batch's clipped sum equals clipping each example's own gradient of its own loss
    (the sum of both uses of the tied weight), in float64."""
    vocab, b, t, c = 40, 5, 6, 0.3
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab, n_positions=8, n_embd=8, n_layer=1, n_head=2, pad_token_id=0
        )
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
        model = transformers.GPT2LMHeadModel(config).double()
    else:
        config = _bert_config(_VocabOf(vocab))
        model = transformers.BertForMaskedLM(config).double()
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 4:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    if family == "bert-mlm":
        labels[:, ::2] = -100
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(b)]
    trainer = DPTrainer(
        model=model,
        args=_args(tmp_path, per_device_train_batch_size=b, max_steps=1),
        train_dataset=rows,
        noise_multiplier=1.0,
        target_delta=1e-5,
        max_grad_norm=c,
        noise_seed=0,
        accountant="rdp",
    )
    trainer.create_optimizer()
    dp = trainer.dp_optimizer
    assert dp is not None
    trainer.training_step(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    got = dp._summed
    assert got is not None
    loss_fn = per_example_loss_for(model)
    params = dict(model.named_parameters())
    for i in range(b):
        logits = model(
            input_ids=ids[i : i + 1],
            attention_mask=mask[i : i + 1],
            position_ids=torch.arange(t)[None],
        ).logits
        loss = loss_fn(logits, labels[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        gs = [
            torch.zeros_like(p) if x is None else x
            for x, p in zip(grads, params.values(), strict=True)
        ]
        norm = math.sqrt(sum(float(x.pow(2).sum()) for x in gs))
        w = min(1.0, c / (norm * (1 + 1e-6)))
        for name, x in zip(params, gs, strict=True):
            got[f"model.{name}"] = got[f"model.{name}"] - w * x
    for name, rest in got.items():
        assert float(rest.abs().max()) < 1e-12, name


class _VocabOf:
    def __init__(self, n: int) -> None:
        self.n, self.pad_token_id = n, 0

    def __len__(self) -> int:
        return self.n


def _refused(build: Callable[[], Any], match: str) -> None:
    with pytest.raises(PrivacyParameterError, match=match):
        build()


def test_refusals(tokenizers: dict[str, Any], lines: list[str], tmp_path: Path) -> None:
    tok = tokenizers["bpe"]
    data = _Encoded(tok, lines)
    # a trainable parameter shared with a module that has no per-example rule (here a
    # holder with a parameter of its own): refused, saying what to do
    shared = _gpt2(tok, lora=False)
    shared.holder = nn.Module()
    shared.holder.w = shared.lm_head.weight
    shared.holder.own = nn.Parameter(torch.zeros(2))
    _refused(lambda: _trainer(shared, _args(tmp_path), data, _clm(tok)), "shared by modules")
    # a model without a known per-example loss
    base = transformers.GPT2Model(_gpt2(tok, lora=False).config)
    _refused(lambda: _trainer(base, _args(tmp_path), data, _clm(tok)), "per_example_loss")
    _refused(lambda: _trainer(_llama(tok), _args(tmp_path, bf16=True), data, _clm(tok)), "bf16")
    _refused(
        lambda: _trainer(_llama(tok), _args(tmp_path), data, _clm(tok), noise_multiplier=1.0),
        "exactly one",
    )


def test_an_empty_poisson_batch_collates_to_zero_rows_with_hf_collators(
    tokenizers: dict[str, Any], lines: list[str]
) -> None:
    """transformers' collators return a BatchEncoding (a UserDict, not a dict): an empty
    batch must still come out with zero rows, never as dataset[0]."""
    from renyi.dpsgd import EmptyBatchCollate

    tok = tokenizers["wordpiece"]
    data = _Encoded(tok, lines, [0] * N)
    batch = EmptyBatchCollate(data, _padding(tok))([])
    assert set(batch) >= {"input_ids", "attention_mask", "labels"}
    assert all(v.shape[0] == 0 for v in batch.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_opacus_loop_with_the_models_own_loss_is_sound_or_refused(
    family: str, tokenizers: dict[str, Any], lines: list[str]
) -> None:
    """``outputs.loss.backward(); optimizer.step()`` through ``PrivacyEngine`` on the same
    models, with their built-in (batch-mean) losses: what step() would noise moves by at
    most C when one example leaves the batch, or the step is refused with renyi's error."""
    from torch.utils.data import DataLoader

    from renyi.dpsgd import PrivacyEngine
    from renyi.errors import RenyiError

    clip = 0.05
    model, data, collator = _family(family, tokenizers, lines)
    params = [p for p in model.parameters() if p.requires_grad]
    module, optimizer, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(params, lr=0.1),
        data_loader=DataLoader(data, batch_size=BATCH, collate_fn=collator),
        noise_multiplier=1.0,
        max_grad_norm=clip,
        seed=0,
    )
    torch.manual_seed(0)  # the masked-LM collator masks at random: one fixed batch
    batch = dict(collator([data[i] for i in range(6)]))

    def clipped(rows: list[int]) -> dict[str, torch.Tensor]:
        module.zero_grad()
        out = module(**{k: v[rows] for k, v in batch.items()})
        out.loss.backward()
        sums, count, _ = optimizer.capture.pop_clipped_sum()
        assert count == len(rows)
        return sums

    try:
        full = clipped(list(range(6)))
    except RenyiError as refused:  # refused: renyi's error saying why, nothing released
        assert str(refused)
        return
    for j in range(6):
        part = clipped([i for i in range(6) if i != j])
        diff = math.sqrt(sum(float((full[k] - part[k]).double().pow(2).sum()) for k in full))
        assert diff <= clip * (1 + 1e-5), (family, j, diff / clip)


def test_dptrainer_equals_the_privacy_engine_loop_bit_for_bit(tmp_path: Path) -> None:
    """The same LoRA classifier, data, optimizer (AdamW, constant lr), Poisson rate, σ, C and
    seeded source: DPTrainer and ``PrivacyEngine`` + ``loss.backward(); optimizer.step()``
    draw the same batches and noise and end with identical adapters."""
    from torch.utils.data import DataLoader, TensorDataset

    from renyi.dpsgd import PrivacyEngine

    g = torch.Generator().manual_seed(0)
    n, seq, vocab = 64, 12, 50
    ids = torch.randint(1, vocab, (n, seq), generator=g)
    mask = (torch.arange(seq) < (4 + torch.arange(n) % 8).unsqueeze(1)).long()
    ids = ids * mask  # right padding with token 0
    labels = torch.randint(0, 3, (n,), generator=g)

    def model() -> nn.Module:
        config = transformers.GPT2Config(
            vocab_size=vocab,
            n_positions=seq,
            n_embd=16,
            n_layer=2,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            pad_token_id=0,
            num_labels=3,
        )
        torch.manual_seed(0)
        lora = peft.LoraConfig(
            r=4, target_modules=["c_attn"], fan_in_fan_out=True, task_type="SEQ_CLS"
        )
        return peft.get_peft_model(transformers.GPT2ForSequenceClassification(config), lora)

    class Classifier(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.inner(input_ids=x, attention_mask=m).logits
            return out

    engine_model = model()
    wrapped = Classifier(engine_model)
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    module, optimizer, loader = PrivacyEngine(accountant="rdp").make_private(
        module=wrapped,
        optimizer=torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.0),
        data_loader=DataLoader(TensorDataset(ids, mask, labels), batch_size=BATCH),
        noise_multiplier=0.8,
        max_grad_norm=1.0,
        seed=0,
        epochs=1,
    )
    for x, m, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(module(x, m), y).backward()
        optimizer.step()

    trainer_model = model()
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in range(n)]
    args = _args(
        tmp_path,
        max_steps=-1,
        num_train_epochs=1,
        learning_rate=1e-2,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        optim="adamw_torch",
    )
    trainer = DPTrainer(
        model=trainer_model,
        args=args,
        train_dataset=rows,
        noise_multiplier=0.8,
        target_delta=1e-5,
        max_grad_norm=1.0,
        accountant="rdp",
        noise_seed=0,
    )
    trainer.train()
    assert trainer.dp_optimizer is not None
    assert trainer.dp_optimizer.steps_taken == optimizer.steps_taken == n // BATCH
    # (the trainer composed its steps one log at a time: the same ε up to rounding)
    assert trainer.epsilon() == pytest.approx(optimizer.epsilon(1e-5).epsilon, rel=1e-12)
    for (name, a), (_, b) in zip(
        engine_model.named_parameters(), trainer_model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
