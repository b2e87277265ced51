"""CLI: renyi train --accounting individual / --user-level, renyi tune (tiny runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _renyi(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run(
        [sys.executable, "-m", "renyi", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_train_individual_json() -> None:
    out = _renyi(
        "train",
        "--accounting",
        "individual",
        "--epochs",
        "1",
        "--limit",
        "200",
        "--epsilon",
        "2",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    ind = d["individual_epsilon"]
    assert ind["min"] <= ind["median"] <= ind["p90"] <= ind["max"] <= 2.0
    assert d["steps"] >= d["planned_steps"] and isinstance(d["examples_retired"], int)


@pytest.mark.parametrize("level", ["ELS", "ULS"])
def test_train_user_level_json(level: str) -> None:
    out = _renyi(
        "train",
        "--user-level",
        level,
        "--examples-per-user",
        "4",
        "--epochs",
        "1",
        "--limit",
        "200",
        "--epsilon",
        "4",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["user_level"] == level and d["examples_per_user"] == 4 and d["users"] == 50
    assert d["epsilon"] <= 4.0
    if level == "ELS":
        assert d["group_privacy_epsilon"] > d["epsilon"]


def test_tune_json() -> None:
    out = _renyi("tune", "--trials-mean", "2", "--epsilon", "4", "--epochs", "0.5", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["epsilon"] <= 4.0 < d["epsilon_naive"]
    assert d["epsilon_one_run"] < d["epsilon"]
    assert d["runs"] >= 1 and d["best"] is not None and 0.0 <= d["accuracy"] <= 1.0


@pytest.mark.parametrize(
    "args,name",
    [
        (("train", "--user-level", "ELS", "--json"), "--examples-per-user"),
        (
            (
                "train",
                "--accounting",
                "individual",
                "--user-level",
                "ULS",
                "--examples-per-user",
                "3",
            ),
            "--accounting",
        ),
        (("tune", "--trials-mean", "0.5"), "mean"),
    ],
)
def test_mistakes_end_in_our_error(args: tuple[str, ...], name: str) -> None:
    out = _renyi(*args)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and name in out.stderr
