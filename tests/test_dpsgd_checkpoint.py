"""DPOptimizer is a torch.optim.Optimizer (LR schedulers, GradScaler, zero_grad, hooks) and
checkpoints resume a private run exactly (PrivacyEngine.save_checkpoint / load_checkpoint,
DPOptimizer.state_dict): the same ε and, with seeded sources, the same parameters."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from renyi.dpsgd import PrivacyEngine, make_private  # noqa: E402
from renyi.dpsgd.grad_sample import NonFiniteGradientError  # noqa: E402
from renyi.dpsgd.optimizer import DPOptimizer  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)


def _data(n: int = 100) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(torch.randn(n, 5, generator=g) + y.unsqueeze(1), y)


def _engine_run(
    optimizer_cls: Any = torch.optim.SGD, seed: int | None = 0, **opt_kwargs: Any
) -> tuple[PrivacyEngine, nn.Module, DPOptimizer, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    engine = PrivacyEngine(accountant="rdp")
    opt_kwargs.setdefault("lr", 0.2)
    module, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=optimizer_cls(model.parameters(), **opt_kwargs),
        data_loader=DataLoader(_data(), batch_size=10),
        epochs=3,
        target_epsilon=3.0,
        target_delta=1e-5,
        max_grad_norm=1.0,
        seed=seed,
    )
    return engine, module, optimizer, loader


def _train(
    module: nn.Module,
    optimizer: Any,
    loader: Any,
    epochs: range,
    *,
    after_step: Callable[[], None] | None = None,
    stop_after: int | None = None,
) -> None:
    taken = 0
    for _ in epochs:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(x), y).backward()
            optimizer.step()
            if after_step is not None:
                after_step()
            taken += 1
            if stop_after is not None and taken == stop_after:
                return


def _params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


# ------------------------------------------------------------------ torch.optim.Optimizer
def _linear_warmup(opt: Any) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.get_linear_schedule_with_warmup(opt, 3, 20)


SCHEDULERS: dict[str, Callable[[Any], Any]] = {
    "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5),
    "LambdaLR": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + t)),
    "get_linear_schedule_with_warmup": _linear_warmup,
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_lr_schedulers_drive_the_private_steps(name: str) -> None:
    _, module, optimizer, loader = _engine_run()
    assert isinstance(optimizer, torch.optim.Optimizer)
    scheduler = SCHEDULERS[name](optimizer)
    # the scheduler's rates, read off an ordinary optimizer driven by the same schedule
    probe = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.2)
    probe_scheduler = SCHEDULERS[name](probe)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. "lr_scheduler.step() before ..."
        for x, y in (batch for _ in range(3) for batch in loader):
            lr = optimizer.param_groups[0]["lr"]
            assert lr == probe.param_groups[0]["lr"]
            assert optimizer.original_optimizer.param_groups[0]["lr"] == lr
            before = _params(module)
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(x), y).backward()
            optimizer.step()
            for p0, p in zip(before, module.parameters(), strict=True):
                assert p.grad is not None  # the released (noisy, scaled) gradient
                torch.testing.assert_close(p0 - p.detach(), lr * p.grad, rtol=1e-5, atol=1e-7)
            scheduler.step()
            probe.step()
            probe_scheduler.step()
    assert optimizer.steps_taken == 30


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_set_to_none(set_to_none: bool) -> None:
    _, module, optimizer, loader = _engine_run()
    _train(module, optimizer, loader, range(1), stop_after=1)
    optimizer.zero_grad(set_to_none=set_to_none)
    for p in module.parameters():
        if set_to_none:
            assert p.grad is None
        else:
            assert p.grad is not None and not p.grad.any()


def test_step_hooks_run_and_new_parameter_groups_are_refused() -> None:
    _, module, optimizer, loader = _engine_run()
    calls: list[str] = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append("pre"))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    _train(module, optimizer, loader, range(1), stop_after=2)
    assert calls == ["pre", "post", "pre", "post"]
    with pytest.raises(PrivacyParameterError, match="add_param_group"):
        optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})


def test_grad_scaler_gives_the_unscaled_update_bit_for_bit() -> None:
    _, plain_module, plain_opt, plain_loader = _engine_run()
    _train(plain_module, plain_opt, plain_loader, range(1), stop_after=6)
    _, module, optimizer, loader = _engine_run()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    for _, (x, y) in zip(range(6), loader, strict=False):
        optimizer.zero_grad()
        scaler.scale(nn.functional.cross_entropy(module(x), y)).backward()
        scaler.step(optimizer)
        scaler.update()
    assert scaler.get_scale() == 2.0**15  # grew 3 times, never backed off
    for a, b in zip(plain_module.parameters(), module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_grad_scaler_overflow_is_refused_not_skipped() -> None:
    _, module, optimizer, loader = _engine_run()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    x, y = next(iter(loader))
    before = _params(module)
    optimizer.zero_grad()
    scaler.scale(nn.functional.cross_entropy(module(x), y) * 1e10).backward()
    # the captured per-example norms (or the scaler's check) are not finite: refused
    with pytest.raises(NonFiniteGradientError):
        scaler.step(optimizer)
    assert optimizer.steps_taken == 0
    assert all(torch.equal(a, p) for a, p in zip(before, module.parameters(), strict=True))


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("stop_after", [10, 14])  # at an epoch boundary, and mid-epoch
def test_engine_checkpoint_resume_equals_the_uninterrupted_run(
    tmp_path: Path, stop_after: int
) -> None:
    """Epoch boundary and mid-epoch (Poisson allows both): the resumed run takes the same
    batches, noise, learning rates and Adam moments as the uninterrupted one."""

    def schedule(opt: Any) -> Any:
        return torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)

    engine, module, optimizer, loader = _engine_run(torch.optim.Adam, lr=0.05)
    scheduler = schedule(optimizer)
    _train(module, optimizer, loader, range(3), after_step=scheduler.step)
    assert optimizer.steps_taken == 30
    expected_eps, expected = engine.get_epsilon(1e-5), _params(module)

    engine, module, optimizer, loader = _engine_run(torch.optim.Adam, lr=0.05)
    scheduler = schedule(optimizer)
    _train(module, optimizer, loader, range(3), after_step=scheduler.step, stop_after=stop_after)
    path = tmp_path / "checkpoint.pt"
    engine.save_checkpoint(
        path=path,
        module=module,
        optimizer=optimizer,
        checkpoint_dict={"scheduler": scheduler.state_dict(), "epoch": stop_after // 10},
    )
    del engine, module, optimizer, loader

    engine, module, optimizer, loader = _engine_run(torch.optim.Adam, lr=0.05)
    scheduler = schedule(optimizer)
    checkpoint = engine.load_checkpoint(path=path, module=module, optimizer=optimizer)
    scheduler.load_state_dict(checkpoint["scheduler"])
    assert optimizer.steps_taken == stop_after
    assert len(loader) == 10 - stop_after % 10  # the rest of the checkpoint's epoch
    _train(module, optimizer, loader, range(checkpoint["epoch"], 3), after_step=scheduler.step)
    assert optimizer.steps_taken == 30
    assert engine.get_epsilon(1e-5) == expected_eps
    for a, b in zip(expected, module.parameters(), strict=True):
        assert torch.equal(a, b)
    from renyi.accountants import make_accountant

    event = PoissonSampledEvent(0.1, GaussianEvent(optimizer.noise_multiplier))
    oracle = make_accountant("rdp").compose(event, 30).epsilon(1e-5).epsilon
    assert math.isclose(expected_eps, oracle, rel_tol=1e-12)


def test_secure_noise_checkpoint_holds_no_key_and_resumes_the_accounting(tmp_path: Path) -> None:
    engine, module, optimizer, loader = _engine_run(seed=None)
    _train(module, optimizer, loader, range(1), stop_after=5)
    state = optimizer.state_dict()
    assert state["random_source"] == {"kind": "secure"}
    assert state["sampler"]["random_source"] == {"kind": "secure"}
    eps = engine.get_epsilon(1e-5)
    path = tmp_path / "secure.pt"
    engine.save_checkpoint(path=path, module=module, optimizer=optimizer)
    engine, module, optimizer, loader = _engine_run(seed=None)
    engine.load_checkpoint(path=path, module=module, optimizer=optimizer)  # weights_only
    assert engine.get_epsilon(1e-5) == eps
    _train(module, optimizer, loader, range(1))
    assert optimizer.steps_taken == 10


def test_dp_optimizer_state_dict_round_trip_through_weights_only_torch_load() -> None:
    data = _data()
    runs = []
    for resume in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        private = make_private(
            model,
            torch.optim.Adam(model.parameters(), lr=0.05),
            data,
            loss_fn=nn.CrossEntropyLoss(),
            delta=1e-5,
            max_grad_norm=1.0,
            batch_size=10,
            noise_multiplier=1.0,
            steps=12,
            accountant="rdp",
            seed=3,
        )
        for i, (x, y) in enumerate(b for _ in range(2) for b in private.data_loader):
            private.optimizer.zero_grad()
            private.optimizer.accumulate(x, y)
            private.optimizer.step()
            if resume and i == 4:
                buffer = io.BytesIO()
                torch.save(private.optimizer.state_dict(), buffer)
                buffer.seek(0)
                state = torch.load(buffer, weights_only=True)
                break
        if resume:
            torch.manual_seed(0)
            model2 = nn.Linear(5, 3)
            model2.load_state_dict(model.state_dict())
            private = make_private(
                model2,
                torch.optim.Adam(model2.parameters(), lr=0.05),
                data,
                loss_fn=nn.CrossEntropyLoss(),
                delta=1e-5,
                max_grad_norm=1.0,
                batch_size=10,
                noise_multiplier=1.0,
                steps=12,
                accountant="rdp",
                seed=3,
            )
            private.optimizer.load_state_dict(state)  # also moves the loader on
            for x, y in (b for _ in range(2) for b in private.data_loader):
                private.optimizer.zero_grad()
                private.optimizer.accumulate(x, y)
                private.optimizer.step()
        assert private.optimizer.steps_taken == 12
        runs.append((private.epsilon().epsilon, _params(private.model)))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_checkpoint_refusals(tmp_path: Path) -> None:
    engine, module, optimizer, loader = _engine_run()
    _train(module, optimizer, loader, range(1), stop_after=3)
    path = tmp_path / "c.pt"
    with pytest.raises(PrivacyParameterError, match="noise_scheduler"):
        engine.save_checkpoint(path=path, module=module, noise_scheduler=object())
    engine.save_checkpoint(path=path, module=module, optimizer=optimizer)
    # another mechanism (a different target, so a different sigma): refused before anything
    other_engine = PrivacyEngine(accountant="rdp")
    torch.manual_seed(0)
    other_model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    before = _params(other_model)
    m2, o2, _ = other_engine.make_private_with_epsilon(
        module=other_model,
        optimizer=torch.optim.SGD(other_model.parameters(), lr=0.2),
        data_loader=DataLoader(_data(), batch_size=10),
        epochs=3,
        target_epsilon=5.0,
        target_delta=1e-5,
        max_grad_norm=1.0,
        seed=0,
    )
    with pytest.raises(PrivacyParameterError, match="noise_multiplier"):
        other_engine.load_checkpoint(path=path, module=m2, optimizer=o2)
    assert o2.steps_taken == 0 and other_engine.get_epsilon(1e-5) == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, other_model.parameters(), strict=True))
    # an optimizer checkpoint loaded without the optimizer (its sampler would restart)
    fresh_engine, fresh_module, _, _ = _engine_run()
    with pytest.raises(PrivacyParameterError, match="optimizer"):
        fresh_engine.load_checkpoint(path=path, module=fresh_module)
    # in the middle of a logical batch there is nothing consistent to save
    x, y = next(iter(loader))
    optimizer.zero_grad()
    optimizer.accumulate(x, y)
    with pytest.raises(PrivacyParameterError, match="middle of a logical batch"):
        optimizer.state_dict()
