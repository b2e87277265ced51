"""Correlated-noise training in PyTorch: DP-SGD equivalence, streaming in torch, resume."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import TensorDataset  # noqa: E402

from renyi.correlated.strategies import (  # noqa: E402
    BandedToeplitzStrategy,
    BltStrategy,
    TreeStrategy,
)
from renyi.correlated.streaming import streaming_noise  # noqa: E402
from renyi.dpsgd.correlated import (  # noqa: E402
    CyclicPoissonSampler,
    make_private_correlated,
)
from renyi.dpsgd.optimizer import PlanExceededError  # noqa: E402
from renyi.dpsgd.privacy import make_private  # noqa: E402
from renyi.dpsgd.sampler import PoissonSampler, SeededRandomSource  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402

warnings.filterwarnings("ignore", category=InsecureRandomnessWarning)


def _data(n: int = 240, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return TensorDataset(x, y)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _run(private, steps: int | None = None) -> None:
    opt = private.optimizer
    stop = private.steps if steps is None else steps
    while opt.steps_taken < stop:  # epochs
        for x, y in private.data_loader:
            opt.zero_grad()
            opt.accumulate(x, y)
            opt.step()
            if opt.steps_taken >= stop:  # before the loader draws (and spends) another batch
                break


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_identity_is_dpsgd_bit_for_bit():
    data = _data()
    kw = dict(
        loss_fn=torch.nn.CrossEntropyLoss(),
        delta=1e-5,
        batch_size=24,
        max_grad_norm=1.0,
        target_epsilon=2.0,
        epochs=1,
        accountant="rdp",
        seed=7,
    )
    m1, m2 = _model(), _model()
    a = make_private(m1, torch.optim.SGD(m1.parameters(), lr=0.5, momentum=0.9), data, **kw)
    b = make_private_correlated(
        m2, torch.optim.SGD(m2.parameters(), lr=0.5, momentum=0.9), data, noise="dpsgd", **kw
    )
    assert a.noise_multiplier == b.noise_multiplier and a.steps == b.steps
    assert b.optimizer.event == a.optimizer.event
    _run(a)
    _run(b)
    for p, q in zip(_params(m1), _params(m2), strict=True):
        assert torch.equal(p, q)
    assert a.epsilon().epsilon == b.epsilon().epsilon


def test_cyclic_sampler():
    src = SeededRandomSource(3)
    s = CyclicPoissonSampler(200, 4, 0.5, 12, random_source=src)
    assign = s.assignment
    for t, batch in enumerate(s):
        assert all(int(assign[i]) == t % 4 for i in batch)
    assert s.expected_batch_size == 25.0
    one = CyclicPoissonSampler(50, 1, 0.2, 5, random_source=SeededRandomSource(1))
    ref = PoissonSampler(50, 0.2, 5, random_source=SeededRandomSource(1))
    assert list(one) == list(ref)
    with pytest.raises(PrivacyParameterError, match="partitions"):
        CyclicPoissonSampler(10, 0, 0.5, 3)


@pytest.mark.parametrize(
    "strategy",
    [BandedToeplitzStrategy((1.0, 0.5, 0.2)), BltStrategy((0.9, 0.3), (0.2, 0.1)), TreeStrategy()],
    ids=["banded", "blt", "tree"],
)
def test_streaming_on_torch_tensors_equals_dense(strategy):
    t = 21
    z = torch.randn(t, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gen = streaming_noise(strategy)
    ys = torch.stack([gen.next(z[i].clone()) for i in range(t)]).numpy()
    np.testing.assert_allclose(ys, strategy.noising_matrix(t) @ z.numpy(), atol=1e-12)


@pytest.mark.parametrize("noise", ["banded", "blt", "tree"])
def test_checkpoint_resume_is_exact(noise, tmp_path):
    data = _data()
    kw = dict(
        loss_fn=torch.nn.CrossEntropyLoss(),
        delta=1e-5,
        batch_size=24,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        steps=16,
        accountant="rdp",
        seed=11,
        noise=noise,
        bands=3,
    )

    def fresh():
        m = _model()
        return make_private_correlated(
            m, torch.optim.SGD(m.parameters(), lr=0.3, momentum=0.5), data, **kw
        )

    full = fresh()
    _run(full)
    half = fresh()
    _run(half, 7)
    half.save(tmp_path / "ckpt.pt")
    resumed = fresh()
    resumed.load(tmp_path / "ckpt.pt")
    assert resumed.optimizer.steps_taken == 7
    _run(resumed)
    for p, q in zip(_params(full.model), _params(resumed.model), strict=True):
        assert torch.equal(p, q)
    assert full.epsilon().epsilon == resumed.epsilon().epsilon
    with pytest.raises(PlanExceededError, match="plan covers"):
        full.optimizer.step()


def test_noise_has_the_strategy_covariance():
    """With zero gradients the released update is the noise alone: its prefix sums have the
    variance the strategy promises (σ·sens per unit of the noising matrix)."""
    data = _data(60)
    model = torch.nn.Linear(6, 2, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    private = make_private_correlated(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        data,
        loss_fn=lambda out, y: (out * 0.0).sum(dim=1),
        delta=1e-5,
        batch_size=6,
        max_grad_norm=1.0,
        noise_multiplier=0.7,
        steps=10,
        noise="banded",
        bands=2,
        seed=5,
        accountant="rdp",
    )
    opt = private.optimizer
    updates = []
    for _ in range(10):
        before = model.weight.detach().clone()
        opt.zero_grad()
        opt.accumulate(data.tensors[0][:0], data.tensors[1][:0])
        opt.step()  # empty batch: pure noise
        updates.append((before - model.weight.detach()).reshape(-1).numpy())
    g = np.array(updates) * opt.expected_batch_size  # the noise added to the gradient sum
    plan = private.extra["plan"]
    s = private.extra["strategy"]
    # whiten with C: C·g / (σ·sens·clip) must be i.i.d. N(0, 1) rows (here: exactly the z's)
    z = s.matrix(10) @ g / (plan.noise_multiplier * plan.sensitivity.value)
    assert abs(float(z.std()) - 1.0) < 0.25
    assert np.abs(np.corrcoef(z[:-1].ravel(), z[1:].ravel())[0, 1]) < 0.4


def test_budget_gate_at_round_starts_and_validation():
    spent = []

    class Budget:
        def spend(self, event):
            spent.append(event)

    data = _data()
    m = _model()
    private = make_private_correlated(
        m,
        torch.optim.SGD(m.parameters(), lr=0.1),
        data,
        loss_fn=torch.nn.CrossEntropyLoss(),
        delta=1e-5,
        batch_size=20,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        steps=9,
        noise="banded",
        bands=4,
        seed=1,
        accountant="rdp",
        budget=Budget(),
    )
    _run(private)
    assert len(spent) == 3 and all(e == private.extra["plan"].step_event for e in spent)
    with pytest.raises(PrivacyParameterError, match="bands"):
        make_private_correlated(
            _model(),
            torch.optim.SGD(_model().parameters(), lr=0.1),
            data,
            loss_fn=torch.nn.CrossEntropyLoss(),
            delta=1e-5,
            batch_size=100,
            max_grad_norm=1.0,
            noise_multiplier=1.0,
            steps=9,
            noise="banded",
            bands=4,
        )
    with pytest.raises(PrivacyParameterError, match="noise"):
        make_private_correlated(
            m,
            torch.optim.SGD(m.parameters(), lr=0.1),
            data,
            loss_fn=torch.nn.CrossEntropyLoss(),
            delta=1e-5,
            batch_size=10,
            max_grad_norm=1.0,
            noise_multiplier=1.0,
            steps=9,
            noise="gaussian",  # type: ignore[arg-type]
        )


def test_cli_train_correlated_json(capsys):
    import json

    from renyi.cli.main import main

    code = main(
        ["train", "--noise", "banded", "--bands", "2", "--epsilon", "4", "--epochs", "1",
         "--limit", "300", "--seed", "0", "--no-baseline", "--no-progress", "--json"]
    )  # fmt: skip
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["epsilon"] <= 4.0 and 0.0 <= data["accuracy"] <= 1.0
    assert data["noise"]["kind"] == "banded" and data["noise"]["analysis"] == "amplified"
    assert data["noise"]["partitions"] == 2
    assert main(["train", "--noise", "blt", "--sampling", "fixed-size", "--json"]) == 2


def test_cli_train_refuses_noise_with_personalized_accounting(capsys):
    from renyi.cli.main import main

    assert main(["train", "--noise", "banded", "--user-level", "ELS", "--json"]) == 2
    assert "--noise" in capsys.readouterr().err
