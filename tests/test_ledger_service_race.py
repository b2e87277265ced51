"""Many machines, one budget: remote spends racing near the limit, and a server killed
mid-spend, against a real ``renyi ledger serve`` on SQLite and on PostgreSQL.

Spender processes (forked from one harness that imported renyi once) charge the service
with ``Budget.connect``; each spend is sent, then sent again with the same idempotency key
(a client retry after a lost answer), and a release is announced only after ``spend``
returned. Afterwards: nothing overspent (exactly as many entries as fit), nothing lost
(every announced release has its entry, no index twice), and every retry was answered with
the first receipt, never charged again.
"""

import os
import random
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from _ledger_server import Server, _env, free_port
from renyi.budget import Budget
from renyi.errors import BudgetExceededError
from renyi.events import PureDpEvent
from renyi.ledger import LedgerError, open_store
from renyi.ledger.tokens import create_token

pytest.importorskip("uvicorn")

RACE = textwrap.dedent(
    """
    import os, sys
    from renyi.errors import BudgetExceededError
    from renyi.events import PureDpEvent
    from renyi.ledger.client import RemoteBudget

    url, token, nproc, per, outdir = sys.argv[1:6]
    nproc, per = int(nproc), int(per)

    def spender(label):
        b = RemoteBudget(url, token=token, timeout=120)
        with open(f"{outdir}/{label}", "w") as out:
            for i in range(per):
                key = f"{label}-{i}"
                try:
                    r = b.spend(PureDpEvent(1.0), idempotency_key=key)
                except BudgetExceededError:
                    out.write(f"refused {key}\\n")
                    continue
                again = b.spend(PureDpEvent(1.0), idempotency_key=key)  # a retried request
                assert again.replayed and again.index == r.index, (r, again)
                out.write(f"released {key} {r.index}\\n")  # after the commit
                out.flush()

    pids = []
    for p in range(nproc):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                spender(f"p{p}")
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    print(*[os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids])
    """
)


def _store_for_service(kind, tmp_path, request):
    """A fresh store (its own PostgreSQL database: a service serves every ledger in it)."""
    if kind == "sqlite":
        return str(tmp_path / "team.sqlite")
    psycopg = pytest.importorskip("psycopg")
    url = request.getfixturevalue("postgres_url").rsplit("#", 1)[0]
    db = f"svc_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    return url.replace("/postgres?", f"/{db}?")


def _race(target, tmp_path, nproc, per, limit):
    Budget(epsilon=float(limit), ledger=target)
    token = create_token(open_store(target), name="racer", role="spend")
    server = Server(target)
    outdir = tmp_path / "out"
    outdir.mkdir()
    args = [str(nproc), str(per), str(outdir)]
    try:
        done = subprocess.run(
            [sys.executable, "-c", RACE, f"{server.url}#default", token, *args],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=900,
        )
    finally:
        server.stop()
    assert done.returncode == 0 and done.stdout.split() == ["0"] * nproc, done.stderr
    lines = [line.split() for f in outdir.iterdir() for line in f.read_text().splitlines()]
    released = {key: int(rest[0]) for what, key, *rest in lines if what == "released"}
    refused = [key for what, key, *_ in lines if what == "refused"]
    b = Budget.open(target)
    entries = b.entries()
    assert len(released) + len(refused) == nproc * per  # every request answered
    assert len(entries) == limit == len(released)  # used exactly to the limit, never beyond
    assert sorted(released.values()) == list(range(limit))  # no index twice, none lost
    assert {e.metadata["idempotency_key"]: e.index for e in entries} == released
    assert b.verify() and b.remaining() == 0.0


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_remote_spends_race_near_the_limit(kind, tmp_path, request):
    """4 processes x 30 spends (each retried once) for 90 units."""
    _race(_store_for_service(kind, tmp_path, request), tmp_path, 4, 30, 90)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_8_processes_x_100_remote_spends_race_near_the_limit(kind, tmp_path, request):
    _race(_store_for_service(kind, tmp_path, request), tmp_path, 8, 100, 600)


KILLED = textwrap.dedent(
    """
    import os, sys
    from renyi.events import PureDpEvent
    from renyi.ledger.client import RemoteBudget

    url, token, cap, out, stop = sys.argv[1:6]
    b = RemoteBudget(url, token=token, timeout=120)
    with open(out, "w") as fh:
        for i in range(int(cap)):
            if os.path.exists(stop):
                break
            r = b.spend(PureDpEvent(1.0), idempotency_key=f"k{i}")
            # released: after the service committed; the retry count lets the harness see
            # that a request was cut off and sent again
            fh.write(f"{i} {r.index} {b.retries}\\n")
            fh.flush()
    print(b.retries)
    """
)


def _killed_mid_spend(target, tmp_path, cap, kills):
    Budget(epsilon=1000.0, ledger=target)
    token = create_token(open_store(target), name="job", role="spend")
    port = free_port()
    server = Server(target, port=port)
    url = f"{server.url}#default"
    try:
        # unreachable: the client gets an error (nothing may be released), no charge
        from renyi.ledger.client import RemoteBudget

        remote = RemoteBudget(url, token=token, timeout=60)
        server.kill()
        remote._timeout = 0.5
        with pytest.raises(LedgerError, match="cannot reach"):
            remote.spend(PureDpEvent(1.0), idempotency_key="lost")
        server.start()
        remote._timeout = 60
        first = remote.spend(PureDpEvent(1.0), idempotency_key="lost")
        assert (
            not first.replayed and remote.spend(PureDpEvent(1.0), idempotency_key="lost").replayed
        )

        # a client spending without pause while the server is SIGKILLed and restarted. Kills
        # wait for the client's progress (not for wall-clock luck: on a fast machine the
        # client once finished before the first kill); the client stops once a killed
        # request was retried and every kill was done, or at the cap.
        out = tmp_path / "released"
        stop = tmp_path / "stop"
        client = subprocess.Popen(
            [sys.executable, "-c", KILLED, url, token, str(cap), str(out), str(stop)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )

        def progress():
            lines = out.read_text().splitlines() if out.exists() else []
            return len(lines), int(lines[-1].split()[2]) if lines else 0

        rng = random.Random(26)
        done_kills, seen = 0, 0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and client.poll() is None:
            count, retried = progress()
            if done_kills >= kills and retried >= 1:
                break
            if count > seen:  # the client is spending: cut it off mid-request
                time.sleep(rng.uniform(0.0, 0.05))
                server.kill()
                done_kills += 1
                server.start()
                seen = progress()[0]
            time.sleep(0.01)
        stop.touch()
        stdout, stderr = client.communicate(timeout=300)
    finally:
        server.stop()
    assert client.returncode == 0, stderr
    retries = int(stdout.split()[-1])
    released = dict(tuple(map(int, line.split()[:2])) for line in out.read_text().splitlines())
    n = len(released)
    b = Budget.open(target)
    entries = b.entries()
    keys = [e.metadata["idempotency_key"] for e in entries]
    assert done_kills >= 1 and retries >= 1  # requests were cut off and sent again
    assert len(keys) == len(set(keys)) == n + 1  # each spend charged exactly once
    assert {f"k{i}" for i in released} | {"lost"} == set(keys)  # none lost
    assert {e.metadata["idempotency_key"]: e.index for e in entries if e.index > 0} == {
        f"k{i}": index for i, index in released.items()
    }
    assert b.verify() and b.remaining() == 1000.0 - (n + 1)
    return done_kills, retries


def test_server_killed_mid_spend_sqlite(tmp_path):
    _killed_mid_spend(str(tmp_path / "team.sqlite"), tmp_path, 300, 2)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_server_killed_mid_spend_many_times(kind, tmp_path, request):
    _killed_mid_spend(_store_for_service(kind, tmp_path, request), tmp_path, 900, 8)


def test_budget_exceeded_is_not_an_unreachable_service():
    assert not issubclass(BudgetExceededError, LedgerError)
    assert os.environ.get("RENYI_LEDGER_TOKEN") is None
