"""`renyi ledger`: answers in ε spent and left, correct amounts, refusals in ε, both stores."""

import json
import sqlite3

import pytest

from renyi.budget import Budget
from renyi.cli.main import main
from renyi.events import GaussianEvent, PoissonSampledEvent


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_init_twice_does_not_say_created(capsys, tmp_path):
    path = str(tmp_path / "b.sqlite")
    code, out, _ = _run(capsys, "ledger", "init", path, "--epsilon", "3", "--delta", "1e-5")
    assert code == 0 and out.startswith("created")
    code, out, _ = _run(capsys, "ledger", "init", path, "--epsilon", "3", "--delta", "1e-5")
    assert code == 0 and "created" not in out and "already holds this budget" in out
    code, out, _ = _run(
        capsys, "ledger", "init", path, "--epsilon", "3", "--delta", "1e-5", "--json"
    )
    assert json.loads(out)["created"] is False
    code, _, err = _run(capsys, "ledger", "init", path, "--epsilon", "4", "--delta", "1e-5")
    assert code == 1 and "different budget" in err and err.count("\n") == 1


def test_pure_amounts_and_refusal_in_epsilon(capsys, tmp_path):
    path = str(tmp_path / "b.sqlite")
    _run(capsys, "ledger", "init", path, "--epsilon", "100")
    for eps in ("10", "20"):
        assert _run(capsys, "ledger", "spend", path, "--pure-epsilon", eps)[0] == 0
    code, out, _ = _run(capsys, "ledger", "show", path)
    assert "ε spent 30 of 100, 70 left" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [r[-2:] for r in rows] == [["10", "10"], ["20", "30"]]  # cost, spent after: no lost 0
    code, _, err = _run(capsys, "ledger", "spend", path, "--pure-epsilon", "80")
    assert code == 1
    assert err == (
        "renyi: error: refused PureDpEvent: it costs epsilon=80 but only epsilon=70 of 100 "
        "remains (30 spent)\n"
    )


def test_count_zero_and_negative_are_errors(capsys, tmp_path):
    path = str(tmp_path / "b.sqlite")
    _run(capsys, "ledger", "init", path, "--epsilon", "1")
    for bad in ("0", "-3", "1.5", "many"):
        code, _, err = _run(
            capsys, "ledger", "spend", path, "--pure-epsilon", "0.1", "--count", bad
        )
        assert code == 2 and "--count" in err and "an integer >= 1" in err
    assert Budget.open(path).entries() == []


def test_fits_status_show_json_in_user_units(capsys, tmp_path):
    path = str(tmp_path / "b.sqlite")
    _run(capsys, "ledger", "init", path, "--epsilon", "3", "--delta", "1e-5")
    step = ["--noise-multiplier", "1.1", "--sample-rate", "0.01"]
    code, out, _ = _run(capsys, "ledger", "fits", path, *step, "--json")
    steps = json.loads(out)["steps"]
    assert steps == Budget.open(path).max_count(PoissonSampledEvent(0.01, GaussianEvent(1.1)))
    assert steps > 1000
    _run(capsys, "ledger", "spend", path, *step, "--count", "1000", "--label", "run1")
    code, out, _ = _run(capsys, "ledger", "fits", path, *step)
    assert out.startswith(f"{steps - 1000} more steps")
    code, out, _ = _run(capsys, "ledger", "show", path, "--json")
    d = json.loads(out)
    assert {"epsilon_spent", "epsilon_remaining", "delta", "entries", "curves"} <= set(d)
    assert 0 < d["epsilon_spent"] < 3 and d["epsilon_spent"] + d["epsilon_remaining"] == 3
    assert d["delta"] == 1e-5 and len(d["entries"]) == 1 and d["entries"][0]["label"] == "run1"
    assert "limit" not in d["budget"] and len(d["curves"]["orders"]) == len(d["curves"]["spent"])
    assert d["entries"][0]["cost"]["epsilon"] == pytest.approx(d["epsilon_spent"])
    code, out, _ = _run(capsys, "ledger", "status", path)
    assert f"ε spent {d['epsilon_spent']:.4g} of 3" in out and "δ=1e-05" in out and "order" in out
    code, _, err = _run(capsys, "ledger", "spend", path, *step, "--count", str(steps))
    assert code == 1 and "would raise epsilon spent from" in err and "remains" in err
    # the refusal changed nothing: exactly the remaining steps still fit
    b = Budget.open(path)
    b.spend(PoissonSampledEvent(0.01, GaussianEvent(1.1)), steps - 1000)
    assert b.max_count(PoissonSampledEvent(0.01, GaussianEvent(1.1))) == 0


def test_json_errors_go_to_stderr_as_json(capsys, tmp_path):
    code, out, err = _run(capsys, "ledger", "show", str(tmp_path / "none.sqlite"), "--json")
    assert code == 2 and out == ""
    assert json.loads(err) == {
        "error": f"no ledger at {str(tmp_path / 'none.sqlite')!r}",
        "kind": "usage",
    }


def test_tampered_ledger_through_the_cli(capsys, tmp_path):
    path = str(tmp_path / "b.sqlite")
    _run(capsys, "ledger", "init", path, "--epsilon", "100")
    for _ in range(3):
        _run(capsys, "ledger", "spend", path, "--pure-epsilon", "10")
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM entries WHERE idx = 1")
    conn.commit()
    conn.close()
    for action in (["show"], ["status"], ["spend", "--pure-epsilon", "1"]):
        code, _, err = _run(capsys, "ledger", action[0], path, *action[1:])
        assert code == 1 and "entry #1 is missing" in err and err.count("\n") == 1


def test_keyed_ledger_through_the_cli(capsys, tmp_path, monkeypatch):
    path = str(tmp_path / "b.sqlite")
    monkeypatch.setenv("RENYI_LEDGER_KEY", "a-long-operator-secret")
    assert _run(capsys, "ledger", "init", path, "--epsilon", "1")[0] == 0
    assert _run(capsys, "ledger", "spend", path, "--pure-epsilon", "0.5")[0] == 0
    monkeypatch.delenv("RENYI_LEDGER_KEY")
    code, _, err = _run(capsys, "ledger", "show", path)
    assert code == 1 and "keyed" in err


def test_postgres_ledger_through_the_cli(capsys, postgres_url):
    assert _run(capsys, "ledger", "init", postgres_url, "--epsilon", "2")[0] == 0
    assert _run(capsys, "ledger", "spend", postgres_url, "--laplace-scale", "2")[0] == 0
    code, out, _ = _run(capsys, "ledger", "show", postgres_url)
    assert code == 0 and "ε spent 0.5 of 2, 1.5 left" in out
    code, out, _ = _run(capsys, "ledger", "fits", postgres_url, "--laplace-scale", "2", "--json")
    assert json.loads(out)["steps"] == 3
