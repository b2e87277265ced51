"""DP-SGD benchmark: renyi's ``PrivacyEngine`` path against Opacus in the same run.

Two parts, both with ``torch.set_num_threads(1)``:

1. **Throughput and memory** (``--throughput``): one training step as users write it,
   ``loss = criterion(model(x), y); loss.backward(); optimizer.step()`` (Hugging Face:
   ``model(**batch).loss.backward()``), repeated on a fixed random batch, for

   * ``cnn``: the Opacus MNIST-example CNN (26k parameters, 1x28x28, batch 256);
   * ``mlp``: an MLP 100-512-512-2 (315k parameters, batch 512);
   * ``transformer``: a text classifier, embedding of 1000 tokens + positions, 2 post-norm
     ``nn.TransformerEncoderLayer`` (d_model 64, 4 heads, feed-forward 128, dropout 0.1),
     mean pooling (sequences of 32, batch 64);
   * ``lstm``: embedding 64 + one-layer ``nn.LSTM`` (hidden 64) + linear on ``h_n``
     (sequences of 32, batch 64);
   * ``gpt2-lora``: a GPT-2-architecture causal LM from ``transformers`` (d 256, 4 layers, 4
     heads, vocabulary 2048, dropout 0, random weights) with ``peft`` LoRA (r 8 on
     ``c_attn`` and ``c_proj``), its built-in loss with ``labels`` (sequences of 128, batch
     8).

   Configurations: ``non-private`` (the same loop with the plain optimizer); ``renyi``
   (``renyi.dpsgd.PrivacyEngine.make_private``, the loop unchanged: per-example clipping
   captured from ``loss.backward()``, **secure noise** from ``renyi.noise``; on the CPU in
   float32 renyi's own products run on its faster CPU kernels: oneDNN's products,
   ``renyi.dpsgd._onednn``; the per-example convolution kernel, ``_conv_kernels``; the
   AVX-512 tiles of the recurrent scans, clipped sums and Grams, ``_scan_kernels``; the
   embedding's and plain Linear layers' compiled norms and sums, ``_embedding_kernels``,
   ``_linear_kernels``);
   ``renyi-torch-kernels`` (the same with all three switched off: products by torch's and
   OpenBLAS's default kernels, those the non-private step uses: the cost of privacy itself,
   apart from faster kernels);
   ``renyi-randn`` (the same with the noise drawn by ``torch.randn``: NOT secure, to show
   what the noise costs; labelled so in every table); ``opacus-hooks`` and ``opacus-ghost``
   (Opacus 1.6's ``PrivacyEngine.make_private``, ``ModuleValidator.fix`` first as an Opacus
   user must: ``DPMultiheadAttention``, ``DPLSTM``; ghost clipping with its wrapped
   criterion, and not for the LM, whose loss is computed inside the model). Every
   measurement runs in a fresh subprocess (so peak RSS is that configuration's own),
   configurations interleaved round by round. Each subprocess times its steps one by one
   (after 3 warm-up steps) and reports the median step time and its peak RSS; then it times
   its steps alternating (two by two, the second timed) with those of a non-private twin of
   the model in the same process: the ratio to non-private time (``×time``) is the median of
   those step-by-step ratios (each pair sees the same load of a shared machine), median over
   rounds; ``×cpu`` is the same with each step's CPU (thread) time, which the other
   processes of a loaded machine do not add to; ``noise`` is the CPU time of the noise
   release alone (renyi's configurations) in units of the twin's step, so that the noise's
   share and the rest's can be told apart.
   Every subprocess first imports the same libraries (torch, opacus, transformers, peft,
   renyi with its accountant and scipy, cryptography) whatever it measures, so that peak
   RSS differences are the training step's; the subprocesses are started before this
   process imports torch (Linux carries peak RSS across ``exec``), as in
   benchmarks/dpsgd_engine.py.
2. **Accuracy at equal ε** (``--accuracy``): each library calibrates σ to the same (ε, δ)
   with its own accountant and trains the same model with the same optimizer, epochs and
   expected batch size; mean test accuracy over ``--seeds`` seeds. On scikit-learn's digits
   (softmax regression, 15 epochs, batch 64, δ = 1e-5) and, when the files are found,
   Fashion-MNIST (tanh CNN, 5 epochs, batch 256, δ = 5.55e-6).

The CPU state (load average, CPU model, a single-thread matmul rate before and after) is
printed with the results: on shared machines compare numbers only inside one run.

    .venv/bin/python benchmarks/dpsgd.py --throughput [--models cnn,mlp] [--rounds 3] [--json]
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
import warnings
from collections.abc import Callable
from typing import Any

CONFIGS = (
    "non-private",
    "renyi",
    "renyi-torch-kernels",
    "renyi-randn",
    "opacus-hooks",
    "opacus-ghost",
)
#: Opacus's ghost clipping wraps a criterion(output, target): not the LM's built-in loss.
SKIP = {("gpt2-lora", "opacus-ghost")}
MODELS = {"cnn": 256, "mlp": 512, "transformer": 64, "lstm": 64, "gpt2-lora": 8}
VOCAB, SEQ = 1000, 32
GPT2_VOCAB, GPT2_DROPOUT = 2048, 0.0
# Each child times every step separately and reports the median (robust to the other
# processes of a shared machine taking the CPU for a few ms), the mean and the best; it stops
# after MAX_TIMED_SECONDS once MIN_STEPS are timed.
WARMUP_STEPS = 3
MIN_STEPS = 3
MAX_TIMED_SECONDS = 5.0
#: CPU time of each noise release of the current child (renyi configurations)
NOISE_CPU_S: list[float] = []


# ---------------------------------------------------------------------------- models
def build(model: str) -> Any:
    from torch import nn

    if model == "cnn":  # Opacus examples/mnist.py SampleConvNet (26,010 parameters)
        from renyi.cli.train import build_model

        return build_model("fashion-mnist", "cnn")
    if model == "mlp":  # 100-512-512-2 (315,394 parameters)
        return nn.Sequential(
            nn.Linear(100, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)
        )
    if model == "linear64":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    if model in ("transformer", "lstm"):  # the engine benchmark's two text models
        from dpsgd_engine import lstm_classifier, text_transformer

        return text_transformer() if model == "transformer" else lstm_classifier()
    if model == "gpt2-lora":
        import transformers
        from peft import LoraConfig, get_peft_model

        cfg = transformers.GPT2Config(
            vocab_size=GPT2_VOCAB,
            n_positions=128,
            n_embd=256,
            n_layer=4,
            n_head=4,
            resid_pdrop=GPT2_DROPOUT,
            embd_pdrop=GPT2_DROPOUT,
            attn_pdrop=GPT2_DROPOUT,
        )
        base = transformers.GPT2LMHeadModel(cfg)
        lora = LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["c_attn", "c_proj"],
            fan_in_fan_out=True,
            lora_dropout=0.0,
        )
        return get_peft_model(base, lora)
    raise ValueError(model)


def batch_for(model: str, size: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    if model == "cnn":
        return torch.randn(size, 1, 28, 28, generator=g), torch.randint(0, 10, (size,), generator=g)
    if model in ("transformer", "lstm"):
        return (
            torch.randint(0, VOCAB, (size, SEQ), generator=g),
            torch.randint(0, 2, (size,), generator=g),
        )
    if model == "gpt2-lora":
        ids = torch.randint(0, GPT2_VOCAB, (size, 128), generator=g)
        return ids, ids.clone()
    return torch.randn(size, 100, generator=g), torch.randint(0, 2, (size,), generator=g)


def _forward_loss(model_name: str, criterion: Any) -> Callable[[Any, Any, Any], Any]:
    """``(model, x, y) -> loss`` as users write it for this model."""
    if model_name == "gpt2-lora":
        return lambda m, x, y: m(input_ids=x, labels=y).loss
    return lambda m, x, y: criterion(m(x), y)


# ---------------------------------------------------------------------------- one child run
def import_all() -> float:
    """Import every library any configuration uses; return the peak RSS (MiB) afterwards.

    Run first in every child, whatever its configuration, so that peak RSS differences are
    those of the training step, not of which libraries a configuration happens to import:
    torch, opacus, transformers and peft, renyi's PrivacyEngine with its sampler and
    accountants (scipy), and the secure noise (``cryptography``'s ChaCha20).
    """
    import opacus  # noqa: F401
    import scipy.special  # noqa: F401
    import torch
    from opacus import PrivacyEngine  # noqa: F401
    from torch.utils.data import DataLoader, TensorDataset  # noqa: F401

    import renyi.accountants.rdp
    import renyi.dpsgd
    import renyi.noise
    import renyi.random
    from renyi.dpsgd.optimizer import DPOptimizer  # noqa: F401
    from renyi.dpsgd.sampler import PoissonSampler  # noqa: F401

    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:  # then gpt2-lora is not measured, in any configuration
        pass
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms  # noqa: F401
    except ImportError:  # renyi.random then uses os.urandom alone, in every configuration
        pass
    torch.set_num_threads(1)
    # the secure noise's compiled kernels (numba, cffi) load on first use: in every child
    renyi.noise.gaussian(torch.zeros(8), 1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_step(model_name: str, config: str) -> Callable[[], None]:
    """One training step of ``config`` on a fresh model (seed 0) and the fixed batch."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    size = MODELS[model_name]
    model = build(model_name)
    x, y = batch_for(model_name, size)
    criterion = nn.CrossEntropyLoss()
    loss_of = _forward_loss(model_name, criterion)
    params = [p for p in model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(params, lr=0.01)

    if config == "non-private":

        def step() -> None:
            sgd.zero_grad()
            loss_of(model, x, y).backward()
            sgd.step()

        return step
    loader = DataLoader(TensorDataset(x, y), batch_size=size)
    if config.startswith("renyi"):
        from renyi.dpsgd import (
            PrivacyEngine,
            _conv_kernels,
            _embedding_kernels,
            _linear_kernels,
            _onednn,
            _scan_kernels,
        )

        # renyi-torch-kernels: renyi's products by torch's and OpenBLAS's default kernels
        # (the non-private step's), none of renyi's own: the cost of privacy itself, apart
        # from the faster kernels
        own = config != "renyi-torch-kernels"
        _onednn.ENABLED = _conv_kernels.ENABLED = own
        _embedding_kernels.ENABLED = _linear_kernels.ENABLED = own
        _scan_kernels.OWN_PRODUCTS = own and _scan_kernels.OWN_PRODUCTS

        pmodel, popt, _ = PrivacyEngine(accountant="rdp").make_private(
            module=model,
            optimizer=sgd,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            criterion=criterion,
        )
        popt.unlink_data_loaders()  # the timed step reuses one batch, not the loader's
        if config == "renyi-randn":  # NOT secure: to show what the secure noise costs
            popt.release_noisy_sum = lambda flat: flat + popt.noise_std() * torch.randn_like(flat)
        release = popt.release_noisy_sum

        def timed_release(flat: torch.Tensor) -> torch.Tensor:
            # the noise draw's own CPU time (thread time), apart from the rest of the step
            t0 = time.thread_time()
            out = release(flat)
            NOISE_CPU_S.append(time.thread_time() - t0)
            return out

        popt.release_noisy_sum = timed_release

        def step() -> None:
            popt.zero_grad()
            loss_of(pmodel, x, y).backward()
            popt.step()

        return step
    from opacus import PrivacyEngine as OpacusEngine
    from opacus.validators import ModuleValidator

    if model_name in ("transformer", "lstm"):  # Opacus's own DPMultiheadAttention/DPLSTM
        model = ModuleValidator.fix(model)
        sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    mode = "ghost" if config == "opacus-ghost" else "hooks"
    out = OpacusEngine().make_private(
        module=model,
        optimizer=sgd,
        criterion=criterion,
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=False,
        grad_sample_mode=mode,
    )
    if mode == "ghost":
        pmodel, popt, pcrit, _ = out
        loss_of = _forward_loss(model_name, pcrit)
    else:
        pmodel, popt, _ = out

    def opacus_step() -> None:
        popt.zero_grad()
        loss_of(pmodel, x, y).backward()
        popt.step()

    return opacus_step


def child(model_name: str, config: str, steps: int) -> dict[str, Any]:
    rss_imports = import_all()
    modules_after_imports = {m.split(".")[0] for m in sys.modules}
    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    step = make_step(model_name, config)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    # Phase 1: this configuration alone (its time per step and its peak RSS).
    for _ in range(WARMUP_STEPS):
        step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < steps:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if len(times) >= MIN_STEPS and time.perf_counter() - start > MAX_TIMED_SECONDS:
            break
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # Phase 2 (after the RSS is read): steps alternating with those of a non-private twin
    # (same model, own SGD) in this process, two at a time, the second one timed; the ratio
    # of each adjacent pair sees the same machine load, unlike two processes measured
    # seconds apart.
    twin_step = make_step(model_name, "non-private")
    for _ in range(WARMUP_STEPS):
        twin_step()
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    twin_times: list[float] = []
    twin_cpu: list[float] = []
    noise_cpu: list[float] = []
    start = time.perf_counter()
    while len(ratios) < steps:
        pair = []
        # alternate which of the two goes first; each runs one untimed step first, so that
        # the timed one finds its own data in the caches (the previous step was the other's)
        for f in (twin_step, step) if len(ratios) % 2 == 0 else (step, twin_step):
            f()
            NOISE_CPU_S.clear()
            t0, c0 = time.perf_counter(), time.thread_time()
            f()
            pair.append((f is step, time.perf_counter() - t0, time.thread_time() - c0))
            if f is step and NOISE_CPU_S:
                noise_cpu.append(sum(NOISE_CPU_S))
        mine = next(p for p in pair if p[0])
        theirs = next(p for p in pair if not p[0])
        ratios.append(mine[1] / theirs[1])
        cpu_ratios.append(mine[2] / theirs[2])
        twin_times.append(theirs[1])
        twin_cpu.append(theirs[2])
        if len(ratios) >= MIN_STEPS and time.perf_counter() - start > MAX_TIMED_SECONDS:
            break
    median_ms = 1000 * statistics.median(times)
    size = MODELS[model_name]
    return {
        "samples_per_s": size / median_ms * 1000,
        "step_ms": median_ms,
        "step_ms_mean": 1000 * sum(times) / len(times),
        "step_ms_best": 1000 * min(times),
        "steps_timed": len(times),
        "paired_ratio": statistics.median(ratios),
        "paired_cpu_ratio": statistics.median(cpu_ratios),
        "paired_twin_cpu_ms": 1000 * statistics.median(twin_cpu),
        # the noise release's CPU time over the twin's step CPU time (0 without a release)
        "noise_cpu_ms": 1000 * statistics.median(noise_cpu) if noise_cpu else 0.0,
        "noise_share_of_non_private": (
            statistics.median(noise_cpu) / statistics.median(twin_cpu) if noise_cpu else 0.0
        ),
        "paired_twin_step_ms": 1000 * statistics.median(twin_times),
        "pairs_timed": len(ratios),
        "peak_rss_mb": peak_rss,
        "rss_before_steps_mb": rss_before,
        "rss_after_imports_mb": rss_imports,
        "modules_imported_by_step": sorted(
            {m.split(".")[0] for m in sys.modules} - modules_after_imports
        ),
    }


def run_child(model: str, config: str, steps: int) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", model, config, str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["?"]
        print(f"  [{model}/{config}] failed: {tail[0][:300]}", file=sys.stderr)
        return None
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def cpu_state_subprocess() -> dict[str, Any]:
    """``cpu_state()`` in a fresh process, so that this one has not imported torch yet.

    Linux carries a process's peak RSS across ``exec`` (``ru_maxrss`` of a child started
    from a large parent starts at the parent's size), so the measurement children must be
    started while this process is small, as in benchmarks/dpsgd_engine.py.
    """
    cmd = [sys.executable, __file__, "--cpu-state"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------------- CPU state
def cpu_state() -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    start = time.perf_counter()
    for _ in range(50):
        a @ a
    gflops = 50 * 2 * 256**3 / (time.perf_counter() - start) / 1e9
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if "model name" in ln), "")
    except OSError:
        pass
    return {
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "matmul_gflops_1thread": gflops,
        "torch": torch.__version__,
    }


# ---------------------------------------------------------------------------- accuracy
def _accuracy_renyi(model: Any, train: Any, test: Any, spec: dict[str, Any], seed: int) -> float:
    import torch

    from renyi.dpsgd.privacy import make_private
    from renyi.dpsgd.trainer import Trainer, evaluate

    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=spec["lr"]),
        train,
        loss_fn=torch.nn.CrossEntropyLoss(),
        target_epsilon=spec["epsilon"],
        delta=spec["delta"],
        epochs=spec["epochs"],
        batch_size=spec["batch"],
        max_grad_norm=spec["clip"],
        accountant=spec["accountant"],
        seed=seed,
    )
    Trainer(private, progress=False).fit()
    spec["renyi_sigma"] = private.noise_multiplier
    return evaluate(model, test)[1]


def _accuracy_opacus(model: Any, train: Any, test: Any, spec: dict[str, Any], seed: int) -> float:
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from renyi.dpsgd.trainer import evaluate

    engine = PrivacyEngine()
    gen = torch.Generator().manual_seed(seed)
    pmodel, popt, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=spec["lr"]),
        data_loader=DataLoader(train, batch_size=spec["batch"], generator=gen),
        target_epsilon=spec["epsilon"],
        target_delta=spec["delta"],
        epochs=spec["epochs"],
        max_grad_norm=spec["clip"],
        noise_generator=gen,
    )
    spec["opacus_sigma"] = popt.noise_multiplier
    criterion = torch.nn.CrossEntropyLoss()
    for _ in range(spec["epochs"]):
        for x, y in loader:
            if len(y) == 0:
                continue
            popt.zero_grad()
            criterion(pmodel(x), y).backward()
            popt.step()
    return evaluate(model, test)[1]


def accuracy(
    datasets: list[str],
    seeds: int,
    fashion_dir: str | None,
    accountant: str,
    epsilons: tuple[float, ...] = (1.0, 3.0, 8.0),
) -> list[dict[str, Any]]:
    import torch

    from renyi.dpsgd.data import DatasetNotFoundError, load_digits, load_fashion_mnist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    rows = []
    for name in datasets:
        if name == "digits":
            train, test = load_digits()
            base = {"model": "linear64", "epochs": 15, "batch": 64, "lr": 2.0, "clip": 1.0}
            base["delta"] = 1e-5
        else:
            try:
                train, test = load_fashion_mnist(fashion_dir)
            except DatasetNotFoundError as exc:
                print(f"skipping Fashion-MNIST: {exc}", file=sys.stderr)
                continue
            base = {"model": "cnn", "epochs": 5, "batch": 256, "lr": 2.0, "clip": 1.0}
            base["delta"] = 5.55e-6
        for eps in epsilons:
            spec: dict[str, Any] = {**base, "dataset": name, "epsilon": eps}
            spec["accountant"] = accountant
            accs: dict[str, list[float]] = {"renyi": [], "opacus": []}
            for seed in range(seeds):
                for lib, fn in (("renyi", _accuracy_renyi), ("opacus", _accuracy_opacus)):
                    torch.manual_seed(seed)
                    model = build(spec["model"])
                    accs[lib].append(fn(model, train, test, spec, seed))
            spec["renyi_accuracy"] = statistics.mean(accs["renyi"])
            spec["opacus_accuracy"] = statistics.mean(accs["opacus"])
            spec["renyi_runs"], spec["opacus_runs"] = accs["renyi"], accs["opacus"]
            rows.append(spec)
            print(
                f"{name} eps={eps:g}: renyi {100 * spec['renyi_accuracy']:.2f}% "
                f"(sigma {spec['renyi_sigma']:.3f}, {spec['accountant']}), opacus "
                f"{100 * spec['opacus_accuracy']:.2f}% (sigma {spec['opacus_sigma']:.3f}, prv)",
                file=sys.stderr,
            )
    return rows


# ---------------------------------------------------------------------------- main
def _median_ratio(runs: list[dict[str, Any]], base: list[dict[str, Any]], key: str) -> float:
    """Median over rounds of (this configuration / non-private of the same round)."""
    return statistics.median(r[key] / b[key] for r, b in zip(runs, base, strict=True))


def throughput(
    rounds: int, steps: int, models: list[str], configs: list[str], skip: set[Any]
) -> list[dict[str, Any]]:
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(rounds):
        for model in models:
            for config in configs:
                if (model, config) in skip:
                    continue
                res = run_child(model, config, steps)
                if res is None:
                    continue
                results.setdefault((model, config), []).append(res)
                extra = ",".join(res["modules_imported_by_step"])
                print(
                    f"round {r + 1}/{rounds} {model:11s} {config:13s} "
                    f"{res['step_ms']:8.1f} ms  x{res['paired_ratio']:.2f} "
                    f"cpu x{res['paired_cpu_ratio']:.2f} noise {res['noise_cpu_ms']:.2f} ms  "
                    f"{res['peak_rss_mb']:7.0f} MB (imports {res['rss_after_imports_mb']:.0f} "
                    f"MB; step imported: {extra or '-'})",
                    file=sys.stderr,
                )
    rows = []
    for model in models:
        base_runs = results.get((model, "non-private"))
        if not base_runs:
            continue
        base_rss = statistics.median(x["peak_rss_mb"] for x in base_runs)
        base_step = statistics.median(
            x["peak_rss_mb"] - x["rss_after_imports_mb"] for x in base_runs
        )
        for config in configs:
            if (model, config) not in results:
                continue
            runs = results[(model, config)]
            step_ms = statistics.median(x["step_ms"] for x in runs)
            rss = statistics.median(x["peak_rss_mb"] for x in runs)
            rss_imports = statistics.median(x["rss_after_imports_mb"] for x in runs)
            step_rss = statistics.median(x["peak_rss_mb"] - x["rss_after_imports_mb"] for x in runs)
            rows.append(
                {
                    "model": model,
                    "batch": MODELS[model],
                    "config": config,
                    "samples_per_s": MODELS[model] / step_ms * 1000,
                    "step_ms": step_ms,
                    "time_ratio_vs_non_private": statistics.median(x["paired_ratio"] for x in runs),
                    "cpu_ratio_vs_non_private": statistics.median(
                        x["paired_cpu_ratio"] for x in runs
                    ),
                    "noise_cpu_ms": statistics.median(x["noise_cpu_ms"] for x in runs),
                    "noise_share_of_non_private": statistics.median(
                        x["noise_share_of_non_private"] for x in runs
                    ),
                    "time_ratio_separate": _median_ratio(runs, base_runs, "step_ms"),
                    "time_ratio_of_means": _median_ratio(runs, base_runs, "step_ms_mean"),
                    "best_step_ms": min(x["step_ms_best"] for x in runs),
                    "best_ratio": min(x["step_ms_best"] for x in runs)
                    / min(x["step_ms_best"] for x in base_runs),
                    "peak_rss_mb": rss,
                    "rss_ratio_vs_non_private": rss / base_rss,
                    "rss_after_imports_mb": rss_imports,
                    "step_rss_mb": step_rss,
                    "step_rss_ratio": step_rss / base_step if base_step > 0 else float("nan"),
                    "rounds": len(runs),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=3, metavar=("MODEL", "CONFIG", "STEPS"), help=argparse.SUPPRESS)
    p.add_argument("--cpu-state", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--throughput", action="store_true")
    p.add_argument("--accuracy", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="most steps timed per phase")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--datasets", default="digits,fashion-mnist")
    p.add_argument("--fashion-dir")
    p.add_argument("--epsilons", default="1,3,8", help="target epsilons, comma-separated")
    p.add_argument("--accountant", default="pld", help="renyi's calibration accountant")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))))
        return 0
    if args.cpu_state:
        print(json.dumps(cpu_state()))
        return 0
    if not (args.throughput or args.accuracy):
        args.throughput = args.accuracy = True
    # measured in a subprocess: this process must not import torch before the throughput
    # children are started (see cpu_state_subprocess)
    report: dict[str, Any] = {"cpu_before": cpu_state_subprocess()}
    if args.throughput:
        configs = args.configs.split(",")
        if "non-private" not in configs:
            configs.insert(0, "non-private")
        report["throughput"] = throughput(
            args.rounds, args.steps, args.models.split(","), configs, SKIP
        )
        if not args.json:  # print as soon as it is known: the accuracy part is long
            _print_report({"throughput": report["throughput"]})
    if args.accuracy:
        report["accuracy"] = accuracy(
            args.datasets.split(","),
            args.seeds,
            args.fashion_dir,
            args.accountant,
            tuple(float(e) for e in args.epsilons.split(",")),
        )
    report["cpu_after"] = cpu_state()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_report({k: v for k, v in report.items() if k != "throughput"})
    return 0


def _print_report(report: dict[str, Any]) -> None:
    from renyi.cli._output import format_table

    for key in ("cpu_before", "cpu_after"):
        if key not in report:
            continue
        c = report[key]
        print(
            f"{key}: load {c['loadavg'][0]:.2f}, {c['cpus']} cpus ({c['cpu_model']}), "
            f"1-thread matmul {c['matmul_gflops_1thread']:.1f} GFLOP/s, torch {c['torch']}"
        )
    if "throughput" in report:
        rows = [
            [
                r["model"],
                r["batch"],
                r["config"] + (" (NOT secure noise)" if r["config"] == "renyi-randn" else ""),
                round(r["samples_per_s"]),
                round(r["step_ms"], 1),
                round(r["time_ratio_vs_non_private"], 2),
                round(r["cpu_ratio_vs_non_private"], 2),
                round(r["noise_share_of_non_private"], 2),
                round(r["time_ratio_separate"], 2),
                round(r["best_ratio"], 2),
                round(r["peak_rss_mb"]),
                round(r["rss_ratio_vs_non_private"], 2),
                round(r["step_rss_mb"]),
                round(r["step_rss_ratio"], 2),
            ]
            for r in report["throughput"]
        ]
        print(
            format_table(
                [
                    "model",
                    "batch",
                    "config",
                    "samples/s",
                    "ms/step",
                    "×time",
                    "×cpu",
                    "noise",
                    "×sep",
                    "×best",
                    "peak MB",
                    "×RSS",
                    "step MB",
                    "×step MB",
                ],
                rows,
                title=(
                    "Throughput (torch threads = 1, medians over interleaved rounds). ×time: "
                    "median of step-by-step ratios to a non-private twin in the same process; "
                    "×cpu: the same with each step's CPU (thread) time, which other processes "
                    "of a loaded machine do not add to; noise: the noise release's CPU time "
                    "in units of the twin's step (included in ×time and ×cpu); "
                    "×sep: ratio of median step times of separate processes; ×best: fastest "
                    "step / fastest non-private step; ×RSS: peak RSS / non-private's; step MB: "
                    "peak RSS above the imports alone, ×step MB its ratio to non-private's"
                ),
            )
        )
        imports = {r["model"]: r["rss_after_imports_mb"] for r in report["throughput"]}
        print(
            "peak RSS after the imports alone (torch, opacus, transformers, peft, renyi, scipy, "
            "cryptography; "
            "step MB = peak - this): " + ", ".join(f"{m} {v:.0f} MB" for m, v in imports.items())
        )
    if report.get("accuracy"):
        rows = [
            [
                r["dataset"],
                r["epsilon"],
                r["delta"],
                f"{100 * r['renyi_accuracy']:.2f}",
                f"{r['renyi_sigma']:.3f} ({r['accountant']})",
                f"{100 * r['opacus_accuracy']:.2f}",
                f"{r['opacus_sigma']:.3f} (prv)",
            ]
            for r in report["accuracy"]
        ]
        print(
            format_table(
                ["dataset", "ε", "δ", "renyi %", "renyi σ", "opacus %", "opacus σ"],
                rows,
                title="Accuracy at equal ε (mean over seeds)",
            )
        )


if __name__ == "__main__":
    sys.exit(main())
