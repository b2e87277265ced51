"""LoRA fine-tuning of a GPT-2-architecture classifier: renyi against Opacus at ε = 8.

The model: ``transformers.GPT2ForSequenceClassification`` (d 256, 4 layers, 4 heads,
sequence 128) built from its config with random weights (nothing is downloaded: a stand-in
for a pretrained base), every weight frozen, LoRA adapters (``peft``, rank 8, α 16) on the
attention projections ``c_attn`` and a trainable classification head.

The task ships with the installed packages: which documentation is this text from — the
Python language reference (CPython's ``pydoc_data``, cut into 128-token windows), numpy's
docstrings, or the standard library's docstrings (first 128 tokens of each)? Three balanced
classes; the byte-level BPE tokeniser is trained on *other* public text (torch's
docstrings), not on the task's. The split is fixed; ``--seeds`` vary the initialisation (and
Opacus's noise; renyi's noise is always from the secure source).

Each configuration calibrates σ to the same (ε, δ) with its own accountant (renyi: PLD, a
proven bound; Opacus: PRV, its default) and trains with the same hyper-parameters — AdamW
(no weight decay), learning rate, epochs, Poisson batches of the same expected size
(``q = 1/len(loader)``; the training set is a multiple of the batch size, so ``DPTrainer``'s
``q = b/n`` is the same), clipping norm C:

* ``renyi``: ``renyi.dpsgd.PrivacyEngine`` and the Opacus loop
  (``loss.backward(); optimizer.step()``), the model called through a positional wrapper
  ``(input_ids, attention_mask) -> logits`` (the same wrapper for Opacus);
* ``opacus``: the same loop with ``opacus.PrivacyEngine`` (hooks);
* ``renyi-trainer``: ``renyi.dpsgd.hf.DPTrainer`` on the peft model itself (per-example
  cross-entropy, ``lr_scheduler_type="constant"``).

Reported: σ, ε spent, test accuracy per seed, mean ± standard deviation, and CPU seconds.

    nice -n 10 .venv/bin/python benchmarks/hf_lora.py [--seeds 0 1 2] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEQ = 128
LIBRARIES = ("renyi", "opacus", "renyi-trainer")


# ------------------------------------------------------------------ data
def _docstrings(module: Any) -> list[str]:
    found = [module.__doc__ or ""]
    for _, member in inspect.getmembers(module):
        doc = getattr(member, "__doc__", None)
        if isinstance(doc, str):
            found.append(doc)
    return [d for d in found if d.strip()]


def _stdlib_docs() -> list[str]:
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "lib2to3"}
    docs: set[str] = set()
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in skip:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                docs.update(_docstrings(importlib.import_module(name)))
        except Exception:  # platform-specific modules that do not import here
            continue
    return sorted(docs)


def _numpy_docs() -> list[str]:
    docs: set[str] = set()
    for name in ("", ".linalg", ".fft", ".random", ".ma", ".polynomial", ".lib", ".strings"):
        docs.update(_docstrings(importlib.import_module("numpy" + name)))
    return sorted(docs)


def build_task(per_class: int, test_per_class: int) -> tuple[Any, TensorDataset, TensorDataset]:
    """(tokeniser, train, test): ``input_ids``, ``attention_mask``, ``labels`` tensors."""
    import pydoc_data.topics

    from renyi.dpsgd.hf import train_tokenizer

    tokenizer = train_tokenizer(_docstrings(torch) + _docstrings(torch.nn), vocab_size=2000)
    pad = tokenizer.pad_token_id

    def encode(texts: list[str], windows: bool) -> list[list[int]]:
        rows = []
        for text in texts:
            ids = tokenizer(text)["input_ids"]
            starts = range(0, max(len(ids) - 32, 1), SEQ) if windows else [0]
            rows.extend(ids[s : s + SEQ] for s in starts if len(ids[s : s + SEQ]) >= 32)
        return rows

    sources = [
        encode(sorted(pydoc_data.topics.topics.values()), windows=True),
        encode(_numpy_docs(), windows=False),
        encode(_stdlib_docs(), windows=False),
    ]
    need = per_class + test_per_class
    rng = np.random.default_rng(0)
    split: dict[str, list[tuple[list[int], int]]] = {"train": [], "test": []}
    for label, rows in enumerate(sources):
        if len(rows) < need:
            raise SystemExit(f"class {label} has {len(rows)} examples < {need}")
        order = rng.permutation(len(rows))
        split["train"] += [(rows[i], label) for i in order[:per_class]]
        split["test"] += [(rows[i], label) for i in order[per_class:need]]

    def tensors(items: list[tuple[list[int], int]]) -> TensorDataset:
        ids = torch.full((len(items), SEQ), pad, dtype=torch.long)
        mask = torch.zeros((len(items), SEQ), dtype=torch.long)
        for i, (row, _) in enumerate(items):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        labels = torch.tensor([label for _, label in items])
        perm = torch.from_numpy(rng.permutation(len(items)))
        return TensorDataset(ids[perm], mask[perm], labels[perm])

    return tokenizer, tensors(split["train"]), tensors(split["test"])


# ------------------------------------------------------------------ model
def build_model(vocab: int, pad: int, seed: int) -> nn.Module:
    import peft
    import transformers

    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=SEQ,
        n_embd=256,
        n_layer=4,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=pad,
        num_labels=3,
    )
    torch.manual_seed(seed)
    model = transformers.GPT2ForSequenceClassification(config)
    lora = peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True, task_type="SEQ_CLS"
    )
    return peft.get_peft_model(model, lora)


class Classifier(nn.Module):
    """``(input_ids, attention_mask) -> logits``: the same positional call for both engines."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=ids, attention_mask=mask).logits
        return logits


@torch.no_grad()
def accuracy(model: nn.Module, test: TensorDataset) -> float:
    model.eval()
    ids, mask, labels = test.tensors
    correct = 0
    for s in range(0, len(labels), 256):
        logits = model(ids[s : s + 256], mask[s : s + 256])
        correct += int((logits.argmax(-1) == labels[s : s + 256]).sum())
    return correct / len(labels)


# ------------------------------------------------------------------ runs
def run_engine(library: str, args: argparse.Namespace, data: Any, seed: int) -> dict[str, Any]:
    tokenizer, train, test = data
    if library == "renyi":
        from renyi.dpsgd import PrivacyEngine
    else:
        from opacus import PrivacyEngine  # type: ignore[no-redef]
    model = Classifier(build_model(len(tokenizer), tokenizer.pad_token_id, seed))
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0
    )
    engine = PrivacyEngine()
    module, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=optimizer,
        data_loader=DataLoader(train, batch_size=args.batch_size, shuffle=True),
        epochs=args.epochs,
        target_epsilon=args.epsilon,
        target_delta=args.delta,
        max_grad_norm=args.max_grad_norm,
    )
    criterion = nn.CrossEntropyLoss()
    for _ in range(args.epochs):
        module.train()
        for ids, mask, labels in loader:
            optimizer.zero_grad()
            criterion(module(ids, mask), labels).backward()
            optimizer.step()
    return {
        "sigma": float(optimizer.noise_multiplier),
        "epsilon": float(engine.get_epsilon(args.delta)),
        "accuracy": accuracy(model, test),
    }


def run_trainer(args: argparse.Namespace, data: Any, seed: int, out: str) -> dict[str, Any]:
    import transformers

    from renyi.dpsgd.hf import DPTrainer

    tokenizer, train, test = data
    peft_model = build_model(len(tokenizer), tokenizer.pad_token_id, seed)
    ids, mask, labels = train.tensors
    rows = [
        {"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]}
        for i in range(len(labels))
    ]
    training = transformers.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=seed,
    )
    trainer = DPTrainer(
        model=peft_model,
        args=training,
        train_dataset=rows,
        target_epsilon=args.epsilon,
        target_delta=args.delta,
        max_grad_norm=args.max_grad_norm,
    )
    trainer.train()
    plan = trainer.privacy_plan()
    return {
        "sigma": plan.noise_multiplier,
        "epsilon": trainer.epsilon(),
        "accuracy": accuracy(Classifier(peft_model), test),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--per-class", type=int, default=384)
    parser.add_argument("--test-per-class", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    if (3 * args.per_class) % args.batch_size:
        raise SystemExit("3 * per-class must be a multiple of batch-size (equal q for all)")

    start = time.process_time()
    data = build_task(args.per_class, args.test_per_class)
    results: dict[str, Any] = {
        "load_average": os.getloadavg(),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "data_cpu_s": time.process_time() - start,
        "runs": [],
    }
    import tempfile

    for seed in args.seeds:  # interleaved: every library once per seed
        for library in args.libraries:
            t0 = time.process_time()
            if library == "renyi-trainer":
                with tempfile.TemporaryDirectory() as out:
                    run = run_trainer(args, data, seed, out)
            else:
                run = run_engine(library, args, data, seed)
            run.update(library=library, seed=seed, cpu_s=time.process_time() - t0)
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
    summary = {}
    for library in args.libraries:
        acc = [r["accuracy"] for r in results["runs"] if r["library"] == library]
        summary[library] = {
            "mean": statistics.mean(acc),
            "std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "accuracies": acc,
        }
    results["summary"] = summary
    results["total_cpu_s"] = time.process_time() - start
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for library, s in summary.items():
            accs = ", ".join(f"{a:.3f}" for a in s["accuracies"])
            print(f"{library:14s} accuracy {s['mean']:.3f} ± {s['std']:.3f}  ({accs})")
        print(f"total CPU {results['total_cpu_s']:.0f} s, load {results['load_average']}")
    return results


if __name__ == "__main__":
    main()
