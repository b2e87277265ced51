"""``renyi audit``: one JSON object with --json, exit status = verdict, plots, config files."""

import json

import pytest

from renyi.cli.main import main


def run_json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)  # exactly one JSON object (json.loads refuses trailing text)


def test_mechanism_audit_passes_for_our_laplace(capsys):
    code, obj = run_json(
        capsys, ["audit", "mechanism", "laplace", "--trials", "20000", "--seed", "1", "--json"]
    )
    assert code == 0 and obj["passed"] is True
    assert obj["epsilon_lower"] <= obj["claimed_epsilon"]
    assert {a["attack"] for a in obj["attacks"]} == {
        "threshold",
        "histogram",
        "lowbits",
        "features",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["naive-laplace"],
        ["laplace", "--bug", "half-noise"],
        ["laplace", "--bug", "double-sensitivity"],
    ],
)
def test_mechanism_audit_fails_planted_bugs(capsys, argv):
    code, obj = run_json(
        capsys, ["audit", "mechanism", *argv, "--trials", "50000", "--seed", "2", "--json"]
    )
    assert code == 1 and obj["passed"] is False
    assert obj["epsilon_lower"] > obj["claimed_epsilon"]


def test_mechanism_audit_text_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "roc.png"
    code = main(
        ["audit", "mechanism", "gaussian", "--trials", "5000", "--seed", "3", "--plot", str(path)]
    )
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out and path.stat().st_size > 1000


def test_dpsgd_audit_from_a_config_file(capsys, tmp_path):
    cfg = tmp_path / "audit.json"
    cfg.write_text(
        json.dumps(
            {"method": "many-runs", "noise_multiplier": 2.0, "steps": 4, "runs": 500, "seed": 0}
        )
    )
    code, obj = run_json(capsys, ["audit", "dpsgd", "--config", str(cfg), "--json"])
    assert code == 0 and obj["method"] == "many_runs" and obj["passed"] is True
    assert obj["epsilon_lower"] <= obj["accountant"]["exact"] <= obj["accountant"]["rdp"]
    code, obj = run_json(
        capsys,
        ["audit", "dpsgd", "--config", str(cfg), "--bug", "no_clipping", "--json"],
    )
    assert code == 1 and obj["passed"] is False


def test_dpsgd_audit_bad_input_is_an_error(capsys, tmp_path):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"noise": 1.0}))
    assert main(["audit", "dpsgd", "--config", str(cfg)]) == 2
    assert "noise" in capsys.readouterr().err
    assert main(["audit", "dpsgd", "--method", "one-run", "--trainer", "torch"]) == 2


def test_mechanism_audit_checks_renyi_claims(capsys):
    from renyi.closed_forms import randomized_response_rdp

    argv = ["audit", "mechanism", "randomized-response", "--trials", "100000", "--seed", "4"]
    code, obj = run_json(capsys, [*argv, "--orders", "2,8,inf", "--json"])
    truth = randomized_response_rdp(0.75, [2.0, 8.0, float("inf")])
    assert code == 0 and obj["rdp_passed"] is True
    assert obj["orders"] == [2.0, 8.0, "inf"]
    assert all(lo <= t for lo, t in zip(obj["rdp_lower"], truth, strict=True))
    code, obj = run_json(capsys, [*argv, "--orders", "2,8", "--bug", "half-noise", "--json"])
    assert code == 1 and obj["rdp_passed"] is False
    assert main([*argv, "--orders", "0.5"]) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["dpsgd-noise", "--dtype", "float32", "--trials", "4000"],
        ["central-mean", "--k", "10", "--trials", "300"],
        ["local-mean", "--trials", "300"],
        ["fedavg", "--trials", "300"],
    ],
)
def test_release_path_targets_attack_the_installed_code(capsys, argv):
    code, obj = run_json(capsys, ["audit", "mechanism", *argv, "--json"])
    assert code == 0 and obj["passed"] is True
    assert "features" in {a["attack"] for a in obj["attacks"]}
    assert obj["epsilon_lower"] <= obj["claimed_epsilon"]


def test_release_path_targets_refuse_planted_bug_options(capsys):
    assert main(["audit", "mechanism", "fedavg", "--bug", "half-noise"]) == 2
    assert "bug" in capsys.readouterr().err
