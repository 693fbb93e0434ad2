"""`mixgate serve`: settings from the environment and flags, logging, uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from gateway.http.logging_setup import configure_logging
from gateway.runtime.settings import Settings


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model folder (default: the small preset, made on first run)",
    )
    parser.add_argument("--model-name", default=None, help="model id clients send")
    parser.add_argument("--host", default=None, help="default 127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="default 8000")
    parser.add_argument(
        "--redis-url",
        default=None,
        help="default: an embedded redis-server (AOF) under the data folder",
    )
    parser.add_argument("--envelope", type=Path, default=None, help="operating envelope TOML")
    parser.add_argument("--data-dir", type=Path, default=None, help="default ./data")
    parser.add_argument("--api-keys", type=Path, default=None, help="API keys file (JSON/TOML)")
    parser.add_argument("--device", default=None, help="cpu | cuda | auto")
    parser.add_argument("--dtype", default=None, help="float32 | bfloat16 | auto")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--replica-id", default=None)
    parser.add_argument(
        "--policy",
        choices=("mixgate", "priority", "fcfs"),
        default=None,
        help="scheduling preset (default mixgate); the others are baselines",
    )
    parser.add_argument(
        "--engine",
        choices=("native", "vllm"),
        default=None,
        help="native (default) or vllm: vLLM's async engine in-process (pip install "
        "'mixgate[vllm]' or scripts/setup-vllm)",
    )
    parser.add_argument("--log-level", default=None)


def run_serve(args: argparse.Namespace) -> int:
    settings = Settings.from_env().with_overrides(
        model_dir=args.model,
        model_name=args.model_name,
        host=args.host,
        port=args.port,
        redis_url=args.redis_url,
        envelope_path=args.envelope,
        data_dir=args.data_dir,
        api_keys_path=args.api_keys,
        device=args.device,
        dtype=args.dtype,
        num_threads=args.threads,
        replica_id=args.replica_id,
        policy=args.policy,
        log_level=args.log_level,
        engine=args.engine,
    )
    configure_logging(settings.log_level, settings.log_json)
    if settings.engine == "vllm":
        # Fail at start, not in the background bring-up, when the extra is missing.
        from engine.backends.vllm.args import VllmNotInstalledError, require_vllm

        try:
            require_vllm()
        except VllmNotInstalledError as error:
            print(f"mixgate serve --engine vllm: {error}", file=sys.stderr)
            return 2
    # NOTE: imported here: the app pulls in torch; `mixgate --help` builds this parser.
    from gateway.http.app import begin_drain, create_app

    app = create_app(settings)
    # NOTE: uvicorn drains on SIGTERM, then re-raises the signal to the handler that was in
    # place before it; a no-op handler makes a drained shutdown exit 0, as orchestrators expect.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,  # RequestIdMiddleware logs one line per request, with its id
        timeout_graceful_shutdown=int(settings.drain_timeout_s) + 5,
    )
    state = app.state.gw
    server = _DrainingServer(config, lambda: begin_drain(state))
    server.run()
    # uvicorn.run's convention: 3 when the app never started (e.g. its lifespan refused).
    return 0 if server.started else 3


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, but a SIGTERM starts the gateway's drain at once (app.begin_drain)."""

    def __init__(self, config: uvicorn.Config, on_exit_signal: Callable[[], object]) -> None:
        super().__init__(config)
        self._on_exit_signal = on_exit_signal
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and not self._loop.is_closed():
            # A signal handler runs between two bytecodes: hand the work to the loop.
            self._loop.call_soon_threadsafe(self._on_exit_signal)
