"""Missing test dependencies: a skip on a developer's machine, a failure in CI.

Under ``CI=true`` (how `.ci/run` runs) a missing module or binary means a broken CI image or
install step, never a reason to run fewer tests: a skipped test there would let a green run
hide it. Everywhere else a missing optional tool only skips the tests that need it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

__all__ = ["missing_dependency", "require_module", "under_ci"]


def under_ci() -> bool:
    """CI=true (as .ci/run sets it); any other value that CI services use for yes counts."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_dependency(reason: str) -> NoReturn:
    """Fail under CI=true, skip elsewhere (also at module level)."""
    if under_ci():
        pytest.fail(f"{reason} (CI=true: a missing test dependency fails)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, hint: str = "") -> ModuleType:
    """`pytest.importorskip`, except that under CI=true a module that will not import fails."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        suffix = f": {hint}" if hint else ""
        missing_dependency(f"cannot import {name} ({error}){suffix}")
