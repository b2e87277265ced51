"""``renyi audit``: one JSON object with --json, exit status = verdict, plots, config files."""

import json

import numpy as np
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
        "signzero",
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


# ------------------------------------------------------------------ issue 22, item 7
# Audits at confidence 0.999 unless stated (false-alarm probability <= 1e-3, seeded).
@pytest.mark.parametrize(
    "argv",
    [
        ["gaussian", "--pair", "zero"],
        ["laplace", "--pair", "midpoint"],
        # failed before 819ffb4 (noise): 4.385 > 4.377 at sigma 1, the signzero attack
        ["dpsgd-noise", "--pair", "zero", "--sigma", "4", "--trials", "20000"],
        ["dpsgd-noise", "--pair", "midpoint"],
    ],
)
def test_inputs_on_both_sides_of_zero_and_of_a_lattice_midpoint(capsys, argv):
    trials = [] if "--trials" in argv else ["--trials", "40000"]
    code, obj = run_json(
        capsys,
        ["audit", "mechanism", *argv, *trials, "--seed", "5", "--confidence", "0.999", "--json"],
    )
    assert obj["pair"] in ("zero", "midpoint")
    assert code == 0 and obj["passed"] is True, obj["best_attack"]


def test_gopa_sum_against_the_residue_attack(capsys):
    """GOPA's sum, inputs 0 vs 0.01 around zero: no residue of the inputs survives (secagg's
    fix of issue 22.2; before it, K * estimate mod g was the sum mod g: epsilon 6 from one
    release). 640 releases, 3 parties."""
    code, obj = run_json(
        capsys,
        [
            "audit",
            "mechanism",
            "gopa",
            "--k",
            "3",
            "--pair",
            "zero",
            "--trials",
            "640",
            "--seed",
            "5",
            "--confidence",
            "0.999",
            "--json",
        ],
    )
    assert "residue" in {a["attack"] for a in obj["attacks"]}
    assert code == 0 and obj["passed"] is True, obj["best_attack"]


def test_the_sign_and_residue_attacks_catch_their_planted_leaks(capsys):
    """A sum released as sum + g K keeps sum mod g: the residue attack reads it from 6400
    releases; the sign-of-zero attack is tested on planted -0.0 in test_audit_blackbox."""
    from renyi.audit.blackbox import audit_mechanism
    from renyi.audit.paths import release_path
    from renyi.noise import lattice_step

    mech, _, _, claim, delta, _ = release_path("residue-sum", pair="zero")
    r = audit_mechanism(
        mech,
        0.0,
        0.01,
        trials=6400,
        claimed_epsilon=claim,
        delta=delta,
        confidence=0.999,
        rng=np.random.default_rng(0),
        residue=(1.0, lattice_step(1.0)),
    )
    residue = next(a for a in r.attacks if a.attack == "residue")
    assert not r.passed and residue.epsilon > claim


def test_mechanism_timing_is_rank_tested(capsys):
    code, obj = run_json(
        capsys,
        [
            "audit",
            "mechanism",
            "laplace",
            "--trials",
            "2000",
            "--timing",
            "--seed",
            "0",
            "--confidence",
            "0.9999",
            "--json",
        ],
    )
    assert obj["timing"]["pairs"] == 2000 and 0.0 <= obj["timing"]["p_value"] <= 1.0
    assert code == 0 and obj["timing"]["passed"] is True


def test_pairs_are_refused_for_integer_inputs(capsys):
    assert main(["audit", "mechanism", "discrete-laplace", "--pair", "zero"]) == 2
    assert "pair" in capsys.readouterr().err


# ------------------------------------------------------------------ renyi audit train
TRAIN = ["audit", "train", "--limit", "300", "--epochs", "1", "--seed", "0", "--audit-seed", "0"]


def test_audit_train_reports_a_lower_bound_beside_the_claim(capsys, tmp_path):
    """renyi train's set-up, digits, one epoch: one-run audit at confidence 0.95."""
    pytest.importorskip("torch")
    code, obj = run_json(capsys, [*TRAIN, "--json"])
    for key in ("epsilon_lower_bound", "epsilon_claimed", "delta", "confidence", "canaries"):
        assert key in obj
    assert code == 0 and obj["passed"] is True
    assert obj["epsilon_lower_bound"] <= obj["epsilon_claimed"] <= 3.0 + 1e-9
    assert obj["delta"] == 1e-5 and obj["confidence"] == 0.95
    assert set(obj["details"]["kinds"]) == {"gaussian", "sign", "residue", "examples"}


def test_audit_train_config_file_and_plot(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"epsilon": 2.0, "batch-size": 32, "example_canaries": 16}))
    plot = tmp_path / "tradeoff.png"
    code = main([*TRAIN, "--config", str(cfg), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert code == 0 and "claimed epsilon" in out and "PASS" in out
    assert plot.stat().st_size > 1000
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"epsilonn": 2.0}))
    assert main([*TRAIN, "--config", str(bad)]) == 2
    assert "epsilonn" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"epochs": -1}, "epochs=-1"),  # ran an audit of no training, and passed
        ({"canaries": 0}, "canaries=0"),
        ({"confidence": 1.5}, "confidence=1.5"),
        ({"sampling": "sometimes"}, "sometimes"),
        ({"no_baseline": "yes"}, "true or false"),
        ({"epsilon": [1, 2]}, "a number or a string"),
    ],
)
def test_audit_train_config_values_are_checked_like_flags(capsys, tmp_path, config, needle):
    """Held-out review: the config's values skipped the flags' checks."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(config))
    assert main(["audit", "train", "--limit", "300", "--seed", "0", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "c.json" in err and "Traceback" not in err


def test_audit_train_on_no_data_is_our_error(capsys):
    """Held-out review: --limit 0 was an internal error (torch's min of an empty tensor)."""
    pytest.importorskip("torch")
    assert main([*TRAIN, "--limit", "0"]) in (1, 2)
    err = capsys.readouterr().err
    assert "internal error" not in err and "dataset" in err


def test_audit_train_catches_a_planted_bug(capsys):
    """Noise divided by the batch size twice: refuted in one run (confidence 0.95)."""
    pytest.importorskip("torch")
    code, obj = run_json(
        capsys, [*TRAIN, "--planted", "noise-over-batch-twice", "--epsilon", "1", "--json"]
    )
    assert code == 1 and obj["passed"] is False and obj["planted"] == "noise-over-batch-twice"
    assert main([*TRAIN, "--planted", "sampler-rate"]) == 2
    assert "harness" in capsys.readouterr().err
