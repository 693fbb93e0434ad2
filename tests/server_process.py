"""Start real `mixgate serve` processes (uvicorn on loopback) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class ServerProcess:
    model_dir: Path
    redis_url: str
    key_prefix: str
    data_dir: Path
    envelope_path: Path | None = None
    api_keys_json: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 60.0) -> ServerProcess:
        env = {
            **os.environ,
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
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"server-{self.port}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(ready_timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not ready in {timeout_s} s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode
