"""The vLLM engine backend: the install check, and its suite inside the vLLM environment.

vLLM lives in its own environment, `.venv-vllm` (scripts/setup-vllm; .ci/run makes it), so
the tests that need it run there as one pytest subprocess (tests/vllm_inside/): in-process
engine tests (greedy parity in token ids, the class-aware scheduler's steps, abort) and
`mixgate serve --engine vllm` end to end. Without the environment they are skipped, except
in CI, where they fail.

The subprocess starts as soon as the session has collected this test (tests/conftest.py,
`pytest_collection_finish`; tests/vllm_suite.py, once per session under pytest-xdist too), not
when the test's turn comes: most of its minute is vLLM loading two engines, which overlaps the
rest of the suite instead of adding to it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import vllm_suite
from tests.dependencies import missing_dependency

VLLM_PYTHON = vllm_suite.VLLM_PYTHON
INSIDE_TESTS = 18
INSIDE_TEST_NAME = "test_vllm_suite_passes_inside_the_vllm_environment"


def test_engine_vllm_without_vllm_exits_at_start_with_the_install_hint(tmp_path: Path) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")
    result = subprocess.run(
        [sys.executable, "-m", "mixgate", "serve", "--engine", "vllm", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MIXGATE_DATA_DIR": str(tmp_path)},
    )
    assert result.returncode == 2
    assert "pip install 'mixgate[vllm]'" in result.stderr
    assert "scripts/setup-vllm" in result.stderr


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(900)
def test_vllm_suite_passes_inside_the_vllm_environment() -> None:
    if not VLLM_PYTHON.is_file():
        missing_dependency(".venv-vllm is missing (scripts/setup-vllm makes it; .ci/run runs it)")
    vllm_suite.start()  # already under way since the session collected this test
    returncode, output = vllm_suite.wait()
    tail = output[-6000:]
    assert returncode == 0, tail
    # Every inside test ran: none skipped for a missing vLLM or redis-server.
    assert re.search(rf"\b{INSIDE_TESTS} passed\b", output), tail
    assert "skipped" not in output.strip().splitlines()[-1], tail
