"""renyi's own release paths as black-box mechanisms, for :func:`renyi.audit.audit_mechanism`.

Each factory returns ``(mechanism, x0, x1, claimed_epsilon, delta, description)``:
``mechanism(x, size, rng)`` runs the *real* code path ``size`` times on input ``x`` (a
neighbouring pair ``x0``, ``x1``) and returns the released floats, so the audit attacks the
installed code, not a model of it. The claims are the ones renyi reports for that release.

* ``dpsgd-noise``: :meth:`renyi.dpsgd.optimizer.DPOptimizer.add_noise` on a model of ``size``
  parameters (one unsampled step, clipped sum 0 or ``C`` per coordinate, each coordinate an
  independent release; float32 or float64 parameters).
* ``central-mean`` / ``local-mean``: :func:`renyi.federated.aggregation.private_mean_central`
  / ``private_mean_local`` on ``k`` values ``[0, 0, ...]`` vs ``[1, 0, ...]``.
* ``fedavg``: one :meth:`renyi.federated.fedavg.DpFedAvg.round` with one client, update ``0``
  vs ``C`` per coordinate.
* ``gopa``: :class:`renyi.federated.gopa.GopaProtocol` with ``k`` parties (vector values,
  64 coordinates a run), party 0's every coordinate ``x``, the others' 0; the output is
  ``k`` times the released mean (the sum), with ``residue=(1, lattice_step(sigma))`` for the
  lattice-residue attack. Its "sensitivity" pair is ``0`` vs ``1/16`` (a row of 64 such
  values has norm 1/2, the domain's radius).
* planted bugs ``numpy-normal`` (``x + numpy.random.normal``), ``box-muller`` (the former
  :meth:`renyi.random.RandomSource.normal` floats added to ``x``) and ``residue-sum`` (a sum
  released as ``sum + g K``: lattice noise, values off the lattice): what the attacks must
  catch.

``pair`` picks the inputs: ``"sensitivity"`` (0 and 1, the default), ``"zero"`` (``-t`` and
``+t`` with ``t = 2**-7``: both sides of zero, where a release that keeps the input's sign
shows ``-0.0``) or ``"midpoint"`` (``g/2 - t'`` and ``g/2 + t'``, ``g = lattice_step(sigma)``,
``t' = g 2**-7``: the two sides of a rounding boundary of the lattice).

Example:
    >>> from renyi.audit import audit_mechanism
    >>> mech, x0, x1, claim, delta, _ = release_path("central-mean", k=1)
    >>> r = audit_mechanism(mech, x0, x1, trials=2000, claimed_epsilon=claim, delta=delta)
    >>> r.passed
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from renyi._validation import check_int, check_positive, fail

__all__ = ["PATHS", "release_path"]

PATHS = (
    "dpsgd-noise",
    "central-mean",
    "local-mean",
    "fedavg",
    "gopa",
    "numpy-normal",
    "box-muller",
    "residue-sum",
)
PAIRS = ("sensitivity", "zero", "midpoint")
Path = tuple[Callable[[Any, int, Any], Any], Any, Any, float, float, str]


def _dpsgd(sigma: float, dtype: str, delta: float) -> Path:
    import torch

    from renyi.analysis.closed_forms import gaussian_epsilon
    from renyi.dpsgd.optimizer import DPOptimizer
    from renyi.dpsgd.sampler import PoissonSampler

    tdtype = {"float32": torch.float32, "float64": torch.float64}[dtype]

    def mech(x: Any, size: int, rng: Any) -> Any:
        model = torch.nn.Linear(size, 1, bias=False).to(tdtype)
        opt = DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0),
            model=model,
            loss_fn=torch.nn.functional.mse_loss,
            noise_multiplier=sigma,
            max_grad_norm=1.0,
            sampler=PoissonSampler(1, 1.0, 1),
            accountant=None,
        )
        # one clipped sum of value x in every coordinate: each coordinate is its own release
        # of the Gaussian mechanism with sensitivity C = 1 (the step's claim, per coordinate)
        opt._summed = {name: torch.full_like(p, float(x)) for name, p in model.named_parameters()}
        opt.add_noise()
        grad = model.weight.grad
        assert grad is not None  # add_noise sets every gradient
        return grad.detach().to(torch.float64).numpy().reshape(-1)

    claim = gaussian_epsilon(1.0 / sigma, delta)
    return mech, 0.0, 1.0, claim, delta, f"DPOptimizer.add_noise, sigma={sigma:g}, {dtype}"


def _mean(kind: str, k: int, epsilon: float, delta: float) -> Path:
    from renyi.federated.aggregation import private_mean_central, private_mean_local

    fn = private_mean_central if kind == "central" else private_mean_local

    def mech(x: Any, size: int, rng: Any) -> Any:
        values = np.zeros(k)
        values[0] = float(x)
        return np.array([fn(values, epsilon, delta, rng=rng) for _ in range(size)])

    return mech, 0.0, 1.0, epsilon, delta, f"private_mean_{kind}, K={k}, eps={epsilon:g}"


def _fedavg(sigma: float, delta: float) -> Path:
    from renyi.analysis.closed_forms import gaussian_epsilon
    from renyi.federated.fedavg import DpFedAvg

    def mech(x: Any, size: int, rng: Any) -> Any:
        agg = DpFedAvg(
            population=1,
            clients_per_round=1,
            noise_multiplier=sigma,
            clip_norm=1.0,
            sampling="fixed",
            rng=rng,
        )
        # one round, one client, update x in each of `size` coordinates clipped jointly would
        # change the sensitivity: run `size` one-coordinate rounds instead
        return np.array([float(agg.round(np.array([[float(x)]]))[0]) for _ in range(size)])

    claim = gaussian_epsilon(1.0 / sigma, delta)
    return mech, 0.0, 1.0, claim, delta, f"DpFedAvg.round, one client, z={sigma:g}"


def _gopa(k: int, sigma: float, delta: float) -> Path:
    from renyi.federated.gopa import GopaProtocol

    dim = 64
    probe = GopaProtocol(np.zeros((k, dim)), sigma_eta=sigma, sigma_delta=5.0, peers=k - 1)
    claim = float(probe.privacy().epsilon(delta))

    def mech(x: Any, size: int, rng: Any) -> Any:
        out = []
        for _start in range(0, size, dim):
            values = np.zeros((k, dim))
            values[0] = float(x)
            proto = GopaProtocol(values, sigma_eta=sigma, sigma_delta=5.0, peers=k - 1, rng=rng)
            out.append(np.asarray(proto.run().estimate, dtype=np.float64) * k)
        return np.concatenate(out)[:size]

    return mech, 0.0, 2.0**-4, claim, delta, f"GopaProtocol, K={k}, sigma_eta={sigma:g}, sum"


def _planted(kind: str, sigma: float, delta: float) -> Path:
    from renyi.analysis.closed_forms import gaussian_epsilon

    def mech(x: Any, size: int, rng: Any) -> Any:
        if kind == "residue-sum":  # lattice noise g K added to the value as it is
            from renyi import noise

            return float(x) + np.asarray(noise.gaussian_noise(size, sigma, rng=rng))
        if kind == "numpy-normal":
            gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng()
            return float(x) + gen.normal(0.0, sigma, size)
        from renyi.random import get_source

        return float(x) + sigma * get_source(rng).normal(size)  # raw Box-Muller floats

    claim = gaussian_epsilon(1.0 / sigma, delta)
    return mech, 0.0, 1.0, claim, delta, f"planted bug: x + {kind} noise, sigma={sigma:g}"


def release_path(
    name: str,
    *,
    sigma: float = 1.0,
    k: int = 1,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    dtype: str = "float64",
    pair: str = "sensitivity",
) -> Path:
    """``(mechanism, x0, x1, claimed_epsilon, delta, description)`` for the release path
    ``name`` (one of :data:`PATHS`); ``sigma`` is the noise multiplier of DP-SGD / DP-FedAvg,
    GOPA's ``sigma_eta`` and the planted bugs' noise, ``k``, ``epsilon`` the parameters of the
    private means (``k`` parties for GOPA, at least 2); ``pair`` the inputs (module
    docstring)."""
    if name not in PATHS:
        raise fail("name", name, f"one of {', '.join(PATHS)}")
    if pair not in PAIRS:
        raise fail("pair", pair, f"one of {', '.join(PAIRS)}")
    sigma = check_positive("sigma", sigma)
    path = _path(name, sigma, k, epsilon, delta, dtype)
    if pair == "sensitivity":
        return path
    from renyi import noise

    mech, _, _, claim, d, desc = path
    if pair == "zero":
        t = 2.0**-7
        return mech, -t, t, claim, d, f"{desc}; inputs -/+2^-7 (both sides of zero)"
    g = noise.lattice_step(sigma)
    return mech, g / 2 - g / 128, g / 2 + g / 128, claim, d, f"{desc}; inputs g/2 -/+ g/128"


def _path(name: str, sigma: float, k: int, epsilon: float, delta: float, dtype: str) -> Path:
    if name == "dpsgd-noise":
        if dtype not in ("float32", "float64"):
            raise fail("dtype", dtype, "'float32' or 'float64'")
        return _dpsgd(sigma, dtype, delta)
    if name in ("central-mean", "local-mean"):
        return _mean(
            name.split("-")[0], check_int("k", k, 1), check_positive("epsilon", epsilon), delta
        )
    if name == "fedavg":
        return _fedavg(sigma, delta)
    if name == "gopa":
        return _gopa(check_int("k", k, 2), sigma, delta)
    return _planted(name, sigma, delta)
