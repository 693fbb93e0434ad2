"""Property-based fuzzing of every route in /openapi.json (schemathesis, every check it has)
against a real `mixgate serve` with an API keys file and a real Redis: no 5xx, every response
matches the documented schema, status codes and headers, schema-valid requests are accepted and
schema-invalid ones refused, 405s name the right methods, and a request without the key (or
with a wrong one) is refused wherever the document says a key is needed.

Two runs, both seeded and bounded so CI stays repeatable and short:
- the schemathesis CLI with `--checks all` (its coverage, fuzzing and stateful phases), the
  command a developer runs by hand (see `schemathesis_command`);
- schemathesis' Python API, every registered check on positive cases of each operation, so a
  failure names the operation and shrinks to a small example. (Negative cases are the CLI's:
  through the Python API the key passed in `headers` overrides the generated Authorization
  header, so a case generated without one is mislabelled schema-invalid.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import CHECKS
from schemathesis.core.result import Ok
from starlette.routing import Route

from bench.live.processes import ServerProcess
from gateway.http.app import create_app
from gateway.http.openapi import build_openapi
from gateway.runtime.settings import Settings
from tests.replica_cluster import cluster_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SEED = 20261201
# Per operation and phase: enough to reach every documented rule, few enough that both runs
# together take well under a minute (the CLI at its default of 100 takes about 75 s here).
CLI_EXAMPLES_PER_OPERATION = 40
API_EXAMPLES_PER_OPERATION = 10
KEY = "sk-fuzz-tenant-a"
OTHER_KEY = "sk-fuzz-tenant-b"
HOOKS_MODULE = "tests.fuzz_openapi_hooks"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fuzz_server(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fuzz")
    keys_path = tmp / "api-keys.json"
    keys = [{"key": KEY, "tenant": "fuzz-a"}, {"key": OTHER_KEY, "tenant": "fuzz-b"}]
    keys_path.write_text(json.dumps({"keys": keys}))
    proc = ServerProcess(
        tiny_model_dir,
        redis_server,
        cluster_prefix(),
        tmp,
        extra_env={"MIXGATE_API_KEYS_PATH": str(keys_path)},
    ).start()
    yield proc
    assert proc.stop() == 0, proc.logs()


def schemathesis_command(url: str, report_dir: Path) -> list[str]:
    """What CI runs; by hand: `SCHEMATHESIS_HOOKS=tests.fuzz_openapi_hooks schemathesis run
    --checks all --seed 20261201 -H 'Authorization: Bearer KEY' URL/openapi.json`."""
    executable = Path(sys.executable).with_name("schemathesis")
    return [
        str(executable),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--seed",
        str(SEED),
        "--max-examples",
        str(CLI_EXAMPLES_PER_OPERATION),
        "--continue-on-failure",
        "--header",
        f"Authorization: Bearer {KEY}",
        "--request-timeout",
        "30",
        "--report",
        "ndjson",
        "--report-dir",
        str(report_dir),
    ]


def test_schemathesis_cli_with_all_checks_finds_nothing(
    fuzz_server: ServerProcess, tmp_path: Path
) -> None:
    env = {**os.environ, "SCHEMATHESIS_HOOKS": HOOKS_MODULE, "NO_COLOR": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        schemathesis_command(fuzz_server.url, tmp_path / "report"),
        cwd=tmp_path,  # schemathesis writes its cache (.schemathesis/) into the working folder
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20_000:]
    # It really ran: every operation, a good number of cases, and none failed.
    operations = 23
    assert f"Tested: {operations}" in output or f"{operations} selected" in output, output[-5000:]
    summary = next(line for line in output.splitlines() if " generated, " in line)
    generated = int(summary.split()[0])
    assert generated >= operations * CLI_EXAMPLES_PER_OPERATION, summary
    assert " passed" in summary and "fail" not in summary, summary


def _api_run(operation: Any, mode: schemathesis.GenerationMode, failures: dict[str, str]) -> None:
    """Hypothesis over one operation's strategy in one mode, with every schemathesis check."""
    checks = list(CHECKS.get_all())

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=API_EXAMPLES_PER_OPERATION,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        case.call_and_validate(
            checks=checks, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
        )

    try:
        run()
    except (Exception, BaseExceptionGroup) as error:  # collected, asserted by the caller
        failures[f"{operation.label} ({mode.value})"] = str(error)[:2000]


def test_every_operation_passes_every_check(fuzz_server: ServerProcess) -> None:
    # NOTE: schemathesis' pytest plugin (from_fixture) fails on this pytest version, so each
    # operation gets its own hypothesis run here; every failing operation is reported.
    import tests.fuzz_openapi_hooks  # noqa: F401 - registers the upload's part strategies

    api = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    failures: dict[str, str] = {}
    tested: set[tuple[str, str]] = set()
    for result in api.get_all_operations():
        assert isinstance(result, Ok), result  # an operation the document fails to describe
        operation = result.ok()
        tested.add((operation.method.upper(), operation.path))
        _api_run(operation, schemathesis.GenerationMode.POSITIVE, failures)
    # Schemathesis leaves out the operation that serves the document itself.
    assert tested == build_openapi_operations() - {("GET", "/openapi.json")}
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())


def build_openapi_operations() -> set[tuple[str, str]]:
    paths = build_openapi()["paths"]
    return {(m.upper(), p) for p, ops in paths.items() for m in ops if m != "parameters"}


def test_every_route_is_documented() -> None:
    app = create_app(Settings(redis_url="redis://127.0.0.1:1/0"))
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or ())
        if method != "HEAD"
    }
    assert served == build_openapi_operations()
