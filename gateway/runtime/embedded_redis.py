"""The embedded default when REDIS_URL is unset: a redis-server child process on a unix socket
with AOF under the data folder, or, when no redis-server is installed, in-process fakeredis
(neither durable nor shared across processes: it says so).

Ownership: the child dies with this process (PR_SET_PDEATHSIG), writes a pidfile, and a start
that finds a live redis-server on the same data folder refuses with a clear message rather than
start a second server on the same AOF (adopting one would mean serving from a server whose
settings and owner we do not know).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis
import structlog

from engine.process.parent_death import die_with_parent_preexec

log = structlog.get_logger("mixgate.redis")


class EmbeddedRedis:
    def __init__(self, data_dir: Path):
        # Absolute: redis-server changes into --dir before it opens the log file.
        self.data_dir = (data_dir / "redis").resolve()
        self.socket_path = self.data_dir / "redis.sock"
        self.pidfile = self.data_dir / "redis.pid"
        self._process: subprocess.Popen[bytes] | None = None

    async def start(
        self, pool_for: Callable[[str], aioredis.BlockingConnectionPool] | None = None
    ) -> aioredis.Redis:
        binary = shutil.which("redis-server")
        if binary is None:
            return self._fake()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_if_running()
        self.socket_path.unlink(missing_ok=True)
        self.pidfile.unlink(missing_ok=True)
        # NOTE: appendfsync always: Redis 7.0 has no WAITAOF, and a bulk job is accepted only
        # once durable; `everysec` could lose the last second of accepted jobs on a crash.
        self._process = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--unixsocket",
                str(self.socket_path),
                "--unixsocketperm",
                "700",
                "--dir",
                str(self.data_dir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--logfile",
                str(self.data_dir / "redis.log"),
                "--pidfile",
                str(self.pidfile),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # NOTE: start() runs on the event-loop thread, which lives as long as the process:
            # the parent-death signal fires when the forking *thread* exits.
            preexec_fn=die_with_parent_preexec(os.getpid()),
        )
        if pool_for is not None:
            client = aioredis.Redis(connection_pool=pool_for(str(self.socket_path)))
        else:
            client = aioredis.Redis(unix_socket_path=str(self.socket_path), decode_responses=True)
        for _ in range(500):
            if self._process.poll() is not None:
                raise RuntimeError(f"embedded redis-server exited; see {self.data_dir}/redis.log")
            try:
                await client.ping()
                log.info("embedded_redis_started", socket=str(self.socket_path), aof=True)
                return client
            except (ConnectionError, OSError, aioredis.ConnectionError):
                await asyncio.sleep(0.01)
        raise RuntimeError("embedded redis-server did not answer within 5 s")

    def _refuse_if_running(self) -> None:
        """Raise if a redis-server already serves this data folder (never two on one AOF)."""
        pid = _read_pid(self.pidfile)
        if pid is not None and _is_redis_server(pid):
            raise EmbeddedRedisRunningError(
                f"a redis-server (pid {pid}) is already running on {self.data_dir}: another "
                "`mixgate serve` uses this data folder, or one was killed and left it behind; "
                "stop it (or use another --data-dir, or set REDIS_URL to share it) and retry"
            )
        if _answers_ping(self.socket_path):
            raise EmbeddedRedisRunningError(
                f"a redis-server already answers on {self.socket_path}: another `mixgate "
                "serve` uses this data folder; stop it (or use another --data-dir) and retry"
            )

    def _fake(self) -> aioredis.Redis:
        import fakeredis

        log.warning(
            "embedded_fakeredis",
            message="redis-server is not installed: using in-process fakeredis, which is "
            "neither durable nor shared between replicas; set REDIS_URL or install redis-server",
        )
        client: aioredis.Redis = fakeredis.FakeAsyncRedis(decode_responses=True)
        return client

    async def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            await asyncio.to_thread(self._process.wait, 10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            await asyncio.to_thread(self._process.wait)
        self._process = None
        self.pidfile.unlink(missing_ok=True)


class EmbeddedRedisRunningError(RuntimeError):
    """A live redis-server already owns the data folder's socket and AOF."""


def _read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_redis_server(pid: int) -> bool:
    """A live (not zombie) redis-server: the pidfile's pid may be reused or unreaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    state = stat[stat.rindex(")") + 2 :].split()[0]
    return name.startswith("redis-server") and state not in ("Z", "X")


def _answers_ping(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            sock.connect(str(socket_path))
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
