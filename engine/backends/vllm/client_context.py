"""What `AsyncLLM.shutdown` leaves behind: the ZeroMQ context of vLLM's engine-core client.

vLLM (0.32, `BackgroundResources`) closes the client's sockets at shutdown but not their
context, leaving it to the garbage collector, and pyzmq reports every context collected unclosed
(`ResourceWarning: Unclosed context`): one per engine stopped, which failed the vLLM test suite
whenever a collection found one before the session ended.
"""

from __future__ import annotations

from typing import Any

__all__ = ["destroy_client_context"]


def destroy_client_context(llm: Any) -> None:
    """Destroy the context of a shut-down `AsyncLLM`'s client; sockets still open (vLLM may
    close them later, on the event loop) are closed with it."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    context = getattr(resources, "ctx", None)
    if context is not None and not context.closed:
        context.destroy(linger=0)
