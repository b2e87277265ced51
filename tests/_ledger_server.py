"""A real ``renyi ledger serve`` process on loopback, for the ledger service tests."""

import os
import select
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(extra or {})}
    env.pop("RENYI_LEDGER_TOKEN", None)
    return env


class Server:
    """``renyi ledger serve TARGET --port PORT``, started and waited for (its first line)."""

    def __init__(self, target, *, port=0, env=None, timeout=60):
        self.target, self.port, self.extra = str(target), port, env
        self.proc = None
        self.url = None
        self.start(timeout)

    def start(self, timeout=60):
        cmd = [sys.executable, "-m", "renyi", "ledger", "serve", self.target]
        cmd += ["--port", str(self.port)]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(self.extra),
            text=True,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if "http://" not in line:
            self.proc.kill()
            err = self.proc.stderr.read()
            raise RuntimeError(f"the ledger service did not start: {line!r} {err!r}")
        self.url = line.split("http://", 1)[1].split("/", 1)[0]
        self.url = "http://" + self.url
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def kill(self):
        """SIGKILL: no shutdown of any kind."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


def wait_until(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.05)
    return False
