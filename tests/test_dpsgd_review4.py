"""Held-out review 4: Hugging Face ``transformers`` / ``peft`` / ``Trainer`` habits on
``renyi.dpsgd`` (the ``PrivacyEngine`` capture path and :class:`renyi.dpsgd.hf.DPTrainer`).

Leave-one-out with noise off reuses the machinery of the earlier suites
(``test_dpsgd_losses_hf.leave_one_out``: ``C`` = the median per-example norm, so about half
of the examples are clipped; ``test_dpsgd_losses.leave_one_out`` for plain torch models):
removing one example must move the released clipped sum by at most ``C`` (the engine clips
to ``C / (1 + 1e-6)``). Deterministic: no statistical test here, so no false alarms. Tiny
models from configs with random weights (d 16, 2 layers, vocab 40, 8 tokens): nothing is
downloaded.

Defects these tests found on main (each failed there):

* the capture path decided whether a token sum divided by something is a per-example
  *mean* or *sum* by comparing the divisor's **value** with the batch's token count:
  Hugging Face's ``num_items_in_batch`` (counted over the micro-batches of a logical batch,
  or any count that is not this batch's) made each example's loss a mean in one batch and a
  sum in its neighbour: leave-one-out **1.0117 C** (Llama) and **1.060 C** (token model);
* the same with an unmasked sum divided by a constant (``mse_loss(reduction="sum") /
  (expected batch size × outputs)``): 1.10 C; a flattened token ``.mean()`` of per-token
  losses was refused at random as "mixes the examples";
* ``peft``'s DoRA (``use_dora=True``) raised torch's raw "A view was created in no_grad
  mode ..." on both paths: the per-layer ``vmap`` gradient of the magnitude vector carried a
  graph to the LoRA factors the DoRA layer calls;
* ``peft``'s LoRA on embeddings, IA3 and VeRA were refused with false reasons ("mixes the
  examples", "per-example gradients are wrong"): their tensors are ``ParameterDict``
  entries, parameters of a container that is never called; they are now the adapted
  layer's (per-layer ``vmap``);
* ``DPTrainer.train()`` called a second time wrapped accelerate's wrapper of the private
  optimizer in a *new* private optimizer (a fresh accountant, on a spent sampler):
  ``trainer.epsilon()`` reported **0.0** for a model trained with ε = 4.4;
* ``DPTrainer`` silently ignored ``label_smoothing_factor``, a ``compute_loss`` override and
  ``compute_loss_func=`` (the model was trained on another loss than the one asked for);
* activation checkpointing (``gradient_checkpointing_enable()``, ``torch.utils.checkpoint``)
  on the capture path raised torch's raw ``CheckpointError`` from the user's backward;
* ``peft`` prompt tuning in DPTrainer failed with torch's batch-size ``ValueError`` inside a
  false "works only for some batch sizes" refusal;
* a DPTrainer run resumed mid-epoch from a checkpoint diverged from the uninterrupted run
  when the model or the collator draws random numbers (dropout, masked-LM masking);
* DPTrainer released ``total_flos`` (the sampled batches' token counts, without noise) in
  its logs and checkpoints, and the unnoised training loss from ``train()``; it accepted
  ``include_num_input_tokens_seen`` (the same count) and NEFTune (noise scaled by the
  batch's padded length);
* the private optimizer handed to a plain ``transformers.Trainer`` (``optimizers=(opt,
  None)``) stepped on the ``Trainer``'s own shuffled fixed-size batches and reported the
  Poisson ε of the loader it never used (a second step on one batch was also released
  before the next draw refused it);
* a batch of one example through a Hugging Face model's own token loss raised torch's raw
  ``IndexError`` in the loss analysis; an empty Poisson batch had no way through (the
  models raise torch's raw reshape error on zero rows, and skipping the step is refused);
* full fine-tuning of Gemma (tied, scaled embeddings) in DPTrainer raised torch's raw
  ``vmap`` ``.item()`` error from the whole-model fall-back;
* a DPTrainer resumed from a checkpoint without ``optimizer.pt`` (``save_only_model=True``)
  restarted the accountant: ε reported for the resumed steps only (3.87 instead of 4.87).

Checked and found sound on main (see the report): ``peft`` prefix tuning (a case of the
adapter test), LoRA with ``use_rslora`` on ``"all-linear"``, ``modules_to_save`` heads
(Llama and GPT-2 classifiers), Qwen2/Mistral/Llama-classifier built-in losses on the capture
path, bfloat16 models on both paths, DistilBERT in DPTrainer, ``eval_strategy="steps"``,
``torch_compile=True``, ``gradient_accumulation_steps`` with epochs (ε = the accountant's).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from torch import Tensor, nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from renyi.dpsgd.capture import PerExampleCapture  # noqa: E402
from renyi.dpsgd.hf import DPTrainer, per_example_loss_for  # noqa: E402
from renyi.errors import PrivacyParameterError  # noqa: E402
from test_dpsgd_losses import leave_one_out as torch_leave_one_out  # noqa: E402
from test_dpsgd_losses_hf import leave_one_out as hf_leave_one_out  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore::renyi.errors.InsecureRandomnessWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

B, T, V = 6, 8, 40  # the batch of test_dpsgd_losses_hf.leave_one_out


@pytest.fixture(autouse=True, scope="module")
def _quiet_and_cheap() -> Any:
    transformers.logging.set_verbosity_error()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _llama(cls: Any = None) -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model: nn.Module = (cls or transformers.LlamaForCausalLM)(config)
    return model


def _batch(seed: int = 0) -> dict[str, Tensor]:
    """Right-padded token batch (0..5 pad tokens), causal-LM labels (-100 on padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    for i in range(B):
        mask[i, T - i :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}


PEFT: dict[str, Callable[[], Any]] = {
    "dora": lambda: peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=True),
    "lora-embedding": lambda: peft.LoraConfig(r=4, target_modules=["embed_tokens", "q_proj"]),
    "ia3": lambda: peft.IA3Config(
        target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]
    ),
    "vera": lambda: peft.VeraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    "prefix": lambda: peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3),
}


def _adapted(kind: str) -> nn.Module:
    torch.manual_seed(1)
    model = peft.get_peft_model(_llama(), PEFT[kind]())
    with torch.no_grad():  # adapters start as the identity (a factor at 0): move them
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p), alpha=0.1)
    return model


def _rows(batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    n = len(next(iter(batch.values())))
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def _trainer(model: nn.Module, rows: list[dict[str, Tensor]], tmp: Path, **kw: Any) -> DPTrainer:
    args = {
        "output_dir": str(tmp),
        "per_device_train_batch_size": B,
        "max_steps": 2,
        "learning_rate": 1e-2,
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
    }
    args.update(kw.pop("args", {}))
    kw.setdefault("noise_multiplier", 1.0)
    return DPTrainer(
        model=model,
        args=transformers.TrainingArguments(**args),
        train_dataset=rows,
        target_delta=1e-5,
        max_grad_norm=kw.pop("max_grad_norm", 0.5),
        noise_seed=0,
        accountant="rdp",
        **kw,
    )


def _trainer_sums(
    make: Callable[[], nn.Module], batch: dict[str, Tensor], tmp: Path, clip: float
) -> Callable[[list[int]], Tensor]:
    """DPTrainer's clipped sum (float64, flat) of one micro-batch ``batch[rows]``."""
    trainer = _trainer(make(), _rows(batch), tmp, max_grad_norm=clip)
    trainer.create_optimizer()
    dp = trainer.dp_optimizer
    assert dp is not None

    def run(rows: list[int]) -> Tensor:
        dp._summed = None
        trainer.training_step(trainer.model, {k: v[rows] for k, v in batch.items()})
        sums = dp._summed
        dp._summed = None
        assert sums is not None
        return torch.cat([v.double().flatten() for v in sums.values()])

    return run


def trainer_leave_one_out(
    make: Callable[[], nn.Module], batch: dict[str, Tensor], tmp: Path
) -> float:
    """DPTrainer's leave-one-out of one micro-batch / C, C = the median per-example norm."""
    single = _trainer_sums(make, batch, tmp, 1e6)
    c = sorted(float(single([i]).norm()) for i in range(B))[B // 2]
    run = _trainer_sums(make, batch, tmp, c)
    full = run(list(range(B)))
    return max(float((full - run([i for i in range(B) if i != j])).norm()) / c for j in range(B))


# ------------------------------------------------------------------ defects found on main


class _CountedElsewhere(nn.Module):
    """The model called as the ``Trainer`` calls it with gradient accumulation: its built-in
    loss is the batch's token sum divided by ``num_items_in_batch``, a count taken over the
    whole logical batch (here: the full batch's, also when an example is left out)."""

    def __init__(self, model: nn.Module, count: int) -> None:
        super().__init__()
        self.model, self.count = model, count

    def forward(self, **kw: Tensor) -> Any:
        return self.model(**kw, num_items_in_batch=torch.tensor(self.count))


def test_num_items_in_batch_from_other_micro_batches_keeps_each_example_a_mean() -> None:
    """On main the capture path called the token sum a per-example *mean* when
    ``num_items_in_batch`` happened to equal this batch's token count and a *sum* otherwise:
    the full batch (count equal) and the batch without one example (count stale) defined
    every example's loss differently: leave-one-out 1.0117 C. Now a normalised masked sum is
    a mean whatever the divisor's value; the released sum equals the one without
    ``num_items_in_batch`` (the model's own token mean)."""
    batch = _batch()
    count = int((batch["labels"][:, 1:] != -100).sum())
    assert hf_leave_one_out(_CountedElsewhere(_llama(), count), batch) <= 1.0
    sums = []
    for model in (_CountedElsewhere(_llama(), 1000), _llama()):
        cap = PerExampleCapture(model, max_grad_norm=0.5)
        try:
            model(**batch).loss.backward()
            got, _, _ = cap.pop_clipped_sum()
        finally:
            cap.remove()
        sums.append(torch.cat([v.double().flatten() for v in got.values()]))
    assert float((sums[0] - sums[1]).abs().max()) <= 1e-6 * float(sums[1].abs().max())


def test_token_sum_over_a_public_constant_is_not_batch_dependent() -> None:
    """The same without transformers: ``cross_entropy(..., reduction="sum") / 16`` on a
    token model, 16 being the full batch's token count (e.g. a constant "tokens per batch").
    On main: leave-one-out 1.060 C."""
    from test_dpsgd_losses import K, _token_data, _tokens

    x, y = _token_data()
    count = int((y != -100).sum())

    def loss(o: Tensor, t: Tensor) -> Tensor:
        return F.cross_entropy(o.view(-1, K), t.view(-1), reduction="sum") / count

    assert torch_leave_one_out(_tokens, x, y, loss) <= 1.0


def test_unmasked_sum_over_the_expected_batch_size_is_not_batch_dependent() -> None:
    """``mse_loss(..., reduction="sum") / (expected batch size × outputs)``: normalising by a
    public constant is the DP habit; on main the analysis called the sum a per-example
    *mean* in the batches whose number of terms happened to equal the constant and a *sum*
    in the others: leave-one-out 1.10 C. Now an unmasked sum stays a sum whatever it is
    divided by (``kl_div``'s ``batchmean`` and ``/ B`` keep their per-example sums)."""
    from test_dpsgd_losses import K, _class_data, _mlp

    x, y = _class_data()
    expected = x.shape[0] * K

    def loss(o: Tensor, t: Tensor) -> Tensor:
        return F.mse_loss(o, F.one_hot(t, K).to(o.dtype), reduction="sum") / expected

    assert torch_leave_one_out(_mlp, x, y, loss) <= 1.0


def test_a_flattened_token_mean_is_not_refused_as_mixing() -> None:
    """``cross_entropy(logits.view(-1, V), labels.view(-1), reduction="none").mean()``: on
    main the probe mapped token term ``k`` to example ``k`` (the layout was never looked
    up, the weights not needing it) and refused the loss as "mixes the examples" at random.
    Now the layout is found for the probe; leave-one-out below C, three times."""
    from test_dpsgd_losses import K, _token_data, _tokens

    x, y = _token_data()

    def loss(o: Tensor, t: Tensor) -> Tensor:
        flat = F.cross_entropy(o.view(-1, K), t.view(-1).clamp_min(0), reduction="none")
        return flat.mean()

    for _ in range(3):  # the probe picks a random term
        assert torch_leave_one_out(_tokens, x, y, loss) <= 1.0


@pytest.mark.parametrize("kind", list(PEFT))
def test_peft_adapters_train_on_both_paths_and_equal_a_batch_of_one_loop(
    kind: str, tmp_path: Path
) -> None:
    """``peft`` adapters beyond LoRA on Linear layers (prefix tuning: sound on main). On
    main: DoRA raised torch's raw
    RuntimeError ("A view was created in no_grad mode ...") on both paths; LoRA on the
    embedding, IA3 and VeRA (their trainable tensors are ``ParameterDict`` entries used by
    the adapted layer's forward) were refused as "mixes the examples" (capture path) or
    "the layer-wise per-example gradients are wrong" (DPTrainer). Now leave-one-out stays
    below C on both paths, and the unclipped captured sum equals the sum of each example's
    own gradient (plain autograd, one example at a time): every adapter tensor is there."""
    batch = _batch()
    assert hf_leave_one_out(_adapted(kind), batch) <= 1.0
    assert trainer_leave_one_out(lambda: _adapted(kind), batch, tmp_path) <= 1.0
    model = _adapted(kind)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    want = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    for i in range(B):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        grads = torch.autograd.grad(model(**one).loss, list(params.values()))
        for n, g in zip(params, grads, strict=True):
            want[n] += g.double()
    cap = PerExampleCapture(model, max_grad_norm=1e6)
    try:
        model(**batch).loss.backward()
        got, _, _ = cap.pop_clipped_sum()
    finally:
        cap.remove()
    assert sorted(got) == sorted(params)
    for n in params:
        scale = float(want[n].abs().max())
        assert scale > 0, n
        assert float((got[n].double() - want[n]).abs().max()) <= 1e-4 * scale, n


def test_a_second_train_is_refused_and_epsilon_stays_the_accountants(tmp_path: Path) -> None:
    """On main a second ``train()`` wrapped accelerate's wrapper of the private optimizer in
    a new one: ``epsilon()`` fell to 0.0 for a model trained with ε = 4.4. Now it is
    refused with our error; ε and the parameters are those of the first run."""
    from renyi.accountants import make_accountant
    from renyi.events import GaussianEvent, PoissonSampledEvent

    rows = _rows(_batch()) * 4  # 24 examples, q = 6/24
    model = _llama()
    trainer = _trainer(model, rows, tmp_path)
    trainer.train()
    event = PoissonSampledEvent(B / len(rows), GaussianEvent(1.0))
    oracle = make_accountant("rdp").compose(event, 2).epsilon(1e-5).epsilon
    assert trainer.epsilon() == oracle
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(PrivacyParameterError, match="called again"):
        trainer.train()
    assert trainer.epsilon() == oracle
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("kind", ["causal", "classifier"])
def test_label_smoothing_factor_is_the_loss_trained(kind: str, tmp_path: Path) -> None:
    """``label_smoothing_factor`` (the ``Trainer``'s ``LabelSmoother``): on main DPTrainer
    trained the unsmoothed loss. Now each example's loss equals the ``LabelSmoother`` on
    that example alone (causal LM: shifted labels; classifier)."""
    from transformers.trainer_pt_utils import LabelSmoother

    eps = 0.2
    batch = _batch()
    if kind == "classifier":
        make = functools.partial(_llama, transformers.LlamaForSequenceClassification)
        batch["labels"] = torch.tensor([0, 1, 1, 0, 1, 0])
    else:
        make = _llama
    model = make()
    trainer = _trainer(model, _rows(batch), tmp_path, args={"label_smoothing_factor": eps})
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    got = trainer.per_example_loss(logits, batch["labels"])
    smoother = LabelSmoother(epsilon=eps)
    for i in range(B):
        want = smoother(
            {"logits": logits[i : i + 1]}, batch["labels"][i : i + 1], shift_labels=kind == "causal"
        )
        assert math.isclose(float(got[i]), float(want), rel_tol=1e-5), i
    assert not math.isclose(
        float(got[0]), float(per_example_loss_for(model)(logits, batch["labels"])[0])
    )


def test_a_custom_training_loss_is_refused_not_ignored(tmp_path: Path) -> None:
    """A ``compute_loss`` override or ``compute_loss_func=``: on main DPTrainer never called
    them and trained its own loss. Now refused, pointing to ``per_example_loss=``."""
    rows = _rows(_batch())

    class Custom(DPTrainer):
        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("not reached")

    with pytest.raises(PrivacyParameterError, match="per_example_loss"):
        Custom(
            model=_llama(),
            args=transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[]),
            train_dataset=rows,
            noise_multiplier=1.0,
            target_delta=1e-5,
            max_grad_norm=1.0,
        )
    with pytest.raises(PrivacyParameterError, match="per_example_loss"):
        _trainer(_llama(), rows, tmp_path, compute_loss_func=lambda *a, **k: None)
    with pytest.raises(PrivacyParameterError, match="label_smoothing"):
        _trainer(
            _llama(),
            rows,
            tmp_path,
            args={"label_smoothing_factor": 0.1},
            per_example_loss=lambda logits, labels: logits.sum((1, 2)),
        )


def test_activation_checkpointing_on_the_capture_path_is_refused_clearly() -> None:
    """``model.gradient_checkpointing_enable()`` (Hugging Face) or ``torch.utils.checkpoint``
    in the forward with ``loss.backward()`` through the capture: on main torch's raw
    ``CheckpointError`` ("Recomputed values ... have different metadata") from the user's
    backward. Now refused with our error naming the fix (DPTrainer and ``accumulate()``
    run their own forward)."""
    from torch.utils.checkpoint import checkpoint

    from renyi.dpsgd.grad_sample import UnsupportedModelError

    model = _llama()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    cap = PerExampleCapture(model, max_grad_norm=1.0)
    try:
        with pytest.raises(UnsupportedModelError, match="gradient checkpointing"):
            model(**_batch()).loss.backward()
    finally:
        cap.remove()

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

        def forward(self, x: Tensor) -> Tensor:
            h = checkpoint(lambda z: torch.tanh(self.a(z)), x, use_reentrant=False)
            return self.b(h)  # type: ignore[arg-type]

    torch.manual_seed(0)
    small = Checkpointed()
    cap = PerExampleCapture(small, max_grad_norm=1.0)
    try:
        with pytest.raises(UnsupportedModelError, match="checkpointing"):
            F.cross_entropy(small(torch.randn(6, 4)), torch.arange(6) % 3).backward()
    finally:
        cap.remove()


def test_prompt_tuning_is_refused_by_dptrainer_with_the_reason(tmp_path: Path) -> None:
    """``peft`` prompt tuning embeds the virtual tokens once and repeats them over the
    batch. On main DPTrainer failed inside its independence check with torch's "Expected
    input batch_size (30) to match target batch_size (21)" (the logits carry the virtual
    tokens) under a claim that the forward "works only for some batch sizes". Now refused
    at set-up, saying why and what trains instead (prefix tuning: tested above)."""
    torch.manual_seed(1)
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
    model = peft.get_peft_model(_llama(), config)
    with pytest.raises(PrivacyParameterError, match="prefix tuning"):
        _trainer(model, _rows(_batch()), tmp_path)


def test_resume_mid_epoch_with_dropout_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """A Llama with attention dropout, 2 micro-batches per step, 2 epochs of 4 steps, a
    checkpoint every 3 steps; the run resumed from ``checkpoint-3`` (mid-epoch). On main
    its parameters differed from the uninterrupted run's by up to 7e-3 (from
    ``checkpoint-2``; 2e-3 from ``checkpoint-3``): the ``Trainer`` restores torch's RNG at the
    start of the resumed epoch, and the private loader's iterator then drew its seed from it,
    so dropout (and a masked-LM collator's masking) drew other numbers. Now equal bit for
    bit, with the same ε (the accountant's for 8 steps)."""

    def dropout_llama() -> nn.Module:
        model = _llama()
        model.config.attention_dropout = 0.2
        for layer in model.model.layers:  # type: ignore[union-attr]
            layer.self_attn.attention_dropout = 0.2
        return model

    rows = _rows(_batch()) * 4

    def run(out: Path, resume: str | None) -> tuple[float, list[Tensor]]:
        model = dropout_llama()
        trainer = _trainer(
            model,
            rows,
            out,
            max_grad_norm=0.1,
            args={
                "per_device_train_batch_size": 3,
                "gradient_accumulation_steps": 2,
                "max_steps": -1,
                "num_train_epochs": 2,
                "save_strategy": "steps",
                "save_steps": 3,
            },
        )
        trainer.train(resume_from_checkpoint=resume)
        dp = trainer.dp_optimizer
        assert dp is not None and dp.steps_taken == 8
        return trainer.epsilon(), [p.detach().clone() for p in model.parameters()]

    eps, params = run(tmp_path / "a", None)
    eps_resumed, resumed = run(tmp_path / "b", str(tmp_path / "a" / "checkpoint-3"))
    assert eps_resumed == eps
    assert all(torch.equal(a, b) for a, b in zip(params, resumed, strict=True))


def test_dptrainer_logs_and_state_carry_no_unnoised_batch_statistics(tmp_path: Path) -> None:
    """On main DPTrainer logged, and saved in ``trainer_state.json``, ``total_flos``: the
    ``Trainer`` sums ``6 × parameters × tokens`` of every sampled batch, so it released the
    Poisson batches' realised sizes (an example's presence shifts it) without noise;
    ``include_num_input_tokens_seen=True`` logged their token count; ``neftune_noise_alpha``
    was accepted although NEFTune scales its noise by the batch's padded length (each
    example's gradient then depends on the others' lengths). Now ``total_flos`` is 0 and
    not logged, the other two are refused with the reason."""
    rows = _rows(_batch()) * 4
    trainer = _trainer(_llama(), rows, tmp_path)
    output = trainer.train()
    assert trainer.state.total_flos == 0
    assert "total_flos" not in output.metrics or output.metrics["total_flos"] == 0
    assert not any(
        "total_flos" in h or "num_input_tokens_seen" in h for h in trainer.state.log_history
    )
    for name, value in (("include_num_input_tokens_seen", True), ("neftune_noise_alpha", 5.0)):
        with pytest.raises(PrivacyParameterError, match=name):
            _trainer(_llama(), rows, tmp_path, args={name: value})


def test_the_private_optimizer_in_a_plain_trainer_is_refused(tmp_path: Path) -> None:
    """``make_private`` then ``transformers.Trainer(..., optimizers=(optimizer, None))`` with
    a ``compute_loss`` returning ``model(**inputs).loss``: the ``Trainer`` feeds batches from
    its own loader (shuffled, fixed size). On main the private optimizer took 3 steps and
    reported ε = 4.42 for Poisson sampling at q = 1/4, which those batches never had. Now the
    first step is refused (no batch was drawn from the private loader): nothing released."""
    from torch.utils.data import DataLoader

    from renyi.dpsgd import PrivacyEngine

    rows = _rows(_batch()) * 4

    def collate(batch: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        return {k: torch.stack([r[k] for r in batch]) for k in batch[0]}

    model = _llama()
    module, optimizer, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(rows, batch_size=B, collate_fn=collate),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
    )

    class Plain(transformers.Trainer):
        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            return model(**inputs).loss

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=B,
        max_steps=3,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        remove_unused_columns=False,
    )
    trainer = Plain(
        model=module,
        args=args,
        train_dataset=rows,
        data_collator=collate,
        optimizers=(optimizer, None),
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(PrivacyParameterError, match="private data loader"):
        trainer.train()
    assert optimizer.steps_taken == 0
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_train_returns_no_unnoised_training_loss(tmp_path: Path) -> None:
    """DPTrainer leaves the training loss out of its logs (an unnoised statistic of the
    private batches), but on main ``train()`` returned it (``training_loss`` and
    ``metrics["train_loss"]``, 2.68 here), which Hugging Face's example scripts print and
    save (``trainer.save_metrics("train", metrics)``). Now NaN / absent, unless
    ``log_train_loss=True``."""
    rows = _rows(_batch()) * 4
    output = _trainer(_llama(), rows, tmp_path).train()
    assert math.isnan(output.training_loss)
    assert "train_loss" not in output.metrics
    logged = _trainer(_llama(), rows, tmp_path / "b", log_train_loss=True).train()
    assert logged.training_loss > 0 and logged.metrics["train_loss"] == logged.training_loss


def test_an_empty_poisson_batch_steps_without_a_forward_on_hf_models() -> None:
    """Hugging Face models raise torch's raw ``RuntimeError: cannot reshape tensor of 0
    elements`` on a batch of zero rows, which Poisson sampling draws; on main the Opacus loop
    had no way through: the forward raised, and skipping the batch (``continue``) is refused
    at the next draw. Now the forward of an empty batch is refused with our error saying
    what to do, and ``optimizer.step()`` without a forward on an empty batch drawn from the
    private loader releases the noise-only step (accounted; ε equals the accountant's)."""
    from torch.utils.data import DataLoader

    from renyi.accountants import make_accountant
    from renyi.dpsgd import PrivacyEngine
    from renyi.events import GaussianEvent, PoissonSampledEvent

    rows = _rows(_batch()) * 4

    def collate(batch: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        if not batch:  # an empty Poisson batch: zero rows of each column
            return {k: v[:0] for k, v in _batch().items()}
        return {k: torch.stack([r[k] for r in batch]) for k in batch[0]}

    model = _llama()
    module, optimizer, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(rows, batch_size=1, collate_fn=collate),  # q = 1/24
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
    )
    empty = full = 0
    for batch in loader:
        optimizer.zero_grad()
        if len(batch["input_ids"]) == 0:
            if empty == 0:
                with pytest.raises(PrivacyParameterError, match="empty batch"):
                    module(**batch)
            before = [p.detach().clone() for p in model.parameters()]
            optimizer.step()  # noise only
            assert not all(
                torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)
            )
            empty += 1
        else:
            module(**batch).loss.backward()
            optimizer.step()
            full += 1
        if empty >= 2 and full >= 1:
            break
    assert empty >= 2 and full >= 1
    event = PoissonSampledEvent(1 / len(rows), GaussianEvent(1.0))
    want = make_accountant("rdp").compose(event, empty + full).epsilon(1e-5).epsilon
    assert optimizer.epsilon(1e-5).epsilon == want


def test_a_batch_of_one_through_the_models_own_token_loss() -> None:
    """A batch of one example (Poisson batches and micro-batches of one are common) through
    ``model(**batch).loss.backward()``: on main the loss analysis mapped the flattened token
    terms as if each were an example and raised torch's raw ``IndexError: index out of range
    in self``. Now the captured sum is that example's own gradient (unclipped, C large), and
    clipped to C."""
    batch = {k: v[1:2] for k, v in _batch().items()}
    model = _llama()
    params = [p for p in model.parameters() if p.requires_grad]
    want = torch.cat([g.flatten() for g in torch.autograd.grad(model(**batch).loss, params)])
    for clip in (1e6, 0.1):
        cap = PerExampleCapture(model, max_grad_norm=clip)
        try:
            model(**batch).loss.backward()
            got, n, _ = cap.pop_clipped_sum()
        finally:
            cap.remove()
        flat = torch.cat([v.flatten() for v in got.values()])
        assert n == 1
        scale = min(1.0, clip / (float(want.norm()) * (1 + 1e-6)))
        torch.testing.assert_close(flat, want * scale, rtol=1e-4, atol=1e-7)


def test_tied_gemma_in_dptrainer_is_refused_with_our_error(tmp_path: Path) -> None:
    """Gemma ties its LM head to a scaled embedding (a subclass of ``nn.Embedding`` without
    a per-example rule), so renyi falls back to whole-model ``vmap``, which cannot run the
    model (Hugging Face's mask construction calls ``.item()``). On main DPTrainer's first
    step raised torch's raw "vmap: It looks like you're either (1) calling .item() ...".
    Now our error, saying why and what to do (untie or freeze, LoRA); untied, it trains
    (leave-one-out below C)."""
    from renyi.dpsgd.grad_sample import UnsupportedModelError

    def gemma(tie: bool) -> nn.Module:
        config = transformers.GemmaConfig(
            vocab_size=V,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=32,
            pad_token_id=0,
            tie_word_embeddings=tie,
        )
        torch.manual_seed(0)
        return transformers.GemmaForCausalLM(config)

    batch = _batch()
    trainer = _trainer(gemma(True), _rows(batch), tmp_path)
    trainer.create_optimizer()
    with pytest.raises(UnsupportedModelError, match="tie_word_embeddings=False"):
        trainer.training_step(trainer.model, dict(batch))
    assert trainer_leave_one_out(lambda: gemma(False), batch, tmp_path) <= 1.0


def test_resuming_a_checkpoint_without_the_private_optimizer_state_is_refused(
    tmp_path: Path,
) -> None:
    """``save_only_model=True`` (or a checkpoint copied without ``optimizer.pt``): on main
    the ``Trainer`` loaded the weights trained for 2 private steps and silently started a
    fresh accountant: ``epsilon()`` = 3.87 (the 2 resumed steps) for a model trained with
    4 (ε = 4.87). Now refused with our error before anything is trained."""
    rows = _rows(_batch()) * 4
    args = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "save_only_model": True}
    _trainer(_llama(), rows, tmp_path / "a", args=args).train()
    resumed = _trainer(_llama(), rows, tmp_path / "b", args=args)
    with pytest.raises(PrivacyParameterError, match=r"optimizer\.pt"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.epsilon() == 0.0 and resumed.state.global_step == 0
