"""``renyi.dpsgd._memory.keep_freed_memory``: glibc keeps freed memory, so that buffers
freed at the end of a private step are not faulted in anew at the next one.

Checked in fresh subprocesses (the setting is process-wide): a loop that allocates and
frees 32 MB of 4 MB arrays takes at most a quarter of the minor page faults per round
after the call than before it (deterministic allocator behaviour; on this machine about
4,000 before and 0 after). ``make_private`` calls it by default and refuses a
non-boolean ``keep_freed_memory``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from renyi.dpsgd import PrivacyEngine, _memory  # noqa: E402
from renyi.errors import PrivacyParameterError  # noqa: E402

pytestmark = pytest.mark.torch

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's mallopt",
)

_PROBE = """
import importlib.util, json, resource, sys
import numpy as np
# the module alone (the renyi.dpsgd package would import torch: seconds)
spec = importlib.util.spec_from_file_location("_memory", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
keep_freed_memory = mod.keep_freed_memory

def faults_per_round():
    counts = []
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [np.ones(1 << 20, dtype=np.float32) for _ in range(8)]  # 8 x 4 MB, touched
        del blocks
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sorted(counts[1:])[2]  # median of the rounds after the first

default = faults_per_round()
ok = keep_freed_memory()
print(json.dumps({"default": default, "kept": faults_per_round(), "ok": ok}))
"""


@glibc
def test_freed_memory_is_reused_without_page_faults() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, _memory.__file__],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ok"] is True
    assert res["default"] >= 1000  # 32 MB faulted in again every round by default
    assert res["kept"] * 4 <= res["default"]


@glibc
def test_keep_freed_memory_is_set_once_per_process() -> None:
    assert _memory.keep_freed_memory() is True
    assert _memory.keep_freed_memory() is True


def _make_private(**kwargs: Any) -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(20, 3, generator=g), torch.randint(0, 2, (20,), generator=g))
    model = nn.Linear(3, 2)
    PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=5),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        seed=0,
        **kwargs,
    )


def test_make_private_keeps_freed_memory_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(_memory, "keep_freed_memory", lambda: calls.append(1) or True)
    with pytest.warns(Warning):  # seed=: insecure randomness
        _make_private()
    assert calls == [1]
    with pytest.warns(Warning):
        _make_private(keep_freed_memory=False)
    assert calls == [1]
    with pytest.raises(PrivacyParameterError, match="keep_freed_memory"):
        _make_private(keep_freed_memory="yes")
