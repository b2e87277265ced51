"""Training with the per-epoch samplers (balls-in-bins, shuffling), accounted per epoch.

The optimizer asks the sampler which event is due at each step: for
:class:`BallsInBinsSampler` one ``RandomAllocationEvent`` and for :class:`ShuffleSampler` one
``ShuffledEvent`` at the first step of every epoch, before any of that epoch's noise is
released. These tests train tiny models and check the accounting against
:func:`renyi.analysis.events.training_event` (the single source of both events), the budget
gate, the sampler's one-use-per-epoch property, checkpoints and the plan.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from renyi.accountants import make_accountant  # noqa: E402
from renyi.analysis.events import (  # noqa: E402
    RandomAllocationEvent,
    SelfComposedEvent,
    ShuffledEvent,
    training_event,
)
from renyi.dpsgd.optimizer import DPOptimizer, PlanExceededError  # noqa: E402
from renyi.dpsgd.privacy import make_private, private_data_loader  # noqa: E402
from renyi.dpsgd.sampler import (  # noqa: E402
    BallsInBinsSampler,
    SeededRandomSource,
    ShuffleSampler,
)
from renyi.errors import (  # noqa: E402
    BudgetExceededError,
    InsecureRandomnessWarning,
    PrivacyParameterError,
)

pytestmark = pytest.mark.torch

N, B, SIGMA, DELTA = 60, 10, 1.3, 1e-5


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        yield


class RecordingDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A tiny classification set that records every index it serves."""

    def __init__(self, n: int = N) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.served: list[int] = []

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.served.append(int(i))
        return self.x[i], self.y[i]


def _source(seed: int = 0) -> SeededRandomSource:
    return SeededRandomSource(seed)


def _optimizer(
    sampler: Any, *, accountant: Any = "rdp", budget: Any = None, **kw: Any
) -> tuple[nn.Module, DPOptimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        model=model,
        loss_fn=nn.CrossEntropyLoss(),
        noise_multiplier=SIGMA,
        max_grad_norm=1.0,
        sampler=sampler,
        accountant=accountant,
        budget=budget,
        **kw,
    )
    return model, opt


def _train(opt: DPOptimizer, loader: Any, steps: int) -> None:
    done = 0
    while done < steps:
        for x, y in loader:
            opt.zero_grad()
            opt.accumulate(x, y)
            opt.step()
            done += 1
            if done == steps:
                return


def _epsilon(event: Any, accountant: str = "rdp") -> float:
    return float(make_accountant(accountant).compose(event).epsilon(DELTA).epsilon)


def _charged(opt: DPOptimizer) -> Counter[Any]:
    opt._flush()
    total: Counter[Any] = Counter()
    for event, count in opt.accountant.history:
        total[event] += count
    return total


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_balls_in_bins_training_is_charged_one_allocation_per_epoch(accountant: str) -> None:
    data = RecordingDataset()
    epochs = 3
    sampler = BallsInBinsSampler(N, B, steps=epochs * (N // B), random_source=_source(1))
    t = sampler.steps_per_epoch
    assert t == N // B == 6
    _, opt = _optimizer(sampler, accountant=accountant)
    loader = private_data_loader(data, sampler)
    assert isinstance(opt.event, RandomAllocationEvent)
    for k in range(epochs * t):  # the due events: the epoch's, at its first step only
        due = opt.event_at(k)
        assert (due == opt.event) if k % t == 0 else due is None
    seen_epsilons = []
    for epoch in range(epochs):
        data.served.clear()
        for x, y in loader:  # one pass of the private loader = one epoch of t batches
            opt.zero_grad()
            opt.accumulate(x, y)
            opt.step()
            if opt.steps_taken % t == 1:  # charged in full at the epoch's first step
                expected = training_event(
                    "random-allocation", SIGMA, dataset_size=N, batch_size=B, steps=epoch * t + 1
                )
                assert expected == SelfComposedEvent(opt.event, epoch + 1)
                eps = float(opt.epsilon(DELTA).epsilon)
                assert eps == pytest.approx(_epsilon(expected, accountant), rel=1e-12)
                seen_epsilons.append(eps)
        # every example used exactly once in the epoch (counted where the data is read)
        assert sorted(data.served) == list(range(N))
    assert opt.steps_taken == epochs * t
    whole = training_event(
        "random-allocation", SIGMA, dataset_size=N, batch_size=B, steps=opt.steps_taken
    )
    assert isinstance(whole, SelfComposedEvent)
    assert _charged(opt) == Counter({whole.event: whole.count})
    assert float(opt.epsilon(DELTA).epsilon) == pytest.approx(
        _epsilon(whole, accountant), rel=1e-12
    )
    assert seen_epsilons[0] < seen_epsilons[1] < seen_epsilons[2]
    assert seen_epsilons[-1] == pytest.approx(_epsilon(whole, accountant), rel=1e-12)


def test_a_partial_epoch_costs_a_full_one() -> None:
    sampler = BallsInBinsSampler(N, B, steps=8, random_source=_source(2))
    _, opt = _optimizer(sampler)
    _train(opt, private_data_loader(RecordingDataset(), sampler), 8)  # 1 epoch + 2 steps
    two = training_event("random-allocation", SIGMA, dataset_size=N, batch_size=B, steps=12)
    assert _charged(opt) == Counter({opt.event: 2})
    assert float(opt.epsilon(DELTA).epsilon) == pytest.approx(_epsilon(two), rel=1e-12)
    assert sampler.charges(8) == 2 and sampler.charges(6) == 1 and sampler.charges(0) == 0


def test_budget_refuses_the_epoch_that_would_exceed_it_before_any_release() -> None:
    from renyi.budget import Budget

    sampler = BallsInBinsSampler(N, B, steps=5 * (N // B), random_source=_source(3))
    epoch = sampler.charged_event(SIGMA)
    budget = Budget(epsilon=6.0, delta=DELTA)
    allowed = budget.max_count(epoch)
    assert 2 <= allowed < 5
    model, opt = _optimizer(sampler, budget=budget)
    t = sampler.steps_per_epoch
    _train(opt, private_data_loader(RecordingDataset(), sampler), allowed * t)
    spent_before = budget.spent_epsilon()
    entries = len(budget.entries())
    assert entries == allowed  # one budget entry per epoch, none within an epoch
    eps_before = float(opt.epsilon(DELTA).epsilon)
    snapshot = [p.detach().clone() for p in model.parameters()]
    x, y = RecordingDataset().x[:B], RecordingDataset().y[:B]
    opt.zero_grad()
    opt.accumulate(x, y)
    with pytest.raises(BudgetExceededError):
        opt.step()  # first step of epoch allowed + 1: refused before any noise is drawn
    assert all(torch.equal(a, p) for a, p in zip(snapshot, model.parameters(), strict=True))
    assert opt.steps_taken == allowed * t
    assert len(budget.entries()) == entries
    assert budget.spent_epsilon() == spent_before
    assert float(opt.epsilon(DELTA).epsilon) == eps_before
    assert _charged(opt) == Counter({epoch: allowed})


def test_shuffle_run_reports_the_shuffle_bound_never_the_poisson_one() -> None:
    epochs = 2
    sampler = ShuffleSampler(N, B, steps=epochs * 6, random_source=_source(4))
    _, opt = _optimizer(sampler)
    data = RecordingDataset()
    _train(opt, private_data_loader(data, sampler), epochs * 6)
    assert Counter(data.served) == Counter({i: epochs for i in range(N)})
    assert isinstance(opt.event, ShuffledEvent)
    shuffled = training_event("shuffle", SIGMA, dataset_size=N, batch_size=B, steps=12)
    poisson = training_event("poisson", SIGMA, dataset_size=N, batch_size=B, steps=12)
    eps = float(opt.epsilon(DELTA).epsilon)
    assert eps == pytest.approx(_epsilon(shuffled), rel=1e-12)
    assert eps > 3 * _epsilon(poisson)  # no amplification is proven for shuffling
    # the closed form: 2 epochs of a Gaussian with multiplier σ/2 (replace-one, sum moves 2C)
    from renyi.analysis.closed_forms import gaussian_epsilon

    mu = (2.0 / SIGMA) * epochs**0.5
    assert _epsilon(shuffled, "pld") == pytest.approx(gaussian_epsilon(mu, DELTA), rel=2e-3)


def test_checkpoint_at_an_epoch_boundary_resumes_with_the_same_epsilon(tmp_path: Any) -> None:
    def private(seed: int) -> Any:
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        data = RecordingDataset()
        return make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=0.5),
            torch.utils.data.TensorDataset(data.x, data.y),
            loss_fn=nn.CrossEntropyLoss(),
            delta=DELTA,
            max_grad_norm=1.0,
            batch_size=B,
            noise_multiplier=SIGMA,
            epochs=3,
            accountant="rdp",
            sampling="random-allocation",
            seed=seed,
        )

    straight = private(5)
    _train(straight.optimizer, straight.data_loader, straight.steps)
    first = private(5)
    _train(first.optimizer, first.data_loader, 6)  # one epoch
    path = tmp_path / "ckpt.pt"
    first.save(path)
    resumed = private(99)
    resumed.load(path)
    assert resumed.optimizer.steps_taken == 6
    _train(resumed.optimizer, resumed.data_loader, resumed.steps - 6)
    assert resumed.optimizer.steps_taken == straight.optimizer.steps_taken == 18
    eps = float(resumed.epsilon().epsilon)
    assert eps == float(straight.epsilon().epsilon)
    assert eps == pytest.approx(
        _epsilon(
            training_event("random-allocation", SIGMA, dataset_size=N, batch_size=B, steps=18)
        ),
        rel=1e-12,
    )
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)  # same seed, same batches and noise: bit-identical

    # a mid-epoch checkpoint is refused before anything is restored
    mid = private(5)
    _train(mid.optimizer, mid.data_loader, 8)
    state = mid.state_dict()
    fresh = private(7)
    before = [p.detach().clone() for p in fresh.model.parameters()]
    with pytest.raises(PrivacyParameterError, match="epoch boundary"):
        fresh.load_state_dict(state)
    assert fresh.optimizer.steps_taken == 0
    assert all(torch.equal(a, p) for a, p in zip(before, fresh.model.parameters(), strict=True))


@pytest.mark.parametrize("sampling", ["random-allocation", "shuffle"])
def test_plan_is_calibrated_on_the_epoch_event_and_refuses_step_t_plus_1(sampling: str) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    data = RecordingDataset()
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        torch.utils.data.TensorDataset(data.x, data.y),
        loss_fn=nn.CrossEntropyLoss(),
        delta=DELTA,
        max_grad_norm=1.0,
        batch_size=B,
        target_epsilon=4.0,
        epochs=2.5,
        accountant="rdp",
        sampling=sampling,
        seed=0,
    )
    t = 6
    assert private.steps == 15  # ceil(2.5 × t)
    assert "3 whole epochs" in private.steps_note
    event = training_event(
        sampling, private.noise_multiplier, dataset_size=N, batch_size=B, steps=15
    )
    assert isinstance(event, SelfComposedEvent) and event.count == 3
    calibrated = _epsilon(event)
    assert calibrated <= 4.0
    assert calibrated > 4.0 * (1 - 1e-3)  # tight: no utility thrown away
    # σ a little smaller would miss the target: the calibration is on the epoch event
    smaller = training_event(
        sampling, private.noise_multiplier * 0.99, dataset_size=N, batch_size=B, steps=15
    )
    assert _epsilon(smaller) > 4.0
    opt = private.optimizer
    _train(opt, private.data_loader, 15)
    assert opt.steps_taken == 15 and opt.steps_taken % t == 3
    assert float(private.epsilon().epsilon) == pytest.approx(calibrated, rel=1e-12)
    x, y = data.x[:B], data.y[:B]
    opt.zero_grad()
    opt.accumulate(x, y)
    with pytest.raises(PlanExceededError, match="step 16"):
        opt.step()
    assert float(private.epsilon().epsilon) == pytest.approx(calibrated, rel=1e-12)


def test_epoch_boundaries_stay_aligned_when_a_pass_ends_mid_epoch() -> None:
    """A sampler pass of ``steps`` batches that ends mid-epoch continues that epoch's
    allocation in the next pass: batch s always belongs to epoch s // t, where it is charged
    (a fresh allocation mid-epoch would be an uncharged epoch)."""
    sampler = BallsInBinsSampler(N, B, steps=9, random_source=_source(6))  # 1.5 epochs a pass
    batches = [b for _ in range(4) for b in sampler]  # 36 batches = 6 epochs
    for e in range(6):
        assert sorted(i for b in batches[6 * e : 6 * e + 6] for i in b) == list(range(N))
    state = sampler.state_dict()
    assert state["served"] == 36 and state["position"] == 0


# -- the Opacus-style engine ------------------------------------------------------------


def _indexed_loader(n: int = N, batch_size: int = B) -> Any:
    """A shuffled DataLoader whose first input column is the example's index."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    x[:, 0] = torch.arange(n, dtype=x.dtype)
    y = (x[:, 1] > 0).long()
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch_size, shuffle=True
    )


def _opacus_loop(model: Any, optimizer: Any, loader: Any, epochs: int) -> list[list[int]]:
    """The Opacus idiom: loss.backward(); optimizer.step(). Returns the indices per epoch."""
    criterion = nn.CrossEntropyLoss()
    used = []
    for _ in range(epochs):
        seen: list[int] = []
        for x, y in loader:
            seen += x[:, 0].long().tolist()
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        used.append(seen)
    return used


def test_opacus_poisson_sampling_false_trains_shuffled_and_reports_the_proven_bound() -> None:
    import re

    from renyi.dpsgd import PrivacyEngine
    from renyi.dpsgd.engine import ShuffledBatchesWarning

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    engine = PrivacyEngine(accountant="rdp")
    with pytest.warns(ShuffledBatchesWarning, match="no amplification") as record:
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=_indexed_loader(),
            noise_multiplier=SIGMA,
            max_grad_norm=1.0,
            poisson_sampling=False,
            epochs=2,
            seed=0,
        )
    used = _opacus_loop(model, optimizer, loader, 2)
    for seen in used:  # shuffled batches: every example exactly once per epoch
        assert sorted(seen) == list(range(N))
    shuffled = _epsilon(training_event("shuffle", SIGMA, dataset_size=N, batch_size=B, steps=12))
    poisson = _epsilon(training_event("poisson", SIGMA, dataset_size=N, batch_size=B, steps=12))
    reported = engine.get_epsilon(DELTA)
    assert reported == pytest.approx(shuffled, rel=1e-12)
    assert reported > 3 * poisson  # never the Poisson value
    # the warning names both numbers (at the default delta 1e-5 over the planned epochs)
    text = next(str(w.message) for w in record if w.category is ShuffledBatchesWarning)
    claimed = re.search(r"would claim epsilon=([0-9.e+-]+)", text)
    proven = re.search(r"cost epsilon=([0-9.e+-]+)", text)
    assert claimed is not None and proven is not None
    assert float(claimed.group(1)) == pytest.approx(poisson, rel=1e-3)
    assert float(proven.group(1)) == pytest.approx(shuffled, rel=1e-3)
    assert "sampling='random-allocation'" in text and "poisson_sampling=True" in text


@pytest.mark.parametrize("kw", [{"poisson_sampling": False}, {"sampling": "random-allocation"}])
def test_opacus_make_private_with_epsilon_calibrates_on_the_epoch_event(kw: dict[str, Any]) -> None:
    from renyi.dpsgd import PrivacyEngine
    from renyi.dpsgd.engine import ShuffledBatchesWarning

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShuffledBatchesWarning)
        model, optimizer, loader = engine.make_private_with_epsilon(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=_indexed_loader(),
            target_epsilon=5.0,
            target_delta=DELTA,
            epochs=2,
            max_grad_norm=1.0,
            seed=0,
            **kw,
        )
    sampling = "shuffle" if kw.get("poisson_sampling") is False else "random-allocation"
    sigma = optimizer.noise_multiplier
    assert optimizer.max_steps == 12 and len(loader) == 6
    event = training_event(sampling, sigma, dataset_size=N, batch_size=B, steps=12)
    assert 5.0 * (1 - 1e-3) < _epsilon(event) <= 5.0
    from renyi.dpsgd.privacy import PlanCompleteWarning

    with pytest.warns(PlanCompleteWarning):
        used = _opacus_loop(model, optimizer, loader, 3)  # the third pass yields nothing
    assert [sorted(u) for u in used[:2]] == [list(range(N))] * 2 and used[2] == []
    assert engine.get_epsilon(DELTA) == pytest.approx(_epsilon(event), rel=1e-12)
    if sampling == "random-allocation":  # amplified: far below the shuffle bound at this σ
        shuffled = training_event("shuffle", sigma, dataset_size=N, batch_size=B, steps=12)
        assert _epsilon(shuffled) > 2 * engine.get_epsilon(DELTA)


# -- renyi train --------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", ["random-allocation", "shuffle"])
def test_cli_train_names_the_sampling_and_reports_its_event_epsilon(
    sampling: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from renyi.cli.main import main

    argv = ["train", "--json", "--seed", "1", "--no-baseline", "--limit", "300"]
    argv += ["--epochs", "1.5", "--batch-size", "50", "--accountant", "rdp"]
    assert main([*argv, "--sampling", sampling]) == 0
    summary = json.loads(capsys.readouterr().out)
    n, sigma = summary["n_train"], summary["noise_multiplier"]
    t = n // 50 if sampling == "random-allocation" else -(-n // 50)
    assert summary["sampling"] == sampling
    assert summary["accounted_per"] == "epoch" and summary["charges"] == 2
    assert summary["steps"] == -(-3 * t // 2)
    event = training_event(sampling, sigma, dataset_size=n, batch_size=50, steps=summary["steps"])
    assert summary["event"] == event.event.kind  # type: ignore[attr-defined]
    assert summary["epsilon"] == pytest.approx(_epsilon(event), rel=1e-9)
    assert summary["epsilon"] <= 3.0
    poisson = training_event(
        "poisson", sigma, dataset_size=n, batch_size=50, steps=summary["steps"]
    )
    if sampling == "shuffle":
        assert summary["epsilon"] > 2 * _epsilon(poisson)
        assert summary["neighbouring"] == "replace_one"
    else:
        assert summary["neighbouring"] == "add_remove"


def test_trainer_evaluates_at_epoch_boundaries_with_the_epoch_event_epsilon() -> None:
    from renyi.dpsgd.trainer import Trainer

    n, b = 71, 6  # t = 11, while ceil(1 / (n / t / n)) is 12 in floating point
    data = RecordingDataset(n)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        torch.utils.data.TensorDataset(data.x, data.y),
        loss_fn=nn.CrossEntropyLoss(),
        delta=DELTA,
        max_grad_norm=1.0,
        batch_size=b,
        noise_multiplier=SIGMA,
        epochs=2,
        accountant="rdp",
        sampling="random-allocation",
        seed=0,
    )
    history = Trainer(
        private, eval_data=torch.utils.data.TensorDataset(data.x, data.y), progress=False
    ).fit()
    assert history.steps == [11, 22]
    for epochs, eps in zip((1, 2), history.epsilons, strict=True):
        event = training_event(
            "random-allocation", SIGMA, dataset_size=n, batch_size=b, steps=11 * epochs
        )
        assert eps == pytest.approx(_epsilon(event), rel=1e-12)


def test_optimizer_refuses_a_mid_epoch_checkpoint_with_a_fresh_sampler() -> None:
    """A mid-epoch optimizer state resumed with a fresh sampler would start a new allocation
    mid-epoch and run it uncharged until the next boundary: refused before any change."""
    sampler = BallsInBinsSampler(N, B, steps=18, random_source=_source(8))
    _, opt = _optimizer(sampler)
    _train(opt, private_data_loader(RecordingDataset(), sampler), 8)
    state = opt.state_dict()
    fresh_sampler = BallsInBinsSampler(N, B, steps=18, random_source=_source(9))
    model2, opt2 = _optimizer(fresh_sampler)
    before = [p.detach().clone() for p in model2.parameters()]
    with pytest.raises(PrivacyParameterError, match="epoch boundary"):
        opt2.load_state_dict(state)
    assert opt2.steps_taken == 0 and opt2.accountant.is_empty
    assert all(torch.equal(a, p) for a, p in zip(before, model2.parameters(), strict=True))
    _train(opt, private_data_loader(RecordingDataset(), sampler), 4)  # to the boundary
    opt2.load_state_dict(opt.state_dict())  # at a boundary: accepted
    assert opt2.steps_taken == 12
    assert float(opt2.epsilon(DELTA).epsilon) == float(opt.epsilon(DELTA).epsilon)


def test_opacus_engine_fixed_size_sampling_is_charged_per_step() -> None:
    from renyi.dpsgd import PrivacyEngine

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=_indexed_loader(),
        target_epsilon=5.0,
        target_delta=DELTA,
        epochs=2,
        max_grad_norm=1.0,
        seed=0,
        sampling="fixed-size",
    )
    used = _opacus_loop(model, optimizer, loader, 2)
    assert all(len(u) == 6 * B for u in used)  # fresh subsets of exactly B, 6 per epoch
    event = training_event(
        "fixed-size", optimizer.noise_multiplier, dataset_size=N, batch_size=B, steps=12
    )
    assert engine.get_epsilon(DELTA) == pytest.approx(_epsilon(event), rel=1e-12)
    assert 5.0 * (1 - 1e-3) < engine.get_epsilon(DELTA) <= 5.0
