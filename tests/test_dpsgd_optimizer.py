"""DPOptimizer: noise variance, division by q·n, accounting, refusals, virtual steps."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402

from renyi.dpsgd.optimizer import DPOptimizer, NonFiniteLossError  # noqa: E402
from renyi.dpsgd.sampler import PoissonSampler, SecureRandomSource, SeededRandomSource  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402

pytestmark = pytest.mark.torch
ALPHA = 1e-6  # false-alarm rate of each statistical test


@pytest.fixture(autouse=True)
def _quiet_insecure() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)


class StandInEngine:
    """Minimal flat-clipping engine with the contract of renyi.dpsgd.clipping (tests only)."""

    def __init__(self, model: nn.Module, loss_fn: Any, *, max_grad_norm: float) -> None:
        self.model, self.loss_fn, self.max_grad_norm = model, loss_fn, max_grad_norm

    def clipped_grad_sum(
        self, inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        params = {k: v.detach() for k, v in self.model.named_parameters()}

        def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = functional_call(self.model, p, (x.unsqueeze(0),))
            return self.loss_fn(out, y.unsqueeze(0))

        if inputs.shape[0] == 0:
            zeros = {k: torch.zeros_like(v) for k, v in params.items()}
            return zeros, torch.zeros(0), torch.zeros(0)
        grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, inputs, targets)
        losses = vmap(loss, in_dims=(None, 0, 0))(params, inputs, targets)
        flat = torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1)
        norms = flat.norm(dim=1)
        factor = (self.max_grad_norm / (norms + 1e-12)).clamp(max=1.0)
        sums = {k: torch.einsum("b,b...->...", factor, g) for k, g in grads.items()}
        return sums, losses.detach(), norms


def _setup(
    *,
    sigma: float = 1.0,
    clip: float = 1.0,
    n: int = 100,
    q: float = 0.1,
    lr: float = 1.0,
    model: nn.Module | None = None,
    source: Any = None,
    **kwargs: Any,
) -> tuple[nn.Module, DPOptimizer]:
    torch.manual_seed(0)
    model = model if model is not None else nn.Linear(3, 2)
    sampler = PoissonSampler(n, q, 50, random_source=source or SeededRandomSource(0))
    kwargs.setdefault("accountant", None)
    if isinstance(kwargs.get("random_source"), _NoNoise):  # a stand-in: refused without the flag
        kwargs.setdefault("allow_predictable_noise", True)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr),
        model=model,
        loss_fn=nn.functional.cross_entropy,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        sampler=sampler,
        engine=StandInEngine(model, nn.functional.cross_entropy, max_grad_norm=clip),
        **kwargs,
    )
    return model, opt


def _empty_step(opt: DPOptimizer, features: int = 3) -> None:
    """One step on an empty Poisson batch (declared by accumulating zero examples)."""
    opt.zero_grad()
    opt.accumulate(torch.zeros(0, features), torch.zeros(0, dtype=torch.long))
    opt.step()


def _data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)


class _NoNoise:
    """A noise source that returns zeros (to isolate the deterministic stages)."""

    secure = False

    def normal(self, shape: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(tuple(shape), dtype=dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "none"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@pytest.mark.parametrize("source_kind", ["seeded", "secure"])
def test_noise_has_variance_sigma_c_squared_over_qn_squared(source_kind: str) -> None:
    # Empty batch: the update is pure noise N(0, (sigma C)^2) / (q n) times lr.
    sigma, clip, n, q = 1.7, 0.6, 400, 0.05
    model = nn.Linear(500, 200)  # 100,200 noise coordinates
    source = SeededRandomSource(3) if source_kind == "seeded" else SecureRandomSource()
    _, opt = _setup(sigma=sigma, clip=clip, n=n, q=q, model=model, source=source)
    before = torch.cat([p.detach().clone().flatten() for p in model.parameters()])
    _empty_step(opt, 500)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    update = (before - after).double().numpy()
    std = sigma * clip / (q * n)
    k = update.size
    # chi-square test of the variance (known mean 0), two-sided, false alarm ALPHA
    stat = float(np.sum((update / std) ** 2))
    assert stats.chi2.ppf(ALPHA / 2, k) < stat < stats.chi2.isf(ALPHA / 2, k)
    # z-test of the mean
    assert abs(update.mean() / (std / math.sqrt(k))) < stats.norm.isf(ALPHA / 2)
    # normality: the release is N(0, std^2) snapped to the lattice of renyi.noise (step
    # g = lattice_step(sigma C) before the division by q n): chi-square goodness of fit of the
    # lattice indices against the rounded normal's probabilities (bins with >= 5 expected)
    from renyi.noise import lattice_step

    h = lattice_step(sigma * clip) / (q * n)
    idx = np.rint(update / h).astype(np.int64)
    assert np.allclose(idx * h, update, rtol=0, atol=h * 1e-3)  # on the lattice (float32 params)
    edges = np.arange(idx.min(), idx.max() + 2) - 0.5
    expected = k * np.diff(stats.norm.cdf(edges * h / std))
    observed = np.bincount(idx - idx.min(), minlength=expected.size).astype(float)
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], k - expected[keep].sum())
    chi2 = float(np.sum((obs - exp) ** 2 / exp))
    assert stats.chi2.sf(chi2, obs.size - 1) > ALPHA


def test_gradient_is_clipped_sum_divided_by_expected_batch_size() -> None:
    # No noise: p.grad must be (sum of clipped per-example grads) / (q n), whatever the
    # realised batch size; q n = 12.5 here (not floored to 12).
    model, opt = _setup(n=125, q=0.1, clip=0.5, random_source=_NoNoise())
    x, y = _data(7)
    opt.zero_grad()
    opt.accumulate(x, y)
    opt.pre_step()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    # independent reference: batch-of-one autograd loop, explicit clipping
    ref = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    for i in range(7):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        g = {name: p.grad.clone() for name, p in model.named_parameters()}
        norm = math.sqrt(sum(float(v.pow(2).sum()) for v in g.values()))
        for name in ref:
            ref[name] += g[name] * min(1.0, 0.5 / norm)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name] / 12.5, rtol=1e-5, atol=1e-7)


def test_virtual_steps_equal_one_big_batch() -> None:
    x, y = _data(9)
    model_a, opt_a = _setup(random_source=_NoNoise())
    opt_a.zero_grad()
    opt_a.accumulate(x, y)
    opt_a.step()
    model_b, opt_b = _setup(random_source=_NoNoise())
    opt_b.zero_grad()
    opt_b.accumulate(x[:4], y[:4])
    opt_b.accumulate(x[4:], y[4:])
    opt_b.step()
    model_c, opt_c = _setup(random_source=_NoNoise(), max_physical_batch_size=2)
    opt_c.zero_grad()
    opt_c.accumulate(x, y)
    opt_c.step()
    for pa, pb, pc in zip(
        model_a.parameters(), model_b.parameters(), model_c.parameters(), strict=True
    ):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(pa, pc, rtol=1e-6, atol=1e-7)
    assert opt_a.steps_taken == opt_b.steps_taken == opt_c.steps_taken == 1


def test_noise_is_added_once_per_logical_batch() -> None:
    # Two micro-batches, one step: the noise variance is that of one draw.
    sigma, clip, n, q = 1.0, 1.0, 100, 0.5
    model = nn.Linear(300, 100)
    _, opt = _setup(sigma=sigma, clip=clip, n=n, q=q, model=model, source=SeededRandomSource(9))
    before = torch.cat([p.detach().clone().flatten() for p in model.parameters()])
    x = torch.zeros(0, 300)
    y = torch.zeros(0, dtype=torch.long)
    opt.zero_grad()
    opt.accumulate(x, y)
    opt.accumulate(x, y)
    opt.step()
    update = (before - torch.cat([p.detach().flatten() for p in model.parameters()])).double()
    std = sigma * clip / (q * n)
    stat = float(((update / std) ** 2).sum())
    k = update.numel()
    assert stats.chi2.ppf(ALPHA / 2, k) < stat < stats.chi2.isf(ALPHA / 2, k)


@pytest.mark.parametrize("name", ["rdp", "pld", "zcdp"])
def test_accounting_equals_standalone_accountant(name: str) -> None:
    try:
        from renyi.accountants import ACCOUNTANTS, make_accountant
    except ImportError:
        pytest.skip("renyi.accountants not available yet")
    if name not in ACCOUNTANTS:
        pytest.skip(f"{name} accountant not available yet")
    sigma, n, q, steps = 1.1, 100, 0.1, 7
    _, opt = _setup(sigma=sigma, n=n, q=q, accountant=name)
    x, y = _data(5)
    for _ in range(steps):
        opt.zero_grad()
        opt.accumulate(x, y)
        opt.step()
        if opt.steps_taken == 3:
            opt.epsilon(1e-5)  # an intermediate query must not change the final answer
    got = opt.epsilon(1e-5)
    standalone = make_accountant(name)
    for _ in range(steps):  # one compose per step, as the textbook does
        standalone.compose(PoissonSampledEvent(q, GaussianEvent(sigma)))
    want = standalone.epsilon(1e-5)
    assert got.epsilon == pytest.approx(want.epsilon, rel=1e-9)
    assert opt.steps_taken == steps


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("nan"), float("inf")])
def test_refuses_nonpositive_noise_multiplier(sigma: float) -> None:
    with pytest.raises(PrivacyParameterError, match="noise_multiplier"):
        _setup(sigma=sigma)


@pytest.mark.parametrize("clip", [0.0, -0.5, float("nan")])
def test_refuses_nonpositive_clipping_norm(clip: float) -> None:
    with pytest.raises(PrivacyParameterError, match="max_grad_norm"):
        _setup(clip=clip)


def test_refuses_nan_loss_with_the_real_engine() -> None:
    from renyi.dpsgd.grad_sample import NonFiniteGradientError

    model = nn.Linear(3, 2)
    sampler = PoissonSampler(10, 0.5, 1, random_source=SeededRandomSource(0))
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampler=sampler,
        accountant=None,
    )
    x, y = _data(4)
    x[1, 2] = float("inf")
    with pytest.raises(NonFiniteGradientError):
        opt.accumulate(x, y)
    assert opt._summed is None


def test_refuses_nan_loss_and_changes_nothing() -> None:
    _, opt = _setup()
    x, y = _data(4)
    x[2, 0] = float("nan")
    opt.zero_grad()
    with pytest.raises(NonFiniteLossError, match="NaN or infinite"):
        opt.accumulate(x, y)
    assert opt._summed is None
    assert opt.steps_taken == 0


def test_refuses_parameters_outside_the_model() -> None:
    model = nn.Linear(3, 2)
    stray = nn.Parameter(torch.zeros(2))
    sampler = PoissonSampler(10, 0.5, 1, random_source=SeededRandomSource(0))
    with pytest.raises(PrivacyParameterError, match="optimizer"):
        DPOptimizer(
            torch.optim.SGD([*model.parameters(), stray], lr=0.1),
            model=model,
            loss_fn=nn.functional.cross_entropy,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampler=sampler,
            accountant=None,
            engine=StandInEngine(model, nn.functional.cross_entropy, max_grad_norm=1.0),
        )


def test_refuses_engine_with_other_clipping_norm() -> None:
    model = nn.Linear(3, 2)
    sampler = PoissonSampler(10, 0.5, 1, random_source=SeededRandomSource(0))
    with pytest.raises(PrivacyParameterError, match="sensitivity"):
        DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            model=model,
            loss_fn=nn.functional.cross_entropy,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampler=sampler,
            accountant=None,
            engine=StandInEngine(model, nn.functional.cross_entropy, max_grad_norm=2.0),
        )


def test_refuses_unclipped_sums_from_a_broken_engine() -> None:
    _, opt = _setup(clip=0.1)
    big = {name: torch.full_like(p, 100.0) for name, p in opt.model.named_parameters()}
    with pytest.raises(Exception, match="did not clip"):
        opt.add_clipped_sum(big, num_examples=1)


def test_clipped_sum_checks_name_the_non_finite_parameter_and_survive_float32_overflow() -> None:
    """The one-pass check of the sums (all norms at once) falls back to the per-parameter
    one: a NaN names its parameter; float32 sums whose squares overflow (norm 3e19, finite)
    are measured in float64 and refused as unclipped, not as non-finite."""
    _, opt = _setup(clip=1.0)
    names = [n for n, _ in opt.model.named_parameters()]
    sums = {n: torch.zeros_like(p) for n, p in opt.model.named_parameters()}
    sums[names[1]][0] = float("nan")
    with pytest.raises(NonFiniteLossError, match=repr(names[1])):
        opt.add_clipped_sum(sums, num_examples=1)
    assert opt._summed is None
    huge = {n: torch.full_like(p, 3e19) for n, p in opt.model.named_parameters()}
    with pytest.raises(Exception, match="did not clip"):
        opt.add_clipped_sum(huge, num_examples=1)
    mixed = {n: torch.zeros_like(p) for n, p in opt.model.named_parameters()}
    mixed[names[0]] = mixed[names[0]].double() + 1.0  # 6 entries of 1: norm 2.45 > 2 C
    with pytest.raises(Exception, match="did not clip"):
        opt.add_clipped_sum(mixed, num_examples=2)
    opt.add_clipped_sum(mixed, num_examples=3)  # within 3 C: kept (a copy: caller's sums)
    assert opt._summed is not None and opt._summed[names[0]] is not mixed[names[0]]


def test_budget_hook_refuses_before_the_step() -> None:
    from renyi.errors import BudgetExceededError

    class OneStepBudget:
        def __init__(self) -> None:
            self.spent = 0

        def spend(self, event: Any) -> None:
            if self.spent >= 1:
                raise BudgetExceededError("budget of one step exhausted")
            self.spent += 1

    model, opt = _setup(budget=OneStepBudget())
    _empty_step(opt)
    snapshot = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BudgetExceededError):
        _empty_step(opt)
    for before, p in zip(snapshot, model.parameters(), strict=True):
        assert torch.equal(before, p)
    assert opt.steps_taken == 1


def test_closure_refused() -> None:
    _, opt = _setup()
    with pytest.raises(PrivacyParameterError, match="closure"):
        opt.step(closure=lambda: 0.0)


def test_real_budget_refuses_the_step_that_would_exceed_it() -> None:
    from renyi.accountants import RdpAccountant
    from renyi.budget import Budget
    from renyi.errors import BudgetExceededError

    budget = Budget(epsilon=1.0, delta=1e-5)
    model, opt = _setup(sigma=2.0, n=100, q=0.1, budget=budget)
    allowed = budget.max_count(opt.event)
    assert allowed >= 1
    for _ in range(allowed):
        _empty_step(opt)
    snapshot = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(BudgetExceededError):
        _empty_step(opt)
    assert all(torch.equal(a, p) for a, p in zip(snapshot, model.parameters(), strict=True))
    assert opt.steps_taken == allowed
    # what was spent is within the budget by an independent accountant of the same steps
    spent = RdpAccountant().compose(PoissonSampledEvent(0.1, GaussianEvent(2.0)), allowed)
    assert spent.epsilon(1e-5).epsilon <= 1.0


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(z)


def test_tuple_inputs_and_micro_batches_with_the_real_engine() -> None:
    # a model with two inputs; micro-batching must slice both, and equal one big batch
    def run(max_physical: int | None) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = _TwoInputs()
        sampler = PoissonSampler(100, 0.1, 1, random_source=SeededRandomSource(0))
        opt = DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0),
            model=model,
            loss_fn=nn.CrossEntropyLoss(),
            noise_multiplier=1.0,
            max_grad_norm=0.5,
            sampler=sampler,
            accountant=None,
            random_source=_NoNoise(),
            allow_predictable_noise=True,
            max_physical_batch_size=max_physical,
        )
        g = torch.Generator().manual_seed(2)
        x, z = torch.randn(7, 3, generator=g), torch.randn(7, 2, generator=g)
        y = torch.randint(0, 2, (7,), generator=g)
        opt.zero_grad()
        losses, _ = opt.accumulate((x, z), y)
        assert losses.shape == (7,)
        opt.step()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(None), run(3), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


class _NegativeZeros(_NoNoise):
    """A caller-supplied source whose normals are all ``-0.0``."""

    def normal(self, shape: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(tuple(shape), -0.0, dtype=dtype)


def test_caller_source_release_never_shows_negative_zero() -> None:
    """Issue 22 row 2 on the opt-in path: a signed-zero clipped-sum coordinate plus a
    caller-supplied source's -0.0 was released as -0.0 (a sign that can reveal the example);
    the release is canonical (+0.0) even where the source is not lattice-safe."""
    _, opt = _setup(random_source=_NegativeZeros(), allow_predictable_noise=True)
    total = sum(p.numel() for p in opt._params)
    flat = torch.full((total,), -0.0, dtype=torch.float32)  # a signed-zero clipped sum
    flat[-1] = 2.5
    released = opt.release_noisy_sum(flat)
    assert released[-1] == 2.5
    assert not bool(torch.signbit(released[:-1]).any())


def test_a_patched_draw_noise_on_an_instance_is_used() -> None:
    """Patching ``draw_noise`` on one optimizer (an instance attribute) shapes that
    optimizer's noise: the fast path that draws fresh noise itself must not ignore it."""
    _, opt = _setup(source=SeededRandomSource(0), random_source=SeededRandomSource(1))
    total = sum(p.numel() for p in opt._params)
    opt.draw_noise = lambda: torch.full((total,), 3.0, dtype=torch.float64)  # type: ignore[method-assign]
    flat = torch.zeros(total, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        released = opt.release_noisy_sum(flat)
    assert torch.equal(released, torch.full_like(flat, 3.0 * opt.noise_std()))
