"""A real Flower deployment on loopback, started and stopped by the caller.

:class:`LocalDeployment` starts ``flower-superlink`` (plain HTTP on 127.0.0.1) and one node
process per ``node_configs`` entry, submits runs of a ServerApp to it (what ``flwr run``
does, done in this process with Flower's own FAB builder and Control API client: ``flwr
run`` is a new process that spends ~1.5 s of CPU importing Flower's CLI first; the
program is used if this Flower lacks those modules) and stops every process it started
(whole process groups; the nodes before the SuperLink, so they deregister while it still
answers) when the ``with`` block ends, also on errors.

Nodes are :mod:`renyi.federated.flower_node` processes by default (one long-lived process
per party running its pinned ``ClientApp``; see that module for why), forked by one
launcher that imports the app once (``start="fork"``, default: K nodes cost one import,
not K) or each started on its own (``start="exec"``, as on separate machines), or Flower's own
``flower-supernode`` with ``node="flower-supernode"`` (one ClientApp process per message
and the ClientApp named by the submitted app bundle: kept for comparison). The SuperLink's
``simulation=True`` starts the SuperLink in Flower's simulation mode instead (no node
processes: ``flwr run`` with ``--federation-config num-supernodes=K`` runs the ServerApp
and K simulated nodes on Flower's Ray engine, in one backend worker; the supported
replacement of the deprecated ``flwr.simulation.run_simulation``). The SuperLink's
SuperExec, which starts the ServerApp process of a run, polls for work every
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` seconds (Flower's own setting; 1 s by default,
``superexec_poll`` = 0.5 s here: every poll is an HTTP request the SuperLink answers for
the deployment's whole life). The SuperExec is started here next to the SuperLink
(``--isolation process``), so its imports run while the SuperLink's do instead of after
them (``parallel_superexec``; the ServerApp's first progress line came ~2.3 s sooner at
load 7.5 in interleaved K = 10 runs). A ``deadline`` (:class:`Deadline`) bounds everything: keys,
start, runs. Flower telemetry and Ray usage statistics are off in every process.

Example (needs Flower; ~10 s of CPU)::

    with LocalDeployment([{"name": "a"}, {"name": "b"}], "my_pkg.apps:client_app") as dep:
        out = dep.run("my_pkg.apps:server_app", {"rounds": 3})
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from renyi._validation import check_positive, fail
from renyi.errors import RenyiError

__all__ = [
    "Deadline",
    "DeploymentError",
    "DeploymentTimeoutError",
    "ForkedNode",
    "LocalDeployment",
    "NodeProcess",
    "NodeStart",
    "deployment_files",
    "toml_value",
    "write_result",
]

TELEMETRY_OFF = {"FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}
SIMULATED_NODES_KEY = "renyi-simulated-nodes"
"""Run-config key: the JSON file of the simulated nodes' configs (``simulation=True``)."""
MAX_LOCAL_NODES = 1000
"""Most real node processes a :class:`LocalDeployment` starts on one machine (each is a
Python process that polls the SuperLink; K = 10 is what the benchmarks measure, K = 100
runs on the simulation engine)."""
NodeKind = Literal["renyi", "flower-supernode"]
NodeStart = Literal["fork", "exec"]


class DeploymentError(RenyiError):
    """The local deployment could not start, run or deliver a result."""


class DeploymentTimeoutError(DeploymentError):
    """The caller's time limit (:class:`Deadline`) ran out: everything started is stopped
    and nothing is released."""


@dataclass(frozen=True)
class Deadline:
    """A time limit of ``seconds`` ending at ``end`` (:func:`time.monotonic`), shared by
    every step of a deployment: writing the parties' keys, starting the SuperLink and the
    nodes, submitting runs and waiting for their results. Make it with :meth:`after`.

    >>> d = Deadline.after(60.0)
    >>> 0 < d.left() <= 60.0
    True
    >>> Deadline(1.0, time.monotonic() - 1.0).check("starting")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    renyi.federated.flower_deploy.DeploymentTimeoutError: timeout=1 s ran out while starting; ...
    """

    seconds: float
    end: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """The limit ``seconds`` from now."""
        s = check_positive("timeout", seconds)
        return cls(s, time.monotonic() + s)

    def left(self) -> float:
        """Seconds left (negative once it has passed)."""
        return self.end - time.monotonic()

    def check(self, what: str) -> None:
        """Raise :class:`DeploymentTimeoutError` naming ``what`` was under way if the limit
        has passed."""
        if self.left() <= 0.0:
            raise DeploymentTimeoutError(
                f"timeout={self.seconds:g} s ran out while {what}; nothing was released"
                " (everything started is stopped)"
            )


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal (``--node-config`` and ``[tool.flwr.app.config]`` syntax)."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()  # numpy scalars: repr(np.float64(1.5)) is "np.float64(1.5)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise fail("node_config", value, "finite numbers (TOML has no portable inf/nan)")
        return repr(float(value))
    text = str(value)
    if '"' not in text:
        return json.dumps(text)
    if "'" not in text and "\n" not in text:
        return f"'{text}'"  # a TOML literal string
    raise fail("node_config", text, "a string without both quote characters (Flower's syntax)")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (``/proc``), ``None`` if it is gone or a
    zombie: with the pid it names one process, even after the pid is reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


class ForkedNode:
    """A node forked by the deployment's launcher (not a child of this process): the part
    of :class:`subprocess.Popen` the deployment and its callers use (``pid``, ``poll``,
    ``wait``). Each is the leader of its own process group, so ``os.killpg(node.pid,
    signal.SIGKILL)`` kills a party outright. Linux only (``/proc``)."""

    def __init__(self, pid: int) -> None:
        self.pid = int(pid)
        self._started = _start_time(self.pid)
        self.returncode: int | None = None if self._started is not None else -1

    def poll(self) -> int | None:
        """``None`` while it runs; ``-1`` once it has exited (its exit status goes to the
        launcher, its parent)."""
        if self.returncode is None and _start_time(self.pid) != self._started:
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"node {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return -1


NodeProcess = subprocess.Popen[bytes] | ForkedNode
"""A node of a :class:`LocalDeployment`: a started program or a forked :class:`ForkedNode`."""


def write_result(path: str | Path, out: Mapping[str, Any]) -> None:
    """Write ``out`` as JSON atomically (a reader never sees half a file): how a ServerApp
    hands its outcome to :meth:`LocalDeployment.run`."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(p)


def deployment_files(
    workdir: Path,
    values: Sequence[float],
    *,
    clip: bool = False,
    noise_keys: Sequence[bytes] | None = None,
    deadline: Deadline | None = None,
) -> tuple[Any, Path, list[dict[str, Any]]]:
    """Fresh identity keys (``party-000``, ...), the roster file and each party's node
    config (``name``, ``key-file``, ``roster-file``, ``value``, ``clip``, optional
    ``noise-key``) under ``workdir``; key files are created with mode 0600. With a
    ``deadline``, :class:`DeploymentTimeoutError` once it passes (about 2 ms per party)."""
    from renyi.federated.channels import IdentityKey, Roster

    k = len(values)
    identities = []
    for i in range(k):
        if deadline is not None:
            deadline.check(f"making the parties' keys ({i} of {k} made)")
        identities.append(IdentityKey(f"party-{i:03d}"))
    roster = Roster.of(identities)
    roster_file = workdir / "roster.json"
    roster_file.write_text(roster.to_json())
    configs: list[dict[str, Any]] = []
    for i, ident in enumerate(identities):
        if deadline is not None:
            deadline.check(f"writing the parties' key files ({i} of {k} written)")
        key_file = workdir / f"{ident.name}.key"
        key_file.touch(mode=0o600)
        key_file.write_bytes(ident.private_bytes())
        cfg: dict[str, Any] = {
            "name": ident.name,
            "key-file": str(key_file),
            "roster-file": str(roster_file),
            "value": float(values[i]),
            "clip": clip,
        }
        if noise_keys is not None:
            cfg["noise-key"] = noise_keys[i].hex()
        configs.append(cfg)
    return roster, roster_file, configs


def _control_api() -> Any:
    """Flower's FAB builder and Control API client (``flwr run``'s own pieces), imported
    once, or ``None`` if this Flower lacks them (then runs are submitted with the ``flwr
    run`` program: a new process that spends ~1.5 s of CPU importing Flower's CLI before it
    submits; in this process the submission takes ~0.05 s). Not Flower's documented API;
    tested with flwr 1.42.0."""
    global _CONTROL
    if _CONTROL is None:
        try:
            from types import SimpleNamespace

            from flwr.cli.build import build_fab_from_disk
            from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
            from flwr.common.serde import fab_to_proto, user_config_to_proto
            from flwr.proto.control_pb2 import StartRunRequest
            from flwr.supercore.control.control_http_client import ControlHttpClient
            from flwr.supercore.fab import Fab
            from flwr.supercore.interceptors.http.runtime_version import (
                RuntimeVersionHttpInterceptor,
            )
            from flwr.supercore.utils import simulation_config_from_json
        except ImportError:
            _CONTROL = False
        else:
            _CONTROL = SimpleNamespace(
                build_fab_from_disk=build_fab_from_disk,
                CliClientHttpInterceptor=CliClientHttpInterceptor,
                fab_to_proto=fab_to_proto,
                user_config_to_proto=user_config_to_proto,
                StartRunRequest=StartRunRequest,
                ControlHttpClient=ControlHttpClient,
                Fab=Fab,
                RuntimeVersionHttpInterceptor=RuntimeVersionHttpInterceptor,
                simulation_config_from_json=simulation_config_from_json,
            )
    return _CONTROL or None


_CONTROL: Any = None


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


def _wait_port(
    port: int, deadline: float, proc: subprocess.Popen[bytes], limit: Deadline | None
) -> None:
    while time.monotonic() < deadline:
        if limit is not None:
            limit.check("starting flower-superlink")
        if proc.poll() is not None:
            raise DeploymentError(f"flower-superlink exited with code {proc.returncode}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise DeploymentError(f"flower-superlink did not listen on 127.0.0.1:{port}")


def _json_default(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()  # numpy scalars
    raise TypeError(f"node config value {v!r} is not JSON")


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (``flwr run`` is one)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 0.0
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(r.ru_utime + r.ru_stime)


def _descendants(roots: set[int]) -> set[int]:
    """Process ids of ``roots`` and everything below them (Linux ``/proc``; else ``roots``)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for d in proc.iterdir():
            if not d.name.isdigit():
                continue
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, []))
    return out


def _stop(procs: Sequence[NodeProcess], grace: float = 5.0) -> None:
    """SIGTERM each process group, then SIGKILL what is left after ``grace`` seconds."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.05, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # children of the group (Flower's superexec, ClientApp/ServerApp processes) too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


class LocalDeployment:
    """``flower-superlink`` + one node per ``node_configs`` entry on 127.0.0.1.

    ``client_app``: the ClientApp every node runs (``"module:attribute"``), pinned by the
    node itself (renyi nodes) or written into each submitted app bundle (``node=
    "flower-supernode"``, where Flower takes it from the bundle). ``node_configs[i]`` is node
    ``i``'s ``--node-config``. Use as a context manager; :attr:`nodes` are the node
    processes (each the leader of its own process group: ``os.killpg(p.pid, SIGKILL)``
    kills a party outright). ``workdir`` (default: a fresh temporary directory, removed at
    exit) holds the logs. ``start`` (renyi nodes): ``"fork"`` forks every node from one
    launcher process (:func:`renyi.federated.flower_node.fork_nodes`; :attr:`nodes` are
    then :class:`ForkedNode` handles), ``"exec"`` starts each node as its own program.
    ``simulation=True``: Flower's simulation engine (module docstring) with one simulated
    node per ``node_configs`` entry; ``client_app`` must then be a simulation ClientApp
    (:func:`renyi.federated.flower_relay.relay_client_app` with ``simulated=True``), which
    finds node ``i``'s config in the file the run config names under
    :data:`SIMULATED_NODES_KEY`. ``deadline``: a time limit for everything the deployment
    does (start, runs); once it passes, :class:`DeploymentTimeoutError` (the ``with`` block
    then stops every process). Real nodes are processes on this machine: at most
    :data:`MAX_LOCAL_NODES` (``simulation=True`` for more). ``first_poll``/``max_poll``:
    each renyi node's polling of the SuperLink (:class:`renyi.federated.flower_node.Poll`);
    ``superexec_poll``: the SuperExec's (module docstring).
    """

    def __init__(
        self,
        node_configs: Sequence[Mapping[str, Any]],
        client_app: str,
        *,
        node: NodeKind = "renyi",
        start: NodeStart = "fork",
        simulation: bool = False,
        max_poll: float = 1.0,
        first_poll: float = 0.1,
        workdir: Path | None = None,
        deadline: Deadline | None = None,
        superexec_poll: float = 0.5,
    ) -> None:
        if node not in ("renyi", "flower-supernode"):
            raise fail("node", node, "'renyi' or 'flower-supernode'")
        if start not in ("fork", "exec"):
            raise fail("start", start, "'fork' (one launcher) or 'exec' (one program per node)")
        if start == "fork" and (node != "renyi" or not Path("/proc").is_dir()):
            start = "exec"  # Flower's own nodes, or no /proc to follow forked nodes by
        if not node_configs:
            raise fail("node_configs", len(node_configs), "at least one node")
        if not simulation and len(node_configs) > MAX_LOCAL_NODES:
            raise fail(
                "node_configs",
                len(node_configs),
                f"at most {MAX_LOCAL_NODES} nodes, one process each on this machine"
                " (simulation=True runs more on Flower's simulation engine)",
            )
        self.deadline = deadline
        check_positive("superexec_poll", superexec_poll)
        self.parallel_superexec = True
        self.node_configs = [dict(c) for c in node_configs]
        self.client_app = client_app
        self.node_kind = node
        self.start_method: NodeStart = start
        self.simulation = bool(simulation)
        self.max_poll = check_positive("max_poll", max_poll)
        self.first_poll = check_positive("first_poll", first_poll)
        self._own_dir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="renyi-flwr-")) if workdir is None else workdir
        self.port = 0
        self.superlink: subprocess.Popen[bytes] | None = None
        self.nodes: list[NodeProcess] = []
        self.launcher: subprocess.Popen[bytes] | None = None
        self.superexec: subprocess.Popen[bytes] | None = None
        self._runs = 0
        self._submit_cpu = 0.0
        bindir = str(Path(_tool("flower-superlink")).parent)  # it starts flower-superexec
        self.env = {
            **os.environ,
            **TELEMETRY_OFF,
            "FLWR_HOME": str(self.workdir / "flwr"),
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": repr(superexec_poll),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        }

    def _spawn(self, cmd: list[str], log: str) -> subprocess.Popen[bytes]:
        with (self.workdir / log).open("wb") as out:
            return subprocess.Popen(
                cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_time(self, what: str) -> None:
        if self.deadline is not None:
            self.deadline.check(what)

    def start(self) -> None:
        """Start the SuperLink and the nodes (returns once the SuperLink listens)."""
        self._check_time("starting the deployment")
        (self.workdir / "flwr").mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        (self.workdir / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.superlink = self._spawn(
            [
                _tool("flower-superlink"),
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *(["--simulation"] if self.simulation else []),
                *(["--isolation", "process"] if self.parallel_superexec else []),
            ],
            "superlink.log",
        )
        if self.parallel_superexec:  # imports while the SuperLink imports, not after it
            self.superexec = self._spawn(
                [
                    _tool("flower-superexec"),
                    "--insecure",
                    "--runtime-api-address",
                    f"127.0.0.1:{self.port}",
                    "--parent-pid",
                    str(os.getpid()),
                ],
                "superexec.log",
            )
        address = f"127.0.0.1:{self.port}"
        _control_api()  # imported here while the SuperLink starts, not when a run is submitted
        if self.simulation:
            nodes = self.workdir / "simulated-nodes.json"
            nodes.touch(mode=0o600)  # the parties' node configs (paths to their key files)
            nodes.write_text(json.dumps(self.node_configs, default=_json_default))
            _wait_port(self.port, time.monotonic() + 60, self.superlink, self.deadline)
            return
        if self.node_kind == "renyi" and self.start_method == "fork":
            self._fork_nodes(address)  # imports while the SuperLink starts
            _wait_port(self.port, time.monotonic() + 60, self.superlink, self.deadline)
            self._wait_forked(time.monotonic() + 120)
            return
        _wait_port(self.port, time.monotonic() + 60, self.superlink, self.deadline)
        for i, cfg in enumerate(self.node_configs):
            self._check_time(f"starting the nodes ({i} of {len(self.node_configs)} started)")
            conf = " ".join(f"{k}={toml_value(v)}" for k, v in cfg.items())
            if self.node_kind == "renyi":
                cmd = [*self._node_command(address), *self._poll_args()]
            else:
                cmd = [
                    _tool("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    address,
                    "--port",
                    str(_free_port()),
                ]
            if conf:
                cmd += ["--node-config", conf]
            self.nodes.append(self._spawn(cmd, f"node-{i:03d}.log"))

    def _node_command(self, address: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "renyi.federated.flower_node",
            "--insecure",
            "--superlink",
            address,
            "--app",
            self.client_app,
        ]

    def _poll_args(self) -> list[str]:
        return ["--max-poll", repr(self.max_poll), "--first-poll", repr(self.first_poll)]

    def _fork_nodes(self, address: str) -> None:
        for cfg in self.node_configs:
            for v in cfg.values():
                toml_value(v)  # the same values a node config on a command line may hold
        spec = self.workdir / "nodes.json"
        spec.touch(mode=0o600)  # the parties' node configs (paths to their key files)
        spec.write_text(
            json.dumps(
                {
                    "nodes": [
                        {"config": cfg, "log": str(self.workdir / f"node-{i:03d}.log")}
                        for i, cfg in enumerate(self.node_configs)
                    ],
                    "pids-file": str(self.workdir / "nodes.pids"),
                },
                default=_json_default,
            )
        )
        self.launcher = self._spawn(
            [
                *self._node_command(address),
                *self._poll_args(),
                "--nodes-file",
                str(spec),
            ],
            "launcher.log",
        )

    def _wait_forked(self, deadline: float) -> None:
        pids = self.workdir / "nodes.pids"
        assert self.launcher is not None
        while not pids.exists():
            self._check_time("forking the nodes")
            if self.launcher.poll() is not None or time.monotonic() > deadline:
                raise DeploymentError(
                    "the node launcher did not start the nodes; its log:"
                    f" {self._log_tail('launcher.log')}"
                )
            time.sleep(0.02)
        self.nodes = [ForkedNode(pid) for pid in json.loads(pids.read_text())]

    def run(
        self,
        server_app: str,
        run_config: Mapping[str, Any],
        *,
        result_key: str = "result-file",
        status_key: str = "status-file",
        app_files: Mapping[str, str] | None = None,
        client_component: str | None = None,
        timeout: float = 120.0,
        on_status: Callable[[str, list[NodeProcess]], None] | None = None,
    ) -> dict[str, Any]:
        """Submit one run of ``server_app`` and return the JSON its ServerApp writes.

        The ServerApp gets ``run_config`` plus ``result_key`` (a file path: it must write
        its outcome there as JSON) and ``status_key`` (a file it may append progress lines
        to; each new line is passed to ``on_status(line, self.nodes)`` as it appears, e.g.
        to kill a node mid-protocol). ``app_files`` are extra files of the app bundle
        (tests: a malicious ServerApp); ``client_component`` replaces the ClientApp the
        bundle names (renyi nodes ignore it: they run their own). Raises
        :class:`DeploymentError` if ``flwr run`` fails or no result arrives within
        ``timeout`` seconds, :class:`DeploymentTimeoutError` if the deployment's deadline
        passes first.
        """
        check_positive("timeout", timeout)
        self._check_time("submitting a run")
        if self.deadline is not None and self.deadline.left() < timeout:
            timeout = self.deadline.left()
        if self.superlink is None:
            raise DeploymentError("the deployment is not started (use it in a with block)")
        self._runs += 1
        app = self.workdir / f"app-{self._runs}"
        app.mkdir()
        result, status = app / "result.json", app / "status.txt"
        cfg = {**run_config, result_key: str(result), status_key: str(status)}
        submit = [_tool("flwr"), "run", str(app), "loopback"]
        if self.simulation:
            cfg[SIMULATED_NODES_KEY] = str(self.workdir / "simulated-nodes.json")
            submit += [
                "--federation-config",
                f"num-supernodes={len(self.node_configs)} client-resources-num-cpus=1"
                " client-resources-num-gpus=0 init-args-num-cpus=1 init-args-num-gpus=0",
            ]
        (app / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
            f'[project]\nname = "renyi-run-{self._runs}"\nversion = "1.0.0"\n'
            'description = "renyi"\nlicense = "Apache-2.0"\ndependencies = []\n\n'
            '[tool.flwr.app]\npublisher = "renyi"\n\n'
            f'[tool.flwr.app.components]\nserverapp = "{server_app}"\n'
            f'clientapp = "{client_component or self.client_app}"\n\n[tool.flwr.app.config]\n'
            + "".join(f'"{k}" = {toml_value(v)}\n' for k, v in cfg.items())
        )
        for name, text in (app_files or {}).items():
            (app / name).write_text(text)
        started = time.monotonic()
        control = _control_api()
        if control is not None:
            before = time.process_time()
            try:
                self._submit_in_process(control, app)
            finally:
                self._submit_cpu += time.process_time() - before
        else:
            before = _children_cpu()
            try:
                subprocess.run(
                    submit,
                    env=self.env,
                    cwd=app,
                    check=True,
                    capture_output=True,
                    timeout=min(timeout, 120.0),
                )
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                self._check_time("submitting a run")
                tail = (exc.stderr or b"")[-500:].decode(errors="replace") if exc.stderr else ""
                raise DeploymentError(f"'flwr run' failed ({exc}); {tail}") from None
            finally:
                self._submit_cpu += _children_cpu() - before
        seen, serverapp_seen, check_at = 0, False, 0.0
        while True:
            if time.monotonic() > check_at:  # a ServerApp that died without a result
                check_at = time.monotonic() + 1.0
                alive = self._serverapp_running()
                if alive:
                    serverapp_seen = True
                elif serverapp_seen and not result.exists():
                    time.sleep(0.5)
                    if not result.exists():
                        raise DeploymentError(
                            "the ServerApp exited without writing its result; SuperLink log"
                            f" tail: {self._log_tail('superlink.log')}"
                        )
            if self.nodes and all(p.poll() is not None for p in self.nodes) and not result.exists():
                raise DeploymentError(
                    f"every node exited; node-000 log tail: {self._log_tail('node-000.log')}"
                )
            if status.exists() and on_status is not None:
                lines = status.read_text().splitlines()
                for line in lines[seen:]:
                    on_status(line, self.nodes)
                seen = len(lines)
            if result.exists():
                with contextlib.suppress(json.JSONDecodeError):
                    out: dict[str, Any] = json.loads(result.read_text())
                    return out
            if time.monotonic() > started + timeout:
                self._check_time("waiting for the ServerApp's result")
                raise DeploymentError(f"no result from the ServerApp within {timeout} s")
            time.sleep(0.02)

    def _submit_in_process(self, control: Any, app: Path) -> None:
        """What ``flwr run <app> loopback`` does, in this process: build the app bundle
        (FAB) with Flower's builder and start the run through the SuperLink's Control API
        with Flower's client (the run config is in the bundle)."""
        import hashlib

        try:
            fab_bytes = control.build_fab_from_disk(app)
            fab = control.Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})
            federation = None
            if self.simulation:
                federation = control.simulation_config_from_json(
                    {
                        "num_supernodes": len(self.node_configs),
                        "client_resources_num_cpus": 1,
                        "client_resources_num_gpus": 0,
                        "init_args_num_cpus": 1,
                        "init_args_num_gpus": 0,
                    }
                )
            client = control.ControlHttpClient.from_server_address(
                server_address=f"127.0.0.1:{self.port}",
                insecure=True,
                root_certificates=None,
                interceptors=[
                    control.CliClientHttpInterceptor(),
                    control.RuntimeVersionHttpInterceptor(component_name="flwr CLI"),
                ],
            )
            try:
                res = client.StartRun(
                    control.StartRunRequest(
                        fab=control.fab_to_proto(fab),
                        override_config=control.user_config_to_proto({}),
                        override_federation_config=federation,
                    )
                )
            finally:
                client.close()
        except Exception as exc:  # Flower's client raises its own and httpx's errors
            self._check_time("submitting a run")
            raise DeploymentError(
                f"submitting the run failed: {type(exc).__name__}: {exc}"
            ) from None
        if not res.HasField("run_id"):
            raise DeploymentError("the SuperLink started no run (StartRun gave no run id)")

    def _log_tail(self, name: str, chars: int = 800) -> str:
        try:
            return (self.workdir / name).read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return ""

    def _serverapp_running(self) -> bool:
        """Whether a ``flwr-serverapp`` (or, simulating, ``flwr-simulation``) process runs
        below the SuperLink (its SuperExec starts it in a session of its own)."""
        if self.superlink is None or not Path("/proc").is_dir():
            return True  # unknown: rely on the timeout
        roots = {p.pid for p in (self.superlink, self.superexec) if p is not None}
        for pid in _descendants(roots):
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if b"flwr-serverapp" in cmd or b"flwr-simulation" in cmd:
                return True
        return False

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far, by role: ``superlink`` (the SuperLink and
        every process below it: its SuperExec and the ServerApps, which run in sessions of
        their own), ``nodes`` (the nodes and their launcher) and ``flwr-run`` (the ``flwr
        run`` submissions). Linux ``/proc`` (``{}`` elsewhere): a live process counts itself
        and the children it has reaped; a process that exited before its parent reaped it
        counts while it is a zombie; one whose parent exited without reaping it is missed,
        so this is a lower bound."""
        if not Path("/proc").is_dir():
            return {}
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        roots = {"superlink": {p.pid for p in (self.superlink, self.superexec) if p is not None}}
        if not self.simulation:  # simulated nodes live in the SuperLink's simulation process
            roots["nodes"] = {p.pid for p in self.nodes} | (
                {self.launcher.pid} if self.launcher is not None else set()
            )
        out = {"flwr-run": self._submit_cpu}
        for role, pids in roots.items():
            total = 0.0
            for pid in _descendants(pids):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                total += sum(int(x) for x in fields[11:15]) / tick
            out[role] = total
        return out

    def close(self) -> None:
        """Stop every process this deployment started (and what they started: Flower's
        SuperExec runs a ServerApp in a session of its own); remove its temporary
        directory."""
        procs: list[NodeProcess] = [*self.nodes]
        procs += [p for p in (self.launcher, self.superlink) if p is not None]
        others = _descendants({p.pid for p in procs}) - {p.pid for p in procs}
        # the SuperExec and its ServerApps hold nothing of ours: killed first (a SuperLink
        # that started its own SuperExec then need not wait 1 s for it at shutdown)
        roots = {p.pid for p in (self.superlink, self.superexec) if p is not None}
        for pid in _descendants(roots) - {p.pid for p in procs}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.superexec is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.superexec.pid, signal.SIGKILL)
            self.superexec.wait()
        # nodes first: they deregister while the SuperLink still answers, then the SuperLink
        _stop([p for p in procs if p is not self.superlink])
        _stop([p for p in procs if p is self.superlink])
        for pid in others:  # a ServerApp still running (a run that failed or timed out)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.nodes, self.superlink, self.launcher, self.superexec = [], None, None, None
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
