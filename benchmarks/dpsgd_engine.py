"""Speed and memory of one DP-SGD step: renyi's clipping engine against Opacus.

Models (those of the issue): the Opacus MNIST example CNN (26k parameters, batch 256, 28x28
inputs) and an MLP 100-512-512-2 (315k parameters, batch 512). Configurations:

* ``nonprivate``: ``loss.backward()`` + SGD step (the baseline of every ratio);
* ``renyi_ghost``: :class:`renyi.dpsgd.ClippedGradientEngine` (mode "auto", here all ghost
  rules) + Gaussian noise + SGD step;
* ``renyi_vmap``: the same engine with ``mode="vmap"`` (whole-model ``torch.func``);
* ``opacus_hooks``: ``PrivacyEngine.make_private(grad_sample_mode="hooks")``;
* ``opacus_ghost``: ``PrivacyEngine.make_private(grad_sample_mode="ghost")``.

All run with ``torch.set_num_threads(1)``, on the same fixed batch, interleaved round by round
(the machine's speed drifts; compare only within one run). Reported: the median step time and
the slowdown = median over rounds of (step time / non-private step time of the same round),
and the ratio of the fastest steps (other processes only ever add time, so the minimum is the
least disturbed estimate of the intrinsic cost).
Peak memory is the ``ru_maxrss`` of a separate subprocess per configuration that builds the
model and runs a few steps (tracemalloc does not see torch's allocations); it includes the
interpreter and the libraries, imported alike by every configuration (torch, renyi, opacus:
the ``import-only`` figure), so that differences come from the training step. Linux keeps a
process's peak RSS across ``exec``, so those subprocesses are started before this process
imports torch (it is small then).

Run:  .venv/bin/python benchmarks/dpsgd_engine.py [--rounds 7] [--models cnn,mlp] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

CONFIGS = ["nonprivate", "renyi_ghost", "renyi_vmap", "opacus_hooks", "opacus_ghost"]
NOISE, CLIP, LR = 1.0, 1.0, 0.05


def mnist_cnn() -> nn.Module:
    """The CNN of Opacus's MNIST example (26,010 parameters)."""
    import torch
    from torch import nn

    class MnistCnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
            self.conv2 = nn.Conv2d(16, 32, 4, 2)
            self.fc1 = nn.Linear(32 * 4 * 4, 32)
            self.fc2 = nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.conv1(x))
            x = nn.functional.max_pool2d(x, 2, 1)
            x = torch.relu(self.conv2(x))
            x = nn.functional.max_pool2d(x, 2, 1)
            x = x.view(-1, 32 * 4 * 4)
            return self.fc2(torch.relu(self.fc1(x)))

    return MnistCnn()


def build(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "cnn":
        return mnist_cnn(), torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(100, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)
        )
        return model, torch.randn(512, 100), torch.randint(0, 2, (512,))
    if name == "transformer":
        return text_transformer(), torch.randint(0, VOCAB, (64, 32)), torch.randint(0, 2, (64,))
    if name == "lstm":
        return lstm_classifier(), torch.randint(0, VOCAB, (64, 32)), torch.randint(0, 2, (64,))
    raise SystemExit(f"unknown model {name!r}: expected cnn, mlp, transformer or lstm")


VOCAB = 1000


def text_transformer() -> nn.Module:
    """Text classifier: embedding + 2 post-norm encoder layers (d_model 64, 4 heads,
    feed-forward 128, dropout 0.1) + mean pooling + linear; sequences of 32 tokens."""
    import torch
    from torch import nn

    class TextTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 64)
            self.pos = nn.Embedding(32, 64)
            layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.fc = nn.Linear(64, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(x.shape[1], device=x.device).repeat(x.shape[0], 1)
            return self.fc(self.enc(self.emb(x) + self.pos(pos)).mean(dim=1))

    return _global(TextTransformer)()


def lstm_classifier() -> nn.Module:
    """Text classifier: embedding 64 + one-layer LSTM (hidden 64) + linear on the last state."""
    from torch import nn

    class LSTMClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 64)
            self.rnn = nn.LSTM(64, 64, batch_first=True)
            self.fc = nn.Linear(64, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _, (h, _) = self.rnn(self.emb(x))
            return self.fc(h[-1])

    return _global(LSTMClassifier)()


def _global(cls: type) -> Any:
    """Make a class defined after the lazy torch import picklable (Opacus's
    ``ModuleValidator.fix`` deep-copies the model with ``torch.save``)."""
    cls.__qualname__ = cls.__name__
    globals()[cls.__name__] = cls
    return cls


def make_step(config: str, model_name: str) -> Callable[[], None]:
    """A closure running one full training step of ``config`` on a fresh model."""
    import torch
    from torch import nn

    model, x, y = build(model_name)
    batch = x.shape[0]
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if config == "nonprivate":
        loss_fn = nn.CrossEntropyLoss()

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

        return step
    if config.startswith("renyi"):
        from renyi.dpsgd.clipping import ClippedGradientEngine

        mode = "vmap" if config == "renyi_vmap" else "auto"
        engine = ClippedGradientEngine(
            model,
            nn.CrossEntropyLoss(),
            max_grad_norm=CLIP,
            mode=mode,  # type: ignore[arg-type]
        )
        params = dict(model.named_parameters())

        def step() -> None:
            sums, _, _ = engine.clipped_grad_sum(x, y)
            for n, p in params.items():  # noise and the division by the (expected) batch size
                p.grad = (sums[n] + torch.randn_like(p) * (NOISE * CLIP)) / batch
            opt.step()

        return step
    if config.startswith("opacus"):
        import warnings

        from opacus import PrivacyEngine

        warnings.filterwarnings("ignore")
        if model_name in ("transformer", "lstm"):  # Opacus's own DPMultiheadAttention/DPLSTM
            from opacus.validators import ModuleValidator

            model = ModuleValidator.fix(model)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch)
        engine = PrivacyEngine(accountant="rdp")
        mode = "ghost" if config == "opacus_ghost" else "hooks"
        out = engine.make_private(
            module=model,
            optimizer=opt,
            criterion=nn.CrossEntropyLoss(),
            data_loader=loader,
            noise_multiplier=NOISE,
            max_grad_norm=CLIP,
            poisson_sampling=False,
            grad_sample_mode=mode,
        )
        if mode == "ghost":
            dp_model, dp_opt, criterion, _ = out
        else:
            dp_model, dp_opt, _ = out
            criterion = nn.CrossEntropyLoss()

        def step() -> None:
            dp_opt.zero_grad(set_to_none=True)
            criterion(dp_model(x), y).backward()
            dp_opt.step()

        return step
    raise SystemExit(f"unknown configuration {config!r}")


def child(model_name: str, config: str, steps: int) -> None:
    """Subprocess body: peak RSS (MiB) of building the model and running ``steps`` steps.

    Every configuration first imports the same libraries (torch, renyi with its DP-SGD engine,
    opacus), so that RSS differences are those of the training step, not of import sizes.
    """
    import opacus  # noqa: F401
    import torch

    import renyi.dpsgd  # noqa: F401

    torch.set_num_threads(1)
    if config != "import-only":
        step = make_step(config, model_name)
        for _ in range(steps):
            step()
    print(json.dumps({"maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def peak_rss(model_name: str, config: str, steps: int) -> float | None:
    cmd = [sys.executable, __file__, "--child", model_name, config, "--steps", str(steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        print(f"  [{model_name}/{config}] memory run failed: {res.stderr[-300:]}", file=sys.stderr)
        return None
    return float(json.loads(res.stdout.strip().splitlines()[-1])["maxrss_mib"])


def cpu_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }
    try:
        import opacus

        state["opacus"] = opacus.__version__
    except ImportError:
        state["opacus"] = None
    try:
        with open("/proc/cpuinfo") as f:
            state["cpu"] = next(ln.split(":", 1)[1].strip() for ln in f if "model name" in ln)
    except (OSError, StopIteration):
        state["cpu"] = platform.processor()
    return state


def run(models: list[str], configs: list[str], rounds: int, memory: bool) -> dict[str, Any]:
    rss: dict[tuple[str, str], float | None] = {}
    if memory:  # first, while this process has not imported torch (see the module docstring)
        for model_name in models:
            for c in ["import-only", *configs]:
                rss[model_name, c] = peak_rss(model_name, c, 3)
    import torch

    torch.set_num_threads(1)
    results: dict[str, Any] = {"cpu_before": cpu_state(), "rounds": rounds, "rows": []}
    for model_name in models:
        model, x, _ = build(model_name)
        n_params = sum(p.numel() for p in model.parameters())
        steps = {c: make_step(c, model_name) for c in configs}
        times: dict[str, list[float]] = {c: [] for c in configs}
        for c in configs:  # warm-up (first-call set-up, the engine's one-time checks)
            steps[c]()
        slow = {"renyi_vmap", "opacus_hooks"}
        for r in range(rounds):
            for c in configs:
                if c in slow and model_name == "mlp" and r >= max(3, rounds // 2):
                    continue  # each takes seconds; a few rounds are enough
                t0 = time.perf_counter()
                steps[c]()
                times[c].append(time.perf_counter() - t0)
        base = times["nonprivate"]
        for c in configs:
            med = statistics.median(times[c])
            # ratio within each round (configurations timed back to back), then the median:
            # robust to the machine's speed drifting between rounds
            ratio = statistics.median(t / b for t, b in zip(times[c], base, strict=False))
            results["rows"].append(
                {
                    "model": model_name,
                    "params": n_params,
                    "batch": int(x.shape[0]),
                    "config": c,
                    "median_s": med,
                    "samples_per_s": x.shape[0] / med,
                    "slowdown": ratio,
                    "best_s": min(times[c]),
                    "best_ratio": min(times[c]) / min(base),
                    "peak_rss_mib": rss.get((model_name, c)),
                    "rss_import_only_mib": rss.get((model_name, "import-only")),
                    "rounds_timed": len(times[c]),
                }
            )
    results["cpu_after"] = cpu_state()
    return results


def print_table(results: dict[str, Any]) -> None:
    cpu = results["cpu_before"]
    print(
        f"# {cpu['cpu']} | {cpu['cpus']} CPUs, torch threads {cpu['torch_threads']} | "
        f"torch {cpu['torch']}, opacus {cpu['opacus']} | load average before "
        f"{tuple(round(v, 2) for v in cpu['loadavg'])}, after "
        f"{tuple(round(v, 2) for v in results['cpu_after']['loadavg'])}"
    )
    head = f"{'model':<5} {'config':<13} {'samples/s':>10} {'ms/step':>9} {'slowdown':>9}"
    head += f" {'best ms':>8} {'best ratio':>10} {'peak RSS MiB':>13}"
    print(head)
    for row in results["rows"]:
        rss = f"{row['peak_rss_mib']:.0f}" if row["peak_rss_mib"] else "-"
        slow = f"{row['slowdown']:.2f}x" if row["slowdown"] else "-"
        print(
            f"{row['model']:<5} {row['config']:<13} {row['samples_per_s']:>10.0f} "
            f"{1e3 * row['median_s']:>9.1f} {slow:>9} {1e3 * row['best_s']:>8.1f} "
            f"{row['best_ratio']:>9.2f}x {rss:>13}"
        )
    bases = {r["model"]: r["rss_import_only_mib"] for r in results["rows"]}
    if any(bases.values()):
        print(
            "peak RSS after the imports only (torch, renyi, opacus): "
            + ", ".join(f"{m} {v:.0f} MiB" for m, v in bases.items() if v)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-memory", action="store_true", help="skip the RSS subprocesses")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steps)
        return
    configs = args.configs.split(",")
    if "nonprivate" not in configs:
        configs.insert(0, "nonprivate")
    results = run(args.models.split(","), configs, args.rounds, not args.no_memory)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
