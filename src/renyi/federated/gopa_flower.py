"""GOPA on Flower's deployment engine: one SuperNode per party, the ServerApp as relay.

Each party runs :data:`client_app` on its own ``flower-supernode``, configured with
``--node-config`` keys ``name`` (its roster name), ``key-file`` (its raw 32-byte Ed25519
private key), ``roster-file`` (the pinned roster, JSON; see
:class:`renyi.federated.channels.Roster`), ``value`` (its private number in ``[0, 1]``),
optionally ``clip`` (clip instead of refusing an out-of-range value) and ``noise-key`` (hex
32 bytes: makes its ``eta`` reproducible; leave it out in production, the OS CSPRNG is
used). The party holds nothing else. :data:`server_app` relays and aggregates. The rounds
are Flower ``query`` messages carrying the messages of :mod:`renyi.federated.gopa_party`:

=========  =====================================  =======================================
phase      server -> party                        party -> server
=========  =====================================  =======================================
join       session parameters, roster fingerprint  signed ephemeral key advertisement
pair       directory of advertisements             one AEAD message per neighbour
mask       present parties, the party's inbox      masked value (fixed point mod 2**64)
reveal     dropped parties (only after dropouts)   terms of the broken edges (budgeted)
result     the released estimate                   acknowledgement
=========  =====================================  =======================================

The communication graph is derived from the session id (:func:`session_graph`), so the
server cannot choose who pairs with whom, and every party recomputes it. A party whose
check fails (substituted key, roster mismatch, broken AEAD, budget exceeded) answers with
the reason and stops; the server then releases nothing. A party that does not answer in time
is a dropout (recovered within the reveal budget, else the session aborts).

:func:`run_local_deployment` starts a real local deployment on loopback (``flower-superlink``,
one ``flower-supernode`` per party, ``flwr run``), waits for the result, stops every process
and returns it; the CLI ``renyi federated gopa-run`` wraps it. Flower telemetry and Ray usage
statistics are switched off before Flower is imported, here and in every process started.
"""

from __future__ import annotations

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import contextlib
import hashlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

try:
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - exercised only without flwr
    raise ImportError(
        "renyi.federated.gopa_flower needs Flower: pip install 'renyi[flower]'"
    ) from exc

from renyi._validation import check_int, check_nonnegative, check_positive, fail
from renyi.errors import RenyiError
from renyi.federated.channels import ChaCha20Source, IdentityKey, Roster
from renyi.federated.gopa import random_peer_graph
from renyi.federated.gopa_party import (
    GopaAggregator,
    GopaParty,
    GopaSession,
    ProtocolAbortedError,
)

__all__ = [
    "DeploymentResult",
    "client_app",
    "run_local_deployment",
    "serve",
    "server_app",
    "session_graph",
]

_TELEMETRY_OFF = {"FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def session_graph(session: bytes, parties: int, peers: int) -> NDArray[np.int64]:
    """The m-out peer graph of a session, drawn from ``SHA-256(label, session)``.

    Everyone recomputes it; the server cannot pick the graph (only re-draw session ids,
    which parties see).
    """
    key = hashlib.sha256(b"renyi-gopa-graph|" + session).digest()
    return random_peer_graph(parties, peers, ChaCha20Source(key))  # type: ignore[arg-type]


def _session_from(cfg: Mapping[str, Any], roster: Roster) -> GopaSession:
    names = tuple(roster)
    sid = bytes(cfg["session"])
    return GopaSession(
        session=sid,
        names=names,
        edges=session_graph(sid, len(names), int(cfg["peers"])),
        sigma_eta=float(cfg["sigma-eta"]),
        sigma_delta=float(cfg["sigma-delta"]),
        reveal_budget=int(cfg["reveal-budget"]),
        rejection_probability=float(cfg["rejection-probability"]),
    )


# --------------------------------------------------------------------------- party side

client_app = ClientApp()


def _load_party(node: Mapping[str, Any]) -> tuple[GopaParty, Roster]:
    name = str(node["name"])
    roster = Roster.from_json(Path(str(node["roster-file"])).read_text())
    identity = IdentityKey.from_private_bytes(name, Path(str(node["key-file"])).read_bytes())
    noise = node.get("noise-key")
    rng = ChaCha20Source(bytes.fromhex(str(noise))) if noise else None
    party = GopaParty(
        identity, roster, float(node["value"]), clip=bool(node.get("clip", False)), rng=rng
    )
    return party, roster


def _party_step(cfg: Mapping[str, Any], node: Mapping[str, Any], state: RecordDict) -> dict:
    phase = str(cfg["phase"])
    party, roster = _load_party(node)
    if phase == "join":
        if str(cfg["roster"]) != roster.fingerprint():
            raise ProtocolAbortedError("the server's roster is not the one this party pinned")
        if "gopa" in state:
            raise ProtocolAbortedError(f"{party.name!r} already joined a session of this run")
        session = _session_from(cfg, roster)
        adv = party.join(session)
        params = {k: cfg[k] for k in _SESSION_KEYS}
        state["gopa"] = ConfigRecord({**params, "state": party.export_state()})
        return {"advertisement": adv.to_bytes()}
    if "gopa" not in state:
        raise ProtocolAbortedError(f"{party.name!r} got {phase!r} before joining")
    saved: Any = state["gopa"]
    session = _session_from(saved, roster)
    if bytes(cfg["session"]) != session.session:
        raise ProtocolAbortedError("message for another session")
    party.restore_state(session, str(saved["state"]))
    out: dict[str, Any]
    if phase == "pair":
        directory = dict(zip(cfg["names"], cfg["adverts"], strict=True))
        box = party.pair(directory)
        out = {"to": list(box), "ct": list(box.values())}
    elif phase == "mask":
        inbox = dict(zip(cfg["from"], cfg["ct"], strict=True))
        out = {"masked": party.mask(inbox, list(cfg["present"])).tobytes()}
    elif phase == "reveal":
        terms = party.reveal(list(cfg["dropped"]))
        out = {"edges": [int(e) for e in terms], "terms": [t.tobytes() for t in terms.values()]}
    elif phase == "result":
        return {"ack": True}
    else:
        raise ProtocolAbortedError(f"unknown phase {phase!r}")
    state["gopa"] = ConfigRecord(
        {**{k: saved[k] for k in _SESSION_KEYS}, "state": party.export_state()}
    )
    return out


_SESSION_KEYS = (
    "session",
    "peers",
    "sigma-eta",
    "sigma-delta",
    "reveal-budget",
    "rejection-probability",
)


@client_app.query()
def _party_query(msg: Message, context: Context) -> Message:
    try:
        out = _party_step(msg.content["gopa"], context.node_config, context.state)
    except (RenyiError, ValueError, KeyError, OSError) as exc:
        # the party stops and says why; it sends nothing derived from its value
        out = {"abort": f"{type(exc).__name__}: {exc}"}
    return Message(RecordDict({"gopa": ConfigRecord(out)}), reply_to=msg)


# --------------------------------------------------------------------------- server side


class _Relay:
    """Query rounds over a Flower grid: push, then poll the replies (0.1 s) until all are
    in, ``timeout`` passed, or ``grace`` seconds passed since the last reply."""

    def __init__(self, grid: Grid, timeout: float, grace: float, status: Path | None) -> None:
        self.grid, self.timeout, self.grace, self.status = grid, timeout, grace, status
        self.bytes_sent: dict[str, int] = {}
        self.bytes_received: dict[str, int] = {}

    def log(self, line: str) -> None:
        if self.status is not None:
            with self.status.open("a") as f:
                f.write(line + "\n")

    def wait_for_nodes(self, count: int) -> list[int]:
        end = time.monotonic() + self.timeout
        while True:
            nodes = sorted(self.grid.get_node_ids())
            if len(nodes) >= count or time.monotonic() > end:
                return nodes
            time.sleep(0.2)

    def exchange(self, contents: Mapping[int, dict], names: Mapping[int, str]) -> dict[int, Any]:
        msgs = []
        for node, content in contents.items():
            self.bytes_sent[names[node]] = self.bytes_sent.get(names[node], 0) + _size(content)
            msgs.append(
                Message(
                    RecordDict({"gopa": ConfigRecord(content)}),
                    dst_node_id=node,
                    message_type=MessageType.QUERY,
                )
            )
        ids = list(self.grid.push_messages(msgs))
        owner = dict(zip(ids, contents, strict=True))
        pending = set(ids)
        replies: dict[int, Any] = {}
        end = time.monotonic() + self.timeout
        last: float | None = None
        while pending:
            now = time.monotonic()
            if now > end or (last is not None and now > last + self.grace):
                break
            for reply in self.grid.pull_messages(list(pending)):
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                node = owner[mid]
                last = time.monotonic()
                if reply.has_error() or "gopa" not in reply.content:
                    continue
                got: Any = reply.content["gopa"]
                self.bytes_received[names[node]] = self.bytes_received.get(names[node], 0) + _size(
                    got
                )
                replies[node] = got
            time.sleep(0.1)
        return replies


def _size(content: Mapping[str, Any]) -> int:
    total = 0
    for v in content.values():
        items = v if isinstance(v, list) else [v]
        for x in items:
            total += len(x) if isinstance(x, bytes | str) else 8
    return total


def _aborts(replies: Mapping[int, Any], names: Mapping[int, str]) -> list[str]:
    return [f"{names[n]}: {r['abort']}" for n, r in replies.items() if "abort" in r]


def serve(grid: Grid, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ServerApp's work: run one GOPA session over ``grid``; returns the outcome dict.

    ``config`` (the run config): ``roster-file``, ``peers``, ``sigma-eta``,
    ``sigma-delta``, ``reveal-budget``, optional ``session`` (hex), ``timeout``,
    ``grace``, ``rejection-probability``, ``status-file``.
    """
    roster = Roster.from_json(Path(str(config["roster-file"])).read_text())
    sid_hex = str(config.get("session", ""))
    sid = bytes.fromhex(sid_hex) if sid_hex else os.urandom(16)
    params: dict[str, Any] = {
        "session": sid,
        "peers": int(config["peers"]),
        "sigma-eta": float(config["sigma-eta"]),
        "sigma-delta": float(config["sigma-delta"]),
        "reveal-budget": int(config["reveal-budget"]),
        "rejection-probability": float(config.get("rejection-probability", 1e-9)),
    }
    session = _session_from(params, roster)
    status = Path(str(config["status-file"])) if config.get("status-file") else None
    relay = _Relay(grid, float(config.get("timeout", 120)), float(config.get("grace", 15)), status)
    k = session.parties
    nodes = relay.wait_for_nodes(k)
    unknown = dict.fromkeys(nodes, "?")
    relay.log(f"nodes {len(nodes)}")
    # join: every node says which party it is (signed advertisement)
    join = {n: {"phase": "join", "roster": roster.fingerprint(), **params} for n in nodes}
    replies = relay.exchange(join, {n: str(n) for n in unknown})
    if bad := _aborts(replies, {n: str(n) for n in replies}):
        return _aborted(relay, f"a party refused to join: {bad}")
    node_of: dict[str, int] = {}
    adverts: dict[str, bytes] = {}
    for node, r in replies.items():
        from renyi.federated.channels import KeyAdvertisement

        try:
            adv = KeyAdvertisement.from_bytes(bytes(r["advertisement"]))
            adv.verify(roster, sid)
        except (RenyiError, KeyError):
            continue  # not a party of the roster: ignored
        if adv.name in node_of:
            return _aborted(relay, f"two nodes claim party {adv.name!r}")
        node_of[adv.name], adverts[adv.name] = node, adv.to_bytes()
    names = {n: p for p, n in node_of.items()}
    relay.bytes_sent = {names.get(int(k_), k_): v for k_, v in relay.bytes_sent.items()}
    relay.bytes_received = {names.get(int(k_), k_): v for k_, v in relay.bytes_received.items()}
    relay.log(f"joined {len(node_of)}")
    # pair: relay the directory, collect one ciphertext per neighbour
    ad_names = sorted(adverts)
    pair = {
        node_of[p]: {
            "phase": "pair",
            "session": sid,
            "names": ad_names,
            "adverts": [adverts[a] for a in ad_names],
        }
        for p in ad_names
    }
    replies = relay.exchange(pair, names)
    if bad := _aborts(replies, names):
        return _aborted(relay, f"pairing refused: {bad}")
    outboxes = {names[n]: dict(zip(r["to"], r["ct"], strict=True)) for n, r in replies.items()}
    present = sorted(outboxes)
    inboxes = GopaAggregator.route(outboxes)
    relay.log(f"paired {len(present)}")
    # mask
    mask = {}
    for p in present:
        box = inboxes.get(p, {})
        mask[node_of[p]] = {
            "phase": "mask",
            "session": sid,
            "present": present,
            "from": list(box),
            "ct": list(box.values()),
        }
    replies = relay.exchange(mask, names)
    if bad := _aborts(replies, names):
        return _aborted(relay, f"masking refused: {bad}")
    messages: dict[int, object] = {}
    for node, r in replies.items():
        raw = r.get("masked")
        ok = isinstance(raw, bytes) and len(raw) == 8 * session.dimension
        messages[session.index(names[node])] = (
            np.frombuffer(raw, dtype=np.uint64).copy() if ok else raw
        )
    relay.log(f"masked {len(messages)}")

    def reveal(dropped: list[str]) -> dict[int, dict[int, NDArray[np.uint64]]]:
        asked = {
            node_of[p]: {"phase": "reveal", "session": sid, "dropped": dropped}
            for p in present
            if p not in dropped and session.index(p) in messages
        }
        got = relay.exchange(asked, names)
        if bad := _aborts(got, names):
            raise ProtocolAbortedError(f"dropout recovery refused: {bad}")
        out = {}
        for node, r in got.items():
            terms = {
                int(e): np.frombuffer(t, dtype=np.uint64).copy()
                for e, t in zip(r.get("edges", []), r.get("terms", []), strict=False)
            }
            out[session.index(names[node])] = terms
        relay.log(f"revealed {len(out)}")
        return out

    try:
        res = GopaAggregator(session).release(messages, [session.index(p) for p in present], reveal)
    except ProtocolAbortedError as exc:
        return _aborted(relay, str(exc))
    estimate = float(np.asarray(res.estimate).ravel()[0])
    relay.log("released")
    if bool(config.get("notify", True)):
        relay.exchange(
            {
                node_of[session.names[i]]: {"phase": "result", "session": sid, "estimate": estimate}
                for i in res.included
            },
            names,
        )
    relay.log("done")
    return {
        "status": "released",
        "estimate": estimate,
        "included": [session.names[i] for i in res.included],
        "dropped": [session.names[i] for i in res.dropped],
        "rejected": [session.names[i] for i in res.rejected],
        "revealed_edges": list(res.revealed_edges),
        "false_rejection_bound": res.false_rejection_bound,
        "bytes_sent": relay.bytes_sent,
        "bytes_received": relay.bytes_received,
        "session": sid.hex(),
    }


def _aborted(relay: _Relay, reason: str) -> dict[str, Any]:
    relay.log("aborted")
    return {
        "status": "aborted",
        "reason": reason,
        "bytes_sent": relay.bytes_sent,
        "bytes_received": relay.bytes_received,
    }


server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    try:
        out = serve(grid, cfg)
    except (RenyiError, ValueError, KeyError, OSError) as exc:
        out = {"status": "aborted", "reason": f"{type(exc).__name__}: {exc}"}
    if cfg.get("result-file"):
        Path(str(cfg["result-file"])).write_text(json.dumps(out))


# --------------------------------------------------------------------------- local deployment


@dataclass(frozen=True)
class DeploymentResult:
    """Outcome of :func:`run_local_deployment` (``estimate`` is ``None`` if it aborted)."""

    status: str
    estimate: float | None
    included: tuple[str, ...]
    dropped: tuple[str, ...]
    rejected: tuple[str, ...]
    reason: str
    wall_seconds: float
    bytes_per_party: float
    session: GopaSession | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise fail(
            "flwr", name, "Flower's command-line tools on PATH (pip install 'renyi[flower]')"
        )
    return found


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _wait_port(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise ProtocolAbortedError(f"flower-superlink did not listen on 127.0.0.1:{port}")


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_local_deployment(
    values: Sequence[float],
    *,
    sigma_eta: float,
    sigma_delta: float,
    peers: int,
    reveal_budget: int = 0,
    noise_keys: Sequence[bytes] | None = None,
    session: bytes | None = None,
    timeout: float = 240.0,
    grace: float = 15.0,
    clip: bool = False,
    notify: bool = True,
    server_component: str = "renyi.federated.gopa_flower:server_app",
    app_files: Mapping[str, str] | None = None,
    on_status: Callable[[str, list[subprocess.Popen[bytes]]], None] | None = None,
) -> DeploymentResult:
    """Run GOPA on a real local Flower deployment (loopback only) and stop it again.

    Starts ``flower-superlink`` (insecure HTTP on 127.0.0.1: the GOPA messages are
    end-to-end authenticated and encrypted by :mod:`renyi.federated.channels`), one
    ``flower-supernode`` per value (each with its own identity key file and value), runs
    the app with ``flwr run`` and waits for the server's result (at most ``timeout``
    seconds). ``on_status(line, supernodes)`` is called for each progress line of the
    server (``nodes``, ``joined``, ``paired``, ``masked``, ...), e.g. to stop a supernode
    mid-protocol. ``notify=False`` skips the last round (parties told the result).
    ``server_component``/``app_files`` replace the ServerApp (tests: a
    malicious relay). Every started process is stopped before returning.
    """
    vals = [float(v) for v in values]
    k = check_int("values", len(vals), 2)
    check_nonnegative("sigma_eta", sigma_eta)
    check_nonnegative("sigma_delta", sigma_delta)
    check_int("peers", peers, 1)
    check_int("reveal_budget", reveal_budget, 0)
    check_positive("timeout", timeout)
    if noise_keys is not None and len(noise_keys) != k:
        raise fail("noise_keys", len(noise_keys), f"one 32-byte key per party ({k})")
    sid = session if session is not None else os.urandom(16)
    names = [f"party-{i:03d}" for i in range(k)]
    identities = [IdentityKey(n) for n in names]
    roster = Roster.of(identities)
    gsession = GopaSession(
        session=sid,
        names=tuple(roster),
        edges=session_graph(sid, k, peers),
        sigma_eta=sigma_eta,
        sigma_delta=sigma_delta,
        reveal_budget=reveal_budget,
    )
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="renyi-gopa-"))
    procs: list[subprocess.Popen[bytes]] = []
    bindir = str(Path(_tool("flower-superlink")).parent)  # it starts flower-superexec
    env = {
        **os.environ,
        **_TELEMETRY_OFF,
        "FLWR_HOME": str(tmp / "flwr"),
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
    }
    try:
        (tmp / "flwr").mkdir()
        roster_file = tmp / "roster.json"
        roster_file.write_text(roster.to_json())
        port = _free_port()
        (tmp / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "127.0.0.1:{port}"\ninsecure = true\n'
        )
        log = (tmp / "superlink.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    _tool("flower-superlink"),
                    "--insecure",
                    "--disable-runtime-dependency-installation",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_port(port, time.monotonic() + 60)
        supernodes: list[subprocess.Popen[bytes]] = []
        for i, ident in enumerate(identities):
            key_file = tmp / f"{ident.name}.key"
            key_file.touch(mode=0o600)
            key_file.write_bytes(ident.private_bytes())
            cfg = {
                "name": ident.name,
                "key-file": str(key_file),
                "roster-file": str(roster_file),
                "value": vals[i],
                "clip": clip,
            }
            if noise_keys is not None:
                cfg["noise-key"] = noise_keys[i].hex()
            node_log = (tmp / f"{ident.name}.log").open("wb")
            p = subprocess.Popen(
                [
                    _tool("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{port}",
                    "--port",
                    str(_free_port()),
                    "--node-config",
                    " ".join(f"{a}={_toml(b)}" for a, b in cfg.items()),
                ],
                env=env,
                stdout=node_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            supernodes.append(p)
            procs.append(p)
        app = tmp / "app"
        app.mkdir()
        result_file, status_file = tmp / "result.json", tmp / "status.txt"
        run_config = {
            "roster-file": str(roster_file),
            "peers": peers,
            "sigma-eta": float(sigma_eta),
            "sigma-delta": float(sigma_delta),
            "reveal-budget": reveal_budget,
            "session": sid.hex(),
            "timeout": float(timeout),
            "grace": float(grace),
            "result-file": str(result_file),
            "status-file": str(status_file),
            "notify": notify,
        }
        client_component = "renyi.federated.gopa_flower:client_app"
        (app / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
            '[project]\nname = "renyi-gopa"\nversion = "1.0.0"\ndescription = "GOPA"\n'
            'license = "Apache-2.0"\ndependencies = []\n\n'
            '[tool.flwr.app]\npublisher = "renyi"\n\n'
            f'[tool.flwr.app.components]\nserverapp = "{server_component}"\n'
            f'clientapp = "{client_component}"\n\n[tool.flwr.app.config]\n'
            + "".join(f'"{a}" = {_toml(b)}\n' for a, b in run_config.items())
        )
        for fname, text in (app_files or {}).items():
            (app / fname).write_text(text)
        try:
            subprocess.run(
                [_tool("flwr"), "run", str(app), "loopback"],
                env=env,
                cwd=app,
                check=True,
                capture_output=True,
                timeout=120,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            tail = (exc.stderr or b"")[-500:].decode(errors="replace") if exc.stderr else ""
            raise ProtocolAbortedError(f"'flwr run' failed ({exc}); {tail}") from None
        end = started + timeout + 30
        seen = 0
        while not result_file.exists():
            if time.monotonic() > end:
                raise ProtocolAbortedError(f"no result within {timeout} s")
            if status_file.exists():
                lines = status_file.read_text().splitlines()
                for line in lines[seen:]:
                    if on_status is not None:
                        on_status(line, supernodes)
                seen = len(lines)
            time.sleep(0.05)
        time.sleep(0.05)
        raw = json.loads(result_file.read_text())
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    sent, received = raw.get("bytes_sent", {}), raw.get("bytes_received", {})
    per_party = (sum(sent.values()) + sum(received.values())) / k
    return DeploymentResult(
        status=str(raw.get("status")),
        estimate=raw.get("estimate"),
        included=tuple(raw.get("included", ())),
        dropped=tuple(raw.get("dropped", ())),
        rejected=tuple(raw.get("rejected", ())),
        reason=str(raw.get("reason", "")),
        wall_seconds=time.monotonic() - started,
        bytes_per_party=per_party,
        session=gsession,
        raw=raw,
    )
