"""The long-lived party node (renyi.federated.flower_node) and the loopback deployment's
forked nodes (renyi.federated.flower_deploy): what forking may and may not share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
pytest.importorskip("flwr")

from renyi.errors import RenyiError
from renyi.federated.flower_deploy import ForkedNode
from renyi.federated.flower_node import fork_nodes

SRC = str(Path(__file__).resolve().parents[1] / "src")

# A launcher in miniature: import what a party node imports, use the CSPRNG once (so the
# process holds a pool of random bytes, the state a careless fork would copy), then fork
# two children that each draw everything a party draws for a session.
_FORK_SCRIPT = r"""
import json, os, sys
import renyi.federated.flower_node, renyi.federated.secagg_flower
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives import serialization
from renyi import noise
from renyi.federated.channels import IdentityKey
from renyi.random import get_source
get_source(None).words(3)
noise.standard_normal(3)
r, w = os.pipe()
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        raw = serialization.Encoding.Raw
        out = {
            "words": [int(x) for x in get_source(None).words(4)],
            "normal": [float(x) for x in noise.standard_normal(4)],
            "x25519": X25519PrivateKey.generate().public_key().public_bytes(
                raw, serialization.PublicFormat.Raw).hex(),
            "ed25519": IdentityKey("p").public_bytes.hex(),
            "urandom": os.urandom(16).hex(),
        }
        os.write(w, (json.dumps(out) + "\n").encode())
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
os.close(w)
sys.stdout.write(os.read(r, 1 << 16).decode())
"""


def test_forked_nodes_share_no_random_bytes() -> None:
    """Two nodes forked from one launcher draw different CSPRNG words, noise, X25519 and
    Ed25519 keys: renyi's pool is discarded in the child, OpenSSL reseeds after fork."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    a, b = (json.loads(line) for line in out.splitlines())
    for key in a:
        assert a[key] != b[key], key


def test_fork_nodes_refuses_a_threaded_process() -> None:
    """A child of a threaded process may inherit a lock another thread held: refused
    before any fork."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with pytest.raises(RenyiError, match="fork_nodes"):
            fork_nodes("127.0.0.1:1", "renyi.federated.secagg_flower:client_app", [])
    finally:
        stop.set()
        t.join()


def test_forked_node_handle_sees_exit_even_before_the_parent_reaps() -> None:
    """A node's exit status goes to the launcher; the handle reads /proc: a zombie (dead,
    not yet reaped) or a vanished pid is an exited node."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        node = ForkedNode(child.pid)
        assert node.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            node.wait(timeout=0.05)
        child.kill()
        assert node.wait(timeout=10) == -1  # a zombie: this process has not reaped it
        child.wait()
        assert node.poll() == -1
    finally:
        child.kill()
        child.wait()
