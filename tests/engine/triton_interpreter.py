"""Running a Triton kernel test module again in Triton's interpreter, on a machine without a GPU.

The interpreter must be on before Triton is imported (its standard library is jit'd at import),
so the module runs itself in a child pytest with TRITON_INTERPRET=1, skipping this very test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def assert_passes_in_the_interpreter(test_file: str, passed: int, timeout_s: float) -> None:
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(Path(test_file)),
            "-k",
            "not in_the_triton_interpreter",
        ],  # fmt: skip
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert f"{passed} passed" in child.stdout, child.stdout
