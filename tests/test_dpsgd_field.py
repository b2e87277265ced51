"""DP-SGD as the field uses it (issue 13's misuse table): each habit ends in our error or in
correct behaviour, never in a silent wrong result.

| habit | expected here |
|---|---|
| Opacus loop ``for epoch in range(E): for batch in loader`` (E larger than planned) | the
  loader ends after the planned steps (warning), ε ≤ target |
| a step past the plan | ``PlanExceededError`` naming the steps; opt-out explicit |
| ``loss.backward(); optimizer.step()`` without a capture | ``UnclippedGradientError``, no update |
| ``step()`` with nothing accumulated | ``UnclippedGradientError``, no update |
| ``make_private(model, opt, data_loader, ...)`` | n = len(dataset), q = b / n, collate kept |
| own ``DataLoader(batch_sampler=PoissonSampler(...))`` | our error before the first batch;
  with ``EmptyBatchCollate`` empty batches work |
| optimizer over ``model.parameters()`` with frozen layers | frozen layers skipped, unchanged |
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from renyi.accountants import make_accountant  # noqa: E402
from renyi.dpsgd import (  # noqa: E402
    EmptyBatchCollate,
    PlanCompleteWarning,
    PlanExceededError,
    PoissonSampler,
    SeededRandomSource,
    UnclippedGradientError,
)
from renyi.dpsgd.privacy import make_private  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet_insecure() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)


def _blobs(n: int = 200, d: int = 6, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, d, generator=g) + (2.0 * y - 1.0).unsqueeze(1)
    return TensorDataset(x, y)


def _params(model: nn.Module) -> list[Any]:
    return [p.detach().clone() for p in model.parameters()]


def _unchanged(model: nn.Module, snapshot: list[Any]) -> bool:
    return all(torch.equal(a, p) for a, p in zip(snapshot, model.parameters(), strict=True))


def test_opacus_epoch_loop_stops_at_the_planned_steps_and_target() -> None:
    data = _blobs()
    model = nn.Linear(6, 2)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        data,
        loss_fn=nn.CrossEntropyLoss(),
        target_epsilon=2.0,
        delta=1e-5,
        epochs=3,
        batch_size=40,
        max_grad_norm=1.0,
        accountant="rdp",
        seed=0,
    )
    opt = private.optimizer
    assert private.steps == 15
    per_epoch = []
    with pytest.warns(PlanCompleteWarning, match="15 planned batches"):
        for _epoch in range(6):  # twice the epochs make_private was told
            count = 0
            for x, y in private.data_loader:
                opt.zero_grad()
                opt.accumulate(x, y)
                opt.step()
                count += 1
            per_epoch.append(count)
    assert per_epoch == [5, 5, 5, 0, 0, 0]
    assert opt.steps_taken == 15
    eps = private.epsilon().epsilon
    assert eps <= 2.0
    # the oracle: a fresh accountant of 15 steps of the same event
    event = PoissonSampledEvent(40 / 200, GaussianEvent(private.noise_multiplier))
    assert math.isclose(eps, make_accountant("rdp").compose(event, 15).epsilon(1e-5).epsilon)


def _planned(**kwargs: Any) -> Any:
    data = _blobs()
    model = nn.Linear(6, 2)
    return make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        data,
        loss_fn=nn.CrossEntropyLoss(),
        target_epsilon=2.0,
        delta=1e-5,
        steps=3,
        batch_size=40,
        max_grad_norm=1.0,
        accountant="rdp",
        seed=0,
        **kwargs,
    )


def test_step_past_the_plan_is_refused_before_any_update() -> None:
    private = _planned()
    opt = private.optimizer
    opt.unlink_data_loaders()  # batches chosen here, not drawn from the private loader
    x, y = private.data_loader.dataset.tensors
    for _ in range(3):
        opt.zero_grad()
        opt.accumulate(x[:10], y[:10])
        opt.step()
    snapshot = _params(private.model)
    opt.zero_grad()
    opt.accumulate(x[:10], y[:10])
    with pytest.raises(PlanExceededError, match=r"step 4 refused: 3 steps taken of the 3 planned"):
        opt.step()
    assert _unchanged(private.model, snapshot)
    assert opt.steps_taken == 3
    assert private.epsilon().epsilon <= 2.0


def test_explicit_opt_out_lets_the_plan_be_exceeded_and_reports_the_cost() -> None:
    private = _planned(allow_exceeding_target=True)
    opt = private.optimizer
    opt.unlink_data_loaders()  # batches chosen here, not drawn from the private loader
    x, y = private.data_loader.dataset.tensors
    for _ in range(8):
        opt.zero_grad()
        opt.accumulate(x[:10], y[:10])
        opt.step()
    assert opt.steps_taken == 8
    assert private.epsilon().epsilon > 2.0  # 8 steps of a 3-step calibration


def test_plain_backward_without_capture_is_refused_not_noised() -> None:
    private = _planned()
    opt = private.optimizer
    x, y = private.data_loader.dataset.tensors
    snapshot = _params(private.model)
    opt.zero_grad()
    nn.functional.cross_entropy(private.model(x[:10]), y[:10]).backward()
    with pytest.raises(UnclippedGradientError, match=r"plain loss\.backward"):
        opt.step()
    assert _unchanged(private.model, snapshot)
    assert opt.steps_taken == 0


def test_step_with_nothing_accumulated_is_refused() -> None:
    private = _planned()
    opt = private.optimizer
    snapshot = _params(private.model)
    opt.zero_grad()
    with pytest.raises(UnclippedGradientError, match="nothing was accumulated"):
        opt.step()
    assert _unchanged(private.model, snapshot) and opt.steps_taken == 0


class _Pairs(Dataset[tuple[Any, int]]):
    """A map-style dataset of (feature list, label): needs a custom collate_fn."""

    def __init__(self, n: int) -> None:
        self.data = _blobs(n)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        x, y = self.data[i]
        return x.tolist(), int(y)


class _MarkingCollate:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: list[tuple[Any, int]]) -> tuple[Any, Any]:
        self.calls += 1
        xs = torch.tensor([x for x, _ in batch], dtype=torch.float32)
        ys = torch.tensor([y for _, y in batch], dtype=torch.long)
        return xs, ys


def test_make_private_accepts_a_dataloader_and_keeps_its_collate() -> None:
    dataset = _Pairs(50)
    collate = _MarkingCollate()
    loader = DataLoader(dataset, batch_size=5, shuffle=True, collate_fn=collate, pin_memory=False)
    model = nn.Linear(6, 2)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        loader,
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=1.0,
        delta=1e-5,
        epochs=2,
        max_grad_norm=1.0,
        seed=0,
    )
    assert private.sample_rate == pytest.approx(5 / 50)  # n from the dataset, b from the loader
    assert private.steps == 20
    assert isinstance(private.data_loader.batch_sampler.sampler, PoissonSampler)
    sizes = []
    for _ in range(2):
        for x, y in private.data_loader:
            assert x.dtype == torch.float32 and x.shape[1:] == (6,)
            sizes.append(len(y))
            private.optimizer.zero_grad()
            private.optimizer.accumulate(x, y)
            private.optimizer.step()
    assert len(sizes) == 20 and collate.calls >= 20
    assert private.optimizer.steps_taken == 20


def test_empty_batches_keep_the_custom_collate_structure() -> None:
    dataset = _Pairs(10)
    x, y = EmptyBatchCollate(dataset, _MarkingCollate())([])
    assert x.shape == (0, 6) and y.shape == (0,) and y.dtype == torch.long


def test_own_dataloader_with_default_collate_is_refused_before_the_first_batch() -> None:
    data = _blobs(20)
    sampler = PoissonSampler(20, 0.05, 50, random_source=SeededRandomSource(0))
    with pytest.raises(PrivacyParameterError, match="empty batches"):
        iter(DataLoader(data, batch_sampler=sampler))
    # the fix named in the error works, empty batches included
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=EmptyBatchCollate(data))
    sizes = [len(yb) for _, yb in loader]
    assert len(sizes) == 50 and 0 in sizes  # P(no empty batch) = (1 - 0.95^20)^50 < 1e-9


class _FineTune(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 2)
        for p in self.body.parameters():
            p.requires_grad_(False)

    def forward(self, x: Any) -> Any:
        return self.head(torch.tanh(self.body(x)))


def test_frozen_parameters_in_the_optimizer_are_skipped() -> None:
    data = _blobs()
    model = _FineTune()
    private = make_private(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5),  # frozen ones too
        data,
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=1.0,
        delta=1e-5,
        steps=3,
        batch_size=40,
        max_grad_norm=1.0,
        seed=0,
    )
    body = _params(model.body)
    head = _params(model.head)
    for x, y in private.data_loader:
        private.optimizer.zero_grad()
        private.optimizer.accumulate(x, y)
        private.optimizer.step()
    assert _unchanged(model.body, body)
    assert not _unchanged(model.head, head)
    # unfreezing after set-up: refused at the next step (it would be updated without noise)
    model.body.weight.requires_grad_(True)
    x, y = data.tensors
    private.optimizer.zero_grad()
    private.optimizer.accumulate(x[:4], y[:4])
    with pytest.raises(PrivacyParameterError, match="unfrozen after set-up"):
        private.optimizer.step()


def test_skipping_an_empty_batch_or_stepping_twice_is_refused() -> None:
    data = _blobs(20)
    model = nn.Linear(6, 2)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        data,
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=1.0,
        delta=1e-5,
        steps=60,
        batch_size=1,  # q = 1/20: empty batches are common
        max_grad_norm=1.0,
        seed=0,
    )
    opt = private.optimizer
    with pytest.raises(PrivacyParameterError, match=r"exactly one optimizer\.step"):
        for _ in range(3):
            for x, y in private.data_loader:
                if len(y) == 0:
                    continue  # the habit: skip empty batches
                opt.zero_grad()
                opt.accumulate(x, y)
                opt.step()
    # stepping twice on one batch: the second step is refused before it is released
    private = _planned()
    x, y = next(iter(private.data_loader))
    private.optimizer.zero_grad()
    private.optimizer.accumulate(x, y)
    private.optimizer.step()
    private.optimizer.zero_grad()
    private.optimizer.accumulate(x, y)
    with pytest.raises(PrivacyParameterError, match="step 2 with 0 new batches drawn"):
        private.optimizer.step()
    assert private.optimizer.steps_taken == 1
