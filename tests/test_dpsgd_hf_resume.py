"""DPTrainer checkpoints with loader worker processes (``dataloader_num_workers > 0``), and
gradient (activation) checkpointing.

Workers prefetch: the private loader's sampler has drawn batches the optimizer has not yet
stepped on when a checkpoint is written. On main a run resumed from such a checkpoint
continued the sampler *after* the prefetched batches: they were never trained on, the
run ended short (1 of 8 steps taken in the reviewer's case) and its parameters differed from
the uninterrupted run's by 0.024, silently. Deterministic (seeded noise and sampling): no
statistical test here, so no false alarms. Helpers and tiny models of
``test_dpsgd_review4``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from torch import Tensor  # noqa: E402

from renyi.errors import PrivacyParameterError  # noqa: E402
from test_dpsgd_review4 import _batch, _llama, _quiet_and_cheap, _rows, _trainer  # noqa: E402,F401

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore::renyi.errors.InsecureRandomnessWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def _run(
    out: Path, resume: str | None, workers: int, seed: int | None = 0
) -> tuple[float, int, list[Tensor]]:
    model = _llama()
    args = {
        "per_device_train_batch_size": 3,
        "gradient_accumulation_steps": 2,
        "max_steps": -1,
        "num_train_epochs": 2,
        "save_strategy": "steps",
        "save_steps": 3,
        "dataloader_num_workers": workers,
    }
    trainer = _trainer(model, _rows(_batch()) * 4, out, max_grad_norm=0.1, args=args)
    trainer.noise_seed = seed  # read when the plan is made (at train())
    trainer.train(resume_from_checkpoint=resume)
    dp = trainer.dp_optimizer
    assert dp is not None
    return trainer.epsilon(), dp.steps_taken, [p.detach().clone() for p in model.parameters()]


def _saved(checkpoint: Path) -> dict[str, Any]:
    return dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))


@pytest.mark.parametrize(
    ("checkpoint", "workers"), [("checkpoint-3", 2), ("checkpoint-6", 2), ("checkpoint-3", 0)]
)
def test_resume_with_loader_workers_equals_the_uninterrupted_run(
    checkpoint: str, workers: int, tmp_path: Path
) -> None:
    """2 epochs of 4 steps, 2 micro-batches each, 2 workers (4 micro-batches prefetched),
    resumed mid-epoch (``checkpoint-3``: the rest of the epoch was prefetched;
    ``checkpoint-6``: part of it), with 2 workers: the same steps, ε and parameters, bit
    for bit. Resumed without workers: the same steps and ε (the parameters differ, as an
    uninterrupted run without workers does: sampling and noise share one seeded generator,
    and workers draw the batches earlier relative to the noise)."""
    eps, steps, params = _run(tmp_path / "a", None, 2)
    assert steps == 8
    assert _saved(tmp_path / "a" / checkpoint)["prefetched"]  # workers did draw ahead
    eps_r, steps_r, resumed = _run(tmp_path / "b", str(tmp_path / "a" / checkpoint), workers)
    assert steps_r == 8 and eps_r == eps
    if workers:
        assert all(torch.equal(a, b) for a, b in zip(params, resumed, strict=True))


def test_secure_resume_with_loader_workers_takes_every_step_and_saves_no_batch(
    tmp_path: Path,
) -> None:
    """The secure source (no ``noise_seed``): the checkpoint holds no batch indices (they
    would reveal which examples the next steps train on) and puts the sampler back before
    the prefetched batches; the resumed run draws them afresh: all 8 steps, the same ε."""
    eps, steps, _ = _run(tmp_path / "a", None, 2, seed=None)
    state = _saved(tmp_path / "a" / "checkpoint-3")
    assert "prefetched" not in state and state["sampler"]["position"] == 3
    eps_r, steps_r, _ = _run(tmp_path / "b", str(tmp_path / "a" / "checkpoint-3"), 2, seed=None)
    assert steps == steps_r == 8 and eps_r == eps


def test_a_checkpoint_that_lost_its_prefetched_batches_is_refused(tmp_path: Path) -> None:
    """A checkpoint whose sampler stands past batches it did not save (what main wrote
    with workers): refused with our error naming ``dataloader_num_workers``, before any
    step (on main the resumed run silently skipped them)."""
    _run(tmp_path / "a", None, 2)
    path = tmp_path / "a" / "checkpoint-3"
    state = _saved(path)
    del state["prefetched"]
    torch.save(state, path / "optimizer.pt")
    with pytest.raises(PrivacyParameterError, match="dataloader_num_workers"):
        _run(tmp_path / "b", str(path), 2)


@pytest.mark.parametrize("where", ["args", "model"])
def test_gradient_checkpointing_is_refused_at_set_up(where: str, tmp_path: Path) -> None:
    """``gradient_checkpointing=True`` (or ``model.gradient_checkpointing_enable()``): on
    main DPTrainer accepted it and trained correctly (equal parameters), recomputing every
    layer in the backward (twice the activation calls), but its per-example engine keeps
    each layer's input, so the peak memory rose (271 -> 307 MiB, an 8-layer Llama step,
    benchmarks/hf_checkpointing_memory.py) instead of falling: a memory saving that
    silently was not. Now refused at set-up, naming the fix (micro-batches via gradient
    accumulation)."""
    model = _llama()
    args: dict[str, Any] = {}
    if where == "args":
        args["gradient_checkpointing"] = True
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with pytest.raises(PrivacyParameterError, match="gradient_accumulation_steps"):
        _trainer(model, _rows(_batch()), tmp_path, args=args)
