"""The Lua scripts the batch layer runs: its own (`batch_*.lua`) and two of the queue's.

NOTE: `admit.lua` and `list_page.lua` are the queue's own scripts, run here with other keys
(a batch's job listing instead of the tenant's; a tenant's files or batches instead of jobs),
so batch lines get exactly the queue's admission (duplicate ids, the class bound) and listings
get its cursor semantics, without a second copy of either script.
"""

from __future__ import annotations

from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

NAMES = ("admit", "list_page", "batch_record", "batch_transition", "batch_unlock")


def load_scripts(redis: Redis) -> dict[str, AsyncScript]:
    folder = resources.files("gateway.queue").joinpath("scripts")
    return {
        name: redis.register_script(folder.joinpath(f"{name}.lua").read_text()) for name in NAMES
    }
