"""The Lua scripts the batch layer runs: its own (`batch_*.lua`) and one of the queue's.

NOTE: `list_page.lua` is the queue's own script, run here with other keys (a tenant's files
or batches instead of jobs), so listings get its cursor semantics without a second copy. Batch
lines are admitted through `QueueStore.admit_many` itself (the batch's job listing as the
listing key), so they get exactly the queue's admission.
"""

from __future__ import annotations

from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

NAMES = ("list_page", "batch_record", "batch_transition", "batch_unlock")


def load_scripts(redis: Redis) -> dict[str, AsyncScript]:
    folder = resources.files("gateway.queue").joinpath("scripts")
    return {
        name: redis.register_script(folder.joinpath(f"{name}.lua").read_text()) for name in NAMES
    }
