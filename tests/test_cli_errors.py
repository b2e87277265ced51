"""The newcomer's mistake list: every one ends in one line `renyi: error: ...`, never a traceback.

Exit codes: 2 for usage errors (bad flags, values, paths, missing extras), 1 for refusals and
ledger failures. Under --json the error is one JSON object on stderr. Missing optional
dependencies are simulated in a separate interpreter whose imports of them are blocked.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from renyi.cli.main import build_parser, main

SRC = Path(__file__).resolve().parents[1] / "src" / "renyi"
EPS = ["epsilon", "--noise-multiplier", "1.1", "--delta", "1e-5", "--sample-rate", "0.01"]


def _one_line_error(capsys, argv, code=2):
    got = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert got == code, err
    assert err.startswith("renyi: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "required: COMMAND"),
        (["nosuch"], "invalid choice: 'nosuch'"),
        ([*EPS, "--steps", "-5"], "steps=-5 is invalid: expected an integer >= 1"),
        ([*EPS, "--steps", "0"], "steps=0 is invalid"),
        ([*EPS, "--steps", "ten"], "steps='ten' is invalid"),
        ([*EPS[:2], "nan", *EPS[3:], "--steps", "9"], "noise_multiplier=nan is invalid"),
        ([*EPS[:2], "inf", *EPS[3:], "--steps", "9"], "noise_multiplier=inf is invalid"),
        ([*EPS[:4], "1.5", *EPS[5:], "--steps", "9"], "delta=1.5 is invalid: expected a number in"),
        (
            [*EPS[:6], "0", "--steps", "9"],
            "sample_rate=0.0 is invalid: expected a number in (0, 1]",
        ),
        (["compare", "--plot", "/no/such/dir/fig.png"], "directory '/no/such/dir' does not exist"),
        (["compare", "--plot", "figure.txt"], "unsupported figure format '.txt'"),
        (["compare", "--plot", "figure"], "unsupported figure format '(none)'"),
        (["mechanism", "laplace", "--epsilon", "-1"], "epsilon=-1.0 is invalid"),
        (["ledger", "show", "/no/such/ledger.sqlite"], "no ledger at '/no/such/ledger.sqlite'"),
        (["ledger", "init", "x.sqlite"], "give exactly one of epsilon"),
        (["audit", "dpsgd", "--config", "/no/such/config.json"], "--config"),
        (["train", "--data-dir", "/no/such/dir"], "--data-dir '/no/such/dir': no such directory"),
        (["train", "--epochs", "-1"], "epochs=-1.0 is invalid"),
    ],
)
def test_newcomer_mistakes_end_in_one_line(capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(capsys, argv)
    assert needle in err
    assert list(tmp_path.iterdir()) == []  # nothing was written before the check


def test_plot_into_a_directory_is_refused_before_work(capsys, tmp_path):
    err = _one_line_error(capsys, ["compare", "--plot", str(tmp_path)])
    assert "is a directory" in err


def test_errors_are_json_on_stderr_under_json(capsys):
    assert main([*EPS, "--steps", "0", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    d = json.loads(err)
    assert d["kind"] == "usage" and "steps=0 is invalid" in d["error"]


def test_refusal_exit_code_is_one(capsys, tmp_path):
    path = str(tmp_path / "b.sqlite")
    assert main(["ledger", "init", path, "--epsilon", "1"]) == 0
    _one_line_error(capsys, ["ledger", "spend", path, "--pure-epsilon", "2"], code=1)


def test_every_flag_has_help():
    parser = build_parser()
    missing = []

    def walk(p, prefix):
        for action in p._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}")
            elif not action.help or not action.help.strip():
                missing.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")

    walk(parser, "renyi")
    assert missing == []


def test_every_warning_in_the_library_points_at_the_caller():
    """Each warnings.warn names a stacklevel, so the warning shows the user's line."""
    bad = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "warn"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "warnings"
                and not any(k.arg == "stacklevel" for k in node.keywords)
            ):
                bad.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert bad == []


def test_warnings_print_as_one_line(capsys):
    assert main(["compare", "--iterations", "3", "--order", "1.01"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert all(line.startswith("renyi: warning: ") for line in err.splitlines())


BLOCKED = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "sklearn", "matplotlib", "flwr", "ray", "psycopg"}:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    from renyi.cli.main import main
    for argv in json.loads(sys.argv[1]):
        code = main(argv)
        print(json.dumps(code), file=sys.stderr, flush=True)
    """
)


def test_missing_extras_name_the_pip_install(tmp_path):
    cases = [
        (["compare", "--iterations", "5", "--plot", str(tmp_path / "f.png")], "renyi[plot]"),
        (["train", "--epochs", "0.01"], "renyi[torch]"),
        (["federated", "gopa-run", "--parties", "3", "--timeout", "5"], "renyi[flower]"),
        (["ledger", "show", "postgresql://nobody@/none?host=/nonexistent"], "renyi[postgres]"),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, json.dumps([argv for argv, _ in cases])],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 * len(cases), lines
    for (argv, extra), message, code in zip(cases, lines[::2], lines[1::2], strict=True):
        assert message.startswith("renyi: error: ") and f"pip install '{extra}'" in message
        assert code == "2", (argv, message)
    assert not (tmp_path / "f.png").exists()


def test_chance_accuracy_is_the_majority_class_rate():
    torch = pytest.importorskip("torch")
    from torch.utils.data import TensorDataset

    from renyi.cli.train import _chance_accuracy

    data = TensorDataset(torch.zeros(5, 2), torch.tensor([3, 3, 1, 3, 0]))
    assert _chance_accuracy(data) == 0.6
    assert _chance_accuracy(TensorDataset(torch.zeros(0, 2), torch.zeros(0))) is None


@pytest.mark.slow
def test_train_warns_when_the_private_model_is_no_better_than_chance(capsys):
    pytest.importorskip("torch")
    argv = ["train", "--epsilon", "0.001", "--epochs", "0.2", "--no-baseline", "--json"]
    assert main([*argv, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    d = json.loads(out)
    chance, n = d["chance_accuracy"], d["n_test"]
    no_better = d["private_accuracy"] <= chance + 2 * (chance * (1 - chance) / n) ** 0.5
    assert no_better == ("renyi: warning: the private model is no better than chance" in err)
    assert d["private_accuracy"] < chance + 0.1  # at epsilon = 0.001 it is noise


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (
            ["--sample-rate", "0.01", "--sampling", "random-allocation", "--steps", "9"],
            ("--sample-rate", "--sampling random-allocation"),
        ),
        (
            ["--sampling", "poisson", "--max-batch-size", "20", "--steps", "9"],
            ("--max-batch-size", "--sampling poisson"),
        ),
        (
            ["--max-batch-size", "20", "--sample-rate", "0.01", "--steps", "9"],
            ("--max-batch-size",),
        ),
        (["--steps", "9", "--epochs", "2"], ("--steps", "--epochs")),
        (["--sample-rate", "0.01", "--epochs", "2"], ("--sample-rate", "--epochs")),
        (["--sample-rate", "0.01", "--steps", "9", "--dataset-size", "500"], ("--dataset-size",)),
    ],
)
def test_ignored_options_are_refused(capsys, extra, names):
    """Issue 30: --sample-rate beside --sampling random-allocation, --max-batch-size with
    Poisson and --steps beside --epochs were ignored silently (epochs won)."""
    base = ["epsilon", "--noise-multiplier", "1.1", "--delta", "1e-5"]
    data = ["--dataset-size", "1000", "--batch-size", "10"]
    if "--dataset-size" in extra:
        data = []
    err = _one_line_error(capsys, [*base, *data, *extra])
    for name in names:
        assert name in err, err
    cal = ["calibrate", "--target-epsilon", "1", "--delta", "1e-5", *data]
    err = _one_line_error(capsys, [*cal, "--steps", "9", "--epochs", "2"])
    assert "--steps" in err and "--epochs" in err
