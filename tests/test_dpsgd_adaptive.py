"""Adaptive clipping (Andrew et al. 2021): the noise split, its accounting, quantile tracking."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from renyi.accountants import make_accountant  # noqa: E402
from renyi.dpsgd import (  # noqa: E402
    AdaptiveClipDPOptimizer,
    PoissonSampler,
    PrivacyEngine,
    SeededRandomSource,
    adaptive_noise_multiplier,
)
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)


@pytest.mark.parametrize(("z", "sb"), [(1.0, 5.0), (0.7, 0.4), (3.0, 20.0), (1.1, 0.56)])
def test_split_is_the_closed_form_and_costs_exactly_the_accounted_gaussian(
    z: float, sb: float
) -> None:
    s = adaptive_noise_multiplier(z, sb)
    assert math.isclose(s, (z**-2 - (2 * sb) ** -2) ** -0.5, rel_tol=1e-15)
    assert s > z
    # the gradient (multiplier s, sensitivity C) and the count (noise sb, sensitivity 1/2,
    # i.e. multiplier 2 sb) composed: exactly one Gaussian of multiplier z (RDP is linear
    # in sigma^-2, so every order agrees)
    both = make_accountant("rdp").compose(GaussianEvent(s)).compose(GaussianEvent(2 * sb))
    one = make_accountant("rdp").compose(GaussianEvent(z))
    assert math.isclose(both.epsilon(1e-5).epsilon, one.epsilon(1e-5).epsilon, rel_tol=1e-9)


@pytest.mark.parametrize(("z", "sb"), [(1.0, 0.5), (2.0, 0.3)])
def test_count_noise_that_leaves_no_budget_is_refused(z: float, sb: float) -> None:
    with pytest.raises(PrivacyParameterError, match="unclipped_num_std"):
        adaptive_noise_multiplier(z, sb)


class _Identity(nn.Module):
    """out = <w, x>: the per-example gradient of loss = out is x (norm known in advance)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Linear(d, 1, bias=False, dtype=torch.float64)

    def forward(self, x: Any) -> Any:
        return self.w(x).squeeze(1)


def _adaptive(n: int, q: float, steps: int, **kwargs: Any) -> tuple[AdaptiveClipDPOptimizer, Any]:
    model = _Identity(4)
    source = SeededRandomSource(1)
    opt = AdaptiveClipDPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),  # norms stay fixed: only C moves
        model=model,
        loss_fn=lambda out, y: out,
        noise_multiplier=kwargs.pop("noise_multiplier", 1.0),
        max_grad_norm=kwargs.pop("max_grad_norm", 0.1),
        sampler=PoissonSampler(n, q, steps, random_source=source),
        accountant="rdp",
        random_source=source,
        target_unclipped_quantile=kwargs.pop("quantile", 0.5),
        clipbound_learning_rate=0.2,
        max_clipbound=100.0,
        min_clipbound=1e-3,
        unclipped_num_std=kwargs.pop("unclipped_num_std", 2.0),
    )
    return opt, model


@pytest.mark.parametrize("quantile", [0.3, 0.5, 0.8])
def test_clip_bound_tracks_the_target_quantile_of_the_norms(quantile: float) -> None:
    n = 2000
    g = torch.Generator().manual_seed(0)
    radii = torch.rand(n, generator=g, dtype=torch.float64) * 2.0  # norms uniform on [0, 2]
    dirs = torch.randn(n, 4, generator=g, dtype=torch.float64)
    x = dirs / dirs.norm(dim=1, keepdim=True) * radii.unsqueeze(1)
    opt, _ = _adaptive(n, 0.25, 150, quantile=quantile)
    for idx in opt.sampler:
        opt.zero_grad()
        opt.accumulate(x[idx], torch.zeros(len(idx)))
        opt.step()
    truth = float(torch.quantile(radii, quantile))
    assert abs(opt.max_grad_norm - truth) < 0.12 * truth + 0.02
    assert len(opt.unclipped_fraction_history) == 150
    # the accountant charged z (not sigma_delta) per step
    assert opt.event == PoissonSampledEvent(0.25, GaussianEvent(1.0))


def test_gradient_noise_uses_sigma_delta_times_the_current_bound() -> None:
    opt, _ = _adaptive(100, 0.1, 5, noise_multiplier=1.0, unclipped_num_std=1.0)
    assert math.isclose(opt.noise_std(), adaptive_noise_multiplier(1.0, 1.0) * 0.1)


def test_checkpoint_keeps_the_current_bound() -> None:
    x = torch.randn(50, 4, dtype=torch.float64)
    opt, _ = _adaptive(50, 0.5, 10)
    for idx in opt.sampler:
        opt.zero_grad()
        opt.accumulate(x[idx], torch.zeros(len(idx)))
        opt.step()
    state = opt.state_dict()
    other, _ = _adaptive(50, 0.5, 10)
    other.load_state_dict(state)
    assert other.max_grad_norm == opt.max_grad_norm != 0.1
    assert other.engine.sensitivity == opt.max_grad_norm  # type: ignore[attr-defined]


def test_privacy_engine_adaptive_clipping_through_backward() -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(200, 5, generator=g), torch.randint(0, 2, (200,), generator=g))
    model = nn.Linear(5, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=50),
        noise_multiplier=1.0,
        max_grad_norm=10.0,
        clipping="adaptive",
        target_unclipped_quantile=0.5,
        clipbound_learning_rate=0.5,
        max_clipbound=10.0,
        min_clipbound=0.01,
        unclipped_num_std=2.0,
        seed=0,
    )
    assert isinstance(optimizer, AdaptiveClipDPOptimizer)
    for _ in range(5):
        for x, y in loader:
            optimizer.zero_grad()
            nn.CrossEntropyLoss()(model(x), y).backward()
            optimizer.step()
    assert optimizer.max_grad_norm < 10.0  # every norm was below C = 10: C came down
    assert engine.get_epsilon(1e-5) > 0
