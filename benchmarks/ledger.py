"""Ledger throughput: local spends vs remote spends through ``renyi ledger serve``; dashboard time.

One run measures, on SQLite and on PostgreSQL (a throw-away server started here, unix socket
only, like the test suite's):

* local spends/s: ``Budget.spend`` in this process (durable commit each);
* remote spends/s with 1 and with 8 client processes (``Budget.connect``, one HTTP request
  per spend, idempotency key each) against one service process on loopback;
* the dashboard's ledger page and the API's ledger object with 10^4 entries (median of 5
  requests after one warm-up; the full chain verification at service start is not in it).

Usage: ``python benchmarks/ledger.py [--spends 300] [--entries 10000] [--no-postgres]``.
Everything listens on 127.0.0.1 or a unix socket and stops by itself. Timings on a shared
machine move with its load: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from renyi.budget import Budget
from renyi.events import PureDpEvent
from renyi.ledger import open_store
from renyi.ledger.tokens import create_token

CLIENT = """
import sys, time, uuid
from renyi.events import PureDpEvent
from renyi.ledger.client import RemoteBudget
url, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = RemoteBudget(url, token=token, timeout=120)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
t = time.perf_counter()
for i in range(n):
    b.spend(PureDpEvent(1e-6), idempotency_key=uuid.uuid4().hex)
print(time.perf_counter() - t)
"""


def _env() -> dict[str, str]:
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _serve(target: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "renyi", "ledger", "serve", target, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if "http://" not in line:
        raise SystemExit(
            f"service did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        )
    return proc, "http://" + line.split("http://", 1)[1].split("/", 1)[0]


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(30)


def local_rate(target: str, n: int) -> float:
    b = Budget.open(target)
    t = time.perf_counter()
    for _ in range(n):
        b.spend(PureDpEvent(1e-6))
    return n / (time.perf_counter() - t)


def remote_rate(url: str, token: str, clients: int, n: int) -> float:
    """Spends/s of ``clients`` processes, each spending ``n`` times, started together."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, token, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for _ in range(clients)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        p.communicate(timeout=900)
    return clients * n / (time.perf_counter() - t)


def _get(url: str, path: str, token: str) -> float:
    host, port = url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    t = time.perf_counter()
    headers = {"Cookie": f"renyi_ledger_token={token}", "Authorization": f"Bearer {token}"}
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    dt = time.perf_counter() - t
    conn.close()
    if resp.status != 200 or not body:
        raise SystemExit(f"GET {path}: HTTP {resp.status}")
    return dt


def store_run(label: str, target: str, spends: int) -> dict[str, float]:
    Budget(epsilon=1e6, ledger=target)
    token = create_token(open_store(target), name="bench", role="spend")
    out = {"local": local_rate(target, spends)}
    proc, url = _serve(target)
    name = target.rsplit("#", 1)[1] if "#" in target else "default"
    try:
        out["remote_1"] = remote_rate(f"{url}#{name}", token, 1, spends)
        out["remote_8"] = remote_rate(f"{url}#{name}", token, 8, max(spends // 4, 10))
        out["local_again"] = local_rate(target, spends)  # beside a running service
    finally:
        _stop(proc)
    print(
        f"{label:10s} local {out['local']:7.0f}/s (again, service idle: {out['local_again']:.0f}/s)"
        f"  remote 1 client {out['remote_1']:6.0f}/s  8 clients {out['remote_8']:6.0f}/s",
        flush=True,
    )
    return out


def dashboard_run(entries: int, tmp: str) -> dict[str, float]:
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tmp  # 10^4 durable commits: fast
    path = os.path.join(tempfile.mkdtemp(dir=folder), "big.sqlite")
    b = Budget(epsilon=1e6, ledger=path)
    t = time.perf_counter()
    for i in range(entries):
        b.spend(PureDpEvent(1e-3), label=f"q{i}", metadata={"job": f"job-{i % 7}", "who": "bench"})
    filled = time.perf_counter() - t
    b.close()
    token = create_token(open_store(path), name="reader", role="read")
    t = time.perf_counter()
    proc, url = _serve(path)
    started = time.perf_counter() - t
    try:
        _get(url, "/ledgers/default", token)  # warm-up
        page = [_get(url, "/ledgers/default", token) for _ in range(5)]
        api = [_get(url, "/api/v1/ledgers/default", token) for _ in range(5)]
    finally:
        _stop(proc)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    out = {"page": statistics.median(page), "api": statistics.median(api), "start": started}
    print(
        f"dashboard with {entries} entries: page {out['page'] * 1000:.0f} ms, API ledger object "
        f"{out['api'] * 1000:.0f} ms (medians of 5); service start incl. full verification "
        f"{started:.1f} s; filling took {filled:.0f} s",
        flush=True,
    )
    return out


def postgres_url(root: str) -> tuple[str, list[str]] | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        return None
    bindir = os.path.dirname(found[-1])
    prefix: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(root, "data")
    run = lambda *a: subprocess.run(prefix + list(a), check=True, capture_output=True)  # noqa: E731
    run(f"{bindir}/initdb", "-D", data, "-U", "renyi", "--auth=trust", "--no-sync")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = f"-k {root} -c listen_addresses='' -p {port} -c max_connections=60"
    run(f"{bindir}/pg_ctl", "-D", data, "-o", opts, "-l", f"{root}/log", "-w", "start")
    stop = [*prefix, f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"]
    return f"postgresql://renyi@/postgres?host={root}&port={port}", stop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spends", type=int, default=300, help="spends per measurement")
    p.add_argument("--entries", type=int, default=10_000, help="entries for the dashboard")
    p.add_argument("--no-postgres", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    tmp = tempfile.mkdtemp(prefix="renyi-ledger-bench-")
    results: dict[str, object] = {}
    try:
        results["sqlite"] = store_run("SQLite", os.path.join(tmp, "team.sqlite"), args.spends)
        if not args.no_postgres:
            pg = postgres_url(tempfile.mkdtemp(prefix="renyi-pg-"))
            if pg is None:
                print("PostgreSQL: no server binaries (apt-get install postgresql); skipped")
            else:
                url, stop = pg
                try:
                    results["postgres"] = store_run(
                        "PostgreSQL", f"{url}#b{uuid.uuid4().hex[:6]}", args.spends
                    )
                finally:
                    subprocess.run(stop, capture_output=True)
        results["dashboard"] = dashboard_run(args.entries, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
