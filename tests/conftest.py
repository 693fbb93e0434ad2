"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # Async tests run on asyncio through anyio's pytest plugin (marked `pytest.mark.anyio`).
    # Session scope so that fixtures of any scope may be async.
    return "asyncio"


# ---- a real redis-server for the session ---------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_redis(binary: str, data_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    # The free port can be taken between probing and binding, so retry a few times.
    for _ in range(3):
        port = _free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(data_dir),
             "--logfile", str(data_dir / f"redis-{port}.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10.0
        while proc.poll() is None and time.monotonic() < deadline:
            if _answers_ping(port):
                return proc, port
            time.sleep(0.01)
        _stop(proc)
    raise RuntimeError(f"redis-server did not start; see the logs in {data_dir}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a throwaway redis-server on 127.0.0.1 (no persistence). Tests sharing it must
    use their own key prefix."""
    binary = shutil.which("redis-server")
    if binary is None:
        # NOTE: in CI a missing binary is a broken image, not a reason to run fewer tests.
        if os.environ.get("CI"):
            pytest.fail("redis-server is not on PATH and CI is set: install it in the CI image")
        pytest.skip("redis-server is not on PATH (apt-get install -y redis-server)")
    proc, port = _start_redis(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)


# ---- model folders made offline, once per session -------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `tiny` preset folder (seeded random weights, byte-level tokenizer), HF layout."""
    from engine.make_model import make_model

    return make_model(tmp_path_factory.mktemp("tiny-model"), "tiny", seed=1)
