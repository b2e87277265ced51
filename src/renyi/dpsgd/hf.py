"""Private fine-tuning with Hugging Face ``transformers`` (and ``peft``): :class:`DPTrainer`.

``DPTrainer`` is a ``transformers.Trainer`` that trains with DP-SGD: give it the privacy
target next to the usual arguments, and every other habit of the ``Trainer`` — training
arguments, data collators, LR schedules, callbacks, evaluation, ``save_steps`` checkpoints
and ``train(resume_from_checkpoint=...)`` — keeps working::

    trainer = DPTrainer(model=model, args=TrainingArguments(...), train_dataset=train,
                        data_collator=collator, target_epsilon=8.0, target_delta=1e-5,
                        max_grad_norm=1.0)
    trainer.train()
    trainer.epsilon()           # the accountant's ε for the steps taken

What it changes, and why:

* **batches** are Poisson samples of the training set (or another renyi sampler,
  ``sampling=``) with expected size ``per_device_train_batch_size ×
  gradient_accumulation_steps`` — the *logical* batch; each is cut into
  ``gradient_accumulation_steps`` micro-batches of nearly equal size (empty ones included)
  and released as one step: one clipped sum over all its micro-batches, one noise draw,
  one accounted step (:class:`~renyi.dpsgd.optimizer.DPOptimizer`).
* **the loss is per example**: Hugging Face models average their loss over the *batch's*
  tokens, so each example's weight depends on the others (its leave-one-out sensitivity
  exceeds ``C``). ``DPTrainer`` calls the model for logits only and computes each example's
  loss on its own (:func:`causal_lm_loss`, :func:`masked_lm_loss`,
  :func:`sequence_classification_loss`, chosen from the model's class; or
  ``per_example_loss=``): the mean over that example's own target tokens (or their sum,
  ``token_reduction="sum"``); the clipped sum is divided by the *expected* logical batch
  size, a public constant.
* **per-example gradients** come from renyi's clipping engine
  (:class:`~renyi.dpsgd.clipping.ClippedGradientEngine`, ghost norms; LoRA adapters of
  ``peft`` are Linear layers) on the model called with explicit per-example
  ``position_ids`` (the default ``[1, T]`` positions would be shared by the batch).
* **the plan is fixed before training**: σ is calibrated so that the planned steps
  (``max_steps``, or ``num_train_epochs`` epochs of ``⌈n / logical batch⌉`` steps, rounded
  up) cost at most ``target_epsilon`` at ``target_delta``; the optimizer refuses a step past
  them. ``args.max_steps`` is set to that number.
* **logs**: ``epsilon`` is added to every log; the training loss is *not* logged by default
  (it is computed from the private data without noise: ``log_train_loss=True`` to log it
  anyway), nor is ``total_flos`` (0: the ``Trainer`` sums the sampled batches' token
  counts into it). Hugging Face's own gradient clipping of the released gradient is
  switched off (``max_grad_norm`` here is the per-example clipping norm).
* **checkpoints**: the optimizer's ``state_dict`` (saved by the ``Trainer`` as
  ``optimizer.pt``) holds the accountant, the sampler's position and random state and the
  noise source's state (no key: secure noise is drawn fresh after a resume; a seeded run,
  ``noise_seed=``, resumes bit for bit); resuming checks the mechanism and continues the
  sampler where the checkpoint left it (``ignore_data_skip`` is set: the ``Trainer`` must not
  draw and discard batches). With ``dataloader_num_workers > 0`` the loader draws batches
  ahead of the steps: a seeded run saves them and the resumed loader yields them first; a
  secure run saves no batch indices and draws those steps' batches afresh.

Refused with the reason: several processes or GPUs, DeepSpeed/FSDP, fp16/bf16 mixed
precision (not yet verified for the per-example engine), ``group_by_length`` and
``auto_find_batch_size`` (they change the sampling), trainable parameters shared by
modules other than layers with per-example rules (tied input/output embeddings, GPT-2's and
BERT's LM heads, are trained: their per-example gradients are the sum of both uses'), models
whose per-example loss is unknown without ``per_example_loss=``, a ``compute_loss``
override or ``compute_loss_func=`` (never called here: give ``per_example_loss=``), a
second ``train()`` without a checkpoint (the planned steps are spent), resuming from a checkpoint
without ``optimizer.pt`` (``save_only_model=True``: ε would restart from zero),
``include_num_input_tokens_seen`` (an unnoised count of the sampled tokens), gradient
(activation) checkpointing (``gradient_checkpointing=True`` or
``model.gradient_checkpointing_enable()``: the per-example engine keeps the layers' inputs,
so the recomputation raises the peak memory instead of lowering it; lower
``per_device_train_batch_size`` and raise ``gradient_accumulation_steps``), NEFTune
(``neftune_noise_alpha``: its noise scale is the batch's padded length), ``peft`` prompt
tuning and p-tuning (the virtual tokens are embedded once and repeated over the batch:
prefix tuning, which embeds them per example, is trained). ``label_smoothing_factor`` is
applied to each example's tokens as the ``Trainer``'s ``LabelSmoother`` does.

Guarantee: as :class:`~renyi.dpsgd.optimizer.DPOptimizer` — the Poisson-subsampled Gaussian
(add/remove one training example), composed over the steps taken, by the chosen accountant
(PLD by default; Abadi et al. 2016; Mironov, Talwar & Zhang 2019). It covers the released
parameters (and anything computed from them), not the logged training loss.

Models are built from configs and tokenisers trained locally in the tests and examples
(:func:`train_tokenizer`); nothing here downloads anything.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

try:
    import transformers
except ImportError as exc:  # pragma: no cover - the optional extra
    raise ImportError(
        "renyi.dpsgd.hf needs Hugging Face transformers: pip install 'renyi[hf]'"
    ) from exc

from renyi._validation import check_delta, check_int, check_positive, fail
from renyi.dpsgd.optimizer import DPOptimizer
from renyi.dpsgd.privacy import (
    EmptyBatchCollate,
    PlannedBatchSampler,
    TrainingPlan,
    dataset_of,
    plan_training,
)

__all__ = [
    "IGNORE_INDEX",
    "DPTrainer",
    "LogitsForward",
    "causal_lm_loss",
    "masked_lm_loss",
    "per_example_loss_for",
    "sequence_classification_loss",
    "train_tokenizer",
]

#: Label of tokens that carry no loss (padding, prompt, unmasked tokens): Hugging Face's.
IGNORE_INDEX = -100

TokenReduction = Literal["mean", "sum"]


# ------------------------------------------------------------------ per-example losses
def _at_least_float32(t: Tensor) -> Tensor:
    """float16/bfloat16 logits in float32 for the loss; float32/float64 unchanged (a float64
    model's loss stays in float64)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _smoothing(label_smoothing: float) -> float:
    if not (isinstance(label_smoothing, int | float) and 0.0 <= label_smoothing < 1.0):
        raise fail("label_smoothing", label_smoothing, "a number in [0, 1)")
    return float(label_smoothing)


def _token_losses(
    logits: Tensor, labels: Tensor, token_reduction: TokenReduction, label_smoothing: float = 0.0
) -> Tensor:
    """``[B]``: each example's cross-entropy over its own labelled tokens (``[B, T, V]``
    logits, ``[B, T]`` labels), their mean or sum; 0 for an example without any. With
    ``label_smoothing`` ``eps``, each token's loss is ``(1 - eps) nll + eps mean_v(-log p_v)``
    (torch's, and the ``Trainer``'s ``LabelSmoother``'s per token)."""
    if token_reduction not in ("mean", "sum"):
        raise fail("token_reduction", token_reduction, "'mean' or 'sum'")
    keep = labels != IGNORE_INDEX
    ce = nn.functional.cross_entropy(
        _at_least_float32(logits.reshape(-1, logits.shape[-1])),
        labels.masked_fill(~keep, 0).reshape(-1),
        reduction="none",
        label_smoothing=_smoothing(label_smoothing),
    ).view(labels.shape)
    total = (ce * keep).sum(dim=1)
    if token_reduction == "sum":
        return total
    return total / keep.sum(dim=1).clamp_min(1)


def causal_lm_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    token_reduction: TokenReduction = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-example next-token loss ``[B]``: token ``t``'s logits predict label ``t + 1``
    (labels ``-100`` are skipped), averaged over the example's own predicted tokens.

    Unlike the models' built-in loss (a mean over all the batch's tokens), each example's
    loss depends on that example alone.

    Example:
        >>> logits = torch.zeros(2, 4, 5)
        >>> labels = torch.tensor([[1, 2, 3, -100], [1, -100, -100, -100]])
        >>> [round(v, 4) for v in causal_lm_loss(logits, labels).tolist()]  # log 5; none
        [1.6094, 0.0]
    """
    return _token_losses(logits[:, :-1], labels[:, 1:], token_reduction, label_smoothing)


def masked_lm_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    token_reduction: TokenReduction = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-example masked-token loss ``[B]`` (labels ``-100`` for unmasked tokens), averaged
    over the example's own masked tokens (0 when none was masked)."""
    return _token_losses(logits, labels, token_reduction, label_smoothing)


def sequence_classification_loss(
    logits: Tensor,
    labels: Tensor,
    *,
    problem_type: str | None = None,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-example loss ``[B]`` of a sequence classifier, as the models define theirs:
    ``"regression"`` (one output: squared error), ``"single_label_classification"`` (cross
    entropy) or ``"multi_label_classification"`` (binary cross entropy, mean over labels).
    ``problem_type=None`` infers it as the models do (one output: regression; integer
    labels: single label; else multi label). ``label_smoothing`` applies to single-label
    classification only (refused for the others)."""
    eps = _smoothing(label_smoothing)
    if problem_type is None:
        if logits.shape[-1] == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if eps and problem_type != "single_label_classification":
        raise fail("label_smoothing", eps, f"0 for {problem_type!r} (no classes to smooth)")
    if problem_type == "regression":
        return (
            (_at_least_float32(logits.reshape(len(labels), -1)) - labels.reshape(len(labels), -1))
            .pow(2)
            .mean(dim=1)
        )
    if problem_type == "single_label_classification":
        return nn.functional.cross_entropy(
            _at_least_float32(logits), labels.long(), reduction="none", label_smoothing=eps
        )
    if problem_type == "multi_label_classification":
        return nn.functional.binary_cross_entropy_with_logits(
            _at_least_float32(logits), labels.to(_at_least_float32(logits).dtype), reduction="none"
        ).mean(dim=1)
    raise fail(
        "problem_type",
        problem_type,
        "'regression', 'single_label_classification' or 'multi_label_classification'",
    )


def _base_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a ``peft`` wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _class_names(mapping: Any) -> set[str]:
    names: set[str] = set()
    for value in mapping.values():
        names.update((value,) if isinstance(value, str) else value)
    return names


def per_example_loss_for(
    model: nn.Module, *, token_reduction: TokenReduction = "mean", label_smoothing: float = 0.0
) -> Callable[[Tensor, Tensor], Tensor]:
    """The per-example loss ``(logits, labels) -> [B]`` of a transformers model (or a
    ``peft`` model around one), from its class: causal LM, masked LM or sequence
    classification (``label_smoothing``: the ``Trainer``'s ``label_smoothing_factor``).

    Raises:
        PrivacyParameterError: another kind of model (pass ``per_example_loss=``).
    """
    from transformers.models.auto import modeling_auto as auto

    base = _base_model(model)
    name = type(base).__name__
    eps = _smoothing(label_smoothing)
    if name in _class_names(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        return lambda logits, labels: causal_lm_loss(
            logits, labels, token_reduction=token_reduction, label_smoothing=eps
        )
    if name in _class_names(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES):
        return lambda logits, labels: masked_lm_loss(
            logits, labels, token_reduction=token_reduction, label_smoothing=eps
        )
    if name in _class_names(auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES):
        problem = getattr(getattr(base, "config", None), "problem_type", None)
        return lambda logits, labels: sequence_classification_loss(
            logits, labels, problem_type=problem, label_smoothing=eps
        )
    raise fail(
        "model",
        name,
        "a causal-LM, masked-LM or sequence-classification model of transformers, or "
        "per_example_loss=(logits, labels) -> one loss per example",
    )


# ------------------------------------------------------------------ the model, positionally
class LogitsForward(nn.Module):
    """The model as the clipping engine calls it: tensors in (positionally, in the order of
    :attr:`keys`), logits out.

    Calls ``model(**dict(zip(keys, tensors)))`` with ``use_cache=False`` and, when the model
    takes them and the batch has none, explicit per-example ``position_ids``
    (``arange(T)`` for every example, the models' own default): the default positions are
    one ``[1, T]`` tensor broadcast over the batch, which would attribute every example's
    position-embedding gradient to the batch.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.keys: tuple[str, ...] = ()
        params = inspect.signature(_base_model(model).forward).parameters
        self._positions = "position_ids" in params
        self._no_cache = "use_cache" in params

    def forward(self, *tensors: Tensor) -> Tensor:
        if len(tensors) != len(self.keys):
            raise fail("inputs", len(tensors), f"{len(self.keys)} tensors {self.keys}")
        kwargs: dict[str, Any] = dict(zip(self.keys, tensors, strict=True))
        if self._positions and "position_ids" not in kwargs and "input_ids" in kwargs:
            ids = kwargs["input_ids"]
            kwargs["position_ids"] = torch.arange(ids.shape[1], device=ids.device).expand(
                ids.shape[0], -1
            )
        if self._no_cache:
            kwargs["use_cache"] = False
        out = self.model(**kwargs)
        logits = out["logits"] if isinstance(out, dict) else getattr(out, "logits", None)
        if logits is None:
            logits = out[0] if isinstance(out, tuple | list) else out
        if not isinstance(logits, Tensor):
            raise fail("model output", type(out).__name__, "logits (a tensor, or .logits)")
        return logits


def _repeated_prompt(model: nn.Module) -> str | None:
    """The peft type of a prompt-learning model whose virtual tokens are embedded once for the
    batch and repeated (prompt tuning, p-tuning, ...; prefix tuning embeds them per example),
    else None."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict):
        return None
    for config in configs.values():
        kind = str(getattr(getattr(config, "peft_type", None), "value", ""))
        if getattr(config, "is_prompt_learning", False) and kind != "PREFIX_TUNING":
            return kind
    return None


def _tied_trainable(model: nn.Module) -> list[str]:
    """Trainable parameters used by more than one module (tied embeddings)."""
    owners: dict[int, list[str]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for p_name, p in module.named_parameters(recurse=False, remove_duplicate=False):
            if p.requires_grad:
                owners.setdefault(id(p), []).append(f"{mod_name}.{p_name}".lstrip("."))
    return [" = ".join(names) for names in owners.values() if len(names) > 1]


def _checkpointing(model: nn.Module) -> bool:
    """Whether Hugging Face activation (gradient) checkpointing is on in ``model``."""
    on = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5
    if on is None:
        on = getattr(model, "is_gradient_checkpointing", False)
    return on is True


def _layerwise(model: nn.Module) -> bool:
    """Whether renyi's engine clips ``model`` layer by layer (whole-model vmap is not
    supported on Hugging Face models' keyword calls)."""
    from renyi.dpsgd.clipping import ClippedGradientEngine

    engine = ClippedGradientEngine(
        LogitsForward(model), lambda out, y: out.sum(), max_grad_norm=1.0, self_check=False
    )
    return engine.mode != "vmap"


# ------------------------------------------------------------------ logical batches
class _MicroBatches:
    """A batch sampler: each logical batch of ``batches`` cut into ``pieces`` consecutive
    micro-batches of nearly equal size (some may be empty), in order."""

    def __init__(self, batches: PlannedBatchSampler, pieces: int) -> None:
        self.batches = batches
        self.pieces = pieces

    def __len__(self) -> int:
        return len(self.batches) * self.pieces

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            size = len(batch)
            for k in range(self.pieces):
                yield list(batch[k * size // self.pieces : (k + 1) * size // self.pieces])


class _TrainerBatches(PlannedBatchSampler):
    """DPTrainer's planned batches, remembering those drawn ahead of the optimizer's steps.

    Loader worker processes (``dataloader_num_workers > 0``) make the ``DataLoader`` draw
    batches ahead of the steps (``prefetch_factor`` micro-batches per worker), so when a
    checkpoint is written the sampler stands past batches never stepped on. The
    checkpoint holds them (:meth:`ahead_of`, seeded runs) and the resumed loader yields them
    first (:meth:`replay`), with the sampler continuing after them: the resumed run draws
    what the uninterrupted one did, in the same order relative to the noise."""

    def __init__(self, sampler: Any, steps_per_epoch: int) -> None:
        super().__init__(sampler, steps_per_epoch)
        self._replay: list[list[int]] = []
        self._recent: deque[tuple[int, list[int]]] = deque()  # (plan index, batch)
        self.stepper: DPOptimizer | None = None  # forgets the batches it has stepped on

    def _remember(self, batch: Any) -> None:
        self._recent.append((self._drawn - 1, [int(i) for i in batch]))
        taken = 0 if self.stepper is None else int(self.stepper.steps_taken)
        while self._recent and self._recent[0][0] < taken:
            self._recent.popleft()

    def ahead_of(self, steps_taken: int) -> list[list[int]]:
        """The batches drawn but not yet stepped on (plan index ``>= steps_taken``)."""
        return [list(b) for i, b in self._recent if i >= steps_taken]

    def replay(self, batches: list[list[int]]) -> None:
        """Yield ``batches`` (drawn before a checkpoint, never stepped on) before the
        sampler's next ones; call after :meth:`resync`."""
        self._replay = [list(b) for b in batches]
        self._drawn -= len(self._replay)
        if self._optimizer is not None:
            self.link(self._optimizer)

    def resync(self) -> None:
        self._replay = []
        self._recent.clear()
        super().resync()

    def __len__(self) -> int:
        if not self._replay:
            return super().__len__()
        after = self._drawn + len(self._replay)  # the sampler's position
        rest = (
            0
            if after >= self.steps or after % self.steps_per_epoch == 0
            else min(self.steps - after, self.steps_per_epoch - after % self.steps_per_epoch)
        )
        return len(self._replay) + rest

    def __iter__(self) -> Any:
        if self._replay:
            rest = len(self) - len(self._replay)
            replay, self._replay = self._replay, []
            for batch in replay:
                self._check_stepped()
                self._drawn += 1
                self.last_size = len(batch)
                self._remember(batch)
                yield batch
            if not rest:
                return
        for batch in super().__iter__():
            self._remember(batch)
            yield batch


class _TrainerOptimizer(DPOptimizer):
    """DPTrainer's private optimizer: its checkpoints also account for the batches its
    loader's worker processes drew ahead of the steps (:class:`_TrainerBatches`).

    A seeded run (``noise_seed=``) saves them (``"prefetched"``), and resumes bit for bit. A
    secure run saves no batch (the indices of batches yet to be trained on would be a
    secret in the checkpoint): its sampler's position is put back before them, and the
    resumed run draws those steps' batches afresh from the OS source, as it draws its noise
    (independent samples: the guarantee is unchanged, the steps and ε are the
    uninterrupted run's)."""

    def _trainer_batches(self) -> list[_TrainerBatches]:
        return [b for b in self._linked_batches if isinstance(b, _TrainerBatches)]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        ahead: list[list[int]] = []
        for batches in self._trainer_batches():
            ahead = ahead or batches.ahead_of(self.steps_taken)
        sampler = state.get("sampler")
        if ahead and isinstance(sampler, dict):
            if getattr(getattr(self.sampler, "random_source", None), "secure", True):
                state["sampler"] = {**sampler, "position": int(sampler["position"]) - len(ahead)}
            else:
                state["prefetched"] = ahead
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:  # type: ignore[override]
        state = dict(state)
        ahead = state.pop("prefetched", None) or []
        sampler = state.get("sampler")
        n = int(getattr(self.sampler, "num_samples", 0))
        if not isinstance(ahead, list) or not all(
            isinstance(b, list) and all(isinstance(i, int) and 0 <= i < n for i in b) for b in ahead
        ):
            raise fail(
                "checkpoint prefetched", type(ahead).__name__, f"lists of indices in [0, {n})"
            )
        if isinstance(sampler, dict):
            position = sampler.get("position")
            taken = state.get("steps_taken")
            if isinstance(position, int) and isinstance(taken, int):
                if position != taken + len(ahead):
                    raise fail(
                        "checkpoint sampler position",
                        position,
                        f"{taken} steps taken + {len(ahead)} batches saved as drawn ahead (a "
                        "checkpoint of a run with dataloader_num_workers > 0 written by an "
                        "earlier renyi, which did not save the batches its workers had "
                        "drawn: resuming would skip them; resume from a checkpoint written "
                        "with dataloader_num_workers=0, or by this version)",
                    )
        super().load_state_dict(state)
        for batches in self._trainer_batches():
            batches.replay(ahead)


# ------------------------------------------------------------------ tokenisers
def train_tokenizer(
    texts: Sequence[str],
    *,
    vocab_size: int = 512,
    kind: Literal["bpe", "wordpiece"] = "bpe",
) -> transformers.PreTrainedTokenizerFast:
    """A tokeniser trained here on ``texts`` (the ``tokenizers`` library; nothing
    downloaded): byte-level BPE (GPT-2/Llama style) or WordPiece (BERT style), with
    ``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]`` special tokens.

    A tokeniser learnt from private text is itself a release of it: train it on public text
    (as the tests and examples do) or account for it.

    Example:
        >>> tok = train_tokenizer(["a small corpus", "of public text"] * 20, vocab_size=300)
        >>> tok("public text")["input_ids"][:1] != [], tok.pad_token
        (True, '[PAD]')
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    vocab_size = check_int("vocab_size", vocab_size, 16)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer: Any = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=specials, show_progress=False
        )
    else:
        raise fail("kind", kind, "'bpe' or 'wordpiece'")
    tok.train_from_iterator(list(texts), trainer=trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


# ------------------------------------------------------------------ the trainer
_TRAINER_LOSS = transformers.Trainer.compute_loss


class DPTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` that trains with DP-SGD (see the module docstring).

    Args:
        model, args, train_dataset, data_collator, eval_dataset, ...: as for ``Trainer``
            (``train_dataset`` must be map-style: Poisson sampling draws each example
            independently).
        target_epsilon: ε to calibrate σ for (at ``target_delta``), or give
            ``noise_multiplier`` instead.
        target_delta: δ of the guarantee.
        max_grad_norm: C, the per-example clipping norm (Hugging Face's global-norm
            clipping of the update is switched off).
        noise_multiplier: σ, instead of ``target_epsilon`` (no plan enforced then).
        sampling: ``"poisson"`` (default), ``"fixed-size"``, ``"random-allocation"`` or
            ``"shuffle"`` (:func:`~renyi.dpsgd.privacy.make_private`'s samplers).
        accountant: ``"pld"`` (default, tight), ``"rdp"`` or ``"zcdp"``.
        noise_seed: None (default) for the secure OS source; an int for reproducible,
            insecure noise and sampling (tests, experiments).
        per_example_loss: ``(logits, labels) -> [B]`` instead of the model's default.
        token_reduction: ``"mean"`` (default) or ``"sum"`` over each example's tokens.
        log_train_loss: also log the (non-private) training loss.
        allow_exceeding_target: let the optimizer step past the planned steps.

    Raises:
        PrivacyParameterError: bad privacy arguments or a refused setting (see above).
    """

    def __init__(
        self,
        model: Any = None,
        args: transformers.TrainingArguments | None = None,
        *positional: Any,
        target_epsilon: float | None = None,
        target_delta: float,
        max_grad_norm: float,
        noise_multiplier: float | None = None,
        sampling: str = "poisson",
        accountant: str = "pld",
        noise_seed: int | None = None,
        per_example_loss: Callable[[Tensor, Tensor], Tensor] | None = None,
        token_reduction: TokenReduction = "mean",
        log_train_loss: bool = False,
        allow_exceeding_target: bool = False,
        **kwargs: Any,
    ) -> None:
        self.target_delta = check_delta(target_delta, "target_delta")
        self.dp_max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
        if (target_epsilon is None) == (noise_multiplier is None):
            raise fail(
                "target_epsilon/noise_multiplier",
                (target_epsilon, noise_multiplier),
                "exactly one of target_epsilon or noise_multiplier",
            )
        self.target_epsilon = (
            None if target_epsilon is None else check_positive("target_epsilon", target_epsilon)
        )
        self.noise_multiplier = (
            None
            if noise_multiplier is None
            else check_positive("noise_multiplier", noise_multiplier)
        )
        if token_reduction not in ("mean", "sum"):
            raise fail("token_reduction", token_reduction, "'mean' or 'sum'")
        if not isinstance(model, nn.Module):
            raise fail("model", type(model).__name__, "a transformers (or peft) model")
        prompt = _repeated_prompt(model)
        if prompt:
            raise fail(
                "model",
                f"a peft {prompt} model",
                "per-example trainable tensors: prompt tuning's virtual-token embeddings are "
                "computed once for the batch and repeated for every example, so no "
                "per-example gradient can be read off them; use prefix tuning "
                "(peft.PrefixTuningConfig) or LoRA",
            )
        if _checkpointing(model) or getattr(args, "gradient_checkpointing", False):
            raise fail(
                "gradient_checkpointing",
                True,
                "False (DPTrainer's per-example clipping keeps every adapted layer's input "
                "for the per-example norms, so recomputing the forward in the backward frees "
                "little and duplicates what it recomputes: the peak memory rises (271 -> 307 "
                "MiB for an 8-layer Llama step) and the step is slower; to save memory, "
                "lower per_device_train_batch_size and raise gradient_accumulation_steps: "
                "the logical batch, the noise and epsilon stay the same, and memory follows "
                "the micro-batch)",
            )
        tied = _tied_trainable(model)
        if tied and not _layerwise(model):
            raise fail(
                "model",
                f"trainable parameters shared by modules {tied[:2]}",
                "parameters shared only by layers with per-example rules (tied input/output "
                "embeddings of GPT-2's and BERT's LM heads are): freeze the shared ones, "
                "fine-tune with LoRA, or untie them",
            )
        smoothing = float(getattr(args, "label_smoothing_factor", 0.0) or 0.0)
        if per_example_loss is not None and smoothing:
            raise fail(
                "args.label_smoothing_factor",
                smoothing,
                "0 with per_example_loss= (smooth the labels in your per-example loss)",
            )
        custom = [
            what
            for what, given in (
                ("a compute_loss override", type(self).compute_loss is not _TRAINER_LOSS),
                ("compute_loss_func=", kwargs.get("compute_loss_func") is not None),
            )
            if given
        ]
        if custom:
            raise fail(
                "loss",
                custom,
                "DPTrainer's per-example loss (it never calls compute_loss, whose loss "
                "is a mean over the batch): pass per_example_loss=(logits, labels) -> one "
                "loss per example instead",
            )
        self.per_example_loss = (
            per_example_loss
            if per_example_loss is not None
            else per_example_loss_for(
                model, token_reduction=token_reduction, label_smoothing=smoothing
            )
        )
        self.sampling = sampling
        self.accountant_name = accountant
        self.noise_seed = noise_seed
        self.log_train_loss = bool(log_train_loss)
        self.allow_exceeding_target = bool(allow_exceeding_target)
        self._plan: TrainingPlan | None = None
        self._batches: _TrainerBatches | None = None
        self._forward = LogitsForward(model)
        if args is None:
            args = transformers.TrainingArguments(output_dir="trainer_output")
        args = self._private_args(args)
        super().__init__(model, args, *positional, **kwargs)

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def _private_args(args: transformers.TrainingArguments) -> transformers.TrainingArguments:
        """A copy of ``args`` with what DP-SGD needs, after refusing what it cannot do."""
        refused = {
            "fp16": args.fp16,
            "bf16": args.bf16,
            "deepspeed": bool(args.deepspeed),
            "fsdp": bool(args.fsdp),
            "group_by_length": bool(getattr(args, "group_by_length", False)),
            "auto_find_batch_size": bool(getattr(args, "auto_find_batch_size", False)),
        }
        for name, on in refused.items():
            if on:
                raise fail(
                    f"args.{name}",
                    True,
                    "False (DPTrainer: mixed precision is not yet verified for per-example "
                    "clipping; sharded training, length grouping and batch-size search change "
                    "the sampling the noise was calibrated for)",
                )
        tokens_seen = getattr(args, "include_num_input_tokens_seen", False)
        if tokens_seen not in (False, None, "no"):
            raise fail(
                "args.include_num_input_tokens_seen",
                tokens_seen,
                "'no' (DPTrainer: the count of the sampled batches' tokens is a statistic of the "
                "private data released without noise)",
            )
        if getattr(args, "neftune_noise_alpha", None):
            raise fail(
                "args.neftune_noise_alpha",
                args.neftune_noise_alpha,
                "None (DPTrainer: NEFTune scales its noise by the batch's padded length, so an "
                "example's gradient would depend on the other examples of its batch)",
            )
        if args.world_size > 1 or args.n_gpu > 1:
            raise fail(
                "args.world_size",
                args.world_size,
                "1 process on at most one device (use renyi.dpsgd.distributed for "
                "data-parallel DP-SGD)",
            )
        args = copy.copy(args)
        args.max_grad_norm = 0.0  # no global clipping of the released, noisy gradient
        args.ignore_data_skip = True  # the private sampler resumes itself; never skip
        return args

    @property
    def dp_optimizer(self) -> DPOptimizer | None:
        """The private optimizer (None before training starts)."""
        opt = self.optimizer
        inner = getattr(opt, "optimizer", opt)  # accelerate wraps it
        return inner if isinstance(inner, DPOptimizer) else None

    @property
    def logical_batch_size(self) -> int:
        """Expected logical batch: ``per_device_train_batch_size × gradient_accumulation``."""
        return int(self.args.per_device_train_batch_size) * int(
            self.args.gradient_accumulation_steps
        )

    def privacy_plan(self) -> TrainingPlan:
        """The sampler, σ and number of steps of this run (fixed at its first call)."""
        if self._plan is None:
            if self.train_dataset is None:
                raise fail("train_dataset", None, "a map-style training dataset")
            dataset = dataset_of(self.train_dataset)
            n = check_int("len(train_dataset)", len(dataset), 1)  # type: ignore[arg-type]
            b = self.logical_batch_size
            if self.args.max_steps is not None and self.args.max_steps > 0:
                length: dict[str, Any] = {"steps": int(self.args.max_steps)}
            else:
                length = {"epochs": float(self.args.num_train_epochs)}
            self._plan = plan_training(
                n,
                b,
                delta=self.target_delta,
                target_epsilon=self.target_epsilon,
                noise_multiplier=self.noise_multiplier,
                accountant=self.accountant_name,
                sampling=self.sampling,
                seed=self.noise_seed,
                **length,
            )
            self.args.max_steps = self._plan.steps
        return self._plan

    def get_train_dataloader(self) -> DataLoader[Any]:
        """Logical batches from the private sampler, each cut into
        ``gradient_accumulation_steps`` micro-batches (empty batches included)."""
        plan = self.privacy_plan()
        dataset = self.train_dataset
        collator = self.data_collator
        try:
            import datasets

            is_hf_dataset = isinstance(dataset, datasets.Dataset)
        except ImportError:  # pragma: no cover - datasets is optional
            is_hf_dataset = False
        if is_hf_dataset:
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        per_epoch = getattr(plan.sampler, "steps_per_epoch", None) or max(
            1, math.ceil(1.0 / plan.sample_rate - 1e-9)
        )
        self._batches = _TrainerBatches(plan.sampler, per_epoch)
        pieces = check_int(
            "args.gradient_accumulation_steps", self.args.gradient_accumulation_steps, 1
        )
        workers = int(self.args.dataloader_num_workers)
        # the loader's own generator: starting an epoch's iterator then draws nothing from
        # torch's global RNG, whose state the Trainer restores at the start of a resumed
        # epoch; dropout and random collators (masked-LM masking) then draw after a resume
        # what they drew in the uninterrupted run
        own = torch.Generator().manual_seed(int(self.args.seed))
        loader: DataLoader[Any] = DataLoader(
            dataset,  # type: ignore[arg-type]
            batch_sampler=_MicroBatches(self._batches, pieces),  # type: ignore[arg-type]
            collate_fn=EmptyBatchCollate(dataset, collator),  # type: ignore[arg-type]
            num_workers=workers,
            generator=own,
            pin_memory=bool(self.args.dataloader_pin_memory),
        )
        if self.dp_optimizer is not None:
            self._link(self.dp_optimizer)
        return loader

    def _link(self, optimizer: DPOptimizer) -> None:
        batches = self._batches
        if batches is None:
            return
        if all(b is not batches for b in optimizer._linked_batches):
            optimizer._linked_batches.append(batches)
        batches.stepper = optimizer
        if not int(self.args.dataloader_num_workers):
            batches.link(optimizer)

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        """The ``Trainer``'s optimizer (``args.optim``, weight decay groups, or the one you
        passed), wrapped in a :class:`~renyi.dpsgd.optimizer.DPOptimizer`."""
        base = super().create_optimizer(model)
        if isinstance(getattr(base, "optimizer", base), DPOptimizer):
            return base  # already private (a second train(): accelerate wraps it)
        plan = self.privacy_plan()
        dp = _TrainerOptimizer(
            base,
            model=self._forward,
            loss_fn=self.per_example_loss,
            noise_multiplier=plan.noise_multiplier,
            max_grad_norm=self.dp_max_grad_norm,
            sampler=plan.sampler,
            accountant=self.accountant_name,
            random_source=plan.sampler.random_source,
            max_steps=plan.steps if plan.target is not None else None,
            target=plan.target,
            allow_exceeding_target=self.allow_exceeding_target,
        )
        self.optimizer = dp
        self._link(dp)
        return dp

    # ------------------------------------------------------------------ training
    def train(
        self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        """``Trainer.train``; refused (our error, nothing changed) when this trainer has
        already taken private steps and no checkpoint is given: its sampler's planned
        batches are spent, and a second private optimizer would account from zero. Unless
        ``log_train_loss``, the returned ``training_loss`` is NaN and ``metrics`` has no
        ``train_loss`` (an unnoised statistic of the private batches)."""
        dp = self.dp_optimizer
        if dp is not None and dp.steps_taken and not resume_from_checkpoint:
            raise fail(
                "train()",
                f"called again after {dp.steps_taken} private steps (epsilon {self.epsilon():.6g})",
                "one train() per DPTrainer (its planned steps are spent): to train further, "
                "make a new DPTrainer (its epsilon adds to this one's) or resume from a "
                "checkpoint",
            )
        if resume_from_checkpoint:
            self._check_resumable(resume_from_checkpoint)
        output = super().train(resume_from_checkpoint, *args, **kwargs)
        if self.log_train_loss or not hasattr(output, "_replace"):
            return output
        # the mean training loss is computed from the private batches without noise: not
        # returned either (example scripts print and save train() metrics)
        metrics = {k: v for k, v in dict(output.metrics or {}).items() if k != "train_loss"}
        return output._replace(training_loss=math.nan, metrics=metrics)

    def _check_resumable(self, checkpoint: str | bool) -> None:
        """Refuse a checkpoint without the private optimizer's state (``save_only_model``,
        or ``optimizer.pt`` removed): the ``Trainer`` would load the trained weights and
        silently start a fresh accountant, reporting ε for the resumed steps only."""
        import os

        from transformers.trainer_utils import get_last_checkpoint

        path = get_last_checkpoint(self.args.output_dir) if checkpoint is True else checkpoint
        if not isinstance(path, str) or not os.path.isdir(path):
            return  # the Trainer's own error (no checkpoint found)
        name = getattr(transformers.trainer, "OPTIMIZER_NAME", "optimizer.pt")
        if not os.path.isfile(os.path.join(path, name)):
            raise fail(
                "resume_from_checkpoint",
                path,
                f"a checkpoint with the private optimizer's state ({name}: the accountant, "
                "the sampler's position, the noise state); without it the trained weights "
                "would be resumed with ε counted from zero (save_only_model=False)",
            )

    def training_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        num_items_in_batch: Any = None,
    ) -> Tensor:
        """Add one micro-batch's clipped per-example gradients to the logical batch (the
        ``Trainer`` then calls ``optimizer.step()`` once per logical batch). Returns the
        micro-batch's share of the logical batch's mean loss (for the optional log)."""
        dp = self.dp_optimizer
        if dp is None:
            raise fail("optimizer", type(self.optimizer).__name__, "DPTrainer's DPOptimizer")
        model.train()
        inputs = self._prepare_inputs(inputs)
        labels = inputs.get("labels")
        if not isinstance(labels, Tensor):
            raise fail(
                "batch",
                sorted(inputs),
                "a 'labels' tensor (causal LM: the input ids, e.g. from "
                "DataCollatorForLanguageModeling(tokenizer, mlm=False))",
            )
        tensors = {k: v for k, v in inputs.items() if k != "labels"}
        odd = [k for k, v in tensors.items() if not isinstance(v, Tensor)]
        if odd:
            raise fail("batch", odd, "tensors batched along dim 0")
        self._forward.keys = tuple(tensors)
        losses, _ = dp.accumulate(tuple(tensors.values()), labels)
        return (losses.detach().sum() / dp.expected_batch_size).to(self.args.device)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """0: the ``Trainer`` sums each batch's token count into ``total_flos`` (logged, and
        saved in checkpoints), which would release the sampled batches' sizes without
        noise."""
        return 0

    # ------------------------------------------------------------------ privacy
    def epsilon(self, delta: float | None = None) -> float:
        """ε spent so far at ``delta`` (default ``target_delta``): the accountant's value for
        the steps taken (0 before the first)."""
        dp = self.dp_optimizer
        if dp is None or dp.steps_taken == 0:
            return 0.0
        return float(dp.epsilon(self.target_delta if delta is None else delta).epsilon)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The ``Trainer``'s log, with ``epsilon`` added and, unless ``log_train_loss``, the
        training loss (computed from private data without noise) left out (so is
        ``grad_norm``: the ``Trainer`` reads it before the private step sets ``.grad``)."""
        logs = dict(logs)
        logs.pop("grad_norm", None)  # of .grad before the private step: nothing there
        logs.pop("total_flos", None)  # 0 here (see floating_point_ops): not a measurement
        if not self.log_train_loss:
            for key in ("loss", "train_loss"):
                logs.pop(key, None)
        dp = self.dp_optimizer
        if dp is not None and dp.steps_taken:
            logs["epsilon"] = self.epsilon()
        super().log(logs, start_time)
