"""The relay of :mod:`renyi.federated.relay` over Flower messages (optional ``flwr``).

Party side: :func:`relay_client_app` turns a factory of
:class:`~renyi.federated.relay.PartyEndpoint` into a Flower ``ClientApp``. Every relayed
message is a Flower ``query`` whose content is one ``ConfigRecord`` (:func:`pack`): the
header (protocol name, session id, phase) under keys starting with ``relay.``, the payload
under its own keys (one record: each record is one more object for Flower to push and pull
over HTTP); the reply has the same shape. The opening message of a
session builds the party (``factory(node_config, payload)``: the party's secrets and pinned
settings come from its own node config, never from the server); later messages of that
session go to the same live object, which exists only in the node's memory. So the party
must run on a long-lived node (:mod:`renyi.federated.flower_node`, or Flower's simulation
engine with one backend worker): under ``flower-supernode``, which starts a new process per
message, the second message finds no session and the party refuses (nothing is leaked,
nothing released). A node forgets a session when it ends (the party answers ``done``) or
refuses, and holds at most ``max_sessions`` (the oldest is forgotten first).

Server side: :func:`relay_over_grid` runs a :class:`~renyi.federated.relay.ServerDriver`
over a Flower ``Grid``: it waits for nodes, broadcasts the opening, binds each node to the
party the driver admits, then sends each round and collects the replies. A round waits for
every addressed node, at most ``timeout`` seconds, and at most ``max(grace, 2 x the time the
replies so far took)`` after the last reply (a slow machine stretches it): a node still
silent then is absent. Reply polling backs off from 10 ms to ``max_poll`` (5 ms after a
reply arrived: the others are usually close behind).
"""

from __future__ import annotations

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

try:
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid
except ImportError as exc:  # pragma: no cover - exercised only without flwr
    raise ImportError(
        "renyi.federated.flower_relay needs Flower: pip install 'renyi[flower]'"
    ) from exc

from renyi._validation import check_int, check_positive, fail
from renyi.errors import RenyiError
from renyi.federated.relay import Outcome, PartyEndpoint, Payload, Round, ServerDriver

__all__ = [
    "SERVER_MAX_POLL",
    "RelayStats",
    "payload_size",
    "relay_client_app",
    "relay_over_grid",
    "simulated_node_config",
]

PartyFactory = Callable[[Mapping[str, Any], Payload], PartyEndpoint]

_LIVE: dict[tuple[int, int, str, bytes], PartyEndpoint] = {}


def _fast_grid_pulls(first: float, cap: float) -> None:
    """Make the ServerApp's grid retry a reply's objects after ``first`` s, not 1 s.

    A node pushes its reply message, then the message's objects; a reply pulled in between
    has its objects retried by Flower's ``HttpGrid.pull_messages`` after 1 s (then 2, 4, ...;
    ``PULL_INITIAL_BACKOFF``, not configurable). With replies polled every few milliseconds
    that window is hit in most rounds (measured: 1.2 s added to 2 of 4 rounds at K = 5). The
    grid's module-level ``pull_objects`` is rebound, in this ServerApp process only, to the
    same function with a ``first``-second initial backoff capped at ``cap``; if Flower
    renames it, nothing is patched and rounds are merely slower.
    """
    try:
        from flwr.supercore.inflatable.inflatable_utils import pull_objects
        from flwr.superlink.grid import http_grid
    except ImportError:  # pragma: no cover - a Flower without the HTTP grid
        return
    if getattr(http_grid, "pull_objects", None) is pull_objects:
        http_grid.pull_objects = partial(pull_objects, initial_backoff=first, backoff_cap=cap)


SERVER_MAX_POLL = 0.2
"""The ServerApp's longest wait between two pulls of the replies it awaits (seconds;
``max-poll`` in the run config of :mod:`~renyi.federated.secagg_flower` and
:mod:`~renyi.federated.gopa_flower` changes it)."""

RECORD = "renyi-relay"
_HEAD = "relay."


def pack(head: Mapping[str, Any], payload: Mapping[str, Any]) -> RecordDict:
    """One relayed message's content: ``head`` under ``relay.`` keys, then ``payload``."""
    if bad := [k for k in payload if k.startswith(_HEAD)]:
        raise fail("payload", bad[:3], f"keys not starting with {_HEAD!r} (the relay's own)")
    rec = {**{_HEAD + k: v for k, v in head.items()}, **payload}
    return RecordDict({RECORD: ConfigRecord(rec)})  # type: ignore[arg-type]


def unpack(content: RecordDict) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(head, payload)`` of a relayed message (plain Python values, lists copied)."""
    head: dict[str, Any] = {}
    payload: dict[str, Any] = {}
    for k, v in content[RECORD].items():
        value = list(v) if isinstance(v, list) else v
        if k.startswith(_HEAD):
            head[k[len(_HEAD) :]] = value
        else:
            payload[k] = value
    return head, payload


_SIMULATED_KEYS = {"partition-id", "num-partitions"}
_SIMULATED_CONFIGS: dict[str, list[dict[str, Any]]] = {}


def simulated_node_config(
    node_config: Mapping[str, Any], run_config: Mapping[str, Any]
) -> dict[str, Any]:
    """A simulated node's own config: entry ``partition-id`` of the JSON file that
    :class:`~renyi.federated.flower_deploy.LocalDeployment` (``simulation=True``) wrote
    and named in the run config. Refused unless ``node_config`` is exactly what Flower's
    simulation engine gives a node (``partition-id``, ``num-partitions``): on a real node
    the run config comes from the server, which must never choose a party's secrets or pins.
    """
    from renyi.federated.flower_deploy import SIMULATED_NODES_KEY

    if set(node_config) != _SIMULATED_KEYS:
        raise fail(
            "node_config",
            sorted(node_config)[:4],
            "a simulated node's (partition-id, num-partitions): a simulation ClientApp takes"
            " its party's config from the run config, so it never runs on a real node",
        )
    path = str(run_config.get(SIMULATED_NODES_KEY, ""))
    if path not in _SIMULATED_CONFIGS:
        import json

        _SIMULATED_CONFIGS[path] = json.loads(Path(path).read_text())
    configs = _SIMULATED_CONFIGS[path]
    i, n = int(node_config["partition-id"]), int(node_config["num-partitions"])
    if n != len(configs) or not 0 <= i < n:
        raise fail("partition-id", i, f"one of the {len(configs)} simulated nodes")
    return dict(configs[i])


def _serve_message(
    protocol: str,
    factory: PartyFactory,
    max_sessions: int,
    msg: Message,
    context: Context,
    simulated: bool = False,
) -> Message:
    """Answer one relayed message (module level, so that the live sessions are this
    process's, also when Flower's simulation engine ships the ClientApp by value)."""
    head: dict[str, Any] = {}
    key: tuple[int, int, str, bytes] | None = None
    try:
        head, payload = unpack(msg.content)
        if head.get("protocol") != protocol:
            raise fail("protocol", head.get("protocol"), f"{protocol!r} (this node's party)")
        session, phase = bytes(head["session"]), str(head["phase"])
        key = (int(context.run_id), int(context.node_id), protocol, session)
        if bool(head.get("opening", False)):
            if key in _LIVE:
                raise fail("session", session.hex()[:16], "a session this party has not joined")
            mine = [k for k in _LIVE if k[1] == key[1]]
            for old in mine[: max(0, len(mine) - max_sessions + 1)]:
                del _LIVE[old]  # the oldest sessions are forgotten (they can only abort)
            node = (
                simulated_node_config(context.node_config, context.run_config)
                if simulated
                else dict(context.node_config)
            )
            _LIVE[key] = factory(node, payload)
        elif key not in _LIVE:
            raise fail(
                "session",
                session.hex()[:16],
                "a session this party holds (its state lives in a long-lived node's memory:"
                " run the party on renyi.federated.flower_node)",
            )
        out = dict(_LIVE[key].respond(phase, payload))
        if out.pop("done", False) or "abort" in out:
            _LIVE.pop(key, None)
    except (RenyiError, ValueError, KeyError, TypeError, OSError) as exc:
        if key is not None:
            _LIVE.pop(key, None)
        out = {"abort": f"{type(exc).__name__}: {exc}"}
    reply_head: dict[str, Any] = {k: head[k] for k in ("session", "phase") if k in head}
    try:
        content = pack(reply_head, out)
    except ValueError as exc:
        content = pack(reply_head, {"abort": f"{type(exc).__name__}: {exc}"})
    return Message(content, reply_to=msg)


def relay_client_app(
    protocol: str, factory: PartyFactory, *, max_sessions: int = 4, simulated: bool = False
) -> ClientApp:
    """A ClientApp that serves ``protocol``'s parties built by ``factory`` (module docstring).

    ``factory(node_config, opening_payload)`` is called on a session's opening message and
    returns the party's endpoint; a node keeps at most ``max_sessions`` sessions (opening
    another forgets the oldest, which then can only refuse). ``simulated=True``: for
    Flower's simulation engine only, the node config is :func:`simulated_node_config`.
    """
    check_int("max_sessions", max_sessions, 1)
    app = ClientApp()

    @app.query()
    def _query(msg: Message, context: Context) -> Message:
        return _serve_message(protocol, factory, max_sessions, msg, context, simulated)

    return app


def payload_size(payload: Mapping[str, Any]) -> int:
    """Bytes of a payload's values (bytes and str by length, numbers as 8): what parties
    and server exchange, not counting Flower's framing."""
    total = 0
    for v in payload.values():
        for x in v if isinstance(v, list) else [v]:
            total += len(x) if isinstance(x, bytes | str) else 8
    return total


@dataclass
class RelayStats:
    """What the relay saw: bytes to and from each party, progress, wall time per phase."""

    bytes_sent: dict[str, int] = field(default_factory=dict)
    bytes_received: dict[str, int] = field(default_factory=dict)
    phases: list[tuple[str, int, float]] = field(default_factory=list)  # (phase, replies, s)

    def add(self, table: dict[str, int], name: str, payload: Mapping[str, Any]) -> None:
        table[name] = table.get(name, 0) + payload_size(payload)


class _GridRelay:
    def __init__(
        self,
        grid: Grid,
        protocol: str,
        session: bytes,
        *,
        timeout: float,
        grace: float,
        max_poll: float,
        status: Path | None,
    ) -> None:
        self.grid, self.protocol, self.session = grid, protocol, session
        self.timeout, self.grace, self.max_poll = timeout, grace, max_poll
        self.status = status
        self.stats = RelayStats()

    def log(self, line: str) -> None:
        if self.status is not None:
            with self.status.open("a") as f:
                f.write(line + "\n")

    def wait_for_nodes(self, count: int, minimum: int) -> list[int]:
        """``count`` nodes, or at least ``minimum`` once no node joined for ``grace`` s,
        or whatever is there after ``timeout``."""
        now = time.monotonic()
        end, seen, changed = now + self.timeout, -1, now
        wait = 0.005
        while True:
            nodes = sorted(int(n) for n in self.grid.get_node_ids())
            now = time.monotonic()
            if len(nodes) != seen:
                seen, changed = len(nodes), now
            if len(nodes) >= count or now > end:
                return nodes
            if len(nodes) >= minimum and now > changed + self.grace:
                return nodes
            time.sleep(wait)
            wait = min(0.1, wait * 1.5)

    def exchange(
        self, phase: str, contents: Mapping[int, Payload], opening: bool, names: Mapping[int, str]
    ) -> dict[int, dict[str, Any]]:
        msgs = []
        for node, payload in contents.items():
            head: dict[str, Any] = {
                "protocol": self.protocol,
                "session": self.session,
                "phase": phase,
            }
            if opening:
                head["opening"] = True
            self.stats.add(self.stats.bytes_sent, names.get(node, str(node)), payload)
            msgs.append(
                Message(
                    pack(head, payload),
                    dst_node_id=node,
                    message_type=MessageType.QUERY,
                )
            )
        start = time.monotonic()
        ids = list(self.grid.push_messages(msgs))
        owner = dict(zip(ids, contents, strict=True))
        pending = set(ids)
        replies: dict[int, dict[str, Any]] = {}
        last: float | None = None
        wait = 0.01  # a reply needs a node's poll, its work and its pushes: never < 10 ms
        while pending:
            now = time.monotonic()
            if now > start + self.timeout:
                break
            if last is not None and now > last + max(self.grace, 2.0 * (last - start)):
                break
            got = list(self.grid.pull_messages(list(pending)))
            for reply in got:
                mid = reply.metadata.reply_to_message_id
                if mid not in pending:
                    continue
                pending.discard(mid)
                last = time.monotonic()
                node = owner[mid]
                if reply.has_error() or RECORD not in reply.content:
                    continue
                try:
                    head, payload = unpack(reply.content)
                except (KeyError, TypeError):
                    continue
                if head.get("session") != self.session or head.get("phase") != phase:
                    continue  # a reply to some other message: ignored
                self.stats.add(self.stats.bytes_received, names.get(node, str(node)), payload)
                replies[node] = payload
            if pending:
                wait = 0.005 if got else min(self.max_poll, wait * 1.5)
                time.sleep(wait)
        self.stats.phases.append((phase, len(replies), time.monotonic() - start))
        return replies


def relay_over_grid(
    grid: Grid,
    driver: ServerDriver,
    *,
    protocol: str,
    session: bytes,
    expected_nodes: int,
    min_nodes: int | None = None,
    timeout: float = 120.0,
    grace: float = 5.0,
    max_poll: float = SERVER_MAX_POLL,
    status_file: Path | None = None,
) -> tuple[Outcome, RelayStats]:
    """Run ``driver`` over ``grid`` (module docstring); returns its outcome and the relay's
    counters (bytes are counted per party name once bound, else per node id).

    Waits up to ``timeout`` for ``expected_nodes`` nodes, or goes on with at least
    ``min_nodes`` (default: all expected) once no new node appeared for ``grace`` seconds.
    ``status_file`` gets a line per step (``nodes N``, ``<phase> <replies>``, then the
    outcome's status) as it happens.
    """
    check_positive("timeout", timeout)
    check_positive("grace", grace)
    check_int("expected_nodes", expected_nodes, 1)
    if not isinstance(session, bytes) or not session:
        raise fail("session", type(session).__name__, "non-empty bytes")
    _fast_grid_pulls(0.005, max(0.005, max_poll))
    relay = _GridRelay(
        grid, protocol, session, timeout=timeout, grace=grace, max_poll=max_poll, status=status_file
    )
    nodes = relay.wait_for_nodes(
        expected_nodes,
        expected_nodes if min_nodes is None else check_int("min_nodes", min_nodes, 1),
    )
    relay.log(f"nodes {len(nodes)}")
    phase, opening = driver.opening()
    got = relay.exchange(phase, dict.fromkeys(nodes, opening), True, {})
    node_of: dict[str, int] = {}
    replies: dict[str, Payload] = {}
    for node, reply in got.items():
        if "abort" in reply:
            replies[f"?{node}"] = reply
            continue
        name = driver.admit(reply)
        if name is None:
            continue  # a node that is not a party of this session: ignored
        if name in node_of:
            outcome = Outcome("aborted", {"reason": f"two nodes claim party {name!r}"})
            relay.log(outcome.status)
            return outcome, relay.stats
        node_of[name], replies[name] = node, reply
    names = {n: p for p, n in node_of.items()}
    for table in (relay.stats.bytes_sent, relay.stats.bytes_received):
        for key in list(table):
            if key.isdigit() and int(key) in names:
                table[names[int(key)]] = table.pop(key)
    relay.log(f"{phase} {len(node_of)}")
    while True:
        step = driver.advance(replies)
        if isinstance(step, Outcome):
            relay.log(step.status)
            return step, relay.stats
        if not isinstance(step, Round):
            raise fail("advance", type(step).__name__, "a Round or an Outcome")
        contents = {node_of[p]: m for p, m in step.messages.items() if p in node_of}
        got = relay.exchange(step.phase, contents, False, names)
        replies = {names[n]: r for n, r in got.items()}
        relay.log(f"{step.phase} {len(replies)}")
