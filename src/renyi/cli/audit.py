"""``renyi audit``: attack a mechanism or DP-SGD and check the privacy claim.

* ``renyi audit mechanism laplace --scale 1 --trials 100000 [--json] [--plot roc.png]``:
  run the mechanism on a neighbouring pair (0 and the sensitivity), bound its epsilon below
  with the threshold, set and low-bits attacks (:func:`renyi.audit.audit_mechanism`) and
  compare with the claim. Mechanisms: ``laplace``, ``gaussian``, ``discrete-laplace``,
  ``discrete-gaussian``, ``randomized-response`` (ours), ``naive-laplace``,
  ``naive-gaussian`` (textbook floating point: the low-bits attack breaks them), and
  renyi's own release paths ``dpsgd-noise`` (``--dtype``), ``central-mean``, ``local-mean``
  (``--k``, ``--epsilon``) and ``fedavg`` (``--sigma``: the noise multiplier), which run the
  installed code on inputs 0 and 1 (:mod:`renyi.audit.paths`).
  ``--bug half-noise`` / ``--bug double-sensitivity`` plant a bug to see it caught.
  ``--pair zero|midpoint`` attacks inputs on both sides of zero (``-t, +t``) or on both
  sides of a lattice midpoint instead (``renyi.noise`` lattice of the noise scale);
  ``--timing`` adds a rank test of the two inputs' release times
  (:func:`renyi.audit.timing.audit_timing`). ``gopa`` (``--k`` parties) attacks GOPA's sum
  with the lattice-residue attack.
* ``renyi audit dpsgd --method final-step|many-runs|one-run --canaries 1000 ...``: Dirac
  canary audits of DP-SGD (:mod:`renyi.audit.dpsgd`); ``--config FILE`` reads the same
  options from a JSON object; ``--trainer torch`` audits our DPOptimizer (final step).
* ``renyi audit train [--config FILE] [renyi train's options] [--json] [--plot PATH]``: the
  training ``renyi train`` would run, audited in one run (:mod:`renyi.audit.training`):
  white-box gradient canaries at the clipped-sum stage and black-box canary examples,
  an ε lower bound beside the ε the run claims (JSON keys ``epsilon_lower_bound``,
  ``epsilon_claimed``, ``delta``, ``confidence``, ``canaries``). ``--planted BUG`` plants a
  catalogued bug (:mod:`renyi.audit.planted`) in the optimizer first.

Exit status: 0 when the claim passes, 1 when the audit refutes it, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from typing import Any

import numpy as np

from renyi.cli._output import format_table, print_json
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError

_MECHANISMS = (
    "laplace",
    "gaussian",
    "discrete-laplace",
    "discrete-gaussian",
    "randomized-response",
    "naive-laplace",
    "naive-gaussian",
)
#: renyi's own release paths (renyi.audit.paths): attack the installed code end to end
_PATHS = ("dpsgd-noise", "central-mean", "local-mean", "fedavg", "gopa")
_DPSGD_KEYS = {
    "method": str,
    "noise_multiplier": float,
    "steps": int,
    "sample_rate": float,
    "canaries": int,
    "runs": int,
    "repetitions": int,
    "delta": float,
    "confidence": float,
    "bug": str,
    "trainer": str,
    "seed": int,
    "claimed_epsilon": float,
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="empirical privacy audit: lower-bound epsilon by attacking, check the claim",
        description="Attack a mechanism or DP-SGD and compare the audited lower bound on "
        "epsilon with the claimed epsilon (pass: lower bound <= claim).",
    )
    what = p.add_subparsers(dest="target", metavar="TARGET")
    what.required = True

    m = what.add_parser("mechanism", help="black-box audit of a noise mechanism")
    m.add_argument("name", choices=_MECHANISMS + _PATHS)
    m.add_argument("--scale", type=float, default=1.0, help="Laplace scale b (default 1)")
    m.add_argument("--sigma", type=float, default=1.0, help="Gaussian std (default 1)")
    m.add_argument("--p", type=float, default=0.75, help="RR truth probability (0.75)")
    m.add_argument("--sensitivity", type=float, default=1.0, help="sensitivity (default 1)")
    m.add_argument("--trials", type=int, default=100_000, help="runs per input (100000)")
    m.add_argument("--delta", type=float, default=None, help="delta (default 0; Gaussian 1e-5)")
    m.add_argument("--confidence", type=float, default=0.95, help="confidence (0.95)")
    m.add_argument("--bug", choices=["half-noise", "double-sensitivity"], default=None)
    m.add_argument(
        "--orders", default=None, help="Rényi orders to check too, comma-separated (e.g. 2,8,32)"
    )
    m.add_argument("--seed", type=int, default=None, help="seed (reproducible, insecure)")
    m.add_argument("--k", type=int, default=1, help="central-/local-mean: number of values (1)")
    m.add_argument("--epsilon", type=float, default=1.0, help="central-/local-mean: epsilon (1)")
    m.add_argument(
        "--dtype", choices=["float32", "float64"], default="float64", help="dpsgd-noise dtype"
    )
    m.add_argument(
        "--pair",
        choices=["sensitivity", "zero", "midpoint"],
        default="sensitivity",
        help="inputs: 0 and the sensitivity (default); -t and +t around zero; or the two "
        "sides of a lattice midpoint (t = 2^-7 of the sensitivity, or of the lattice step)",
    )
    m.add_argument(
        "--timing",
        action="store_true",
        help="also rank-test the release time of the two inputs (interleaved pairs)",
    )
    m.add_argument("--plot", metavar="PATH", help="write the ROC figure to PATH")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    m.set_defaults(func=_run_mechanism)

    d = what.add_parser("dpsgd", help="canary audit of DP-SGD")
    d.add_argument("--config", metavar="FILE", help="JSON object with any of the options below")
    d.add_argument("--method", choices=["final-step", "many-runs", "one-run"], default=None)
    d.add_argument("--noise-multiplier", type=float, default=None, help="sigma (default 1)")
    d.add_argument("--steps", type=int, default=None, help="training steps (default 1)")
    d.add_argument("--sample-rate", type=float, default=None, help="q (default 1)")
    d.add_argument("--canaries", type=int, default=None, help="canaries (default 1000)")
    d.add_argument("--runs", type=int, default=None, help="many-runs: trainings (2000)")
    d.add_argument("--repetitions", type=int, default=None, help="final-step: steps (100)")
    d.add_argument("--delta", type=float, default=None, help="delta (default 1e-5)")
    d.add_argument("--confidence", type=float, default=None, help="confidence (0.95)")
    d.add_argument("--claimed-epsilon", type=float, default=None, help="claim to check")
    d.add_argument("--bug", choices=["half_noise", "no_clipping"], default=None)
    d.add_argument("--trainer", choices=["reference", "torch"], default=None)
    d.add_argument("--seed", type=int, default=None, help="seed (reproducible, insecure)")
    d.add_argument("--plot", metavar="PATH", help="write the ROC figure to PATH")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=_run_dpsgd)

    t = what.add_parser(
        "train",
        parents=[_train_parser()],
        conflict_handler="resolve",
        help="audit the training `renyi train` would run, in one run",
        description="Run `renyi train`'s set-up with white-box gradient canaries at the "
        "clipped-sum stage and black-box canary examples; report a lower bound on epsilon "
        "beside the epsilon the run claims (Steinke, Nasr & Jagielski 2023; the f-DP test "
        "of Mahloujifar, Melis & Chaudhuri 2025).",
    )
    t.add_argument("--config", metavar="FILE", help="JSON object of any of these options")
    t.add_argument("--canaries", type=int, default=None, help="gradient canaries (1000)")
    t.add_argument("--sign-canaries", type=int, default=None, help="sign canaries (64)")
    t.add_argument("--residue-canaries", type=int, default=None, help="residue canaries (64)")
    t.add_argument(
        "--example-canaries", type=int, default=None, help="black-box canary examples (128)"
    )
    t.add_argument(
        "--participation",
        choices=["sampler", "every-step"],
        default=None,
        help="canaries join steps as the sampler would sample them (default) or every step",
    )
    t.add_argument("--confidence", type=float, default=None, help="confidence (0.95)")
    t.add_argument("--audit-seed", type=int, default=None, help="seed of the audit's coins")
    t.add_argument(
        "--planted",
        metavar="BUG",
        default=None,
        help="plant a catalogued bug in the optimizer first (renyi.audit.planted)",
    )
    t.add_argument("--plot", metavar="PATH", help="write the ROC / trade-off figure to PATH")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=_run_train)


def _train_parser() -> argparse.ArgumentParser:
    """``renyi train``'s options, as a parent parser (the same flags and defaults)."""
    from renyi.cli.train import add_training_options

    parent = argparse.ArgumentParser(add_help=False)
    add_training_options(parent)
    return parent


# ------------------------------------------------------------------ mechanism
def _release_path(args: argparse.Namespace, delta: float) -> tuple[Any, Any, Any, float, str]:
    """One of renyi's release paths (``--sigma`` is the noise multiplier, sensitivity 1)."""
    from renyi.audit.paths import release_path

    if args.bug is not None:
        raise PrivacyParameterError(
            f"bug={args.bug!r} is invalid: expected no --bug for the release path {args.name} "
            "(it attacks the installed code as it is)"
        )
    if args.sensitivity != 1.0:
        raise PrivacyParameterError(
            f"sensitivity={args.sensitivity!r} is invalid: expected 1 for {args.name} "
            "(its neighbouring inputs are fixed: 0 and 1)"
        )
    k = args.k if args.name != "gopa" else max(args.k, 2)
    mech, x0, x1, claim, _, desc = release_path(
        args.name,
        sigma=args.sigma,
        k=k,
        epsilon=args.epsilon,
        delta=delta,
        dtype=args.dtype,
        pair=args.pair,
    )
    return mech, x0, x1, claim, desc


def _pair(args: argparse.Namespace, x0: Any, x1: Any, scale: float) -> tuple[Any, Any]:
    """The inputs of ``--pair`` for a mechanism of noise scale ``scale``."""
    if args.pair == "sensitivity":
        return x0, x1
    if isinstance(x0, bool | int | np.integer):
        raise PrivacyParameterError(
            f"pair={args.pair!r} is invalid for {args.name}: expected the default pair "
            "(its inputs are integers or bits: no sign of zero, no lattice midpoint)"
        )
    from renyi import noise

    if args.pair == "zero":
        t = args.sensitivity * 2.0**-7
        return -t, t
    g = noise.lattice_step(scale)
    return g / 2 - g / 128, g / 2 + g / 128


def _mechanism(args: argparse.Namespace, delta: float) -> tuple[Any, Any, Any, float, str]:
    if args.name in _PATHS:
        return _release_path(args, delta)
    mech, x0, x1, claim, params = _plain_mechanism(args, delta)
    scale = args.scale if "laplace" in args.name else args.sigma
    x0, x1 = _pair(args, x0, x1, scale)
    return mech, x0, x1, claim, params


def _plain_mechanism(args: argparse.Namespace, delta: float) -> tuple[Any, Any, Any, float, str]:
    from renyi.analysis.closed_forms import gaussian_epsilon
    from renyi.audit.blackbox import vectorised
    from renyi.mechanisms import (
        DiscreteGaussianMechanism,
        DiscreteLaplaceMechanism,
        GaussianMechanism,
        LaplaceMechanism,
        RandomizedResponse,
    )

    sens = args.sensitivity
    noise_factor = 0.5 if args.bug == "half-noise" else 1.0
    shift = 2.0 if args.bug == "double-sensitivity" else 1.0
    name = args.name
    if name == "laplace":
        b = args.scale
        mech = vectorised(lambda n: LaplaceMechanism(b * noise_factor, sens, dimension=n))
        return mech, 0.0, shift * sens, LaplaceMechanism(b, sens).pure_epsilon, f"b={b:g}"
    if name == "gaussian":
        s = args.sigma
        mech = vectorised(lambda n: GaussianMechanism(s * noise_factor, sens, dimension=n))
        return mech, 0.0, shift * sens, GaussianMechanism(s, sens).epsilon(delta), f"sigma={s:g}"
    if name in ("discrete-laplace", "discrete-gaussian"):
        if sens != int(sens):
            raise PrivacyParameterError(
                f"sensitivity={sens!r} is invalid: expected an integer for {name}"
            )
        k = int(sens)
        if name == "discrete-laplace":
            b = args.scale
            mech = vectorised(lambda n: DiscreteLaplaceMechanism(b * noise_factor, k, dimension=n))
            dl = DiscreteLaplaceMechanism(b, k)
            claim = dl.epsilon(delta) if delta > 0 else dl.pure_epsilon
            return mech, 0, int(shift * k), claim, f"b={b:g}"
        s2 = args.sigma**2
        f2 = noise_factor**2
        mech = vectorised(lambda n: DiscreteGaussianMechanism(s2 * f2, k, dimension=n))
        claim = DiscreteGaussianMechanism(s2, k).epsilon(delta)
        return mech, 0, int(shift * k), claim, f"sigma^2={s2:g}"
    if name == "randomized-response":
        p = args.p
        lie = 1.0 - p
        true_p = 1.0 - lie * noise_factor  # "half noise": lies half as often as claimed

        def rr(x: Any, size: int, rng: Any) -> Any:
            return RandomizedResponse(true_p).release(np.full(size, bool(x)), rng=rng)

        mech_rr = RandomizedResponse(p)
        claim = mech_rr.epsilon(delta) if delta > 0 else mech_rr.pure_epsilon
        return rr, False, True, claim, f"p={p:g}"
    if name == "naive-laplace":
        b = args.scale

        def lap(x: Any, size: int, rng: Any) -> Any:
            return x + rng.laplace(0.0, b * noise_factor, size)

        return lap, 0.0, shift * sens, sens / b, f"b={b:g}"
    s = args.sigma

    def gauss(x: Any, size: int, rng: Any) -> Any:
        return x + rng.normal(0.0, s * noise_factor, size)

    return gauss, 0.0, shift * sens, gaussian_epsilon(sens / s, delta), f"sigma={s:g}"


def _claimed_rdp(args: argparse.Namespace, orders: Any) -> Any:
    """The claimed RDP curve of the (bug-free) mechanism at ``orders``."""
    from renyi.analysis.closed_forms import gaussian_rdp, laplace_rdp
    from renyi.mechanisms import (
        DiscreteGaussianMechanism,
        DiscreteLaplaceMechanism,
        GaussianMechanism,
        LaplaceMechanism,
        RandomizedResponse,
    )

    sens, name = args.sensitivity, args.name
    mech: Any
    if name == "naive-laplace":
        return laplace_rdp(args.scale / sens, orders)
    if name == "naive-gaussian":
        return gaussian_rdp(args.sigma / sens, orders)
    if name == "laplace":
        mech = LaplaceMechanism(args.scale, sens)
    elif name == "gaussian":
        mech = GaussianMechanism(args.sigma, sens)
    elif name == "discrete-laplace":
        mech = DiscreteLaplaceMechanism(args.scale, int(sens))
    elif name == "discrete-gaussian":
        mech = DiscreteGaussianMechanism(args.sigma**2, int(sens))
    else:
        mech = RandomizedResponse(args.p)
    return mech.rdp(orders).epsilons


def _parse_orders(text: str) -> Any:
    from renyi._validation import check_orders

    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PrivacyParameterError(
            f"orders={text!r} is invalid: expected comma-separated numbers > 1"
        ) from None
    return check_orders(values)


def _run_mechanism(args: argparse.Namespace) -> int:
    from renyi.audit.blackbox import audit_mechanism

    gaussian = args.name in ("gaussian", "naive-gaussian", "discrete-gaussian", *_PATHS)
    if args.pair != "sensitivity" and args.name in _PATHS and args.sensitivity != 1.0:
        raise PrivacyParameterError(
            f"sensitivity={args.sensitivity!r} is invalid with --pair: expected 1 for {args.name}"
        )
    delta = args.delta if args.delta is not None else (1e-5 if gaussian else 0.0)
    if gaussian and delta == 0.0:
        raise PrivacyParameterError("delta=0.0 is invalid: expected delta in (0, 1) for Gaussians")
    mech, x0, x1, claim, params = _mechanism(args, delta)
    orders = _parse_orders(args.orders) if args.orders else None
    if orders is not None and args.name in _PATHS:
        raise PrivacyParameterError(
            f"orders={args.orders!r} is invalid: expected no --orders for the release path "
            f"{args.name} (its claim is (epsilon, delta))"
        )
    claimed_rdp = _claimed_rdp(args, orders) if orders is not None else None
    naive = args.name.startswith("naive")
    rng: Any = np.random.default_rng(args.seed) if (args.seed is not None or naive) else None
    residue = None
    if args.name == "gopa":
        from renyi import noise

        residue = (1.0, noise.lattice_step(args.sigma))
    timing = None
    with warnings.catch_warnings():
        if args.seed is not None:
            warnings.simplefilter("ignore", InsecureRandomnessWarning)
        result = audit_mechanism(
            mech,
            x0,
            x1,
            trials=args.trials,
            claimed_epsilon=claim,
            delta=delta,
            confidence=args.confidence,
            orders=orders,
            claimed_rdp=claimed_rdp,
            rng=rng,
            residue=residue,
        )
        if args.timing:
            from renyi.audit.timing import audit_timing

            timing = audit_timing(
                lambda x: mech(x, 1, rng),
                x0,
                x1,
                pairs=2000,
                confidence=args.confidence,
                rng=np.random.default_rng(args.seed),
            )
    plot = None
    if args.plot:
        from renyi.audit.plots import plot_roc

        plot = str(plot_roc(result, args.plot, title=f"audit of {args.name}"))
    if args.json:
        print_json(
            {
                "command": "audit",
                "target": "mechanism",
                "mechanism": args.name,
                "parameters": params,
                "bug": args.bug,
                "x0": x0,
                "x1": x1,
                "pair": args.pair,
                **result.to_dict(),
                "timing": None if timing is None else timing.to_dict(),
                "plot": plot,
            }
        )
    else:
        rows = [[a.attack, a.epsilon, a.fpr, a.fnr, a.set_description] for a in result.attacks]
        print(
            format_table(
                ["attack", "eps >=", "FPR", "FNR", "set"],
                rows,
                title=f"audit of {args.name} {params} (bug: {args.bug}), {args.trials} runs "
                f"per input, delta={delta:g}, confidence={args.confidence:g}",
            )
        )
        verdict = "PASS" if result.passed else "FAIL"
        print(
            f"\naudited lower bound {result.epsilon_lower:.4g} vs claimed epsilon "
            f"{claim:.4g}: {verdict}"
        )
        if result.orders is not None and result.rdp_lower is not None:
            claimed = result.claimed_rdp if result.claimed_rdp is not None else result.rdp_lower
            rdp_rows = zip(result.orders, result.rdp_lower, claimed, strict=True)
            print(
                format_table(
                    ["order", "RDP eps >=", "claimed RDP eps"],
                    [[float(a), float(lo), float(c)] for a, lo, c in rdp_rows],
                    title="\nRényi lower bounds (same held-out counts):",
                )
            )
            print(f"RDP claims: {'PASS' if result.rdp_passed else 'FAIL'}")
        if timing is not None:
            print(
                f"timing of x0={x0!r} vs x1={x1!r}: {timing.pairs} interleaved pairs, "
                f"signed-rank p = {timing.p_value:.3g}, P(x1 slower) = {timing.auc:.3f}, "
                f"median ratio {timing.median_ratio:.3f}: "
                f"{'PASS' if timing.passed else 'FAIL'}"
            )
        if plot:
            print(f"figure written to {plot}")
    ok = result.passed and result.rdp_passed is not False and (timing is None or timing.passed)
    return 0 if ok else 1


# ------------------------------------------------------------------ dpsgd
def _read_config(path: str) -> dict[str, Any]:
    """The JSON object of a ``--config`` file, or our error naming ``config``."""
    try:
        with open(path, encoding="utf-8") as fh:
            loaded = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise PrivacyParameterError(
            f"config={path!r} is invalid: expected a readable JSON file ({exc})"
        ) from None
    if not isinstance(loaded, dict):
        raise PrivacyParameterError(f"config={path!r} is invalid: expected an object")
    return loaded


def _dpsgd_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.config:
        loaded = _read_config(args.config)
        for key, value in loaded.items():
            k = key.replace("-", "_")
            if k not in _DPSGD_KEYS:
                raise PrivacyParameterError(
                    f"config key {key!r} is invalid: expected one of {sorted(_DPSGD_KEYS)}"
                )
            opts[k] = value
    for k in _DPSGD_KEYS:
        v = getattr(args, k, None)
        if v is not None:
            opts[k] = v
    defaults = {
        "method": "final-step",
        "noise_multiplier": 1.0,
        "steps": 1,
        "sample_rate": 1.0,
        "canaries": 1000,
        "runs": 2000,
        "repetitions": 100,
        "delta": 1e-5,
        "confidence": 0.95,
        "bug": None,
        "trainer": "reference",
        "seed": None,
        "claimed_epsilon": None,
    }
    return {**defaults, **opts}


def _run_dpsgd(args: argparse.Namespace) -> int:
    from renyi.audit import dpsgd

    o = _dpsgd_options(args)
    rng = np.random.default_rng(o["seed"])
    method = str(o["method"]).replace("_", "-")
    common = {
        "noise_multiplier": o["noise_multiplier"],
        "delta": o["delta"],
        "confidence": o["confidence"],
        "claimed_epsilon": o["claimed_epsilon"],
        "pld": True,
        "rng": rng,
    }
    if o["trainer"] not in ("reference", "torch"):
        raise PrivacyParameterError(
            f"trainer={o['trainer']!r} is invalid: expected reference/torch"
        )
    if o["trainer"] == "torch" and method != "final-step":
        raise PrivacyParameterError(
            f"trainer='torch' is invalid with method={method!r}: expected method final-step"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        if method == "final-step":
            if o["bug"] is not None:
                raise PrivacyParameterError(
                    f"bug={o['bug']!r} is invalid with final-step: expected many-runs/one-run"
                )
            scores_fn = None
            if o["trainer"] == "torch":
                sigma, seed = o["noise_multiplier"], o["seed"]

                def scores_fn(inc: Any, gen: Any) -> Any:
                    return dpsgd.torch_final_step_scores(inc, noise_multiplier=sigma, seed=seed)

            r = dpsgd.audit_final_step(
                canaries=o["canaries"], repetitions=o["repetitions"], scores_fn=scores_fn, **common
            )
        elif method == "many-runs":
            r = dpsgd.audit_many_runs(
                steps=o["steps"],
                sample_rate=o["sample_rate"],
                runs=o["runs"],
                canaries=min(o["canaries"], 64),
                bug=o["bug"],
                **common,
            )
        elif method == "one-run":
            r = dpsgd.audit_one_run(
                canaries=o["canaries"],
                steps=o["steps"],
                sample_rate=o["sample_rate"],
                bug=o["bug"],
                **common,
            )
        else:
            raise PrivacyParameterError(
                f"method={method!r} is invalid: expected final-step, many-runs or one-run"
            )
    plot = None
    if args.plot and r.audit is not None:
        from renyi.audit.plots import plot_roc

        plot = str(plot_roc(r.audit, args.plot, title=f"DP-SGD {method} audit"))
    if args.json:
        print_json(
            {
                "command": "audit",
                "target": "dpsgd",
                "options": o | {"rng": None},
                **r.to_dict(),
                "plot": plot,
            }
        )
    else:
        rows = [["audited lower bound", r.epsilon_lower]]
        rows += [[f"accountant ({k})", v] for k, v in r.accountant.items()]
        rows += [["claimed epsilon", r.claimed_epsilon], ["gap (claim - lower)", r.gap]]
        print(
            format_table(
                ["quantity", "epsilon"],
                rows,
                title=f"DP-SGD {method} audit: sigma={o['noise_multiplier']:g}, "
                f"steps={o['steps']}, q={o['sample_rate']:g}, delta={r.delta:g}, "
                f"confidence={r.confidence:g}, bug={o['bug']}",
            )
        )
        details = ", ".join(f"{k}={v}" for k, v in r.details.items())
        print(f"\n{details}")
        print(f"verdict: {'PASS' if r.passed else 'FAIL'}")
        if plot:
            print(f"figure written to {plot}")
    if not math.isfinite(r.epsilon_lower) and r.epsilon_lower != math.inf:  # pragma: no cover
        return 2
    return 0 if r.passed else 1


# ------------------------------------------------------------------ train
_TRAIN_AUDIT_DEFAULTS: dict[str, Any] = {
    "canaries": 1000,
    "sign_canaries": 64,
    "residue_canaries": 64,
    "example_canaries": 128,
    "participation": "sampler",
    "confidence": 0.95,
    "audit_seed": None,
    "planted": None,
}


def _train_options(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--config`` merged in: a config key applies where the command line left
    the option at its default; unknown keys are refused."""
    parser = _train_parser()
    defaults = {a.dest: a.default for a in parser._actions}
    defaults.update({k: None for k in _TRAIN_AUDIT_DEFAULTS})
    known = set(defaults)
    merged = dict(vars(args))
    if args.config:
        loaded = _read_config(args.config)
        given: dict[str, Any] = {}
        for key, value in loaded.items():
            k = key.replace("-", "_")
            if k not in known:
                raise PrivacyParameterError(
                    f"config key {key!r} is invalid: expected one of {sorted(known)}"
                )
            if merged.get(k) == defaults[k]:
                given[k] = value
        merged.update(_checked_config(args.config, given))
    for k, v in _TRAIN_AUDIT_DEFAULTS.items():
        if merged.get(k) is None:
            merged[k] = v
    return argparse.Namespace(**merged)


def _checked_config(path: str, given: dict[str, Any]) -> dict[str, Any]:
    """The config's values checked as the command line checks its own: each is passed to
    ``renyi audit train``'s parser (the same types, ranges and choices), so a config cannot
    set what the flags refuse (``"epochs": -1`` ran an audit of no training and passed)."""
    from renyi.cli.main import UsageError, build_parser

    parser = build_parser()
    for name in ("audit", "train"):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    argv: list[str] = []
    for k, value in given.items():
        action = actions[k]
        flag = action.option_strings[-1]
        if action.nargs == 0:  # a switch: true or false
            if not isinstance(value, bool):
                raise UsageError(
                    f"config {path!r}: {k}={value!r} is invalid: expected true or false"
                )
            if value != action.default:
                argv.append(flag)
        elif value is not None:
            if isinstance(value, bool | list | dict):
                raise UsageError(
                    f"config {path!r}: {k}={value!r} is invalid: expected a number or a string"
                )
            argv += [flag, str(value)]
    try:
        checked = parser.parse_args(argv)
    except UsageError as exc:
        raise UsageError(f"config {path!r}: {exc}") from None
    return {k: getattr(checked, k) for k in given}


def _run_train(args: argparse.Namespace) -> int:
    import torch

    from renyi.audit.training import add_example_canaries, audit_training, example_scores
    from renyi.cli import _training as cli_training
    from renyi.dpsgd.trainer import Trainer
    from renyi.errors import OrderAtGridEdgeWarning

    o = _train_options(args)
    if o.accounting != "standard" or o.user_level is not None:
        raise PrivacyParameterError(
            "accounting/user-level is invalid for `renyi audit train`: expected standard "
            "example-level training (individual accounting and user-level DP are audited by "
            "the test suite's harness, renyi.audit.harness)"
        )
    if o.threads is not None:
        torch.set_num_threads(max(1, int(o.threads)))
    arch, epochs, batch, lr, clip, momentum = cli_training.DEFAULTS[o.dataset]
    arch = o.model if o.model is not None else arch
    epochs = o.epochs if o.epochs is not None else epochs
    batch = o.batch_size if o.batch_size is not None else batch
    lr = o.lr if o.lr is not None else lr
    clip = o.max_grad_norm if o.max_grad_norm is not None else clip
    gen = np.random.default_rng(o.audit_seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderAtGridEdgeWarning)
        if o.seed is not None:
            warnings.simplefilter("ignore", InsecureRandomnessWarning)
        data, _ = cli_training.load_data(o)
        m_ex = int(o.example_canaries)
        extra: dict[str, Any] = {}
        if m_ex > 0:
            data, cx, cy, inc = add_example_canaries(data, m_ex, classes=10, rng=gen)
        sampling = o.sampling
        accountant = cli_training.choose_accountant(o.accountant, sampling, len(data), batch)
        torch.manual_seed(0 if o.seed is None else o.seed)
        model = cli_training.build_model(o.dataset, arch)
        common: dict[str, Any] = dict(
            loss_fn=torch.nn.CrossEntropyLoss(),
            target_epsilon=o.epsilon,
            delta=o.delta,
            epochs=epochs,
            batch_size=batch,
            max_grad_norm=clip,
            accountant=accountant,
            seed=o.seed,
        )
        sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        if o.noise == "dpsgd":
            from renyi.dpsgd.privacy import make_private

            private = make_private(model, sgd, data, sampling=sampling, **common)
        else:
            from renyi.dpsgd.correlated import make_private_correlated

            if sampling != "poisson":
                raise PrivacyParameterError(
                    f"sampling={sampling!r} is invalid with --noise {o.noise}: expected poisson"
                )
            private = make_private_correlated(
                model, sgd, data, noise=o.noise, bands=o.bands, buffers=o.buffers, **common
            )
        if o.planted is not None:
            from renyi.audit.planted import plant

            plant(o.planted, private.optimizer)
        if m_ex > 0:
            extra["examples"] = lambda: (example_scores(model, cx, cy), inc)
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        others = int(o.sign_canaries) + int(o.residue_canaries)
        # one coordinate per canary: at most the model's parameters in all
        n_gauss = max(0, min(int(o.canaries), params - others))
        result = audit_training(
            private.optimizer,
            lambda: Trainer(private, progress=False).fit(),
            canaries=n_gauss,
            sign_canaries=int(o.sign_canaries),
            residue_canaries=int(o.residue_canaries),
            delta=o.delta,
            confidence=float(o.confidence),
            participation=o.participation,
            extra_scores=extra,
            rng=gen,
        )
    plot = None
    if o.plot:
        from renyi.audit.plots import plot_tradeoff

        plot = str(plot_tradeoff(result, o.plot))
    summary = {
        "command": "audit",
        "target": "train",
        **result.to_dict(),
        "planted": o.planted,
        "dataset": o.dataset,
        "model": arch,
        "sampling": sampling,
        "noise": o.noise,
        "accountant": accountant,
        "noise_multiplier": private.noise_multiplier,
        "steps": private.steps,
        "secure_randomness": o.seed is None,
        "plot": plot,
    }
    if o.json:
        print_json(summary)
    else:
        rows: list[list[Any]] = [
            ["audited lower bound (Steinke et al.)", f"{result.epsilon_lower_bound:.4g}"],
            ["claimed epsilon", f"{result.epsilon_claimed:.4g}"],
            ["delta, confidence", f"{result.delta:g}, {result.confidence:g}"],
            ["canaries", result.canaries],
            ["refuted mu-GDP (f-DP test)", f"{result.mu_lower_bound or 0:.4g}"],
            ["  as epsilon, if Gaussian-shaped", f"{result.epsilon_gdp or 0:.4g}"],
            ["claimed curve refuted", result.fdp_claim_refuted],
            ["steps, sigma", f"{private.steps}, {private.noise_multiplier:.4g}"],
            ["planted bug", o.planted or "none"],
        ]
        print(format_table(["", "value"], rows, title="renyi audit train: one-run audit"))
        for kind, info in result.details.get("kinds", {}).items():
            best = max(info["guesses"], key=lambda g: g["epsilon"])
            print(
                f"  {kind}: {info['canaries']} canaries, best {best['correct']}/"
                f"{best['guesses']} guesses right (eps >= {best['epsilon']:.3g})"
            )
        print(f"verdict: {'PASS' if result.passed else 'FAIL'}")
        if plot:
            print(f"figure written to {plot}")
    return 0 if result.passed else 1
