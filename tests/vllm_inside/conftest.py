"""Collected only where vLLM is installed (the main suite runs this folder through
tests/engine/test_vllm_backend.py in .venv-vllm instead)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if importlib.util.find_spec("vllm") is None and collection_path.suffix == ".py":
        return True
    return None
