"""renyi.dpsgd.PrivacyEngine: Opacus's make_private API, loss.backward() captured per example."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from renyi.dpsgd import (  # noqa: E402
    ClippedGradientEngine,
    GradSampleModule,
    PlanCompleteWarning,
    PlanExceededError,
    PrivacyEngine,
    UnclippedGradientError,
)
from renyi.dpsgd.engine import _make_capture  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError, RenyiError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)


def _data(n: int = 120, d: int = 5, dtype: Any = torch.float32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, d, generator=g, dtype=dtype) + y.unsqueeze(1).to(dtype)
    return TensorDataset(x, y)


def _mlp(d: int = 5, dtype: Any = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_captured_backward_equals_the_engines_clipped_sum(reduction: str) -> None:
    model = _mlp(dtype=torch.float64)
    x, y = _data(dtype=torch.float64).tensors
    x, y = x[:17], y[:17]
    cap = _make_capture(
        model, max_grad_norm=0.3, clipping="flat", loss_reduction=reduction, mode="auto"
    )
    loss = nn.CrossEntropyLoss(reduction=reduction)(model(x), y)
    loss.backward()
    sums, n, norms = cap.pop_clipped_sum()
    want, _, want_norms = ClippedGradientEngine(
        model, nn.CrossEntropyLoss(), max_grad_norm=0.3
    ).clipped_grad_sum(x, y)
    assert n == 17
    for name in want:
        assert torch.allclose(sums[name], want[name], rtol=1e-10, atol=1e-12), name
    assert torch.allclose(norms.double(), want_norms.double(), rtol=1e-10)


def _private(**kwargs: Any) -> tuple[Any, Any, Any, PrivacyEngine]:
    data = _data()
    model = _mlp()
    engine = PrivacyEngine(accountant=kwargs.pop("accountant", "rdp"))
    make = kwargs.pop("make", "epsilon")
    common = {
        "module": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.5),
        "data_loader": DataLoader(data, batch_size=kwargs.pop("batch_size", 12), shuffle=True),
        "max_grad_norm": 1.0,
        "seed": 0,
    }
    if make == "epsilon":
        out = engine.make_private_with_epsilon(
            **common, target_epsilon=2.0, target_delta=1e-5, epochs=2, **kwargs
        )
    else:
        out = engine.make_private(**common, noise_multiplier=1.0, **kwargs)
    return (*out, engine)


def test_opacus_loop_with_backward_trains_the_planned_steps_and_stops() -> None:
    model, optimizer, loader, engine = _private()
    assert isinstance(model, GradSampleModule)
    assert len(loader) == 10 and optimizer.max_steps == 20
    criterion = nn.CrossEntropyLoss()
    with pytest.warns(PlanCompleteWarning):
        for _epoch in range(4):  # the plan said 2
            for x, y in loader:
                optimizer.zero_grad()
                criterion(model(x), y).backward()
                optimizer.step()
    assert optimizer.steps_taken == 20
    assert len(engine.accountant) == 20
    eps = engine.get_epsilon(1e-5)
    assert eps <= 2.0
    from renyi.accountants import make_accountant

    event = PoissonSampledEvent(0.1, GaussianEvent(optimizer.noise_multiplier))
    oracle = make_accountant("rdp").compose(event, 20).epsilon(1e-5).epsilon
    assert math.isclose(eps, oracle, rel_tol=1e-12)
    # one more step by hand is refused, before anything changes
    x, y = loader.dataset.tensors
    snapshot = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    criterion(model(x[:5]), y[:5]).backward()
    with pytest.raises(PlanExceededError, match="20 steps taken of the 20 planned"):
        optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(snapshot, model.parameters(), strict=True))


def test_backward_through_the_unwrapped_model_is_refused() -> None:
    data = _data()
    raw = _mlp()
    engine = PrivacyEngine(accountant="rdp")
    _model, optimizer, _loader = engine.make_private(
        module=raw,
        optimizer=torch.optim.SGD(raw.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=12),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
    )
    x, _ = data.tensors
    snapshot = [p.detach().clone() for p in raw.parameters()]
    optimizer.zero_grad()
    with torch.no_grad():
        feats = raw(x[:6])  # a forward the capture does not see as a training forward
    loss = (feats.requires_grad_() * 0).sum() + sum(p.sum() for p in raw.parameters())
    loss.backward()  # gradients on the parameters that did not pass through the module output
    with pytest.raises(UnclippedGradientError, match="no per-example gradients were captured"):
        optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(snapshot, raw.parameters(), strict=True))
    assert optimizer.steps_taken == 0


def test_empty_poisson_batch_through_backward_is_a_noise_only_step() -> None:
    model, optimizer, loader, _ = _private(make="plain")
    optimizer.unlink_data_loaders()  # a batch chosen here (empty), not drawn
    x, y = loader.dataset.tensors
    optimizer.zero_grad()
    out = model(x[:0])
    nn.CrossEntropyLoss()(out, y[:0]).backward()  # mean of nothing: nan, gradients empty
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    assert optimizer.steps_taken == 1
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_leave_one_out_sensitivity_through_backward_and_step() -> None:
    # same seed, same noise: the two updates differ by (clipped gradient of one example)/(q n)
    x, y = _data().tensors
    updates = []
    for keep in (slice(0, 9), slice(0, 8)):
        model, optimizer, _loader, _ = _private(make="plain")
        optimizer.unlink_data_loaders()  # batches chosen here, not drawn
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(x[keep] * 50.0), y[keep]).backward()  # large gradients
        optimizer.step()
        updates.append(
            torch.cat(
                [
                    (b - p.detach()).flatten()
                    for b, p in zip(before, model.parameters(), strict=True)
                ]
            )
        )
    qn = optimizer.expected_batch_size
    diff = float((updates[0] - updates[1]).double().norm()) * qn / 0.5  # lr 0.5
    # the released sums are snapped to the noise lattice g Z (renyi.noise): each coordinate of
    # the difference moves by at most g beyond the clipped gradient's, so <= C + g sqrt(d)
    from renyi.noise import lattice_step

    g = lattice_step(1.0 * 1.0)  # noise_multiplier * max_grad_norm
    assert diff <= 1.0 * (1 + 1e-5) + g * math.sqrt(updates[0].numel())
    assert diff > 0.9  # the removed example was clipped to (almost) exactly C


def test_model_called_twice_in_one_step_is_refused() -> None:
    model, optimizer, loader, _ = _private(make="plain")
    x, y = loader.dataset.tensors
    optimizer.zero_grad()
    loss = nn.CrossEntropyLoss()(model(x[:4]), y[:4]) + nn.CrossEntropyLoss()(model(x[:4]), y[:4])
    with pytest.raises(PrivacyParameterError, match="computed from 2 forward passes"):
        loss.backward()  # refused before any gradient is computed
    with pytest.raises(RenyiError):  # nothing captured: refused
        optimizer.step()
    assert optimizer.steps_taken == 0
    optimizer.zero_grad()  # two forward passes, two backward passes, one step: refused too
    nn.CrossEntropyLoss()(model(x[:4]), y[:4]).backward()
    nn.CrossEntropyLoss()(model(x[:4]), y[:4]).backward()
    with pytest.raises(PrivacyParameterError, match="2 forward passes of the module"):
        optimizer.step()
    assert optimizer.steps_taken == 0


def test_dropout_is_replayed_with_the_same_masks() -> None:
    data = _data()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=12),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
    )
    for x, y in loader:
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(x), y).backward()
        optimizer.step()
    assert optimizer.steps_taken == len(loader)


def test_frozen_layers_lora_style_through_backward() -> None:
    data = _data()
    model = _mlp()
    model[0].weight.requires_grad_(False)
    model[0].bias.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=12),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
    )
    for x, y in loader:
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(x), y).backward()
        optimizer.step()
    assert torch.equal(model._module[0].weight, frozen)


def test_ghost_mode_returns_the_criterion_as_opacus() -> None:
    out = _private(make="plain", grad_sample_mode="ghost")
    assert len(out) == 5  # module, optimizer, criterion, loader (+ the engine of the helper)
    model, optimizer, criterion, loader, _ = out
    x, y = next(iter(loader))
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
    assert optimizer.steps_taken == 1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"poisson_sampling": False, "sampling": "poisson"}, "poisson_sampling"),
        ({"sampling": "bogus"}, "sampling"),
        ({"noise_generator": torch.Generator()}, "noise_generator"),
        ({"grad_sample_mode": "magic"}, "grad_sample_mode"),
        ({"clipping": "adaptive"}, "clipping='adaptive'"),
        ({"not_an_argument": 1}, "make_private keyword"),
    ],
)
def test_refused_arguments(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(PrivacyParameterError, match=name):
        _private(make="plain", **kwargs)


def test_gdp_accountant_refused_and_prv_is_the_pld_bound() -> None:
    with pytest.raises(PrivacyParameterError, match="gdp"):
        PrivacyEngine(accountant="gdp")
    assert PrivacyEngine().accountant.mechanism() == "prv"
    assert type(PrivacyEngine().accountant.accountant).__name__.lower().startswith("pld")


def test_unplanned_make_private_keeps_opacus_epochs() -> None:
    model, optimizer, loader, engine = _private(make="plain")
    assert engine.get_epsilon(1e-5) == 0.0
    for _epoch in range(3):  # no plan: every pass is one epoch of len(loader) batches
        for x, y in loader:
            optimizer.zero_grad()
            nn.CrossEntropyLoss()(model(x), y).backward()
            optimizer.step()
    assert optimizer.steps_taken == 3 * len(loader)
    assert engine.get_epsilon(1e-5) > 0


def test_second_calibration_on_a_used_engine_is_refused() -> None:
    model, optimizer, loader, engine = _private(make="plain")
    x, y = next(iter(loader))
    optimizer.zero_grad()
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()
    other = _mlp()
    with pytest.raises(PrivacyParameterError, match="fresh PrivacyEngine"):
        engine.make_private_with_epsilon(
            module=other,
            optimizer=torch.optim.SGD(other.parameters(), lr=0.1),
            data_loader=DataLoader(_data(), batch_size=12),
            target_epsilon=1.0,
            target_delta=1e-5,
            epochs=1,
            max_grad_norm=1.0,
        )


def test_batch_memory_manager_pieces_release_the_unsplit_update() -> None:
    from renyi.dpsgd import BatchMemoryManager

    results = []
    for split in (None, 5):
        model, optimizer, loader, engine = _private(make="plain", batch_size=30)
        criterion = nn.CrossEntropyLoss()  # mean: per-example gradients whatever the piece size
        physical = []
        if split is None:
            batches: Any = loader
        else:
            batches = BatchMemoryManager(
                data_loader=loader, max_physical_batch_size=split, optimizer=optimizer
            )
        for x, y in batches:
            physical.append(len(y))
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        results.append(([p.detach().clone() for p in model.parameters()], physical))
        assert optimizer.steps_taken == len(loader) == 4
        assert len(engine.accountant) == 4
    (unsplit, sizes), (pieces, split_sizes) = results
    assert sum(sizes) == sum(split_sizes) and max(split_sizes) <= 5
    for a, b in zip(unsplit, pieces, strict=True):
        assert torch.allclose(a, b, atol=1e-5)  # same batches, same noise, same update
