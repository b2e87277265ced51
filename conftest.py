"""Repository-level pytest configuration.

* No traffic off this machine: Flower's telemetry and Ray's usage statistics are switched off
  here, before any test can import them (``renyi.federated.flower`` and the CLI do the same),
  and Hugging Face's hub is offline (models come from configs, tokenisers are trained here).
* `make test` collects the docstring examples of src/renyi and the ```>>>``` examples of
  docs/*.md; modules whose optional dependency is absent are left out instead of failing.
* ``postgres_url``: a real PostgreSQL server for the ledger tests, started by the test
  session itself (``initdb`` into a temporary directory, ``pg_ctl start`` listening on a
  unix socket only — no TCP port at all) and stopped at the end. Skipped, saying why, only
  when the server binaries are absent (`make test` installs them with apt-get).
"""

import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
import uuid

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # Hugging Face: models from configs, no download

collect_ignore = []
if importlib.util.find_spec("flwr") is None:
    collect_ignore.append("src/renyi/federated/flower.py")
if importlib.util.find_spec("torch") is None:
    collect_ignore.append("src/renyi/dpsgd")
elif importlib.util.find_spec("transformers") is None:
    collect_ignore.append("src/renyi/dpsgd/hf.py")


def _postgres_bindir():
    found = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        version = os.path.basename(os.path.dirname(os.path.dirname(initdb)))
        found.append((int(version) if version.isdigit() else 0, os.path.dirname(initdb)))
    if found:
        return max(found)[1]
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


@pytest.fixture(scope="session")
def postgres_server():
    """``(socket_dir, port)`` of a throw-away PostgreSQL server (unix socket only)."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg is not installed (pip install 'renyi[postgres]')")
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    root = tempfile.mkdtemp(prefix="renyi-pg-")
    data = os.path.join(root, "data")
    prefix = []
    if os.geteuid() == 0:  # initdb refuses to run as root: run the server as `postgres`
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        shutil.chown(root, "postgres", "postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
    port = "54329"

    def run(*args):
        subprocess.run(prefix + list(args), check=True, capture_output=True, timeout=120)

    run(f"{bindir}/initdb", "-D", data, "-U", "renyi", "--auth=trust", "-E", "UTF8", "--no-sync")
    opts = f"-k {root} -c listen_addresses='' -p {port} -c max_connections=60"
    run(f"{bindir}/pg_ctl", "-D", data, "-o", opts, "-l", f"{root}/log", "-w", "-t", "60", "start")
    try:
        yield root, port
    finally:
        subprocess.run(
            [*prefix, f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server):
    """A URL naming a fresh ledger on the session's PostgreSQL server."""
    sock, port = postgres_server
    return f"postgresql://renyi@/postgres?host={sock}&port={port}#t{uuid.uuid4().hex[:12]}"
