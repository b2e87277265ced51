"""The DP-SGD examples run (tiny settings): LoRA fine-tuning of a plain-torch transformer and
an LSTM classifier, both through PrivacyEngine and loss.backward()."""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from renyi.errors import InsecureRandomnessWarning  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _quiet_single_thread() -> Iterator[None]:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: threads only add overhead on a shared machine
    yield
    torch.set_num_threads(threads)


def test_lora_transformer_trains_only_the_adapters_within_the_target() -> None:
    lora = _load("lora_transformer")
    torch.manual_seed(0)
    reference = lora.add_lora(lora.TinyTransformer(seq_len=48))
    model, result = lora.run(
        [
            "--epochs",
            "2",
            "--per-class",
            "1000",
            "--batch-size",
            "64",
            "--accountant",
            "rdp",
            "--seed",
            "0",
        ]
    )
    assert result["epsilon"] <= 8.0
    assert result["accuracy"] > 0.6  # two balanced classes (0.73 at the defaults)
    inner = model._module
    for (name, p), (_, p0) in zip(
        inner.named_parameters(), reference.named_parameters(), strict=True
    ):
        if p.requires_grad:
            continue
        assert torch.equal(p, p0), f"frozen {name} changed"
    trained = [n for n, p in inner.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n or n.startswith("head.") for n in trained)
    assert not torch.equal(
        inner.blocks[0].q.lora_b.weight, torch.zeros_like(inner.blocks[0].q.lora_b.weight)
    )


def test_lstm_example_runs_within_the_target() -> None:
    lstm = _load("lstm_digits")
    result = lstm.main(["--epochs", "1", "--accountant", "rdp", "--seed", "0"])
    assert result["epsilon"] <= 3.0
    assert result["accuracy"] > 0.2  # ten classes; one epoch of DP training


@pytest.mark.slow
def test_hf_dptrainer_example_fine_tunes_within_the_target() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    example = _load("hf_dptrainer")
    result = example.main(
        ["--examples", "64", "--seq", "32", "--batch-size", "8", "--seed", "0", "--lr", "1e-2"]
    )
    assert result["epsilon"] <= 8.0
    assert math.isfinite(result["eval_loss_after"])
    assert result["eval_loss_after"] < result["eval_loss_before"] + 0.05  # noisy, not worse
