"""make_private, Trainer, checkpoint/resume, data loading and the ``renyi train`` command."""

from __future__ import annotations

import gzip
import json
import math
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import Dataset, TensorDataset  # noqa: E402

from renyi.accountants import RdpAccountant  # noqa: E402
from renyi.dpsgd.data import (  # noqa: E402
    DatasetNotFoundError,
    find_fashion_mnist,
    load_digits,
    load_fashion_mnist,
    read_idx,
)
from renyi.dpsgd.privacy import make_private  # noqa: E402
from renyi.dpsgd.trainer import Trainer, evaluate  # noqa: E402
from renyi.errors import (  # noqa: E402
    InsecureRandomnessWarning,
    OrderAtGridEdgeWarning,
    PrivacyParameterError,
)
from renyi.events import GaussianEvent, Neighbouring, PoissonSampledEvent  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)
    warnings.simplefilter("ignore", OrderAtGridEdgeWarning)


@pytest.fixture(scope="module")
def digits() -> tuple[TensorDataset, TensorDataset]:
    return load_digits()


def _linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def _private(train: Any, *, seed: int | None = 0, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    model = _linear()
    opts: dict[str, Any] = {
        "loss_fn": nn.CrossEntropyLoss(),
        "delta": 1e-5,
        "batch_size": 64,
        "max_grad_norm": 1.0,
        "accountant": "rdp",
        "seed": seed,
    }
    opts.update(kwargs)
    if "target_epsilon" not in opts and "noise_multiplier" not in opts:
        opts["noise_multiplier"] = 1.0
    if "epochs" not in opts and "steps" not in opts:
        opts["steps"] = 10
    return make_private(model, torch.optim.SGD(model.parameters(), lr=1.0), train, **opts)


def test_make_private_calibrates_to_target_with_dp_accounting_as_oracle(digits: Any) -> None:
    train, _ = digits
    private = _private(train, target_epsilon=2.0, epochs=5)
    n, b = len(train), 64
    assert private.steps == math.ceil(5 * n / b)
    assert private.sample_rate == b / n
    # our own accountant: at most the target, and tight (within 1%)
    eps = RdpAccountant().compose(
        PoissonSampledEvent(b / n, GaussianEvent(private.noise_multiplier)), private.steps
    )
    assert 0.99 * 2.0 <= eps.epsilon(1e-5).epsilon <= 2.0
    # independent oracle: Google's dp_accounting RDP accountant on the same (q, sigma, T)
    dp_accounting = pytest.importorskip("dp_accounting")
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(
            b / n, dp_accounting.GaussianDpEvent(private.noise_multiplier)
        ),
        private.steps,
    )
    assert acc.get_epsilon(1e-5) == pytest.approx(2.0, rel=0.03)


def test_epochs_rounded_up_and_stated(digits: Any) -> None:
    train, _ = digits
    private = _private(train, epochs=15)
    exact = 15 * len(train) / 64
    assert exact != int(exact)
    assert private.steps == math.ceil(exact)
    assert "rounded up" in private.steps_note and str(private.steps) in private.steps_note


def test_trainer_runs_all_steps_and_accounts_each(digits: Any) -> None:
    train, test = digits
    private = _private(train, noise_multiplier=1.0, steps=30)
    history = Trainer(private, eval_data=test, eval_every=10, progress=False).fit()
    assert private.optimizer.steps_taken == 30
    assert history.steps == [10, 20, 30]
    standalone = RdpAccountant().compose(
        PoissonSampledEvent(64 / len(train), GaussianEvent(1.0)), 30
    )
    assert history.epsilons[-1] == pytest.approx(standalone.epsilon(1e-5).epsilon, rel=1e-12)
    assert history.epsilons == sorted(history.epsilons)
    assert history.final_accuracy > 0.5  # 10 classes: chance is 0.1
    assert history.final_accuracy == evaluate(private.model, test)[1]
    # a second fit() must not train past the steps the guarantee covers
    Trainer(private, progress=False).fit()
    assert private.optimizer.steps_taken == 30


def test_resume_equivalence(digits: Any, tmp_path: Path) -> None:
    train, _ = digits
    full = _private(train, steps=12, seed=3)
    Trainer(full, progress=False).fit()

    first = _private(train, steps=12, seed=3)
    it = iter(first.data_loader)
    for _ in range(5):
        x, y = next(it)
        first.optimizer.zero_grad()
        first.optimizer.accumulate(x, y)
        first.optimizer.step()
    first.save(tmp_path / "ckpt.pt")

    resumed = _private(train, steps=12, seed=999)  # different seed: state must come from ckpt
    resumed.load(tmp_path / "ckpt.pt")
    assert resumed.optimizer.steps_taken == 5
    Trainer(resumed, progress=False).fit()
    assert resumed.optimizer.steps_taken == 12
    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed.epsilon().epsilon == full.epsilon().epsilon


def test_resume_refuses_other_mechanism(digits: Any, tmp_path: Path) -> None:
    train, _ = digits
    a = _private(train, noise_multiplier=1.0)
    a.save(tmp_path / "a.pt")
    b = _private(train, noise_multiplier=1.5)
    with pytest.raises(PrivacyParameterError, match="noise_multiplier"):
        b.load(tmp_path / "a.pt")


class _ListDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, 8, 8, generator=g)
        self.y = [int(v) for v in torch.randint(0, 10, (n,), generator=g)]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], self.y[i]


def test_generic_dataset_with_empty_poisson_batches() -> None:
    data = _ListDataset(20)
    private = _private(data, batch_size=1, steps=40, noise_multiplier=2.0)
    sizes = []
    for _epoch in range(2):  # 40 steps at q = 1/20: two epochs of 20 batches
        for x, y in private.data_loader:
            sizes.append(len(y))
            assert x.shape[1:] == (1, 8, 8)
            private.optimizer.zero_grad()
            private.optimizer.accumulate(x, y)
            private.optimizer.step()
    assert 0 in sizes  # P(no empty batch in 40) = (1 - (19/20)^20)^40 < 1e-7
    assert private.optimizer.steps_taken == 40


def test_fixed_size_sampling_uses_replace_one_event(digits: Any) -> None:
    train, _ = digits
    private = _private(train, sampling="fixed_size", noise_multiplier=2.0, steps=20)
    assert private.neighbouring == "replace_one"
    event = private.optimizer.event
    assert event.neighbouring is Neighbouring.REPLACE_ONE
    assert event.event.noise_multiplier == pytest.approx(1.0)  # sigma / 2: sensitivity 2C
    sizes = {len(y) for _, y in private.data_loader}
    assert sizes == {64}


@pytest.mark.parametrize("name", ["rdp", "zcdp", "pld"])
def test_fixed_size_calibration_meets_target_or_is_refused(digits: Any, name: str) -> None:
    from renyi.accountants import make_accountant
    from renyi.errors import UnsupportedEventError

    train, _ = digits
    probe = _private(train, sampling="fixed_size", noise_multiplier=1.0, steps=1)
    if not make_accountant(name).supports(probe.optimizer.event):
        with pytest.raises(UnsupportedEventError):
            _private(train, sampling="fixed_size", target_epsilon=3.0, steps=50, accountant=name)
        return
    private = _private(train, sampling="fixed_size", target_epsilon=3.0, steps=50, accountant=name)
    acc = make_accountant(name).compose(private.optimizer.event, 50)
    assert acc.epsilon(1e-5).epsilon <= 3.0
    assert private.optimizer.event.event.noise_multiplier == private.noise_multiplier / 2


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"epochs": 1, "steps": 3}, "epochs/steps"),
        ({"target_epsilon": 1.0, "noise_multiplier": 1.0}, "target_epsilon"),
        ({"batch_size": 10_000}, "batch_size"),
        ({"delta": 0.0}, "delta"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"sampling": "bogus"}, "sampling"),
    ],
)
def test_make_private_refuses_bad_arguments(digits: Any, kwargs: dict[str, Any], name: str) -> None:
    train, _ = digits
    with pytest.raises(PrivacyParameterError, match=name):
        _private(train, **kwargs)


def _write_idx(path: Path, array: np.ndarray) -> None:
    code = {np.dtype(np.uint8): 0x08}[array.dtype]
    header = struct.pack(">BBBB", 0, 0, code, array.ndim)
    header += struct.pack(">" + "I" * array.ndim, *array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.tobytes())


def test_idx_reader_and_fashion_loader_on_synthetic_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=5, dtype=np.uint8)
    for prefix in ("train", "t10k"):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", labels)
    np.testing.assert_array_equal(read_idx(tmp_path / "train-images-idx3-ubyte.gz"), images)
    train, _ = load_fashion_mnist(tmp_path)
    assert train.tensors[0].shape == (5, 1, 28, 28)
    np.testing.assert_array_equal(train.tensors[1].numpy(), labels.astype(np.int64))
    # pixel values are (v/255 - mean)/std with public constants: monotone in v
    flat_x = train.tensors[0].flatten().numpy()
    order = np.argsort(images.flatten(), kind="stable")
    assert np.all(np.diff(flat_x[order]) >= 0)


def test_fashion_mnist_absent_gives_instructions(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="apt install dataset-fashion-mnist"):
        find_fashion_mnist(tmp_path)


def test_cli_train_json_is_one_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from renyi.cli.main import main

    plot = tmp_path / "eps.png"
    code = main(
        [
            "train",
            "--json",
            "--seed",
            "0",
            "--epochs",
            "2",
            "--accountant",
            "rdp",
            "--no-baseline",
            "--plot",
            str(plot),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    summary = json.loads(out)  # exactly one JSON object, nothing else
    assert summary["steps"] == math.ceil(2 * summary["n_train"] / 64)
    assert summary["epsilon_spent"]["rdp"] <= 3.0
    assert summary["secure_randomness"] is False
    assert 0.0 <= summary["private_accuracy"] <= 1.0
    assert plot.stat().st_size > 0


def test_cli_train_fixed_size_reports_replace_one(capsys: pytest.CaptureFixture[str]) -> None:
    from renyi.cli.main import main

    args = ["train", "--json", "--seed", "1", "--epochs", "1", "--no-baseline"]
    assert main([*args, "--sampling", "fixed-size"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["neighbouring"] == "replace_one"
    assert summary["sampling"] == "fixed-size"
    # the accountant that calibrated sigma certifies the target; others may be looser
    assert summary["epsilon_spent"][summary["accountant"]] <= 3.0
