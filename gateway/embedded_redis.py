"""The embedded default when REDIS_URL is unset: a redis-server child process on a unix socket
with AOF under the data folder, or, when no redis-server is installed, in-process fakeredis
(neither durable nor shared across processes: it says so)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis
import structlog

log = structlog.get_logger("mixgate.redis")


class EmbeddedRedis:
    def __init__(self, data_dir: Path):
        # Absolute: redis-server changes into --dir before it opens the log file.
        self.data_dir = (data_dir / "redis").resolve()
        self.socket_path = self.data_dir / "redis.sock"
        self._process: subprocess.Popen[bytes] | None = None

    async def start(
        self, pool_for: Callable[[str], aioredis.BlockingConnectionPool] | None = None
    ) -> aioredis.Redis:
        binary = shutil.which("redis-server")
        if binary is None:
            return self._fake()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
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
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
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
        self._process = None
