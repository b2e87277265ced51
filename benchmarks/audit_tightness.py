"""How close do the training audits come to the claim? (issue 27, item 4)

Rows (all seeded, sigma = 1 unless stated; the lower bounds are at confidence 0.95):

1. one step, full pipeline (PrivacyEngine, loss.backward() capture, Dirac canary examples
   clipped per example, lattice noise, division by the batch size), no subsampling; the
   model frozen so the steps are independent repetitions; ``--canaries`` Gaussian canary
   columns x ``--steps`` steps (about canaries * steps / 2 samples per side); held-out
   threshold attack: ``renyi.audit.harness.audit_capture``.
2. one step in ONE run: ``--one-run-canaries`` white-box gradient canaries at the clipped-sum
   stage of one DPOptimizer step (every-step participation), Steinke et al. and the f-DP
   (Gaussian) bound of Mahloujifar et al.: ``renyi.audit.training.audit_training``.
3. one Poisson-subsampled step (q = 1/16), the sampler choosing the batch: per-step claim
   against the releases of ``renyi.audit.harness.audit_sampler``.
4. a whole subsampled multi-step run in one run: ``renyi audit train``'s digits set-up.

Usage: ``python benchmarks/audit_tightness.py [--steps 2000] [--canaries 1024]``
(about 2-4 minutes of one core at the defaults).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings


def main() -> None:
    import torch

    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--canaries", type=int, default=1024)
    p.add_argument("--one-run-canaries", type=int, default=100_000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from renyi.audit import harness
    from renyi.audit.training import audit_training
    from renyi.errors import InsecureRandomnessWarning

    warnings.simplefilter("ignore", InsecureRandomnessWarning)
    rows = []
    for delta in (1e-5, 1e-3):
        t = time.process_time()
        r = harness.audit_capture(
            "mean",
            steps=args.steps,
            sigma=1.0,
            delta=delta,
            confidence=0.95,
            seed=0,
            single=False,
            canaries=args.canaries,
            groups=("gaussian",),
        )
        rows.append(
            {
                "case": "one step, full pipeline, independent releases",
                "delta": delta,
                "samples_per_side": r.details["groups"]["gaussian"]["samples_with"],
                "lower": r.epsilon_lower_bound,
                "claim": r.epsilon_claimed,
                "cpu_s": time.process_time() - t,
            }
        )
    m = args.one_run_canaries
    for delta in (1e-5, 1e-3):
        t = time.process_time()
        model = torch.nn.Linear(m, 1, bias=False).double()
        opt = harness._dp_optimizer(model, torch.nn.MSELoss(), 1.0, 1.0, 0)

        def one_step(opt=opt, m=m):
            opt.zero_grad()
            empty = torch.zeros(0, m, dtype=torch.float64)
            opt.accumulate(empty, torch.zeros(0, 1, dtype=torch.float64))
            opt.step()

        r = audit_training(
            opt, one_step, canaries=m, delta=delta, participation="every-step", seed=0
        )
        rows.append(
            {
                "case": "one step, one run (Steinke / f-DP Gaussian)",
                "delta": delta,
                "canaries": m,
                "lower": r.epsilon_lower_bound,
                "mu_lower": r.mu_lower_bound,
                "epsilon_gdp": r.epsilon_gdp,
                "claim": r.epsilon_claimed,
                "cpu_s": time.process_time() - t,
            }
        )
    t = time.process_time()
    r = harness.audit_sampler("poisson", epochs=40, confidence=0.95, seed=0)
    rows.append(
        {
            "case": "one Poisson step q=1/16, independent releases",
            "delta": r.delta,
            "samples_per_side": r.details["samples_with"],
            "lower": r.epsilon_lower_bound,
            "claim": r.epsilon_claimed,
            "cpu_s": time.process_time() - t,
        }
    )
    for row in rows:
        row["ratio"] = row["lower"] / row["claim"]
        if row.get("epsilon_gdp") is not None:
            row["ratio_gdp"] = row["epsilon_gdp"] / row["claim"]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        extra = ""
        if "mu_lower" in row:
            extra = f" (GDP: mu >= {row['mu_lower']:.3f}, eps {row['epsilon_gdp']:.3f})"
        print(
            f"{row['case']:48s} delta={row['delta']:g}: lower {row['lower']:.3f} / claim "
            f"{row['claim']:.3f} = {row['ratio']:.2f}{extra}  [{row['cpu_s']:.0f} s cpu]"
        )


if __name__ == "__main__":
    main()
