"""Counter-regenerated correlated noise: no past-noise buffers, bit-identical updates."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from renyi.correlated.strategies import bisr, strategy_from_dict
from renyi.correlated.streaming import streaming_noise
from renyi.errors import InsecureRandomnessWarning

torch = pytest.importorskip("torch")
warnings.filterwarnings("ignore", category=InsecureRandomnessWarning)


def test_bisr_noise_is_a_finite_filter_of_fresh_draws():
    s = bisr(5, 0.9)
    t = 40
    z = np.random.default_rng(0).standard_normal((t, 3))
    stored = streaming_noise(s)
    rows = np.array([stored.next(z[i].copy()) for i in range(t)])
    np.testing.assert_allclose(rows, s.noising_matrix(t) @ z, rtol=1e-12, atol=1e-12)
    assert stored.buffers == 4  # b - 1 fresh vectors
    regen = streaming_noise(s, regenerate=lambda step: z[step].copy())
    again = np.array([regen.next(z[i].copy()) for i in range(t)])
    assert regen.buffers == 0 and np.array_equal(again, rows)  # bit for bit
    assert strategy_from_dict(s.to_dict()) == s
    c = s.matrix(t)  # C = R^-1: non-negative, non-increasing (exact min-sep sensitivity)
    assert np.allclose(c @ s.noising_matrix(t), np.eye(t), atol=1e-12)
    assert s.sensitivity(t, 8, 5).exact


def _train(regenerate: bool, key: bytes, steps: int = 12):
    from torch.utils.data import TensorDataset

    from renyi.dpsgd.correlated import make_private_correlated
    from renyi.noise import CounterNoise

    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 5, generator=g)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    private = make_private_correlated(
        model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), data,
        loss_fn=torch.nn.CrossEntropyLoss(), noise_multiplier=1.0, delta=1e-5, steps=steps,
        batch_size=12, max_grad_norm=1.0, noise="banded_inverse", bands=6, seed=3,
        counter_noise=CounterNoise(key),
    )  # fmt: skip
    opt = private.optimizer
    opt._regenerate = regenerate
    if not regenerate:  # the stored-noise filter, fed by the same counter
        opt.noise = streaming_noise(private.extra["strategy"])
    updates = []
    held = 0
    while opt.steps_taken < steps:
        for xb, yb in private.data_loader:
            before = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            opt.accumulate(xb, yb)
            opt.step()
            updates.append(
                [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]
            )
            held = max(held, sum(v.numel() * v.element_size()
                                 for v in opt.noise.state_dict()["vectors"]))  # fmt: skip
            if opt.steps_taken >= steps:
                break
    return updates, held, opt


def test_regenerated_noise_gives_bit_identical_updates_with_no_buffers():
    key = bytes(range(32))
    stored, held_stored, _ = _train(False, key)
    regen, held_regen, opt = _train(True, key)
    assert len(stored) == len(regen) == 12
    for a, b in zip(stored, regen, strict=True):
        for u, v in zip(a, b, strict=True):
            assert torch.equal(u, v)
    params = sum(p.numel() for p in opt.param_groups[0]["params"])
    assert held_stored == 5 * params * 8  # b - 1 = 5 float64 vectors kept
    assert held_regen == 0  # noise state: nothing but the key and the step
    state = opt.state_dict()
    assert state["correlated"]["noise"]["vectors"] == []
    assert state["correlated"]["counter"]["key"] == key.hex()
