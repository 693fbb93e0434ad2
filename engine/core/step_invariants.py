"""What every scheduled step must hold, checked before it runs: a broken one raises at once
rather than computing on the wrong tokens or blocks."""

from __future__ import annotations

from engine.core.config import EngineConfig
from engine.core.scheduler_output import SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus

__all__ = ["check_step"]


def check_step(
    output: SchedulerOutput,
    config: EngineConfig,
    *,
    running: list[Sequence],
    running_bulk_seqs: int,
    block_size_tokens: int,
) -> None:
    if output.num_scheduled_tokens > config.step_token_budget:
        raise RuntimeError("scheduled tokens exceed the step budget")
    if len(running) > config.max_running_seqs:
        raise RuntimeError("running sequences exceed max_running_seqs")
    if running_bulk_seqs > config.max_active_seqs:
        raise RuntimeError("running bulk sequences exceed max_active_seqs")
    for chunk in output.chunks:
        seq = chunk.seq
        if seq.status is not SequenceStatus.RUNNING:
            raise RuntimeError(f"scheduled sequence {seq.seq_id} is not running")
        if len(seq.block_table) * block_size_tokens < chunk.end_pos:
            raise RuntimeError(f"sequence {seq.seq_id} lacks blocks for its chunk")
