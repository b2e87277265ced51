"""Private LoRA fine-tuning of a GPT-2-architecture language model with ``DPTrainer``.

The Hugging Face way — ``TrainingArguments``, a data collator, ``trainer.train()`` — with
``renyi.dpsgd.hf.DPTrainer`` in place of ``Trainer`` and a privacy target next to the usual
arguments. Nothing is downloaded: the model is built from its config (random weights, a
stand-in for a pretrained base: load yours with ``from_pretrained``), the byte-level BPE
tokeniser is trained here on public text (torch's docstrings), and the private text is
numpy's docstrings (it ships with numpy). Prints the held-out loss before and after, ε, and
the plan (σ, steps).

    python examples/hf_dptrainer.py --epochs 1 --epsilon 8
"""

from __future__ import annotations

import argparse
import inspect
import os
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import peft
import torch
import transformers

from renyi.dpsgd.hf import DPTrainer, train_tokenizer


def docstrings(module: object) -> list[str]:
    found = [getattr(module, "__doc__", None) or ""]
    found += [getattr(m, "__doc__", None) or "" for _, m in inspect.getmembers(module)]
    return sorted({d for d in found if isinstance(d, str) and len(d) > 80})


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=None, help="reproducible, insecure noise")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    warnings.simplefilter("ignore", FutureWarning)
    transformers.logging.set_verbosity_error()

    tokenizer = train_tokenizer(docstrings(torch) + docstrings(torch.nn), vocab_size=2000)
    texts = docstrings(np) + docstrings(np.linalg) + docstrings(np.random)
    rows = [dict(tokenizer(t, truncation=True, max_length=args.seq)) for t in texts]
    order = np.random.default_rng(0).permutation(len(rows))
    train = [rows[i] for i in order[: args.examples]]
    held_out = [rows[i] for i in order[args.examples : args.examples + 128]]

    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=args.seq,
        n_embd=256,
        n_layer=4,
        n_head=4,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.GPT2LMHeadModel(config)
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True)
    model = peft.get_peft_model(model, lora)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False)

    with tempfile.TemporaryDirectory() as out:
        training = transformers.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=args.accumulation,
            num_train_epochs=args.epochs,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            logging_steps=5,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
        )
        trainer = DPTrainer(
            model=model,
            args=training,
            train_dataset=train,
            eval_dataset=held_out,
            data_collator=collator,
            target_epsilon=args.epsilon,
            target_delta=args.delta,
            max_grad_norm=1.0,
            noise_seed=args.seed,
        )
        before = trainer.evaluate()["eval_loss"]
        trainer.train()
        after = trainer.evaluate()["eval_loss"]
    plan = trainer.privacy_plan()
    result = {"eval_loss_before": before, "eval_loss_after": after, "epsilon": trainer.epsilon()}
    print(
        f"sigma={plan.noise_multiplier:.4f}, {plan.steps} steps ({plan.steps_note}); "
        f"held-out loss {before:.3f} -> {after:.3f} at epsilon={result['epsilon']:.3f}, "
        f"delta={args.delta}"
    )
    return result


if __name__ == "__main__":
    main()
