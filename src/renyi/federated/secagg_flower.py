"""Double-masked GOPA (:mod:`renyi.federated.secagg`) on Flower: parties pin their privacy
in their own node config; the server only relays.

Each party runs :data:`client_app` on a :mod:`renyi.federated.flower_node` node. Its
``--node-config`` holds everything it trusts, none of it from the server:

================  ==========================================================================
key               meaning
================  ==========================================================================
``name``          its roster name
``key-file``      its raw 32-byte Ed25519 private key (mode 0600)
``roster-file``   the pinned roster (JSON, :class:`~renyi.federated.channels.Roster`)
``value``         its private number in ``[0, 1]``
``epsilon``,      its per-session worst-case target (:class:`~renyi.federated.secagg.
``delta``         PartyPolicy`), checked against every proposal
``min-sigma-eta`` least independent noise it accepts
``min-cohort``    least parties invited and surviving
``min-peers``     least neighbours
``max-corrupt``   parties it assumes may collude with the server
``budget-epsilon``its budget across sessions (:class:`~renyi.budget.Budget`), charged
``budget-delta``  before its masked value leaves; refused once spent
``ledger-file``   optional: the budget's ledger (survives node restarts); otherwise the
                  budget lives in the node's memory for the node's life
``noise-key``     optional, tests only: hex 32 bytes seeding its noise
================  ==========================================================================

A node without these keys refuses every session (secure by default). The rounds
(``propose``, ``directory``, ``openings``, ``shares``, ``survivors``, ``unmask``) are
:class:`~renyi.federated.secagg.SecAggParty` messages relayed unchanged by
:mod:`renyi.federated.flower_relay`; :class:`SecAggDriver` runs
:class:`~renyi.federated.secagg.SecAggServer` over them. :func:`run_secagg_deployment`
starts a loopback deployment (``flower-superlink`` + one node per party), runs one or more
sessions and stops every process.
"""

from __future__ import annotations

import os

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:  # pragma: no cover - exercised only without flwr
    raise ImportError(
        "renyi.federated.secagg_flower needs Flower: pip install 'renyi[flower]'"
    ) from exc

from renyi._validation import check_int, check_positive, fail
from renyi.budget import Budget
from renyi.errors import RenyiError
from renyi.federated.channels import ChaCha20Source, IdentityKey, Roster
from renyi.federated.flower_deploy import (
    Deadline,
    DeploymentError,
    LocalDeployment,
    NodeProcess,
    NodeStart,
    deployment_files,
    write_result,
)
from renyi.federated.flower_relay import SERVER_MAX_POLL, relay_client_app, relay_over_grid
from renyi.federated.gopa_party import ProtocolAbortedError
from renyi.federated.relay import Outcome, Payload, Round, ScriptedDriver
from renyi.federated.secagg import PartyPolicy, SecAggParty, SecAggServer, SessionProposal

__all__ = [
    "SecAggDriver",
    "SecAggEndpoint",
    "SecAggRun",
    "client_app",
    "node_config",
    "pinned_node_configs",
    "run_secagg_deployment",
    "run_secagg_simulation",
    "serve",
    "server_app",
    "simulation_client_app",
]

PROTOCOL = "renyi-secagg"
_POLICY_KEYS = {
    "epsilon": "epsilon",
    "delta": "delta",
    "min-sigma-eta": "min_sigma_eta",
    "min-cohort": "min_cohort",
    "min-peers": "min_peers",
    "max-corrupt": "max_corrupt",
}
_INT_KEYS = {"min_cohort", "min_peers", "max_corrupt"}
_BUDGETS: dict[tuple[str, str], Budget] = {}


def node_config(
    name: str,
    key_file: Path,
    roster_file: Path,
    value: float,
    policy: PartyPolicy,
    *,
    budget_epsilon: float,
    budget_delta: float,
    ledger_file: Path | None = None,
    noise_key: bytes | None = None,
) -> dict[str, Any]:
    """A party's ``--node-config`` (module table) from its pins."""
    cfg: dict[str, Any] = {
        "name": name,
        "key-file": str(key_file),
        "roster-file": str(roster_file),
        "value": float(value),
        **{k: getattr(policy, attr) for k, attr in _POLICY_KEYS.items()},
        "budget-epsilon": float(check_positive("budget_epsilon", budget_epsilon)),
        "budget-delta": float(budget_delta),
    }
    if ledger_file is not None:
        cfg["ledger-file"] = str(ledger_file)
    if noise_key is not None:
        cfg["noise-key"] = noise_key.hex()
    return cfg


def pinned_node_configs(
    workdir: Path,
    values: Sequence[float],
    policy: PartyPolicy,
    *,
    budget_epsilon: float,
    budget_delta: float,
    ledgers: bool = False,
    noise_keys: Sequence[bytes] | None = None,
    deadline: Deadline | None = None,
) -> tuple[Path, list[dict[str, Any]]]:
    """Fresh keys and roster under ``workdir``; each party's pinned ``--node-config``
    (``deadline``: as :func:`~renyi.federated.flower_deploy.deployment_files`)."""
    _, roster_file, base = deployment_files(workdir, values, deadline=deadline)
    return roster_file, [
        node_config(
            c["name"],
            Path(c["key-file"]),
            roster_file,
            float(c["value"]),
            policy,
            budget_epsilon=budget_epsilon,
            budget_delta=budget_delta,
            ledger_file=workdir / f"{c['name']}.ledger" if ledgers else None,
            noise_key=None if noise_keys is None else noise_keys[i],
        )
        for i, c in enumerate(base)
    ]


def _policy(node: Mapping[str, Any]) -> PartyPolicy:
    missing = [k for k in (*_POLICY_KEYS, "budget-epsilon", "budget-delta") if k not in node]
    if missing:
        raise fail(
            "node_config",
            f"missing {missing}",
            "a party's pins (epsilon, delta, min-sigma-eta, min-cohort, min-peers,"
            " max-corrupt, budget-epsilon, budget-delta): it refuses sessions without them",
        )
    kw: dict[str, Any] = {}
    for key, attr in _POLICY_KEYS.items():
        v = node[key]
        if attr in _INT_KEYS:
            if isinstance(v, bool) or not isinstance(v, int):
                raise fail(key, v, "an integer in the node config")
            kw[attr] = v
        else:
            kw[attr] = float(v)
    return PartyPolicy(**kw)


def _budget(node: Mapping[str, Any]) -> Budget:
    """The party's one budget for the node's life (and across restarts with a ledger)."""
    ledger = str(node.get("ledger-file", ""))
    key = (str(node["key-file"]), ledger)  # one party (its key file) and its ledger
    if key not in _BUDGETS:
        _BUDGETS[key] = Budget(
            epsilon=float(node["budget-epsilon"]),
            delta=float(node["budget-delta"]),
            ledger=ledger or None,
        )
    return _BUDGETS[key]


class SecAggEndpoint:
    """One party of one session: a :class:`~renyi.federated.secagg.SecAggParty` built from
    the node's own config (module table), answering the relayed rounds. ``value``/``vector``
    replace the config's ``value`` (e.g. a clipped model update, :mod:`secure_fedavg`)."""

    def __init__(self, node: Mapping[str, Any], value: Any = None, *, vector: bool = False) -> None:
        name = str(node["name"])
        policy = _policy(node)
        roster = Roster.from_json(Path(str(node["roster-file"])).read_text())
        identity = IdentityKey.from_private_bytes(name, Path(str(node["key-file"])).read_bytes())
        noise_key = node.get("noise-key")
        rng = ChaCha20Source(bytes.fromhex(str(noise_key))) if noise_key else None
        self.party = SecAggParty(
            identity,
            roster,
            float(node["value"]) if value is None else value,
            policy,
            budget=_budget(node),
            vector=vector,
            rng=rng,
        )

    def respond(self, phase: str, payload: Payload) -> dict[str, Any]:
        out = self.party.handle({**payload, "round": phase})
        if phase == "unmask" and "abort" not in out:
            g = self.party.guarantee()
            if g is not None:  # what this party verified itself (public parameters only)
                out["epsilon"], out["mu"] = g.epsilon, g.mu
            out["done"] = True
        return out


def _make_party(node: Mapping[str, Any], opening: Payload) -> SecAggEndpoint:
    return SecAggEndpoint(node)


client_app = relay_client_app(PROTOCOL, _make_party)
"""The party's ClientApp: run it on :mod:`renyi.federated.flower_node` (module docstring)."""

simulation_client_app = relay_client_app(PROTOCOL, _make_party, simulated=True)
"""The same party on Flower's simulation engine only (:func:`run_secagg_simulation`): it
takes its pins from the file the run config names, so it refuses to run on a real node."""


class SecAggDriver(ScriptedDriver):
    """The server's side of one session: :class:`~renyi.federated.secagg.SecAggServer`
    driven over the relay. Any refusal aborts the session (nothing is released)."""

    def __init__(self, proposal: SessionProposal, roster: Roster) -> None:
        self.server = SecAggServer(proposal, roster)
        self.roster = roster

    def opening(self) -> tuple[str, Payload]:
        return "propose", {"proposal": self.server.proposal.to_json()}

    def admit(self, reply: Payload) -> str | None:
        """The party whose roster key signed this advert (else None: ignored)."""
        return self.server.admit(reply)

    @staticmethod
    def _refused(phase: str, replies: Mapping[str, Payload]) -> Outcome | None:
        bad = {n.lstrip("?"): r["abort"] for n, r in replies.items() if "abort" in r}
        if bad:
            return Outcome("aborted", {"reason": f"round {phase!r}: parties refused: {bad}"})
        return None

    def script(
        self, joined: Mapping[str, Payload]
    ) -> Generator[Round, Mapping[str, Payload], Outcome]:
        s = self.server
        if out := self._refused("propose", joined):
            return out
        r = yield Round("directory", dict.fromkeys(joined, s.directory(joined)))
        if out := self._refused("directory", r):
            return out
        r = yield Round("openings", dict.fromkeys(r, s.openings_round(r)))
        if out := self._refused("openings", r):
            return out
        r = yield Round("shares", s.shares_round(r))
        if out := self._refused("shares", r):
            return out
        r = yield Round("survivors", dict.fromkeys(r, s.survivors_round(r)))
        if out := self._refused("survivors", r):
            return out
        r = yield Round("unmask", dict.fromkeys(r, s.unmask_round(r)))
        if out := self._refused("unmask", r):
            return out
        res = s.release(r)
        return Outcome(
            "released",
            {
                "estimate": res.estimate,
                "included": list(res.included),
                "dropped": list(res.dropped),
                "lattice": res.lattice,
                "influence_bound": res.influence_bound,
                "party_epsilon": {n: float(m["epsilon"]) for n, m in r.items() if "epsilon" in m},
            },
        )


def _proposal(config: Mapping[str, Any], roster: Roster, session: bytes) -> SessionProposal:
    return SessionProposal(
        session=session,
        names=tuple(roster),
        sigma_eta=float(config["sigma-eta"]),
        sigma_delta=float(config["sigma-delta"]),
        peers=int(config["peers"]),
        threshold=int(config["threshold"]),
        min_survivors=int(config["min-survivors"]),
        rejection_probability=float(config.get("rejection-probability", 1e-9)),
    )


def serve(grid: Grid, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ServerApp's work: ``sessions`` sessions (default 1) one after the other.

    ``config`` (the run config): ``roster-file``, ``sigma-eta``, ``sigma-delta``,
    ``peers``, ``threshold``, ``min-survivors``, optional ``sessions``, ``timeout``,
    ``grace``, ``status-file``. Whatever it says, each party checks it against its pins.
    Returns ``{"status": <last session's>, "sessions": [outcome, ...], "bytes_...": ...}``.
    """
    roster = Roster.from_json(Path(str(config["roster-file"])).read_text())
    status = Path(str(config["status-file"])) if config.get("status-file") else None
    outcomes: list[dict[str, Any]] = []
    sent: dict[str, int] = {}
    received: dict[str, int] = {}
    for _ in range(check_int("sessions", int(config.get("sessions", 1)), 1)):
        sid = os.urandom(16)
        try:
            driver = SecAggDriver(_proposal(config, roster, sid), roster)
        except RenyiError as exc:
            outcomes.append({"status": "aborted", "reason": f"{type(exc).__name__}: {exc}"})
            continue
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
        for total, part in ((sent, stats.bytes_sent), (received, stats.bytes_received)):
            for k, v in part.items():
                total[k] = total.get(k, 0) + v
        outcomes.append({"status": outcome.status, **outcome.detail, "session": sid.hex()})
    return {
        "status": outcomes[-1]["status"],
        "sessions": outcomes,
        "bytes_sent": sent,
        "bytes_received": received,
    }


server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    try:
        out = serve(grid, cfg)
    except (RenyiError, ValueError, KeyError, OSError) as exc:
        out = {"status": "aborted", "reason": f"{type(exc).__name__}: {exc}", "sessions": []}
    if cfg.get("result-file"):
        write_result(str(cfg["result-file"]), out)


@dataclass(frozen=True)
class SecAggRun:
    """Outcome of one run of :func:`run_secagg_deployment`: one entry per session."""

    sessions: tuple[dict[str, Any], ...]
    wall_seconds: float
    bytes_per_party: float
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    cpu_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    """CPU time of the deployment's processes since it started, by role, when this run
    ended (:meth:`~renyi.federated.flower_deploy.LocalDeployment.cpu_seconds`)."""

    @property
    def released(self) -> int:
        return sum(1 for s in self.sessions if s.get("status") == "released")


def run_secagg_deployment(
    values: Sequence[float],
    policy: PartyPolicy,
    runs: Sequence[Mapping[str, Any]],
    *,
    budget_epsilon: float,
    budget_delta: float,
    noise_keys: Sequence[bytes] | None = None,
    ledgers: bool = False,
    timeout: float = 240.0,
    deadline: Deadline | None = None,
    start: NodeStart = "fork",
    on_status: Callable[[str, list[NodeProcess]], None] | None = None,
) -> list[SecAggRun]:
    """Start a loopback deployment of ``len(values)`` party nodes pinned to ``policy`` and
    a budget, submit one Flower run per ``runs`` entry (its run config: the server's
    proposal, ``sessions``, ``grace``, ...; a malicious server is just a server with other
    numbers) and stop every process. Nodes stay up across runs, so budgets carry over.
    ``timeout`` bounds the whole call (keys, start, every run): once it passes,
    :class:`~renyi.federated.flower_deploy.DeploymentTimeoutError` while starting, or
    :class:`~renyi.federated.gopa_party.ProtocolAbortedError` saying so during a run; every
    process is stopped and nothing released. ``deadline`` (a
    :class:`~renyi.federated.flower_deploy.Deadline` that began earlier, e.g. with a
    command) replaces ``timeout``.
    ``ledgers=True`` gives each party a ledger file. ``on_status(line, nodes)`` sees the
    relay's progress lines (``propose 5``, ``shares 5``, ...). ``start``: nodes forked
    from one launcher (default) or each its own program
    (:class:`~renyi.federated.flower_deploy.LocalDeployment`).
    """
    k = check_int("values", len(values), 2)
    limit = Deadline.after(timeout) if deadline is None else deadline
    if noise_keys is not None and len(noise_keys) != k:
        raise fail("noise_keys", len(noise_keys), f"one 32-byte key per party ({k})")
    dep = LocalDeployment(
        [{}] * k, "renyi.federated.secagg_flower:client_app", start=start, deadline=limit
    )
    try:
        roster_file, dep.node_configs = pinned_node_configs(
            dep.workdir,
            values,
            policy,
            budget_epsilon=budget_epsilon,
            budget_delta=budget_delta,
            ledgers=ledgers,
            noise_keys=noise_keys,
            deadline=limit,
        )
    except BaseException:
        dep.close()
        raise
    out = []
    with dep:
        for cfg in runs:
            started = time.monotonic()
            try:
                left = max(limit.left(), 1e-3)  # <= 0: dep.run raises the timeout
                raw = dep.run(
                    "renyi.federated.secagg_flower:server_app",
                    {"roster-file": str(roster_file), "timeout": left, **cfg},
                    timeout=left,
                    on_status=on_status,
                )
            except DeploymentError as exc:
                raise ProtocolAbortedError(str(exc)) from None
            sent, received = raw.get("bytes_sent", {}), raw.get("bytes_received", {})
            out.append(
                SecAggRun(
                    sessions=tuple(raw.get("sessions", [])),
                    wall_seconds=time.monotonic() - started,
                    bytes_per_party=(sum(sent.values()) + sum(received.values())) / k,
                    raw=raw,
                    cpu_seconds=dep.cpu_seconds(),
                )
            )
    return out


def run_secagg_simulation(
    values: Sequence[float],
    policy: PartyPolicy,
    run_config: Mapping[str, Any],
    *,
    budget_epsilon: float,
    budget_delta: float,
    timeout: float = 600.0,
) -> SecAggRun:
    """The sessions of ``run_config`` (as one entry of :func:`run_secagg_deployment`) on
    Flower's simulation engine: the same endpoint, driver and relay, submitted with ``flwr
    run`` to a SuperLink in simulation mode (``LocalDeployment(simulation=True)``), parties
    in one Ray worker. For scale (K = 100)."""
    k = check_int("values", len(values), 2)
    started = time.monotonic()
    limit = Deadline.after(timeout)
    dep = LocalDeployment(
        [{}] * k,
        "renyi.federated.secagg_flower:simulation_client_app",
        simulation=True,
        deadline=limit,
    )
    try:
        roster_file, dep.node_configs = pinned_node_configs(
            dep.workdir,
            values,
            policy,
            budget_epsilon=budget_epsilon,
            budget_delta=budget_delta,
            deadline=limit,
        )
    except BaseException:
        dep.close()
        raise
    with dep:
        try:
            left = max(limit.left(), 1e-3)
            cfg = {"roster-file": str(roster_file), "timeout": left, **run_config}
            raw = dep.run("renyi.federated.secagg_flower:server_app", cfg, timeout=left)
        except DeploymentError as exc:
            raise ProtocolAbortedError(str(exc)) from None
        cpu = dep.cpu_seconds()
    sent, received = raw.get("bytes_sent", {}), raw.get("bytes_received", {})
    return SecAggRun(
        sessions=tuple(raw.get("sessions", [])),
        wall_seconds=time.monotonic() - started,
        bytes_per_party=(sum(sent.values()) + sum(received.values())) / k,
        raw=raw,
        cpu_seconds=cpu,
    )
