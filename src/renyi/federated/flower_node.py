"""A long-lived Flower SuperNode that runs its own pinned ClientApp in-process.

Flower's ``flower-supernode`` (flwr 1.41/1.42) runs every message in a new ``ClientApp``
process (``--isolation subprocess``: started by its ``flower-superexec``; ``--isolation
process``: started by an external executor, still one process per task), polls the
SuperLink every 3 s when idle (``time.sleep(3)`` in its main loop, not configurable), and
runs whatever ``ClientApp`` the SuperLink's app bundle (FAB) names. For a party of a
secure-aggregation protocol all three hurt:

* **code from the server**: the FAB is chosen by whoever submits the run, i.e. the server a
  party must not trust; a ServerApp that ships its own ClientApp reads the party's
  ``--node-config`` (its value, its key file) directly. Flower's answer is FAB signatures
  (``--trusted-entities``), which need a SuperLink that supports verification;
* **state between rounds** has to be exported to Flower's ``Context`` (sent to the
  SuperNode over its Runtime API) and restored by the next process;
* **time**: ~1-2 s of CPU to start each process (K = 10 GOPA: ~74 processes) and up to 3 s
  per round waiting on the idle poll.

:func:`run_node` is a SuperNode built from Flower's own Fleet-API connection (the one
``flower-supernode`` uses: node registration, activation, heartbeats, message and object
transfer over HTTP) whose loop runs one locally chosen ``ClientApp`` in the node's process:
the FAB is never downloaded or executed (its ``[tool.flwr.app.config]`` is read as data,
only for ``context.run_config``), the ``Context`` of a run stays in memory for the life of
the node, and the idle poll backs off from ``first_poll`` to ``max_poll`` (reset by every
message), so a round costs milliseconds, not seconds, of waiting. Everything else is
Flower's: the SuperLink sees an ordinary SuperNode.

Run it as ``python -m renyi.federated.flower_node --superlink 127.0.0.1:9092 --insecure
--app renyi.federated.gopa_flower:client_app --node-config 'name="party-001" ...'``.

**Many nodes on one machine** (:func:`fork_nodes`, ``--nodes-file``): a node's process
spends ~1 s of CPU importing Python modules (numpy, scipy, cryptography, Flower, renyi)
before it does anything, so K nodes started one by one on one machine cost K times that. A
launcher process imports the ``ClientApp`` once and forks one node per configuration; each
child is then an ordinary node: its own process and process group (``os.setsid``), its own
log, its own Fleet connection, its own keys read from its own node config, and it dies with
the launcher (``PR_SET_PDEATHSIG``). Nothing secret exists in the launcher before it forks
(a party reads its key file and value when its first session opens); renyi's CSPRNG pool is
discarded in a forked child (``renyi.random``) and OpenSSL reseeds after ``fork``, so no two
nodes share random bytes (``tests/test_federated_flower_node.py``). On separate machines
each party runs its own ``python -m renyi.federated.flower_node``, as above.

This uses Flower modules that are not its documented public API
(``flwr.supernode.fleet_http_connection``, ``flwr.supercore.inflatable``); tested with
flwr 1.42.0 (``tests/test_federated_flower_node.py`` fails loudly if they change).
"""

from __future__ import annotations

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import argparse
import contextlib
import importlib
import json
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

try:
    from flwr.app import Context, Error, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.common.config import get_fused_config_from_fab, parse_config_args
    from flwr.common.constant import ErrorCode
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )
    from flwr.supercore.inflatable.inflatable_utils import (
        pull_and_inflate_object_from_tree,
        push_objects,
    )
    from flwr.supernode.fleet_http_connection import http_request_response
except ImportError as exc:  # pragma: no cover - exercised only without flwr
    raise ImportError(
        "renyi.federated.flower_node needs Flower: pip install 'renyi[flower]'"
    ) from exc

from renyi._validation import check_positive, fail

__all__ = ["NodeStats", "Poll", "fork_nodes", "load_client_app", "main", "run_node"]


@dataclass(frozen=True)
class Poll:
    """Idle polling of the SuperLink: ``first`` seconds after a message, growing by
    ``factor`` per empty answer up to ``cap``. A message waits at most about a third of
    the time since the node's last message (``factor`` 1.5), and at most ``cap``; an idle
    node makes about ``1/cap`` requests per second. Each poll is an HTTP request the
    SuperLink answers in Python (3-5 ms of its CPU, all of Flower's HTTP stack): a relayed
    round's next message needs every party's reply and the ServerApp's work first (0.3-3 s
    at K = 10 on 2 cores), so polling sooner than ``first`` (0.1 s) after a reply only
    loads the SuperLink, which on a loaded machine is what every round waits for
    (``benchmarks/gopa.py``: K = 10 double-masked GOPA, 0.02 s / 0.2 s before). Objects of
    a message being received are retried after 5 ms instead (they are pushed right after
    the message)."""

    first: float = 0.1
    cap: float = 1.0
    factor: float = 1.5

    def __post_init__(self) -> None:
        check_positive("first", self.first)
        check_positive("cap", self.cap)
        if self.cap < self.first:
            raise fail("cap", self.cap, f">= first ({self.first})")
        if self.factor < 1.0:
            raise fail("factor", self.factor, ">= 1")


@dataclass
class NodeStats:
    """What a node did (for tests and benchmarks)."""

    node_id: int = 0
    messages: int = 0
    polls: int = 0
    app_seconds: float = 0.0


def load_client_app(ref: str) -> ClientApp:
    """The ``ClientApp`` at ``"package.module:attribute"`` (imported locally, never from a FAB)."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise fail("app", ref, "'package.module:attribute' naming a flwr ClientApp")
    app = getattr(importlib.import_module(module), attr, None)
    if not isinstance(app, ClientApp):
        raise fail("app", ref, "an attribute holding a flwr.clientapp.ClientApp")
    return app


def _run_config(get_run: Any, get_fab: Any, run_id: int) -> dict[str, Any]:
    """The run's config (FAB defaults fused with overrides), read as data only."""
    run = get_run(run_id)
    fab = get_fab(run.fab_hash, run_id)
    return dict(get_fused_config_from_fab(fab.content, run))


def _reply(app: ClientApp, message: Message, context: Context) -> Message:
    try:
        return app(message=message, context=context)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        return Message(
            Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message
        )


def run_node(
    superlink: str,
    app: ClientApp | str,
    node_config: Mapping[str, Any] | None = None,
    *,
    insecure: bool = True,
    root_certificates: bytes | str | None = None,
    poll: Poll | None = None,
    stop: threading.Event | None = None,
    max_wait_time: float | None = None,
    stats: NodeStats | None = None,
) -> NodeStats:
    """Serve ``app`` as a SuperNode of the SuperLink at ``superlink`` until ``stop`` is set.

    ``superlink``: the SuperLink's Fleet API address (``host:port``); ``insecure=True`` is
    plain HTTP (loopback only; otherwise pass ``root_certificates`` for TLS). ``app`` is a
    ``ClientApp`` or its ``"module:attribute"`` reference, imported here. Each message is
    answered in this process with the run's long-lived ``Context`` (``node_config`` as
    given, ``state`` kept in memory, ``run_config`` from the run). An exception in the app
    becomes an error reply; the node keeps serving. Returns counters (:class:`NodeStats`).
    """
    client_app = load_client_app(app) if isinstance(app, str) else app
    if not isinstance(client_app, ClientApp):
        raise fail("app", type(client_app).__name__, "a flwr ClientApp or its reference")
    cfg = dict(node_config or {})
    poll = poll or Poll()
    stop = stop or threading.Event()
    stats = stats if stats is not None else NodeStats()
    contexts: dict[int, Context] = {}
    with http_request_response(
        superlink, insecure, root_certificates, None, None, max_wait_time
    ) as conn:
        node_id, receive, send, get_run, get_fab, pull_object, push_object, confirm = conn
        stats.node_id = int(node_id)
        wait = poll.first
        while not stop.is_set():
            got = receive()
            stats.polls += 1
            if got is None:
                stop.wait(wait)
                wait = min(poll.cap, wait * poll.factor)
                continue
            wait = poll.first
            head, tree = got
            run_id = int(head.metadata.run_id)
            message = pull_and_inflate_object_from_tree(
                tree,
                partial(pull_object, run_id),
                partial(confirm, run_id),
                return_type=Message,
                initial_backoff=min(poll.first, 0.005),
                backoff_cap=poll.cap,
            )
            message.metadata.__dict__["_message_id"] = tree.object_id
            if run_id not in contexts:
                contexts[run_id] = Context(
                    run_id=run_id,
                    node_id=int(node_id),
                    node_config=cfg,
                    state=RecordDict(),
                    run_config=_run_config(get_run, get_fab, run_id),
                )
            started = time.perf_counter()
            reply = _reply(client_app, message, contexts[run_id])
            took = time.perf_counter() - started
            stats.app_seconds += took
            stats.messages += 1
            reply.metadata.__dict__["_message_id"] = reply.object_id
            with no_object_id_recompute():
                reply_tree = get_object_tree(reply)
                objects = get_all_nested_objects(reply)
                ids, session = send(reply, reply_tree, took)
                push_objects(objects, partial(push_object, run_id, session), object_ids_to_push=ids)
    return stats


def _wait_for(address: str, timeout: float = 60.0) -> None:
    """Until ``host:port`` accepts TCP connections (at most ``timeout`` s; then go on and
    let Flower's own retries report it)."""
    host, _, port = address.rpartition(":")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex((host.strip("[]") or "127.0.0.1", int(port))) == 0:
                return
        time.sleep(0.02)


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent (the launcher) exits."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _child(
    superlink: str,
    app: ClientApp,
    node_config: Mapping[str, Any],
    log: Path,
    kwargs: Mapping[str, Any],
) -> int:
    """The body of one forked node: its own session, log and signal handlers."""
    os.setsid()
    _die_with_parent()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: stop.set())
    stats = NodeStats()
    try:
        run_node(superlink, app, node_config, stop=stop, stats=stats, **kwargs)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        print(f"flower_node {os.getpid()}: {stats}", flush=True)
    return 0


def fork_nodes(
    superlink: str,
    app: ClientApp | str,
    nodes: list[tuple[Mapping[str, Any], Path]],
    **kwargs: Any,
) -> list[int]:
    """Fork one node per ``(node_config, log_file)`` from this process (module docstring);
    returns their process ids. ``app`` is imported here, once, before any fork; ``kwargs``
    go to :func:`run_node` (``insecure``, ``root_certificates``, ``poll``, ...). Call it
    from a process that runs no other threads (a launcher): a child of a threaded process
    may inherit a held lock."""
    client_app = load_client_app(app) if isinstance(app, str) else app
    if threading.active_count() > 1:
        raise fail("fork_nodes", threading.active_count(), "a process with one thread")
    _wait_for(superlink)
    pids = []
    for cfg, log in nodes:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child (covered by deployment tests)
            code = 1
            try:
                code = _child(superlink, client_app, dict(cfg), Path(log), kwargs)
            finally:
                os._exit(code)
        pids.append(pid)
    return pids


def _serve_launcher(args: argparse.Namespace, certs: bytes | None) -> None:
    """``--nodes-file``: fork the nodes, write their ids, forward SIGTERM, reap them."""
    spec = json.loads(Path(args.nodes_file).read_text())
    nodes = [(n["config"], Path(n["log"])) for n in spec["nodes"]]
    pids = fork_nodes(
        args.superlink,
        args.app,
        nodes,
        insecure=bool(args.insecure),
        root_certificates=certs,
        poll=Poll(first=args.first_poll, cap=args.max_poll),
        max_wait_time=args.max_wait_time,
    )

    def _forward(sig: int, _frame: object) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    out = Path(spec["pids-file"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(pids))
    tmp.replace(out)  # atomic: the deployment reads a whole list or nothing
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m renyi.federated.flower_node",
        description="A long-lived Flower SuperNode running a pinned ClientApp in-process.",
    )
    ap.add_argument("--superlink", required=True, help="SuperLink Fleet API host:port")
    ap.add_argument("--app", required=True, help="the ClientApp, as module:attribute")
    ap.add_argument("--node-config", default="", help="key=value pairs, as flower-supernode")
    ap.add_argument(
        "--nodes-file",
        default=None,
        help="JSON {nodes: [{config, log}], pids-file}: fork one node per entry (one machine)",
    )
    ap.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    ap.add_argument("--root-certificates", default=None, help="PEM CA file for TLS")
    ap.add_argument("--max-poll", type=float, default=Poll.cap, help="idle poll cap (s)")
    ap.add_argument(
        "--first-poll", type=float, default=Poll.first, help="first poll after a message (s)"
    )
    ap.add_argument("--max-wait-time", type=float, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """``python -m renyi.federated.flower_node``: serve until SIGTERM/SIGINT."""
    args = _parse(argv)
    if not args.insecure and args.root_certificates is None:
        raise SystemExit("flower_node: pass --insecure (loopback) or --root-certificates")
    certs = Path(args.root_certificates).read_bytes() if args.root_certificates else None
    if args.nodes_file is not None:
        if args.node_config:
            raise SystemExit("flower_node: --nodes-file holds each node's config")
        _serve_launcher(args, certs)
        return
    stop = threading.Event()

    def _stop(_sig: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    cfg = parse_config_args([args.node_config]) if args.node_config else {}
    run_node(
        args.superlink,
        args.app,
        cfg,
        insecure=bool(args.insecure),
        root_certificates=certs,
        poll=Poll(first=args.first_poll, cap=args.max_poll),
        stop=stop,
        max_wait_time=args.max_wait_time,
    )


if __name__ == "__main__":
    main()
