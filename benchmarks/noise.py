"""Cost of the secure lattice Gaussian (renyi.noise) against insecure baselines and OpenDP.

Contenders, each releasing ``n`` Gaussian values (σ = 1) in one call, timed in interleaved
rounds (medians), all in one run:

* ``renyi.noise.gaussian`` on the release paths users take — a torch tensor in, the same
  dtype out (float32, bfloat16, float64), a numpy float32 array — and
  ``CounterNoise.gaussian`` (keyed counter noise) on a float32 tensor: ChaCha20 keystream,
  exact lattice index (fast float32 pass + exact recomputation near a boundary), canonical
  output on ``2**-3 Z``;
* ``torch.randn`` (float32) and ``numpy.random.Generator.normal`` (float64, and float32
  through ``standard_normal(dtype=float32)``): insecure floating-point baselines (Philox /
  PCG64, no lattice);
* OpenDP's ``make_gaussian`` (secure, exact, on vectors of ``--opendp-n`` values, reported
  per value since it is much slower).

Ratios are relative to ``torch.randn`` in the same run, one thread by default. A script,
not a test:

    .venv/bin/python benchmarks/noise.py --sizes 100000 315394 1000000 10000000 --rounds 9
    .venv/bin/python benchmarks/noise.py --mlp-step --rounds 21
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from renyi import noise


def _opendp(n: int) -> Callable[[], object] | None:
    try:
        import opendp.prelude as dp
    except ImportError:  # pragma: no cover - optional peer
        return None
    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n), dp.l2_distance(T=float)
    meas = dp.m.make_gaussian(*space, scale=1.0)
    x = [0.0] * n
    return lambda: meas(x)


def _contenders(
    n: int, gen: np.random.Generator, x32: np.ndarray, t32: torch.Tensor
) -> dict[str, Callable[[], object]]:
    tb16 = t32.to(torch.bfloat16)
    t64 = t32.to(torch.float64)
    cn = noise.CounterNoise()
    steps = itertools.count()
    return {
        "torch.randn float32 (insecure)": lambda: torch.randn(n),
        "numpy Generator.normal float64 (insecure)": lambda: gen.normal(0.0, 1.0, n),
        "numpy standard_normal float32 (insecure)": lambda: gen.standard_normal(
            n, dtype=np.float32
        ),
        "renyi.noise.gaussian numpy float32 (secure, lattice)": lambda: noise.gaussian(x32, 1.0),
        "renyi.noise.gaussian torch float32 (secure, lattice)": lambda: noise.gaussian(t32, 1.0),
        "renyi.noise.gaussian torch bfloat16 (secure, lattice)": lambda: noise.gaussian(tb16, 1.0),
        "renyi.noise.gaussian torch float64 (secure, lattice)": lambda: noise.gaussian(t64, 1.0),
        "renyi CounterNoise.gaussian torch float32 (keyed, lattice)": lambda: cn.gaussian(
            t32, 1.0, stream=0, step=next(steps)
        ),
    }


def mlp_step_share(rounds: int, batch: int = 512) -> None:
    """The noise's share of a private step of the benchmark MLP (100-512-512-2, 315,394
    parameters, as benchmarks/dpsgd.py): DPOptimizer steps (secure source, Poisson sampler)
    interleaved with the noise stage alone (``release_noisy_sum`` on the flat clipped sum)."""
    from torch import nn

    from renyi.dpsgd.optimizer import DPOptimizer
    from renyi.dpsgd.sampler import PoissonSampler

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(100, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)
    )
    x, y = torch.randn(batch, 100), torch.randint(0, 2, (batch,))
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        model=model,
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampler=PoissonSampler(batch * 100, 0.01, 10**6),
        accountant="rdp",
    )
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def step() -> None:
        opt.zero_grad()
        opt.accumulate(x, y)
        opt.step()

    def release() -> None:
        opt.release_noisy_sum(flat)

    step(), release()
    steps, noises = [], []
    for _ in range(rounds):
        steps.append(_time(step))
        noises.append(_time(release))
    s, n = statistics.median(steps), statistics.median(noises)
    print(
        f"MLP ({flat.numel():,} parameters, batch {batch}): private step {1e3 * s:.1f} ms, "
        f"its noise stage {1e3 * n:.2f} ms = {100 * n / s:.1f} % of the step (medians of "
        f"{rounds} interleaved rounds, {torch.get_num_threads()} thread(s), load average "
        f"{os.getloadavg()[0]:.1f})"
    )


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--opendp-n", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--mlp-step", action="store_true", help="the noise's share of an MLP step")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.mlp_step:
        mlp_step_share(max(args.rounds, 5))
        return
    gen = np.random.default_rng()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of "
        f"{args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.1f}"
    )
    print("| n | contender | seconds | ns/value | × torch.randn |\n|---|---|---:|---:|---:|")
    for n in args.sizes:
        x32 = np.zeros(n, dtype=np.float32)
        t32 = torch.zeros(n, dtype=torch.float32)
        contenders = _contenders(n, gen, x32, t32)
        for fn in contenders.values():  # warm up
            fn()
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                times[name].append(_time(fn))
        base = statistics.median(times["torch.randn float32 (insecure)"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"| {n:.0e} | {name} | {med:.4f} | {1e9 * med / n:.1f} | {med / base:.2f} |")
    odp = _opendp(args.opendp_n)
    if odp is not None:
        odp()
        med = statistics.median(_time(odp) for _ in range(args.rounds))
        per = med / args.opendp_n
        n = args.sizes[-1]
        base_per = base / n
        print(
            f"| {args.opendp_n:.0e} | OpenDP make_gaussian (secure, exact) | {med:.4f} | "
            f"{1e9 * per:.1f} | {per / base_per:.0f} (per value) |"
        )


if __name__ == "__main__":
    main()
