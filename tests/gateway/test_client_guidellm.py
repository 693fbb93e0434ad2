"""guidellm (the vLLM project's load generator, what a platform team points at a server first)
against a real `mixgate serve`, unchanged: its backend check (GET /health, /v1/models), a short
concurrent run on chat and a short sweep on legacy completions. Every request must succeed
with exactly the output length asked for (guidellm sends `ignore_eos`, `stop: null`,
`max_completion_tokens` and `stream_options.continuous_usage_stats`, and counts tokens from
the usage in the chunks).

guidellm lives in its own environment, `.venv-guidellm` (scripts/setup-guidellm; .ci/run makes
it): its pins are not the project's. Without it the tests skip, except in CI, where they fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.baselines.guidellm_run import GUIDELLM, GuidellmRun
from bench.live.processes import ServerProcess
from tests.dependencies import missing_dependency
from tests.gateway.test_gateway_e2e import model_name

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PROMPT_TOKENS = 32
OUTPUT_TOKENS = 8


if not GUIDELLM.is_file():
    missing_dependency(".venv-guidellm is missing (scripts/setup-guidellm makes it)")


def _assert_every_request_exact(benchmark: dict[str, Any], requests: int) -> None:
    """Every request guidellm reports succeeded, with exactly OUTPUT_TOKENS.

    NOTE: how many it reports is its scheduler's business: a sweep benchmark once reported 3 of
    its 4 (all successful, none errored or incomplete, under CI's parallel load). A request our
    server failed, dropped or left open is counted as errored or incomplete, never left out."""
    metrics = benchmark["metrics"]
    totals = metrics["request_totals"]
    sent = totals["total"]
    assert totals == {"successful": sent, "errored": 0, "incomplete": 0, "total": sent}
    assert 1 <= sent <= requests
    outputs = metrics["output_token_count"]["successful"]
    assert outputs["min"] == outputs["max"] == OUTPUT_TOKENS
    assert outputs["count"] == sent


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("endpoint", "profile", "requests", "steps"),
    [
        ("/v1/chat/completions", "kind=concurrent,streams=4", 8, 1),
        # sweep_size=3: synchronous, throughput, and one constant rate between them.
        ("/v1/completions", "kind=sweep,sweep_size=3", 4, 3),
    ],
    ids=["concurrent-chat", "sweep-completions"],
)
def test_guidellm_run_has_no_errored_request_and_exact_output_lengths(
    live_server: ServerProcess,
    tiny_model_dir: Path,
    tmp_path: Path,
    endpoint: str,
    profile: str,
    requests: int,
    steps: int,
) -> None:
    run = GuidellmRun(
        target=live_server.url,
        model=model_name(live_server),
        tokenizer_dir=tiny_model_dir,
        endpoint=endpoint,
        profile=profile,
        prompt_tokens=PROMPT_TOKENS,
        output_tokens=OUTPUT_TOKENS,
        constraint=f"kind=max_requests,count={requests}",
    )
    benchmarks = run.run(tmp_path, timeout_s=240)
    assert len(benchmarks) == steps
    for benchmark in benchmarks:
        _assert_every_request_exact(benchmark, requests)
