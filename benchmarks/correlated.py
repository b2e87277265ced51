"""Correlated-noise benchmark: strategies' errors, accuracy at equal ε, step cost and memory.

Three parts (``torch.set_num_threads(1)`` for the torch ones):

1. **Errors** (``--errors``): RMSE and max error of prefix sums at σ = 1 per unit
   sensitivity (same Gaussian privacy) for T = 128 … 4096 and every strategy
   (:mod:`renyi.correlated.table`; Honaker and dense only up to T = 1024), single
   participation and b-min-sep (b = T/16). Beside it, jax_privacy (if installed) as oracle:
   (i) where the mechanisms coincide its own error and sensitivity code evaluated on *our*
   coefficients must agree to 1e-9 (relative); (ii) its optimisers (banded Toeplitz; BLT)
   give the reference optimum, and ours must be within the stated tolerance of their loss.
2. **Accuracy** (``--accuracy``): digits (softmax regression, 15 epochs, batch 64, lr 2,
   δ = 1e-5, the defaults of ``renyi train``), ε ∈ {1, 3, 8}, ``--seeds`` seeds: DP-SGD
   (``make_private``, Poisson) vs banded (``make_private_correlated(noise="banded")``,
   amplified, ``--bands``) vs BLT (min-sep, one pass per epoch) vs tree, same model and
   epochs; mean ± std test accuracy.
3. **Cost** (``--cost``): per-step time of the training step (clip + noise + update) and
   the noise state's memory for DP-SGD and each correlated strategy, on the digits CNN and a
   315k-parameter MLP; steps interleaved round-robin in one process, medians and ratios to
   DP-SGD.

4. **Memory** (``--memory``): the banded-inverse filter (BISR) over ``--memory-params``
   float64 parameters with ``--memory-bands`` bands, its past draws stored vs regenerated
   from :class:`renyi.noise.CounterNoise`: bytes of noise state and peak RSS, each in its own
   process, and the CPU per step (b counter draws per step when regenerated).

5. **Exactness** (``--exactness``): the noise stage of one correlated step over
   ``--exact-params`` float32 values (fresh counter normals, the strategy's filter, the
   lattice release), the exact path (normals with their error bound, the filter's error
   bound, :meth:`renyi.noise.CounterNoise.snap_combination`) against the former one (float
   normals, the filter, :func:`renyi.noise.snap` of the float noise), steps interleaved,
   medians; how many values the fast check flags (and how many lie within 10**3 and 10**5
   times its margin of a boundary: the count scales linearly), and the cost of the exact
   recomputation of one coordinate against the length of its row. ``--bound-steps T``: the
   filters' error bound over T steps (strategies optimised for T).

    .venv/bin/python benchmarks/correlated.py --errors --accuracy --cost [--seeds 3] [--json]
    .venv/bin/python benchmarks/correlated.py --exactness --exact-params 1000000 --exact-steps 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

STEPS = (128, 256, 512, 1024, 2048, 4096)
ORACLE_TOL = 1e-9  # evaluation of the same coefficients: relative
OPT_TOL = 0.02  # our optimised loss at most 2% above jax_privacy's


def _jax() -> Any:
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz

        return toeplitz, buffered_toeplitz
    except Exception as exc:  # optional oracle
        print(f"jax_privacy unavailable ({exc}); oracle columns skipped", file=sys.stderr)
        return None


def errors(
    steps: tuple[int, ...], bands: int, buffers: int, names: list[str] | None = None
) -> dict[str, Any]:
    import numpy as np

    from renyi.correlated.optimize import optimize_banded, optimize_blt, toeplitz_loss
    from renyi.correlated.table import STRATEGY_NAMES, error_table

    out: dict[str, Any] = {"single": [], "min_sep": [], "oracle": []}
    for t in steps:
        out["single"] += [
            r.as_dict()
            for r in error_table([t], names or list(STRATEGY_NAMES), bands=bands, buffers=buffers)
        ]
        sep = max(1, t // 16)
        out["min_sep"] += [
            dict(r.as_dict(), min_sep=sep)
            for r in error_table([t], ["dpsgd", "tree", "banded", "blt"], bands=min(bands, sep),
                                 buffers=buffers, min_sep=sep)
        ]  # fmt: skip
    jp = _jax()
    if jp is None:
        return out
    toeplitz, buffered_toeplitz = jp
    for t in steps:
        row: dict[str, Any] = {"steps": t}
        ours_banded = optimize_banded(t, bands)
        coefs = np.asarray(ours_banded.coefficients)
        theirs_err = np.asarray(toeplitz.per_query_error(strategy_coef=coefs, n=t))
        row["banded_error_rel_diff"] = float(
            np.max(np.abs(ours_banded.per_step_error(t) - theirs_err) / theirs_err)
        )
        sens = ours_banded.sensitivity(t, max(1, t // 16), None).value ** 2
        theirs_sens = float(toeplitz.minsep_sensitivity_squared(coefs, max(1, t // 16), n=t))
        row["banded_minsep_sens_rel_diff"] = abs(sens - theirs_sens) / theirs_sens
        start = time.perf_counter()
        jb = np.asarray(toeplitz.optimize_banded_toeplitz(t, bands))
        row["jax_banded_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        optimize_banded(t, bands)
        row["renyi_banded_seconds"] = time.perf_counter() - start
        row["banded_loss_ratio"] = toeplitz_loss(coefs, t) / toeplitz_loss(jb / jb[0], t)
        try:
            start = time.perf_counter()
            blt = buffered_toeplitz.optimize(
                n=t, error="mean", min_buffers=buffers, max_buffers=buffers
            )
            row["jax_blt_seconds"] = time.perf_counter() - start
            jcoefs = np.asarray(blt.toeplitz_coefs(t))
            row["jax_blt"] = {
                "thetas": np.asarray(blt.buf_decay).tolist(),
                "omegas": np.asarray(blt.output_scale).tolist(),
            }
            start = time.perf_counter()
            ours = optimize_blt(t, buffers)
            row["renyi_blt_seconds"] = time.perf_counter() - start
            row["blt_loss_ratio"] = toeplitz_loss(ours.coefs(t), t) / toeplitz_loss(
                jcoefs / jcoefs[0], t
            )
        except Exception as exc:  # report, do not hide
            row["blt_oracle_error"] = f"{type(exc).__name__}: {exc}"
        out["oracle"].append(row)
    return out


def _train(noise: str, eps: float, seed: int, bands: int, buffers: int) -> dict[str, Any]:
    import torch

    from renyi.cli.train import _DEFAULTS, build_model
    from renyi.dpsgd.correlated import make_private_correlated
    from renyi.dpsgd.data import load_digits
    from renyi.dpsgd.privacy import make_private
    from renyi.dpsgd.trainer import Trainer, evaluate

    arch, epochs, batch, lr, clip, momentum = _DEFAULTS["digits"]
    train, test = load_digits()
    torch.manual_seed(seed)
    model = build_model("digits", arch)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    kw: dict[str, Any] = dict(
        loss_fn=torch.nn.CrossEntropyLoss(), target_epsilon=eps, delta=1e-5, epochs=epochs,
        batch_size=batch, max_grad_norm=clip, accountant="pld", seed=10_000 + seed,
    )  # fmt: skip
    start = time.perf_counter()
    if noise == "dpsgd":
        private = make_private(model, opt, train, **kw)
    else:
        private = make_private_correlated(
            model, opt, train, noise=noise, bands=bands or None, buffers=buffers, **kw
        )
    Trainer(private, progress=False).fit()
    acc = evaluate(model, test)[1]
    return {
        "noise": noise,
        "epsilon": eps,
        "seed": seed,
        "accuracy": acc,
        "sigma": private.noise_multiplier,
        "spent": float(private.epsilon().epsilon),
        "seconds": time.perf_counter() - start,
        "plan": None if "plan" not in private.extra else private.extra["plan"].to_dict(),
    }


def accuracy(seeds: int, bands: int, buffers: int, noises: list[str]) -> list[dict[str, Any]]:
    import torch

    torch.set_num_threads(1)
    rows = []
    for eps in (1.0, 3.0, 8.0):
        for seed in range(seeds):
            for noise in noises:  # interleaved: every method sees the same machine load
                r = _train(noise, eps, seed, bands, buffers)
                print(json.dumps(r), file=sys.stderr, flush=True)
                rows.append(r)
    return rows


def cost(bands_list: tuple[int, ...], buffers: int, steps: int) -> list[dict[str, Any]]:
    import torch

    from renyi.correlated.accounting import correlated_plan
    from renyi.correlated.strategies import BandedToeplitzStrategy, BltStrategy, TreeStrategy
    from renyi.dpsgd.correlated import CorrelatedOptimizer, CyclicPoissonSampler
    from renyi.dpsgd.optimizer import DPOptimizer
    from renyi.dpsgd.sampler import PoissonSampler, SecureRandomSource

    torch.set_num_threads(1)
    models = {
        "digits-cnn": (
            lambda: torch.nn.Sequential(
                torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.Tanh(), torch.nn.AvgPool2d(2),
                torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.Tanh(), torch.nn.AvgPool2d(2),
                torch.nn.Flatten(), torch.nn.Linear(128, 10),
            ),
            (64, 1, 8, 8), 10,
        ),
        "mlp-315k": (
            lambda: torch.nn.Sequential(
                torch.nn.Linear(100, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                torch.nn.ReLU(), torch.nn.Linear(512, 2),
            ),
            (512, 100), 2,
        ),
    }  # fmt: skip
    strategies: dict[str, Any] = {"dpsgd": None, "tree": TreeStrategy()}
    for b in bands_list:
        strategies[f"banded-{b}"] = BandedToeplitzStrategy(
            (1.0, *[0.5 / (m + 1) for m in range(b - 1)])
        )
    strategies[f"blt-{buffers}"] = BltStrategy(
        tuple(0.5 + 0.4 * i / buffers for i in range(buffers)), (0.1,) * buffers
    )
    rows = []
    n = 40_000  # 64 bands × batch 512 fit
    horizon = 1024  # steps of the plans (more than are timed)
    for mname, (make, shape, classes) in models.items():
        x = torch.randn(*shape)
        y = torch.randint(0, classes, (shape[0],))
        opts: dict[str, Any] = {}
        for sname, strat in strategies.items():
            torch.manual_seed(0)
            model = make()
            sgd = torch.optim.SGD(model.parameters(), lr=0.01)
            src = SecureRandomSource()
            common = dict(model=model, loss_fn=torch.nn.CrossEntropyLoss(), max_grad_norm=1.0)
            if strat is None:
                sampler = PoissonSampler(n, shape[0] / n, horizon, random_source=src)
                opts[sname] = DPOptimizer(sgd, noise_multiplier=1.0, sampler=sampler,
                                          accountant=None, **common)  # fmt: skip
            else:
                parts = strat.bands if strat.bands is not None else 8
                rate = shape[0] * parts / n
                sampler = CyclicPoissonSampler(n, parts, rate, horizon, random_source=src)
                plan = correlated_plan(strat, horizon, 1.0, partitions=parts, sample_rate=rate)
                opts[sname] = CorrelatedOptimizer(sgd, sampler=sampler, strategy=strat,
                                                  plan=plan, accountant=None, **common)  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in opts}
        for _ in range(3):  # warm-up
            for o in opts.values():
                o.zero_grad()
                o.accumulate(x, y)
                o.step()
        deadline = time.perf_counter() + 20.0
        rounds = 0
        while rounds < steps and (rounds < 5 or time.perf_counter() < deadline):
            for k, o in opts.items():
                t0 = time.perf_counter()
                o.zero_grad()
                o.accumulate(x, y)
                o.step()
                times[k].append(time.perf_counter() - t0)
            rounds += 1
        base = statistics.median(times["dpsgd"])
        params = sum(p.numel() for p in make().parameters())
        for k, o in opts.items():
            gen = getattr(o, "noise", None)
            kept = 0 if gen is None else gen.buffers
            state = [] if gen is None else gen.state_dict()["vectors"]
            held = sum(v.element_size() * v.numel() for v in state)
            rows.append({
                "model": mname, "strategy": k, "params": params,
                "median_step_ms": 1e3 * statistics.median(times[k]),
                "ratio_to_dpsgd": statistics.median(times[k]) / base,
                "noise_state_vectors": kept, "noise_state_bytes": held,
                "steps_timed": len(times[k]),
            })  # fmt: skip
    return rows


def _summarise_accuracy(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["epsilon"], r["noise"]) for r in rows})
    for eps, noise in keys:
        accs = [r["accuracy"] for r in rows if r["epsilon"] == eps and r["noise"] == noise]
        out.append({
            "epsilon": eps, "noise": noise, "mean": statistics.mean(accs),
            "std": statistics.stdev(accs) if len(accs) > 1 else 0.0, "n": len(accs),
        })  # fmt: skip
    return out


_MEMORY_CHILD = """
import json, resource, sys, time
import numpy as np
from renyi.correlated.strategies import bisr
from renyi.correlated.streaming import streaming_noise
from renyi.noise import CounterNoise
d, bands, steps, regen = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
cn = CounterNoise(bytes(32))
fresh = lambda s: cn.standard_normal((d,), stream=0, step=s)
f = streaming_noise(bisr(bands, 0.9), regenerate=fresh if regen else None)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.process_time()
acc = 0.0
for t in range(steps):
    acc += float(f.next(fresh(t))[0])
state = sum(v.nbytes for v in f.state_dict()["vectors"])
print(json.dumps({"state_bytes": state, "maxrss_kb": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss, "maxrss_before_kb": before,
    "cpu_s_per_step": (time.process_time() - t0) / steps, "check": acc}))
"""


def memory(params: int, bands: int, steps: int) -> list[dict[str, Any]]:
    """Noise state and peak memory of the banded-inverse filter, stored vs regenerated from
    :class:`renyi.noise.CounterNoise` (each in its own process: ``ru_maxrss``)."""
    import subprocess

    rows = []
    for regen in (False, True):
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, str(params), str(bands), str(steps),
             "1" if regen else "0"],
            capture_output=True, text=True, check=True, env=os.environ,
        )  # fmt: skip
        row = json.loads(out.stdout)
        row.update(params=params, bands=bands, steps=steps, regenerated=regen)
        rows.append(row)
    if rows[0]["check"] != rows[1]["check"]:
        raise RuntimeError("regenerated noise differs from stored noise")
    return rows


def _exact_one(strat: Any, params: int, steps: int, x: Any, std: float, sens: float) -> dict:
    """One strategy of :func:`exactness`: the two release paths interleaved step by step."""
    import numpy as np
    import torch

    from renyi import noise
    from renyi.correlated.exactness import filter_exactness
    from renyi.correlated.streaming import streaming_noise
    from renyi.noise import _combination

    key = os.urandom(32)
    cn = noise.CounterNoise(key)
    old_f, new_f = streaming_noise(strat), streaming_noise(strat)
    ex = filter_exactness(strat)
    assert ex is not None
    g = noise.lattice_step(std)
    s_lat = std / g
    times: dict[str, list[float]] = {"old": [], "new": []}
    bounds: list[float] = []

    def old(t: int) -> Any:
        bits = noise._CounterBits(key, "gaussian", 0, t)
        y = old_f.next(torch.from_numpy(noise._raw_normals(bits, 0, params, np)))
        y.mul_(sens)
        return noise.snap(x, y, std), y

    def new(t: int) -> Any:
        z, err = cn.standard_normal(params, stream=0, step=t, with_bound=True)
        zmax = max(float(z.max()), -float(z.min()))
        y = new_f.next(torch.from_numpy(z))
        lo, hi = torch.aminmax(y)
        bounds.append(ex.observe(t, err, zmax, max(float(hi), -float(lo))))
        out = cn.snap_combination(
            x, y, std, error_bound=bounds[-1], row=lambda b: ex.row(t, b), stream=0, scale=sens
        )
        return out, y

    flagged = near3 = near5 = 0
    f = x.numpy().astype(np.float64) / g
    f = f - np.rint(f)
    for t in range(steps):
        y = None
        for name in ("old", "new") if t % 2 else ("new", "old"):
            t0 = time.perf_counter()
            _, yy = (old if name == "old" else new)(t)
            times[name].append(time.perf_counter() - t0)
            if name == "new":
                y = yy.numpy()
        assert y is not None
        margin = _combination.fast_margin(float(np.abs(y).max()), s_lat, sens, bounds[-1])
        v = f + s_lat * sens * y
        dist = 0.5 - np.abs(v - np.rint(v))
        flagged += int(np.sum(dist <= margin))
        near3 += int(np.sum(dist <= 1e3 * margin))
        near5 += int(np.sum(dist <= 1e5 * margin))
    row_cost = {}
    for t_row in sorted({1, min(64, steps - 1), steps - 1}):
        t0 = time.perf_counter()
        _combination.decide(
            key, 0, np.arange(8, dtype=np.int64), np.zeros(8), s_lat, sens,
            lambda b, t=t_row: ex.row(t, b),
        )  # fmt: skip
        row_cost[len(ex.row(t_row, 64).steps)] = (time.perf_counter() - t0) / 8
    return {
        "params": params, "steps": steps,
        "old_ms": 1e3 * statistics.median(times["old"]),
        "exact_ms": 1e3 * statistics.median(times["new"]),
        "ratio": statistics.median(times["new"]) / statistics.median(times["old"]),
        "bound_first": bounds[0], "bound_last": bounds[-1],
        "values": params * steps, "flagged": flagged, "within_1e3_margin": near3,
        "within_1e5_margin": near5, "exact_seconds_per_coordinate_by_row_terms": row_cost,
    }  # fmt: skip


def bound_growth(steps: int, params: int = 1000) -> list[dict[str, Any]]:
    """The filters' error bound ``B_t`` over ``steps`` steps (``params`` values per step) for
    strategies optimised for that many steps: where it levels off."""
    import numpy as np
    import torch

    from renyi import noise
    from renyi.correlated.exactness import filter_exactness
    from renyi.correlated.optimize import optimize_banded, optimize_blt
    from renyi.correlated.strategies import TreeStrategy, bisr
    from renyi.correlated.streaming import streaming_noise
    from renyi.correlated.workload import prefix_coefs

    work = prefix_coefs(steps, 0.9)
    strategies = {
        "banded 4": optimize_banded(steps, 4, workload=work),
        "banded 64": optimize_banded(steps, 64, workload=work),
        "blt 3": optimize_blt(steps, 3, min_sep=32, max_participations=64, workload=work),
        "tree": TreeStrategy(),
        "banded inverse 16": bisr(16, 0.9),
    }
    cn = noise.CounterNoise(os.urandom(32))
    out = []
    for name, strat in strategies.items():
        filt, ex = streaming_noise(strat), filter_exactness(strat)
        assert ex is not None
        bounds = []
        for t in range(steps):
            z, err = cn.standard_normal(params, stream=0, step=t, with_bound=True)
            y = filt.next(torch.from_numpy(z))
            bounds.append(ex.observe(t, err, float(np.abs(z).max()), float(y.abs().max())))
        marks = sorted({0, min(256, steps - 1), min(1024, steps - 1), steps - 1})
        out.append({"strategy": name, "steps": steps, "params": params,
                    "bound_at": {t: bounds[t] for t in marks}})  # fmt: skip
    return out


def exactness(params: int, steps: int) -> dict[str, Any]:
    """Cost of exact correlated releases against the former float release (see the module
    docstring, part 5)."""
    import numpy as np
    import torch

    from renyi.correlated.optimize import optimize_banded, optimize_blt
    from renyi.correlated.strategies import TreeStrategy, bisr
    from renyi.correlated.workload import prefix_coefs

    torch.set_num_threads(1)
    plan_t = 1024
    work = prefix_coefs(plan_t, 0.9)
    strategies = {
        "banded 4": optimize_banded(plan_t, 4, workload=work),
        "banded 16": optimize_banded(plan_t, 16, workload=work),
        "blt 3": optimize_blt(plan_t, 3, min_sep=16, max_participations=64, workload=work),
        "tree": TreeStrategy(),
        "banded inverse 16": bisr(16, 0.9),
    }
    std, sens = 1.0, 3.0  # sigma * clip and a typical sensitivity
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(scale=0.3, size=params).astype(np.float32))
    rows = []
    for name, strat in strategies.items():
        row = _exact_one(strat, params, steps, x, std, sens)
        row["strategy"] = name
        rows.append(row)
    return {"std": std, "sensitivity": sens, "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--errors", action="store_true")
    p.add_argument("--accuracy", action="store_true")
    p.add_argument("--cost", action="store_true")
    p.add_argument("--steps", type=int, nargs="+", default=list(STEPS))
    p.add_argument("--bands", type=int, default=4, help="bands of banded (0: automatic)")
    p.add_argument("--buffers", type=int, default=3)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--noises", nargs="+", default=["dpsgd", "banded", "blt"])
    p.add_argument("--cost-steps", type=int, default=30)
    p.add_argument("--memory", action="store_true", help="banded-inverse: stored vs regenerated")
    p.add_argument("--memory-params", type=int, default=1_000_000)
    p.add_argument("--memory-bands", type=int, default=16)
    p.add_argument("--strategies", nargs="+", help="strategies of the error table (default all)")
    p.add_argument("--exactness", action="store_true", help="cost of exact correlated releases")
    p.add_argument("--exact-params", type=int, default=1_000_000)
    p.add_argument("--exact-steps", type=int, default=64)
    p.add_argument("--bound-steps", type=int, help="B_t over this many steps (1000 values)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    result: dict[str, Any] = {"load_average": os.getloadavg()}
    if args.errors:
        result["errors"] = errors(tuple(args.steps), 8, args.buffers, args.strategies)
    if args.accuracy:
        rows = accuracy(args.seeds, args.bands, args.buffers, args.noises)
        result["accuracy"] = {"runs": rows, "summary": _summarise_accuracy(rows)}
    if args.cost:
        result["cost"] = cost((4, 16, 64), args.buffers, args.cost_steps)
    if args.memory:
        result["memory"] = memory(args.memory_params, args.memory_bands, 2 * args.memory_bands)
    if args.exactness:
        result["exactness"] = exactness(args.exact_params, args.exact_steps)
    if args.bound_steps:
        result["bound_growth"] = bound_growth(args.bound_steps)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    from renyi.cli._output import format_table

    if "errors" in result:
        for part in ("single", "min_sep"):
            rows_ = result["errors"][part]
            print(format_table(
                ["strategy", "T", "sens", "rmse", "max error", "opt s"],
                [[r["strategy"], r["steps"], r["sensitivity"], r["rmse"], r["max_error"],
                  r["optimise_seconds"]] for r in rows_],
                title=f"prefix-sum error ({part}), sigma = 1 per unit sensitivity",
            ))  # fmt: skip
        for r in result["errors"]["oracle"]:
            print("oracle", json.dumps(r))
    if "accuracy" in result:
        print(format_table(
            ["epsilon", "noise", "mean acc", "std", "seeds"],
            [[r["epsilon"], r["noise"], r["mean"], r["std"], r["n"]]
             for r in result["accuracy"]["summary"]],
            title="digits accuracy at equal epsilon",
        ))  # fmt: skip
    if "cost" in result:
        print(format_table(
            ["model", "strategy", "ms/step", "x dpsgd", "state vectors", "state MB"],
            [[r["model"], r["strategy"], r["median_step_ms"], r["ratio_to_dpsgd"],
              r["noise_state_vectors"], r["noise_state_bytes"] / 2**20] for r in result["cost"]],
            title="step cost (median, interleaved) and noise state",
        ))  # fmt: skip
    if "exactness" in result:
        print(format_table(
            ["strategy", "former ms", "exact ms", "ratio", "B_T", "flagged", "<=1e3 M",
             "<=1e5 M", "values"],
            [[r["strategy"], r["old_ms"], r["exact_ms"], r["ratio"], r["bound_last"],
              r["flagged"], r["within_1e3_margin"], r["within_1e5_margin"], r["values"]]
             for r in result["exactness"]["rows"]],
            title="noise stage per step: exact vs former float release (medians, interleaved)",
        ))  # fmt: skip
        for r in result["exactness"]["rows"]:
            print("exact recomputation s/coordinate by row terms", r["strategy"],
                  json.dumps(r["exact_seconds_per_coordinate_by_row_terms"]))  # fmt: skip
    for r in result.get("bound_growth", []):
        print("error bound B_t", r["strategy"], json.dumps(r["bound_at"]))
    for r in result.get("memory", []):
        print("memory", json.dumps(r))
    print(f"load average at start: {result['load_average']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
