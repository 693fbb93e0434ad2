"""The simulator's own contract: deterministic for a seed, virtual time equal to the cost
model's step estimates, and the gateway's limits (queue bounds) applied as live."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest

from bench.load.records import REJECTED
from bench.load.workload import parse_workload
from bench.sim.setup import resolve_target
from bench.sim.simulate import SimSpec, simulate
from planning.calibration_file import write_calibration
from planning.costmodel import mixed_step_estimate_s
from policies.envelope import Envelope

SMALL_MIX = """
name = "sim-small-mix"
duration_s = 4.0
seed = 3

[interactive]
arrival = {kind = "poisson", rate_per_s = 25.0}
prompt_tokens = {kind = "uniform", min = 16, max = 200}
output_tokens = {kind = "uniform", min = 4, max = 24}
cancel = {probability = 0.1, when = "mid_stream", after_tokens = 3}

[bulk]
arrival = {kind = "backlog", count = 30}
prompt_tokens = {kind = "uniform", min = 100, max = 400}
output_tokens = {kind = "uniform", min = 8, max = 32}
"""

ONE_CHAT = """
name = "one-chat"
duration_s = 1.0
seed = 1

[interactive]
arrival = {kind = "backlog", count = 1}
prompt_tokens = {kind = "fixed", value = 1000}
output_tokens = {kind = "fixed", value = 5}
"""


@pytest.fixture(scope="module")
def gpu_spec() -> SimSpec:
    # A 70B-shaped model on 8 H100s: the GPU scale the simulator exists for.
    return SimSpec(resolve_target("llama-3-70b", "h100", devices=8), drain_s=2.0)


def _as_dicts(spec: SimSpec, seed: int | None) -> list[dict[str, object]]:
    result, _, _ = simulate(dataclasses.replace(spec, seed=seed), parse_workload(SMALL_MIX))
    return [dataclasses.asdict(r) for r in result.records]


def test_same_seed_same_records_other_seed_other_records(gpu_spec: SimSpec) -> None:
    first = _as_dicts(gpu_spec, 5)
    assert first == _as_dicts(gpu_spec, 5)
    assert first != _as_dicts(gpu_spec, 6)
    outcomes = {r["outcome"] for r in first}
    assert "ok" in outcomes and "cancelled" in outcomes  # the run did real work


def test_a_lone_chat_takes_exactly_the_estimated_steps(gpu_spec: SimSpec) -> None:
    result, _, _ = simulate(gpu_spec, parse_workload(ONE_CHAT))
    (record,) = result.records
    shape, hw = gpu_spec.target.shape, gpu_spec.target.hardware
    # The default envelope's budget is 512 tokens: the prompt is read in two chunks.
    prefill_s = sum(
        mixed_step_estimate_s(shape, hw, n, 0, 0, prefill_chunks=[(n, cached)]).step_s
        for n, cached in ((512, 0), (488, 512))
    )
    # Each decode reads the cache of every position before it: 1000, 1001, ... tokens.
    decodes_s = [mixed_step_estimate_s(shape, hw, 0, 1, 1000 + i).step_s for i in range(4)]
    assert record.outcome == "ok" and record.output_tokens == 5
    assert record.ttft_s == pytest.approx(prefill_s, rel=1e-9)
    assert record.itls_s == pytest.approx(decodes_s, rel=1e-9)
    assert record.e2e_s == pytest.approx(prefill_s + sum(decodes_s), rel=1e-9)
    assert 2 * decodes_s[0] < prefill_s  # a 512-token chunk is compute-bound, a decode is not


def test_queue_bound_rejects_like_the_gateway(gpu_spec: SimSpec) -> None:
    burst = ONE_CHAT.replace("count = 1", "count = 6")
    envelope = dataclasses.replace(Envelope.default(), interactive_queue_limit=2)
    spec = dataclasses.replace(gpu_spec, envelope=envelope)
    result, _, _ = simulate(spec, parse_workload(burst))
    # All six arrive at t=0, before any claim: two fit the queue, four get 429 queue_full.
    rejected = [r for r in result.records if r.outcome == REJECTED]
    assert len(rejected) == 4
    assert {(r.status_code, r.error_code) for r in rejected} == {(429, "queue_full")}
    assert all(r.retry_after_s is not None and r.retry_after_s >= 1 for r in rejected)
    # The priority baseline has no queue bound in the gateway: nothing is refused.
    baseline, _, _ = simulate(dataclasses.replace(spec, policy="priority"), parse_workload(burst))
    assert [r.outcome for r in baseline.records] == ["ok"] * 6


def test_a_calibrated_device_drives_the_step_times(tmp_path: Path) -> None:
    calibration = write_calibration(
        tmp_path / "calibration.toml",
        {
            "flops_per_s": 2.0e11,
            "bytes_per_s": 2.0e10,
            "step_overhead_s": 0.004,
            "memory_bytes": 8 << 30,
            "source": "test calibration",
        },
    )
    target = resolve_target("100m", f"measured:{calibration}", devices=2, dtype="fp32")
    assert target.hardware.flops_per_s == 4.0e11 and target.hardware.bytes_per_s == 4.0e10
    assert target.hardware.step_overhead_s == 0.004  # a fixed cost does not scale
    assert target.memory_bytes == 16 << 30
    result, _, _ = simulate(SimSpec(target, drain_s=1.0), parse_workload(ONE_CHAT))
    (record,) = result.records
    decode_s = mixed_step_estimate_s(target.shape, target.hardware, 0, 1, 1000).step_s
    assert record.itls_s[0] == pytest.approx(decode_s, rel=1e-9)
    assert record.itls_s[0] > 0.004


BULK_BURST_UNDER_CHAT = """
name = "bulk-burst-under-chat"
duration_s = 30.0
seed = 4

[interactive]
arrival = {kind = "poisson", rate_per_s = 4.0}
prompt_tokens = {kind = "uniform", min = 64, max = 256}
output_tokens = {kind = "fixed", value = 32}

[bulk]
prompt_tokens = {kind = "uniform", min = 512, max = 1024}
output_tokens = {kind = "uniform", min = 64, max = 128}

[bulk.arrival]
kind = "burst"
rate_per_s = 0.0
burst_rate_per_s = 60.0
burst_start_s = 0.0
burst_duration_s = 5.0
"""


def test_admission_predicts_each_bulk_jobs_ttft_behind_a_growing_backlog(
    gpu_spec: SimSpec,
) -> None:
    # Bulk arrives for 5 s far faster than the engine drains it while chats go on throughout,
    # so each job's predicted TTFT is the backlog ahead of it: the Redis queue, the jobs this
    # replica already holds (their prompts, and the outputs that free a slot) and the bulk
    # prefill the engine measured per step. The simulated engine keeps the live step history
    # and fit; the simulated gateway admits as the live one (engine_rates) and keeps the live
    # dispatcher's work in flight. Measured/predicted per job, deciles: 0.97-1.01. With the
    # queue alone and the envelope's chunk (before): 1.84-7.17, median 2.06 (a job admitted
    # 0.65 s in was predicted 0.06 s and started 2.0 s later); the held jobs counted but the
    # chunk assumed: 1.60-1.63 (the engine ran 62 bulk prefill tokens a step beside the chats,
    # the chunk and the aged guarantee allowed 103).
    result, _, _ = simulate(
        dataclasses.replace(gpu_spec, drain_s=30.0), parse_workload(BULK_BURST_UNDER_CHAT)
    )
    bulk = [
        r
        for r in result.records
        if r.request_class == "bulk" and r.ttft_s is not None and r.predicted_ttft_s
    ]
    assert len(bulk) > 250
    ratios = [(r.ttft_s or 0.0) / (r.predicted_ttft_s or 1.0) for r in bulk]
    deciles = statistics.quantiles(ratios, n=10)
    assert deciles[0] > 0.9 and deciles[-1] < 1.1, deciles
