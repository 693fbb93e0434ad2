"""The `without_compiler` fixture forgets every built-once native kernel binding.

A binding it does not forget keeps, for the rest of the test process, whatever it found inside
a test without a compiler (None): later tests in that process then run the fallback path and fail
or, worse, pass without the kernel. The paged prefill kernel was left out of the list once, and
a test of the mixed step failed only where pytest happened to order it after such a test.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import engine.model.kernels as kernels
from tests.engine.conftest import _KERNELS


def _native_kernel_loaders() -> set[str]:
    found = set()
    for module_info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{module_info.name}")
        for name, value in vars(module).items():
            wrapped = getattr(value, "__wrapped__", None)
            if not (hasattr(value, "cache_clear") and inspect.isfunction(wrapped)):
                continue
            if wrapped.__module__ == module.__name__ and "load_kernel_or_none(" in (
                inspect.getsource(wrapped)
            ):
                found.add(f"{module.__name__}.{name}")
    return found


def test_every_native_kernel_loader_is_forgotten_by_the_fixture() -> None:
    loaders = _native_kernel_loaders()
    # The five C kernels' loaders: the scan must see them, or it checks nothing.
    assert len(loaders) >= 5, loaders
    listed = {f"{k.__wrapped__.__module__}.{k.__wrapped__.__name__}" for k in _KERNELS}
    assert loaders <= listed, loaders - listed
