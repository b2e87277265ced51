"""Peak memory of one step with and without activation (gradient) checkpointing: the plain
(non-private) Hugging Face step against renyi's per-example clipped step (DPTrainer's path).

A Llama built from its config with random weights (d 64, 8 layers, 4 heads, vocab 64;
nothing is downloaded), a batch of 8 × 384 tokens, one thread, CPU. Each configuration runs
in its own process; the figure is the rise of the process's peak RSS (``ru_maxrss``) over
the step. Cost: four processes of about 6 s each.

    PYTHONPATH=src python benchmarks/hf_checkpointing_memory.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import warnings


def _step(checkpointing: bool, private: bool) -> float:
    """The peak-RSS rise (MiB) of one step in this process."""
    import torch
    import transformers

    from renyi.dpsgd.clipping import ClippedGradientEngine
    from renyi.dpsgd.hf import LogitsForward, per_example_loss_for

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(1, 64, (8, 384))
    mask = torch.ones_like(ids)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if private:
        forward = LogitsForward(model)
        forward.keys = ("input_ids", "attention_mask")
        engine = ClippedGradientEngine(
            forward, per_example_loss_for(model), max_grad_norm=1.0, self_check=False
        )
        engine.clipped_grad_sum((ids, mask), ids)
    else:
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def main() -> None:
    if len(sys.argv) == 3:
        print(f"{_step(sys.argv[1] == '1', sys.argv[2] == '1'):.0f}")
        return
    for private in (False, True):
        for checkpointing in (False, True):
            out = subprocess.run(
                [sys.executable, __file__, str(int(checkpointing)), str(int(private))],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()[-1]
            path = "per-example clipped" if private else "plain"
            print(f"{path:20s} checkpointing={checkpointing!s:5s} peak rise {out} MiB")


if __name__ == "__main__":
    main()
