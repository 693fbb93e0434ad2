"""The operator console at /console: a live view of both classes, the envelope in force, jobs
and batches, and a chat playground (static files in `static/`, read from the package)."""

from gateway.console.live import ConsoleLive
from gateway.console.routes import console_routes

__all__ = ["ConsoleLive", "console_routes"]
