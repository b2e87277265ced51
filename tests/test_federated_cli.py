"""``renyi federated ...``: every command prints exactly one JSON object with --json."""

import json
import math

import pytest

from renyi.cli.main import main


def _json(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # exactly one object, nothing else


def test_aggregate_json(capsys):
    d = _json(
        capsys,
        ["federated", "aggregate", "--parties", "1000", "--epsilon", "1", "--delta", "1e-5",
         "--honest", "0.5", "--seed", "1", "--json"],
    )  # fmt: skip
    assert round(d["central_std"], 6) == 0.004845
    assert round(d["local_std"], 6) == 0.153206
    g = d["gopa"]
    assert g["peers"] == 13 and g["honest_parties"] == 500
    assert g["mu"] <= g["target_mu"] and g["honest_graph_connected"]
    assert g["std_over_central"] == pytest.approx(1 / math.sqrt(0.5), rel=0.04)
    # accountants' reports are upper bounds on the exact epsilon of the same Gaussian
    assert g["epsilon_achieved"] <= d["epsilon_reported"]["rdp"] <= 1.0
    assert g["epsilon_achieved"] <= g["epsilon_reported_rdp"] <= 1.0


def test_aggregate_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "agg.png"
    d = _json(
        capsys,
        ["federated", "aggregate", "--parties", "120", "--epsilon", "1", "--delta", "1e-5",
         "--trials", "50", "--seed", "1", "--plot", str(plot), "--json"],
    )  # fmt: skip
    assert d["plot"] == str(plot) and plot.stat().st_size > 1000
    assert d["gopa"]["std_simulated"] > 0


def test_aggregate_table(capsys):
    assert main(["federated", "aggregate", "--parties", "200", "--epsilon", "1",
                 "--delta", "1e-5", "--seed", "2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "GOPA" in out and "local" in out and "connected" in out


def test_sigma_json_reproduces_the_reference(capsys):
    d = _json(
        capsys,
        ["federated", "sigma", "--parties", "2000", "--steps", "20000", "--epsilon", "10",
         "--delta", "1e-6", "--convention", "paper", "--json"],
    )  # fmt: skip
    assert round(d["sigma_local"], 2) == 14.68
    assert round(d["sigma_central"], 3) == 1.742
    assert d["sigma_network"] <= 3.07 and d["sigma_network"] == pytest.approx(3.07, rel=0.01)
    assert d["network_delta_total"] > 1e-6


def test_walk_json(capsys):
    d = _json(
        capsys,
        ["federated", "walk", "--epsilons", "10", "--runs", "3", "--steps-per-party", "2",
         "--seed", "0", "--json"],
    )  # fmt: skip
    assert set(d["accuracy"]) == {"local", "network", "central"}
    assert all(0 <= a[0] <= 1 for a in d["accuracy"].values())


def test_bad_argument_is_a_clean_error(capsys):
    assert main(["federated", "aggregate", "--parties", "1000", "--epsilon", "-1",
                 "--delta", "1e-5"]) == 2  # fmt: skip
    assert "epsilon=-1" in capsys.readouterr().err


def test_aggregate_reports_targeted_coalition(capsys):
    d = _json(
        capsys,
        ["federated", "aggregate", "--parties", "200", "--epsilon", "1", "--delta", "1e-5",
         "--honest", "0.5", "--seed", "2", "--json"],
    )  # fmt: skip
    t = d["gopa"]["targeted"]
    assert t["coalition_size"] == 100 and t["isolated"]
    assert t["mu"] == pytest.approx(1 / d["gopa"]["sigma_eta"], rel=1e-12)
    assert t["epsilon"] > 10 * d["gopa"]["epsilon_achieved"]


def test_gopa_run_bad_arguments_are_clean_errors(capsys):
    pytest.importorskip("flwr")
    assert main(["federated", "gopa-run", "--parties", "1"]) == 2
    assert "parties=1" in capsys.readouterr().err
    assert main(["federated", "gopa-run", "--parties", "5", "--honest", "2"]) == 2
    assert "honest" in capsys.readouterr().err


def test_gopa_run_secure_path_bad_arguments_are_clean_errors(capsys):
    """Checked before any process starts: plain-GOPA flags without --trust-server, an
    unsafe threshold, an odd degree, a coalition as large as a neighbourhood."""
    pytest.importorskip("flwr")
    for extra, word in (
        (["--honest", "0.5"], "--trust-server"),
        (["--reveal-budget", "1"], "--trust-server"),
        (["--threshold", "1"], "threshold=1"),
        (["--peers", "5"], "peers=5"),
        (["--peers", "2", "--max-corrupt", "2"], "max_corrupt=2"),
        (["--sessions", "0"], "sessions=0"),
    ):
        assert main(["federated", "gopa-run", "--parties", "10", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert word in err and "Traceback" not in err, (extra, err)


def test_gopa_run_default_protocol_refuses_a_zero_noise_server(capsys):
    """Issue 25, first row, through the CLI's default path on a real deployment
    (flower-superlink + 5 nodes): a server proposing sigma_eta = sigma_delta = 0 gets
    nothing; every party refuses from its own pins, the command exits 1 without a
    traceback and reports the worst-case epsilon the parties would have verified."""
    pytest.importorskip("flwr")
    argv = ["federated", "gopa-run", "--parties", "5", "--server-sigma-eta", "0",
            "--server-sigma-delta", "0", "--timeout", "120", "--json"]  # fmt: skip
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    d = json.loads(captured.out)
    assert d["trusts_server"] is False and d["released"] == 0
    assert d["server_proposal"]["sigma-eta"] == 0.0
    (s,) = d["sessions"]
    assert s["status"] == "aborted"
    assert s["reason"].count("sigma_eta = 0.0 < its minimum") == 5
    assert d["epsilon_worst_case"] <= d["epsilon_target"] == 1.0
    # the reported epsilon is the worst case the parties verify (issue item 4), not one
    # random honest set: the star bound of the pinned (sigma_eta, sigma_delta, t, c), which
    # is above the exact worst over every coalition and survivor list of this cohort
    from renyi.analysis.closed_forms import gaussian_epsilon
    from renyi.federated.secagg_accounting import (
        exhaustive_worst_mu,
        harary_neighbours,
        worst_case_mu,
    )

    se, sd, t, c = d["sigma_eta"], d["sigma_delta"], d["threshold"], d["max_corrupt"]
    assert d["mu_worst_case"] == pytest.approx(worst_case_mu(se, sd, t, c), rel=1e-12)
    assert d["epsilon_worst_case"] == pytest.approx(gaussian_epsilon(d["mu_worst_case"], 1e-5))
    exact = exhaustive_worst_mu(
        harary_neighbours(list(range(5)), d["peers"]), se, sd, threshold=t, corrupt=c,
        min_survivors=d["min_survivors"],
    )  # fmt: skip
    assert 0.75 * d["mu_worst_case"] <= exact <= d["mu_worst_case"] * (1 + 1e-12)


def test_gopa_run_honours_its_timeout_during_setup(capsys):
    """``--timeout`` bounds the whole command, setup included: 1000 parties' keys take
    0.5-2 s to make and write (1000 files), so a 0.05 s limit ends before they are all made,
    with our error naming the limit and what was under way, before any process starts
    (before the fix the limit was only passed to the ServerApp: keys, SuperLink and 1000
    forked nodes were all started first; with 0.5 s, start was reached after 4.6 s)."""
    pytest.importorskip("flwr")
    import time

    import renyi.federated.flower_deploy as fd

    started: list[object] = []
    real_start = fd.LocalDeployment.start
    fd.LocalDeployment.start = lambda self: started.append(self) or real_start(self)  # type: ignore[method-assign]
    try:
        t0 = time.monotonic()
        code = main(["federated", "gopa-run", "--parties", "1000", "--timeout", "0.05", "--json"])
        took = time.monotonic() - t0
    finally:
        fd.LocalDeployment.start = real_start  # type: ignore[method-assign]
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err
    assert not captured.out
    err = json.loads(captured.err)["error"]
    assert "timeout=0.05 s ran out while" in err and "nothing was released" in err, err
    assert "the parties' key" in err, err  # making or writing them, not starting processes
    assert not started  # no SuperLink, no node
    assert took < 30  # keys stop at the limit (2 ms each), not after all of them


def test_gopa_run_refuses_more_parties_than_one_machine_runs(capsys):
    """``--parties 100000 --timeout 1``: refused at once, naming the limit (a loopback
    deployment is one process per party), not after minutes of key generation."""
    pytest.importorskip("flwr")
    assert main(["federated", "gopa-run", "--parties", "100000", "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "parties=100000" in err and "at most 1000" in err and "Traceback" not in err
