"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bench.live.processes import ServerProcess, start_redis, stop_process
from gateway.queue.keys import Keys
from tests.dependencies import missing_dependency


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # Async tests run on asyncio through anyio's pytest plugin (marked `pytest.mark.anyio`).
    # Session scope so that fixtures of any scope may be async.
    return "asyncio"


# ---- a real redis-server for the session ---------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a throwaway redis-server on 127.0.0.1 (no persistence). Tests sharing it must
    use their own key prefix."""
    binary = shutil.which("redis-server")
    if binary is None:
        # NOTE: in CI a missing binary is a broken image, not a reason to run fewer tests.
        missing_dependency("redis-server is not on PATH (apt-get install -y redis-server)")
    proc, port = start_redis(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process(proc)


@pytest.fixture
async def aclient(redis_server: str) -> AsyncIterator[aioredis.Redis]:
    """An asyncio client of the session's redis-server (str replies), closed after the test."""
    client = aioredis.from_url(redis_server, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def keys() -> Keys:
    # A random prefix per test: tests share the real server without seeing each other's keys.
    return Keys(prefix=f"{{mixgate-test-{uuid.uuid4().hex[:12]}}}:")


# ---- model folders made offline, once per session -------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `tiny` preset folder (seeded random weights, byte-level tokenizer), HF layout."""
    from engine.model.make_model import make_model

    return make_model(tmp_path_factory.mktemp("tiny-model"), "tiny", seed=1)


# ---- a live `mixgate serve` on the tiny model, per test module ------------------------------


@pytest.fixture(scope="module")
def live_server(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A real server (its own key prefix on the session's redis-server), stopped cleanly."""
    prefix = f"{{mg-{uuid.uuid4().hex[:8]}}}:"
    data_dir = tmp_path_factory.mktemp("live") / prefix.strip("{}:")
    proc = ServerProcess(tiny_model_dir, redis_server, prefix, data_dir).start()
    yield proc
    assert proc.stop() == 0, proc.logs()


# ---- order: the longest modules first -------------------------------------------------------


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Modules with a `slow` test run first, the one that waits for the vLLM suite last; each
    module's tests stay together and in order (its module-scoped servers start once).

    Under pytest-xdist (`--dist loadfile --no-loadscope-reorder`, scripts/test; xdist would
    otherwise order modules by their number of tests) modules go to the workers in this order,
    one at a time as each worker runs dry, so the longest are spread over both CPUs from the
    start instead of one of them closing the run alone (guidellm's did, for a minute); the vLLM
    suite's waiter holds a worker only once the rest is done.
    """
    from tests.engine.test_vllm_backend import INSIDE_TEST_NAME

    def module(item: pytest.Item) -> object:
        return getattr(item, "module", None)

    slow_modules = {module(item) for item in items if item.get_closest_marker("slow")}
    waiter_modules = {module(item) for item in items if item.name == INSIDE_TEST_NAME}

    def rank(item: pytest.Item) -> int:
        if module(item) in waiter_modules:
            return 2
        return 0 if module(item) in slow_modules else 1

    first_index: dict[object, int] = {}
    for index, item in enumerate(items):
        first_index.setdefault(module(item), index)
    items.sort(key=lambda item: (rank(item), first_index[module(item)]))


# ---- the vLLM environment's suite, started early ---------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    from tests import vllm_suite

    vllm_suite.configure_session()


def pytest_collection_finish(session: pytest.Session) -> None:
    # The inside suite is a minute of vLLM start-up in another process: begin it now, so that it
    # runs beside the rest of the suite (tests/engine/test_vllm_backend.py waits for it). Every
    # xdist worker collects every test; tests/vllm_suite.py runs it once for all of them.
    from tests import vllm_suite
    from tests.engine.test_vllm_backend import INSIDE_TEST_NAME

    if vllm_suite.VLLM_PYTHON.is_file() and any(
        item.name == INSIDE_TEST_NAME for item in session.items
    ):
        vllm_suite.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests import vllm_suite

    vllm_suite.finish_session()
