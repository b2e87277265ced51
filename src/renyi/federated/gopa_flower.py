"""GOPA on Flower: one long-lived node per party, the ServerApp as an untrusted relay.

The parties and the server exchange the messages of :mod:`renyi.federated.gopa_party`
through the protocol-agnostic relay of :mod:`renyi.federated.relay`
(:class:`GopaPartyEndpoint` on each party, :class:`GopaDriver` on the server), carried by
Flower ``query`` messages (:mod:`renyi.federated.flower_relay`):

=========  =====================================  =======================================
phase      server -> party                        party -> server
=========  =====================================  =======================================
join       session parameters, roster fingerprint  signed ephemeral key advertisement
pair       directory of advertisements             one AEAD message per neighbour
mask       present parties, the party's inbox      masked value (fixed point mod 2**64)
reveal     dropped parties (only after dropouts)   terms of the broken edges (budgeted)
result     the released estimate                   acknowledgement (the party forgets)
=========  =====================================  =======================================

Each party runs :data:`client_app` on a :mod:`renyi.federated.flower_node` node (one
process for its whole life: it runs only this locally installed app, never code from the
server's app bundle, and keeps its session state in memory), configured with
``--node-config`` keys ``name`` (its roster name), ``key-file`` (its raw 32-byte Ed25519
private key), ``roster-file`` (the pinned roster, JSON; see
:class:`renyi.federated.channels.Roster`), ``value`` (its private number in ``[0, 1]``),
optionally ``clip`` (clip instead of refusing an out-of-range value) and ``noise-key`` (hex
32 bytes: makes its ``eta`` reproducible; leave it out in production, the OS CSPRNG is
used). :data:`server_app` relays and aggregates.

The communication graph is derived from the session id (:func:`session_graph`) and every
party recomputes it. A party whose check fails (substituted key, roster mismatch, broken
AEAD, budget exceeded) answers with the reason and forgets the session; the server then
releases nothing. A party that does not answer in time is a dropout (recovered within the
reveal budget, else the session aborts).

:func:`run_local_deployment` starts a real local deployment on loopback
(:class:`~renyi.federated.flower_deploy.LocalDeployment`: ``flower-superlink`` and one
node per party), runs one session, stops every process and returns the outcome; the CLI
``renyi federated gopa-run`` wraps it. Flower telemetry and Ray usage statistics are off.
"""

from __future__ import annotations

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import hashlib
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

try:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - exercised only without flwr
    raise ImportError(
        "renyi.federated.gopa_flower needs Flower: pip install 'renyi[flower]'"
    ) from exc

from renyi._validation import check_int, check_nonnegative, check_positive, fail
from renyi.errors import RenyiError
from renyi.federated.channels import ChaCha20Source, IdentityKey, KeyAdvertisement, Roster
from renyi.federated.flower_deploy import (
    Deadline,
    DeploymentError,
    LocalDeployment,
    NodeKind,
    NodeProcess,
    NodeStart,
    deployment_files,
    write_result,
)
from renyi.federated.flower_relay import SERVER_MAX_POLL, relay_client_app, relay_over_grid
from renyi.federated.gopa_party import (
    GopaAggregator,
    GopaParty,
    GopaSession,
    ProtocolAbortedError,
)
from renyi.federated.relay import Outcome, Payload, Round, ScriptedDriver

__all__ = [
    "DeploymentResult",
    "GopaDriver",
    "GopaPartyEndpoint",
    "client_app",
    "deployment_files",
    "run_local_deployment",
    "run_simulated_session",
    "serve",
    "server_app",
    "session_graph",
    "simulation_client_app",
]

PROTOCOL = "renyi-gopa"


def session_graph(session: bytes, parties: int, peers: int) -> NDArray[np.int64]:
    """The m-out peer graph of a session, drawn from ``SHA-256(label, session)``.

    Everyone recomputes it; the server cannot pick the graph (only re-draw session ids,
    which parties see).
    """
    key = hashlib.sha256(b"renyi-gopa-graph|" + session).digest()
    from renyi.federated.gopa import random_peer_graph

    return random_peer_graph(parties, peers, ChaCha20Source(key))  # type: ignore[arg-type]


_SESSION_KEYS = (
    "session",
    "peers",
    "sigma-eta",
    "sigma-delta",
    "reveal-budget",
    "rejection-probability",
)


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


class GopaPartyEndpoint:
    """One party's answers to the relayed GOPA messages (see the module table).

    Built from the party's own node config (name, key file, pinned roster, value); the
    session parameters come from the server's join message and are checked by
    :class:`~renyi.federated.gopa_party.GopaSession` and :class:`GopaParty`.
    """

    def __init__(self, node: Mapping[str, Any]) -> None:
        name = str(node["name"])
        self.roster = Roster.from_json(Path(str(node["roster-file"])).read_text())
        identity = IdentityKey.from_private_bytes(name, Path(str(node["key-file"])).read_bytes())
        noise = node.get("noise-key")
        rng = ChaCha20Source(bytes.fromhex(str(noise))) if noise else None
        self.party = GopaParty(
            identity, self.roster, float(node["value"]), clip=bool(node.get("clip", False)), rng=rng
        )
        self.session: GopaSession | None = None

    def respond(self, phase: str, payload: Payload) -> dict[str, Any]:
        party = self.party
        if phase == "join":
            if str(payload["roster"]) != self.roster.fingerprint():
                raise ProtocolAbortedError("the server's roster is not the one this party pinned")
            self.session = _session_from(payload, self.roster)
            return {"advertisement": party.join(self.session).to_bytes()}
        if self.session is None:
            raise ProtocolAbortedError(f"{party.name!r} got {phase!r} before joining")
        if phase == "pair":
            box = party.pair(dict(zip(payload["names"], payload["adverts"], strict=True)))
            return {"to": list(box), "ct": list(box.values())}
        if phase == "mask":
            inbox = dict(zip(payload["from"], payload["ct"], strict=True))
            return {"masked": party.mask(inbox, list(payload["present"])).tobytes()}
        if phase == "reveal":
            terms = party.reveal(list(payload["dropped"]))
            return {
                "edges": [int(e) for e in terms],
                "terms": [t.tobytes() for t in terms.values()],
            }
        if phase == "result":
            return {"ack": True, "done": True}
        raise ProtocolAbortedError(f"unknown phase {phase!r}")


def _make_party(node: Mapping[str, Any], opening: Payload) -> GopaPartyEndpoint:
    return GopaPartyEndpoint(node)


client_app = relay_client_app(PROTOCOL, _make_party)
"""The party's ClientApp: run it on :mod:`renyi.federated.flower_node` (module docstring)."""

simulation_client_app = relay_client_app(PROTOCOL, _make_party, simulated=True)
"""The same party on Flower's simulation engine only (:func:`run_simulated_session`): it
takes its config from the file the run config names, so it refuses to run on a real node."""


# --------------------------------------------------------------------------- server side


class _NeedReveal(Exception):
    def __init__(self, dropped: list[str]) -> None:
        self.dropped = dropped


class GopaDriver(ScriptedDriver):
    """The server's side of one GOPA session: relays, checks, recovers dropouts, releases.

    ``params``: ``session`` (bytes), ``peers``, ``sigma-eta``, ``sigma-delta``,
    ``reveal-budget``, ``rejection-probability``; ``notify``: send the result round.
    """

    def __init__(self, roster: Roster, params: Mapping[str, Any], *, notify: bool = True) -> None:
        self.roster = roster
        self.params = {k: params[k] for k in _SESSION_KEYS}
        self.session = _session_from(self.params, roster)
        self.notify = notify
        self.adverts: dict[str, bytes] = {}

    def opening(self) -> tuple[str, Payload]:
        return "join", {"roster": self.roster.fingerprint(), **self.params}

    def admit(self, reply: Payload) -> str | None:
        try:
            adv = KeyAdvertisement.from_bytes(bytes(reply["advertisement"]))
            adv.verify(self.roster, self.session.session)
        except (RenyiError, KeyError, TypeError, ValueError):
            return None  # not a party of the roster: ignored
        self.adverts[adv.name] = adv.to_bytes()
        return adv.name

    @staticmethod
    def _aborts(replies: Mapping[str, Payload]) -> list[str]:
        return [f"{n.lstrip('?')}: {r['abort']}" for n, r in replies.items() if "abort" in r]

    def script(
        self, joined: Mapping[str, Payload]
    ) -> Generator[Round, Mapping[str, Payload], Outcome]:
        s, sid = self.session, self.session.session
        if bad := self._aborts(joined):
            return Outcome("aborted", {"reason": f"a party refused to join: {bad}"})
        names = sorted(p for p in joined if p in self.adverts)
        pair = {}
        for p in names:  # each party gets its neighbours' advertisements (the graph is public)
            peers = [q for q in (s.names[v] for v in s.neighbours(s.index(p))) if q in joined]
            pair[p] = {"names": peers, "adverts": [self.adverts[q] for q in peers]}
        replies = yield Round("pair", pair)
        if bad := self._aborts(replies):
            return Outcome("aborted", {"reason": f"pairing refused: {bad}"})
        outboxes = {p: dict(zip(r["to"], r["ct"], strict=True)) for p, r in replies.items()}
        present = sorted(outboxes)
        inboxes = GopaAggregator.route(outboxes)
        mask = {}
        for p in present:
            box = inboxes.get(p, {})
            mask[p] = {"present": present, "from": list(box), "ct": list(box.values())}
        replies = yield Round("mask", mask)
        if bad := self._aborts(replies):
            return Outcome("aborted", {"reason": f"masking refused: {bad}"})
        messages: dict[int, object] = {}
        for p, r in replies.items():
            raw = r.get("masked")
            if isinstance(raw, bytes) and len(raw) == 8 * s.dimension:
                messages[s.index(p)] = np.frombuffer(raw, dtype=np.uint64).copy()
            else:
                messages[s.index(p)] = raw  # rejected by the aggregator's check
        answers: dict[int, dict[int, NDArray[np.uint64]]] | None = None

        def reveal(dropped: list[str]) -> dict[int, dict[int, NDArray[np.uint64]]]:
            if answers is None:
                raise _NeedReveal(dropped)
            return answers

        agg = GopaAggregator(s)
        idx = [s.index(p) for p in present]
        try:
            try:
                res = agg.release(messages, idx, reveal)
            except _NeedReveal as need:
                asked = {
                    p: {"dropped": need.dropped}
                    for p in present
                    if p not in need.dropped and s.index(p) in messages
                }
                replies = yield Round("reveal", asked)
                if bad := self._aborts(replies):
                    return Outcome("aborted", {"reason": f"dropout recovery refused: {bad}"})
                answers = {
                    s.index(p): {
                        int(e): np.frombuffer(t, dtype=np.uint64).copy()
                        for e, t in zip(r.get("edges", []), r.get("terms", []), strict=False)
                    }
                    for p, r in replies.items()
                }
                res = agg.release(messages, idx, reveal)
        except ProtocolAbortedError as exc:
            return Outcome("aborted", {"reason": str(exc)})
        estimate = float(np.asarray(res.estimate).ravel()[0])
        detail = {
            "estimate": estimate,
            "included": [s.names[i] for i in res.included],
            "dropped": [s.names[i] for i in res.dropped],
            "rejected": [s.names[i] for i in res.rejected],
            "revealed_edges": list(res.revealed_edges),
            "false_rejection_bound": res.false_rejection_bound,
            "session": sid.hex(),
        }
        if self.notify:
            yield Round("result", {s.names[i]: {"estimate": estimate} for i in res.included})
        return Outcome("released", detail)


def serve(grid: Grid, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ServerApp's work: run one GOPA session over ``grid``; returns the outcome dict.

    ``config`` (the run config): ``roster-file``, ``peers``, ``sigma-eta``,
    ``sigma-delta``, ``reveal-budget``, optional ``session`` (hex), ``timeout``,
    ``grace``, ``rejection-probability``, ``notify``, ``status-file``.
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
    driver = GopaDriver(roster, params, notify=bool(config.get("notify", True)))
    status = Path(str(config["status-file"])) if config.get("status-file") else None
    outcome, stats = relay_over_grid(
        grid,
        driver,
        protocol=PROTOCOL,
        session=sid,
        expected_nodes=len(roster),
        timeout=float(config.get("timeout", 120)),
        grace=float(config.get("grace", 5)),
        max_poll=float(config.get("max-poll", SERVER_MAX_POLL)),
        status_file=status,
    )
    return {
        "status": outcome.status,
        **outcome.detail,
        "bytes_sent": stats.bytes_sent,
        "bytes_received": stats.bytes_received,
        "phases": stats.phases,
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
        write_result(str(cfg["result-file"]), out)


# --------------------------------------------------------------------------- local deployment


@dataclass(frozen=True)
class DeploymentResult:
    """Outcome of :func:`run_local_deployment` (``estimate`` is ``None`` if it aborted).

    ``wall_seconds``: from starting the SuperLink to the result (processes stopped after);
    ``bytes_per_party``: payload bytes to and from the server per party (Flower's framing
    not counted); ``cpu_seconds``: CPU time of the SuperLink's and the nodes' processes
    (:meth:`~renyi.federated.flower_deploy.LocalDeployment.cpu_seconds`, a lower bound).
    """

    status: str
    estimate: float | None
    included: tuple[str, ...]
    dropped: tuple[str, ...]
    rejected: tuple[str, ...]
    reason: str
    wall_seconds: float
    bytes_per_party: float
    session: GopaSession | None = field(default=None, repr=False)
    cpu_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


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
    deadline: Deadline | None = None,
    grace: float = 5.0,
    clip: bool = False,
    notify: bool = True,
    node: NodeKind = "renyi",
    start: NodeStart = "fork",
    server_component: str = "renyi.federated.gopa_flower:server_app",
    app_files: Mapping[str, str] | None = None,
    on_status: Callable[[str, list[NodeProcess]], None] | None = None,
) -> DeploymentResult:
    """Run GOPA on a real local Flower deployment (loopback only) and stop it again.

    Starts ``flower-superlink`` (plain HTTP on 127.0.0.1: the GOPA messages are end-to-end
    authenticated and encrypted by :mod:`renyi.federated.channels`) and one node per value
    (:mod:`renyi.federated.flower_node`, each with its own identity key file and value;
    ``node="flower-supernode"``: Flower's stock SuperNode instead, which cannot hold a
    session: see :mod:`renyi.federated.flower_relay`), runs the app with ``flwr run`` and
    waits for the server's result; ``timeout`` bounds the whole call (keys, start, run: once
    it passes, :class:`~renyi.federated.flower_deploy.DeploymentTimeoutError` or
    :class:`~renyi.federated.gopa_party.ProtocolAbortedError` saying so; ``deadline``, a
    :class:`~renyi.federated.flower_deploy.Deadline` begun earlier, replaces it).
    ``on_status(line, nodes)`` is called for each progress line of the server (``nodes 5``,
    ``join 5``, ``pair 5``, ``mask 4``, ...), e.g. to kill a node mid-protocol.
    ``notify=False`` skips the last round (parties told the result).
    ``server_component``/``app_files`` replace the ServerApp (tests: a malicious relay).
    ``start``: the nodes are forked from one launcher (``"fork"``, default) or each started
    as its own program (``"exec"``; see
    :class:`~renyi.federated.flower_deploy.LocalDeployment`). Every started process is
    stopped before returning.
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
    started = time.monotonic()
    limit = Deadline.after(timeout) if deadline is None else deadline
    dep = LocalDeployment(
        [{}] * k,
        "renyi.federated.gopa_flower:client_app",
        node=node,
        start=start,
        deadline=limit,
    )
    try:
        roster, roster_file, dep.node_configs = deployment_files(
            dep.workdir, vals, clip=clip, noise_keys=noise_keys, deadline=limit
        )
    except BaseException:
        dep.close()
        raise
    gsession = GopaSession(
        session=sid,
        names=tuple(roster),
        edges=session_graph(sid, k, peers),
        sigma_eta=sigma_eta,
        sigma_delta=sigma_delta,
        reveal_budget=reveal_budget,
    )
    with dep:
        left = max(limit.left(), 1e-3)  # <= 0: dep.run raises the timeout
        run_config = {
            "roster-file": str(roster_file),
            "peers": peers,
            "sigma-eta": float(sigma_eta),
            "sigma-delta": float(sigma_delta),
            "reveal-budget": reveal_budget,
            "session": sid.hex(),
            "timeout": left,
            "grace": float(grace),
            "notify": notify,
        }
        try:
            raw = dep.run(
                server_component,
                run_config,
                app_files=app_files,
                timeout=left,
                on_status=on_status,
            )
        except DeploymentError as exc:
            raise ProtocolAbortedError(str(exc)) from None
        cpu = dep.cpu_seconds()
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
        cpu_seconds=cpu,
    )


def run_simulated_session(
    values: Sequence[float],
    *,
    sigma_eta: float,
    sigma_delta: float,
    peers: int,
    reveal_budget: int = 0,
    noise_keys: Sequence[bytes] | None = None,
    session: bytes | None = None,
    timeout: float = 600.0,
    grace: float = 30.0,
    notify: bool = False,
) -> DeploymentResult:
    """One GOPA session on Flower's simulation engine (Ray, one backend worker).

    The same ClientApp code, relay and driver as a deployment, submitted with ``flwr run``
    to a SuperLink in simulation mode (:class:`~renyi.federated.flower_deploy.
    LocalDeployment` with ``simulation=True``; the supported replacement of Flower's
    deprecated ``run_simulation``): the ServerApp runs in Flower's simulation process and
    every party's endpoint lives in its single Ray worker (a party's state is in its
    worker's memory, so one worker is required: with several, a party meeting a message on
    another worker refuses and the session aborts). For scale tests (K = 100 in
    ``benchmarks/gopa.py``): a deployment starts one process per party.
    """
    vals = [float(v) for v in values]
    k = check_int("values", len(vals), 2)
    if noise_keys is not None and len(noise_keys) != k:
        raise fail("noise_keys", len(noise_keys), f"one 32-byte key per party ({k})")
    sid = session if session is not None else os.urandom(16)
    started = time.monotonic()
    limit = Deadline.after(timeout)
    dep = LocalDeployment(
        [{}] * k,
        "renyi.federated.gopa_flower:simulation_client_app",
        simulation=True,
        deadline=limit,
    )
    try:
        _, roster_file, dep.node_configs = deployment_files(
            dep.workdir, vals, noise_keys=noise_keys, deadline=limit
        )
    except BaseException:
        dep.close()
        raise
    cfg = {
        "roster-file": str(roster_file),
        "peers": peers,
        "sigma-eta": float(sigma_eta),
        "sigma-delta": float(sigma_delta),
        "reveal-budget": reveal_budget,
        "session": sid.hex(),
        "grace": float(grace),
        "notify": notify,
    }
    with dep:
        try:
            left = max(limit.left(), 1e-3)  # the whole call, Ray's start included
            cfg["timeout"] = left
            out = dep.run("renyi.federated.gopa_flower:server_app", cfg, timeout=left)
        except DeploymentError as exc:
            raise ProtocolAbortedError(str(exc)) from None
        cpu = dep.cpu_seconds()
    sent, received = out.get("bytes_sent", {}), out.get("bytes_received", {})
    return DeploymentResult(
        status=str(out.get("status", "aborted")),
        estimate=out.get("estimate"),
        included=tuple(out.get("included", ())),
        dropped=tuple(out.get("dropped", ())),
        rejected=tuple(out.get("rejected", ())),
        reason=str(out.get("reason", "" if out else "the simulation produced no result")),
        wall_seconds=time.monotonic() - started,
        bytes_per_party=(sum(sent.values()) + sum(received.values())) / k,
        session=None,
        raw=out,
        cpu_seconds=cpu,
    )
