"""The ledger under real process death and real concurrency, on both stores.

SQLite (one file) and PostgreSQL (a real server started by the test session, see
conftest.py) run the same harness: separate spender processes, SIGKILLed at random moments
and restarted, racing for a budget. Afterwards every release a process announced (printed
only after ``spend`` returned, i.e. after the commit) has its entry, nothing was overspent,
and the hash chain and state verify.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from renyi.budget import Budget
from renyi.events import PureDpEvent

# One helper process imports renyi once and forks the spenders (so a restart costs no import
# time); each spender records a release in its own file only after ``spend`` returned.
HARNESS = textwrap.dedent(
    """
    import os, random, signal, sys, time
    from renyi.budget import Budget
    from renyi.errors import BudgetExceededError
    from renyi.events import PureDpEvent

    target, seconds, eps, nproc, outdir = sys.argv[1:6]
    seconds, eps, nproc = float(seconds), float(eps), int(nproc)
    pause = float(os.environ.get("SPEND_PAUSE", "0"))

    def spender(label):
        fd = os.open(f"{outdir}/{label}-{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        b = Budget.open(target)
        while True:
            try:
                r = b.spend(PureDpEvent(eps), label=label)
            except BudgetExceededError:
                return
            os.write(fd, f"{r.index}\\n".encode())  # released: announced after the commit
            # a job works between releases: without this pause an idle machine spent the
            # whole budget before the third kill (kills >= 5 failed); the kills land in
            # spends and in pauses alike, whatever the machine's speed
            time.sleep(random.uniform(0.0, pause))

    def fork(label):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                spender(label)
                code = 0
            finally:
                os._exit(code)
        return pid

    pids = [fork(f"p{i}") for i in range(nproc)]
    rng = random.Random(14)
    kills = 0
    start = time.monotonic()
    # at least `seconds`, and on a loaded machine longer (up to 3x) until 10 kills landed
    while (lambda t: t < seconds or (kills < 10 and t < 3 * seconds))(time.monotonic() - start):
        time.sleep(rng.uniform(0.01, 0.06))
        i = rng.randrange(nproc)
        if os.waitpid(pids[i], os.WNOHANG) == (0, 0):
            os.kill(pids[i], signal.SIGKILL)
            os.waitpid(pids[i], 0)
            kills += 1
        pids[i] = fork(f"p{i}")
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    print(kills, *codes)
    """
)


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_target(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    return request.getfixturevalue("postgres_url")


def _run(target, seconds, eps, nproc, outdir, pause=0.0):
    outdir.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "SPEND_PAUSE": str(pause)}
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, target, str(seconds), str(eps), str(nproc), str(outdir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    kills, *codes = (int(x) for x in done.stdout.split())
    announced = [int(x) for f in outdir.iterdir() for x in f.read_text().split()]
    return kills, codes, announced


def test_sigkill_storm_loses_nothing_and_never_overspends(ledger_target, tmp_path):
    """4 spenders for 150 units, pausing up to 20 ms between spends (so the budget lasts
    ~0.4 s or more on any machine); one is SIGKILLed and restarted every ~35 ms for 1.5 s."""
    Budget(epsilon=150.0, ledger=ledger_target)
    kills, codes, announced = _run(ledger_target, 1.5, 1.0, 4, tmp_path / "out", pause=0.02)
    b = Budget.open(ledger_target)
    entries = b.entries()
    assert kills >= 5 and codes == [0, 0, 0, 0]
    assert len(announced) == len(set(announced))  # no index handed out twice
    assert [e.index for e in entries] == list(range(len(entries)))
    assert set(announced) <= {e.index for e in entries}  # no announced release lost
    assert len(entries) == 150  # the budget was used to the end and never beyond
    assert b.verify()
    assert b.remaining() == 0.0 and not b.can_spend(PureDpEvent(1.0))


def test_concurrent_processes_never_overspend(ledger_target, tmp_path):
    Budget(epsilon=4.0, ledger=ledger_target)  # room for exactly 40 releases of 0.1
    kills, codes, announced = _run(ledger_target, 0.0, 0.1, 4, tmp_path / "out")
    b = Budget.open(ledger_target)
    assert kills == 0 and codes == [0, 0, 0, 0]
    assert sorted(announced) == list(range(40)) == [e.index for e in b.entries()]
    assert b.remaining() == 0.0
    assert b.verify()
    assert not b.can_spend(PureDpEvent(0.1))
