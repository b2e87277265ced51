"""A protocol between parties, relayed by an untrusted server: the interface and an in-process run.

A multi-party protocol (GOPA, secure aggregation, distributed DP-FedAvg) is two state
machines that exchange messages through a relay that may read, drop, delay, reorder or
forge what it carries:

* a :class:`PartyEndpoint` per party answers one message at a time
  (:meth:`~PartyEndpoint.respond`: a phase name and a payload in, a payload out); it keeps its
  own state between messages and checks everything it is told;
* a :class:`ServerDriver` decides what to send next from what came back: an opening
  message broadcast to every node (:meth:`~ServerDriver.opening`), the party each opening
  reply comes from (:meth:`~ServerDriver.admit`: only a reply it can verify, e.g. signed by
  a roster key, binds a node to a party), then :class:`Round` after :class:`Round`
  (:meth:`~ServerDriver.advance`) until an :class:`Outcome`.

Payloads are flat mappings of ``str`` to ``bytes``, ``str``, ``int``, ``float``, ``bool`` or
lists of one of them (what a Flower ``ConfigRecord`` carries). A party that refuses answers
``{"abort": reason}`` and forgets the session; a party that does not answer is absent from
the replies. The transport knows nothing else about the protocol, so a protocol can add
rounds without touching it: :func:`run_in_process` (direct calls, for tests and
simulations) and :mod:`renyi.federated.flower_relay` (Flower messages between real
processes) carry any pair of endpoint and driver.

>>> class Echo:
...     def respond(self, phase, payload):
...         return {"name": payload["name"], "n": payload.get("n", 0) + 1}
>>> class Twice(ScriptedDriver):
...     def opening(self):
...         return "hello", {}
...     def admit(self, reply):
...         return reply.get("name")
...     def script(self, joined):
...         replies = yield Round("count", {p: {"name": p, "n": 10} for p in joined})
...         return Outcome("released", {"sum": sum(r["n"] for r in replies.values())})
>>> run_in_process(Twice(), {"a": Echo(), "b": Echo()}, opening_payload=lambda name: {"name": name})
Outcome(status='released', detail={'sum': 22})
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from renyi._validation import fail
from renyi.errors import RenyiError

__all__ = [
    "Outcome",
    "PartyEndpoint",
    "Payload",
    "Round",
    "ScriptedDriver",
    "ServerDriver",
    "run_in_process",
]

Payload = Mapping[str, Any]


class PartyEndpoint(Protocol):
    """One party's side of a relayed protocol (it holds its own secrets and state)."""

    def respond(self, phase: str, payload: Payload) -> dict[str, Any]:
        """The reply to one message; raise a :class:`~renyi.errors.RenyiError` to refuse."""
        ...


@dataclass(frozen=True)
class Round:
    """One round of messages: ``messages[party]`` is sent to that party (absent: nothing)."""

    phase: str
    messages: Mapping[str, Payload]

    def __post_init__(self) -> None:
        if not self.phase or not isinstance(self.phase, str):
            raise fail("phase", self.phase, "a non-empty phase name")


@dataclass(frozen=True)
class Outcome:
    """How a session ended: ``"released"`` (``detail`` holds the release) or ``"aborted"``."""

    status: Literal["released", "aborted"]
    detail: dict[str, Any] = field(default_factory=dict)


class ServerDriver(Protocol):
    """The server's side of a relayed protocol (it holds nothing a party would not send)."""

    def opening(self) -> tuple[str, Payload]:
        """The phase and payload broadcast to every connected node."""
        ...

    def admit(self, reply: Payload) -> str | None:
        """The party a reply to the opening comes from, if it can be verified, else None."""
        ...

    def advance(self, replies: Mapping[str, Payload]) -> Round | Outcome:
        """The next round, given the last one's replies by party (the opening's first)."""
        ...


class ScriptedDriver:
    """A :class:`ServerDriver` written as one generator: :meth:`script` yields rounds,
    receives their replies and returns the outcome (subclasses define ``opening``, ``admit``
    and ``script``)."""

    _script: Generator[Round, Mapping[str, Payload], Outcome] | None = None

    def script(
        self, joined: Mapping[str, Payload]
    ) -> Generator[Round, Mapping[str, Payload], Outcome]:  # pragma: no cover - abstract
        raise NotImplementedError

    def advance(self, replies: Mapping[str, Payload]) -> Round | Outcome:
        try:
            if self._script is None:
                self._script = self.script(replies)
                return next(self._script)
            return self._script.send(replies)
        except StopIteration as stop:
            out = stop.value
            if not isinstance(out, Outcome):
                raise fail(
                    "script", type(out).__name__, "a generator returning an Outcome"
                ) from None
            return out
        except RenyiError as exc:
            return Outcome("aborted", {"reason": f"{type(exc).__name__}: {exc}"})


def _answer(party: PartyEndpoint, phase: str, payload: Payload) -> dict[str, Any]:
    try:
        return dict(party.respond(phase, payload))
    except (RenyiError, ValueError, KeyError, TypeError) as exc:
        return {"abort": f"{type(exc).__name__}: {exc}"}


def run_in_process(
    driver: ServerDriver,
    parties: Mapping[str, PartyEndpoint],
    *,
    opening_payload: Callable[[str], Payload] | None = None,
    absent: Callable[[str, str], bool] | None = None,
    max_rounds: int = 1000,
) -> Outcome:
    """Run ``driver`` against ``parties`` by direct calls (one process, no network).

    ``parties`` maps a transport label (a node) to its endpoint; the driver learns who is
    who only from :meth:`ServerDriver.admit`. ``absent(label, phase)`` true drops that
    node's reply in that phase (a dropout; it also stops receiving). ``opening_payload``
    replaces the driver's opening payload per node (tests of what a server might send).
    A party that aborted receives nothing more.
    """
    phase, payload = driver.opening()
    gone: set[str] = set()
    names: dict[str, str] = {}
    replies: dict[str, Payload] = {}
    for label, party in parties.items():
        if absent is not None and absent(label, phase):
            gone.add(label)
            continue
        reply = _answer(
            party, phase, payload if opening_payload is None else opening_payload(label)
        )
        name = driver.admit(reply) if "abort" not in reply else None
        if "abort" in reply:
            gone.add(label)
            replies[f"?{label}"] = reply
        elif name is not None and name not in replies:
            names[name], replies[name] = label, reply
    for _ in range(max_rounds):
        step = driver.advance(replies)
        if isinstance(step, Outcome):
            return step
        replies = {}
        for name, msg in step.messages.items():
            found = names.get(name)
            if found is None or found in gone:
                continue
            label = found
            if absent is not None and absent(label, step.phase):
                gone.add(label)
                continue
            reply = _answer(parties[label], step.phase, msg)
            if "abort" in reply:
                gone.add(label)
            replies[name] = reply
    raise fail("max_rounds", max_rounds, "enough rounds for the protocol to end")
