"""Real processes a benchmark (or an end-to-end test) drives: a throwaway redis-server and
`mixgate serve` children on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when the process that started it dies.

    NOTE: a test run killed by a timeout (or ^C twice) skips fixture teardown; without this its
    servers linger, hold ports and steal the CPU that later measurements run on.
    """
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> int:
    """SIGTERM, then SIGKILL after the timeout; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(
    binary: str, data_dir: Path, *, port: int | None = None, durable: bool = False
) -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server on a free loopback port (or `port`), retried because the free port can
    be taken between probing and binding.

    `durable`: AOF with `appendfsync always` in `data_dir`, so a restart on the same port and
    folder finds every write that was acknowledged (fault tests restart it that way).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    persistence = (
        ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
    )
    for _ in range(1 if port is not None else 3):
        chosen = port if port is not None else free_port()
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(chosen),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                *persistence,
                "--dir",
                str(data_dir),
                "--logfile",
                str(data_dir / f"redis-{chosen}.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 10.0
        while proc.poll() is None and time.monotonic() < deadline:
            if _answers_ping(chosen):
                return proc, chosen
            time.sleep(0.01)
        stop_process(proc)
    raise RuntimeError(f"redis-server did not start; see the logs in {data_dir}")


@contextmanager
def redis_url(given: str | None, data_dir: Path) -> Iterator[str]:
    """The given URL, or that of a throwaway redis-server stopped on exit."""
    if given is not None:
        yield given
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("no --redis-url and no redis-server on PATH")
    proc, port = start_redis(binary, data_dir)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process(proc)


def answers_ok(
    url: str, process: subprocess.Popen[bytes], timeout_s: float, *, interval_s: float
) -> bool:
    """Poll GET `url` until it answers 200 (True); False once `process` exits or `timeout_s`
    passes (the caller tells which by `process.poll()`)."""
    deadline = time.monotonic() + timeout_s
    # NOTE: one client for every probe: `httpx.get` makes a client per call, and each loads
    # the CA bundle into a TLS context (half of the bench process's CPU while a vLLM-backed
    # server started, the two cores its engine start needed).
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(interval_s)
    return False


@dataclass
class ServerProcess:
    """A `mixgate serve` child with its own key prefix and data folder."""

    model_dir: Path
    redis_url: str
    key_prefix: str
    data_dir: Path
    envelope_path: Path | None = None
    api_keys_json: str | None = None
    policy: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 120.0) -> ServerProcess:
        self.launch()
        self.wait_ready(ready_timeout_s)
        return self

    def launch(self) -> ServerProcess:
        """Start the child without waiting for it (start several, then `wait_ready` each)."""
        # The child's settings come from here alone, not from the caller's MIXGATE_* variables.
        env = {k: v for k, v in os.environ.items() if not k.startswith("MIXGATE_")}
        env |= {
            "MIXGATE_KEY_PREFIX": self.key_prefix,
            "MIXGATE_DATA_DIR": str(self.data_dir),
            "MIXGATE_NUM_THREADS": "1",
            "MIXGATE_LEASE_S": "2",
            "MIXGATE_KV_CACHE_BYTES": str(64 << 20),
            **self.extra_env,
        }
        if self.api_keys_json is not None:
            env["MIXGATE_API_KEYS"] = self.api_keys_json
        args = [
            sys.executable,
            "-m",
            "mixgate",
            "serve",
            "--model",
            str(self.model_dir),
            "--port",
            str(self.port),
            "--redis-url",
            self.redis_url,
            "--device",
            "cpu",
        ]
        if self.envelope_path is not None:
            args += ["--envelope", str(self.envelope_path)]
        if self.policy is not None:
            args += ["--policy", self.policy]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"server-{self.port}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                args,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        return self

    def wait_ready(self, timeout_s: float) -> None:
        if self.process is not None and answers_ok(
            self.url + "/readyz", self.process, timeout_s, interval_s=0.05
        ):
            return
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"mixgate serve exited early:\n{self.logs()}")
        raise RuntimeError(f"mixgate serve not ready in {timeout_s} s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> int | None:
        return None if self.process is None else stop_process(self.process, 30.0)

    def rss_bytes(self) -> int | None:
        """Resident memory of the server process (VmRSS), or None once it has exited."""
        if self.process is None or self.process.poll() is not None:
            return None
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None
