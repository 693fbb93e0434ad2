"""The operator console in a real headless browser (Debian's chromium through chromedriver,
driven by selenium) against a live `mixgate serve` (tiny preset) on a real redis-server.

The tests run in file order on one server: chats first (TTFT), then the playground, then
bulk work with the engine process paused (SIGSTOP), so the bulk queue holds still while the
page and /metrics are compared and a claimed job stays `running` until the page cancels it;
then tenants and keys. Every wait is a WebDriverWait on the condition that matters.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.live.processes import ServerProcess
from gateway.console.windows import HistogramCounts, histogram_quantile
from gateway.dispatch.config import DEFAULT_MAX_UNSTARTED_BULK_JOBS
from policies.envelope import Envelope, Provenance, dump_envelope
from tests.dependencies import missing_dependency, require_module

pytestmark = [pytest.mark.redis, pytest.mark.slow]

webdriver = require_module("selenium.webdriver", "pip install selenium (the dev extra)")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    missing_dependency("chromium / chromedriver not installed (apt-get install chromium "
                       "chromium-driver)")  # fmt: skip

KEYS = {
    "admin": {"key": "console-admin-key", "tenant": "ops", "admin": True},
    "alpha": {"key": "console-alpha-key", "tenant": "alpha"},
    "beta": {"key": "console-beta-key", "tenant": "beta"},
}
WAIT_S = 60.0
# Screenshots for the notes, when asked for (not part of the verdict).
SHOTS_DIR = os.environ.get("MIXGATE_CONSOLE_SCREENSHOTS")


# ---- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("console")
    envelope = dataclasses.replace(
        Envelope.default(),
        max_active_seqs=8,
        interactive_reserved_seqs=2,
        provenance=Provenance(
            source="sweep", workload="mixed", notes="console test", slo={"ttft_p99_s": 2.0}
        ),
    )
    envelope_path = tmp / "envelope.toml"
    envelope_path.write_text(dump_envelope(envelope))
    prefix = f"{{mg-{uuid.uuid4().hex[:8]}}}:"
    proc = ServerProcess(
        tiny_model_dir,
        redis_server,
        prefix,
        tmp / "data",
        envelope_path=envelope_path,
        api_keys_json=json.dumps({"keys": list(KEYS.values())}),
    ).start()
    yield proc
    _resume_engine(proc)
    assert proc.stop() == 0, proc.logs()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,2200"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    prefs = {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    options.add_experimental_option("prefs", prefs)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.downloads_dir = downloads  # type: ignore[attr-defined]
    try:
        yield driver
    finally:
        driver.quit()


def api(server: ServerProcess, who: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        headers={"authorization": f"Bearer {KEYS[who]['key']}"},
        timeout=30.0,
    )


def model_name(server: ServerProcess) -> str:
    with api(server, "alpha") as client:
        return str(client.get("/v1/models").json()["data"][0]["id"])


def sign_in(driver: WebDriver, server: ServerProcess, key: str) -> None:
    # A fresh tab: session storage is per tab, so it starts without the last test's key
    # (clearing it under a running console would race its polls into 401s).
    old_tabs = driver.window_handles
    driver.switch_to.new_window("tab")
    for handle in old_tabs:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(driver.window_handles[0])
    driver.get(server.url + "/console/")
    field = driver.find_element(By.ID, "api-key")
    field.send_keys(key)
    driver.find_element(By.ID, "sign-in").click()


def wait(driver: WebDriver, condition: Any, timeout_s: float = WAIT_S) -> Any:
    # The page re-renders its tables on every refresh: an element found a moment ago can be
    # replaced before its attribute is read. That is a retry, not a failure (CI saw it once).
    return WebDriverWait(
        driver,
        timeout_s,
        poll_frequency=0.1,
        ignored_exceptions=(StaleElementReferenceException,),
    ).until(condition)


def data_value(driver: WebDriver, element_id: str) -> str | None:
    # One script call: the live table is rebuilt every second, so an element found by one
    # WebDriver call may be gone by the next.
    value = driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.dataset.value : null;",
        element_id,
    )
    return None if value is None else str(value)


def scrape(server: ServerProcess) -> dict[str, Any]:
    """What /metrics says now: queue depths, and the TTFT histograms per class."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    depths: dict[str, float] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mixgate_queue_depth":
                depths[sample.labels["class"]] = sample.value
            if sample.name == "mixgate_ttft_seconds_bucket":
                buckets.setdefault(sample.labels["class"], []).append(
                    (float(sample.labels["le"]), sample.value)
                )
    ttft = {
        c: HistogramCounts(tuple(b for b, _ in sorted(p)), tuple(n for _, n in sorted(p)))
        for c, p in buckets.items()
    }
    return {"depths": depths, "ttft": ttft}


def severe_logs(driver: WebDriver) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def screenshot(driver: WebDriver, name: str) -> None:
    if SHOTS_DIR:
        driver.save_screenshot(str(Path(SHOTS_DIR) / name))


def _engine_pid(server: ServerProcess) -> int:
    """The engine-core child of the server (its command line names the module and parent)."""
    assert server.process is not None
    parent = str(server.process.pid).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"engine.process.main" in argv
            and b"--parent-pid" in argv
            and argv[argv.index(b"--parent-pid") + 1] == parent
        ):
            return int(entry.name)
    raise AssertionError("no engine-core child found")


def _resume_engine(server: ServerProcess) -> None:
    with_engine = server.process is not None and server.process.poll() is None
    if with_engine:
        os.kill(_engine_pid(server), signal.SIGCONT)


# ---- the tests -----------------------------------------------------------------------------------


def test_page_loads_clean_and_chat_ttft_matches_metrics(
    server: ServerProcess, browser: WebDriver
) -> None:
    sign_in(browser, server, KEYS["admin"]["key"])
    wait(browser, lambda d: data_value(d, "live-interactive-queue_depth") is not None)
    wait(browser, lambda d: d.execute_script("return window.mixgateConsole.history.t.length") > 1)
    assert browser.find_element(By.ID, "envelope-source").text == "sweep"
    assert "ttft_p99_s = 2" in browser.find_element(By.ID, "envelope-SLO").text
    assert browser.find_element(By.ID, "open-warning").is_displayed() is False
    screenshot(browser, "console-idle.png")
    assert severe_logs(browser) == []

    model = model_name(server)
    with api(server, "alpha") as client:
        for i in range(4):
            body = {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}],
                    "max_tokens": 8, "stream": True}  # fmt: skip
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                assert "[DONE]" in "".join(response.iter_text())

    def page_matches_metrics(d: WebDriver) -> bool:
        ttft = scrape(server)["ttft"]["interactive"]
        count = data_value(d, "live-interactive-ttft-count")
        p50 = data_value(d, "live-interactive-ttft-p50")
        expected = histogram_quantile(0.5, ttft)
        return (
            count == str(int(ttft.count))
            and ttft.count >= 4
            and expected is not None
            and p50 not in (None, "")
            and abs(float(p50) - expected) < 1e-9
        )

    wait(browser, page_matches_metrics)
    # The TTFT chart moved: its series holds a measured value now.
    p50s = browser.execute_script("return window.mixgateConsole.history.ttftP50")
    assert any(v is not None for v in p50s)
    assert severe_logs(browser) == []


def test_playground_streams_a_reply(server: ServerProcess, browser: WebDriver) -> None:
    sign_in(browser, server, KEYS["alpha"]["key"])
    wait(browser, lambda d: d.find_element(By.ID, "main").is_displayed())
    browser.find_element(By.ID, "chat-input").send_keys("Tell me something")
    browser.find_element(By.ID, "chat-max-tokens").clear()
    browser.find_element(By.ID, "chat-max-tokens").send_keys("16")
    browser.find_element(By.ID, "chat-send").click()
    wait(browser, lambda d: d.find_element(By.ID, "chat-status").text == "done")
    assert browser.find_element(By.ID, "chat-output").text != ""
    assert int(browser.find_element(By.ID, "chat-tokens").text) >= 1
    assert browser.find_element(By.ID, "chat-ttft").text.endswith(" ms")
    errors = severe_logs(browser)
    assert errors == [], errors


def test_bulk_depth_matches_metrics_and_cancel_from_page(
    server: ServerProcess, browser: WebDriver
) -> None:
    with api(server, "admin") as client:
        envelope = client.get("/v1/envelope").json()
    # Bulk claims stop at its slots or, none starting while the engine is paused, at the pacing.
    claimed = min(envelope["max_active_seqs"], DEFAULT_MAX_UNSTARTED_BULK_JOBS)
    model = model_name(server)
    sign_in(browser, server, KEYS["admin"]["key"])
    wait(browser, lambda d: data_value(d, "live-bulk-queue_depth") is not None)
    engine = _engine_pid(server)
    # Paused, the engine runs nothing: claimed jobs stay running, the rest stay queued.
    os.kill(engine, signal.SIGSTOP)
    try:
        with api(server, "alpha") as client:
            ids = []
            for i in range(claimed + 3):
                body = {"model": model, "messages": [{"role": "user", "content": f"doc {i}"}],
                        "max_tokens": 4, "ignore_eos": True}  # fmt: skip
                response = client.post("/v1/jobs", json=body)
                assert response.status_code == 202, response.text
                ids.append(response.json()["id"])

        def depth_matches(d: WebDriver) -> bool:
            shown = data_value(d, "live-bulk-queue_depth")
            return shown == "3" and scrape(server)["depths"].get("bulk") == 3.0

        wait(browser, depth_matches)
        assert max(browser.execute_script("return window.mixgateConsole.history.queue.bulk")) >= 3
        screenshot(browser, "console-load.png")

        running = wait(
            browser,
            lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs-table tr[data-status='running']"),
        )
        job_id = running[0].get_attribute("data-job-id")
        assert job_id in ids
        running[0].find_element(By.CSS_SELECTOR, "button.cancel").click()
        wait(
            browser,
            lambda d: (
                d.find_element(
                    By.CSS_SELECTOR, f"#jobs-table tr[data-job-id='{job_id}']"
                ).get_attribute("data-cancel")
                == "cancelling"
            ),
        )
    finally:
        os.kill(engine, signal.SIGCONT)
    with api(server, "alpha") as client:
        wait(browser, lambda _: client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled")
        # The page's list says so too.
        wait(
            browser,
            lambda d: (
                d.find_element(
                    By.CSS_SELECTOR, f"#jobs-table tr[data-job-id='{job_id}']"
                ).get_attribute("data-status")
                == "cancelled"
            ),
        )
    assert severe_logs(browser) == []


def _create_batch(server: ServerProcess, who: str, lines: int) -> str:
    model = model_name(server)
    rows = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "max_tokens": 4,
                  "messages": [{"role": "user", "content": f"line {i}"}]}}
        for i in range(lines)
    ]  # fmt: skip
    data = "\n".join(json.dumps(r) for r in rows).encode()
    with api(server, who) as client:
        upload = client.post(
            "/v1/files", files={"file": ("in.jsonl", io.BytesIO(data))}, data={"purpose": "batch"}
        )
        assert upload.status_code == 200, upload.text
        batch = client.post(
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions",
                  "completion_window": "1h"},
        )  # fmt: skip
        assert batch.status_code == 200, batch.text
        return str(batch.json()["id"])


def test_a_tenant_sees_only_its_own_and_downloads_its_batch_output(
    server: ServerProcess, browser: WebDriver
) -> None:
    batch_id = _create_batch(server, "alpha", 2)
    sign_in(browser, server, KEYS["alpha"]["key"])
    row = f"#batches-table tr[data-batch-id='{batch_id}']"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row + "[data-status='completed']"))
    assert "2 ok" in browser.find_element(By.CSS_SELECTOR, row + " td.progress").text
    cells = browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody td:nth-child(2)")
    tenants = {td.text for td in cells}
    assert tenants == {"alpha"}
    assert browser.find_element(By.ID, "live-denied").is_displayed()
    browser.find_element(By.CSS_SELECTOR, row + " button.download-output").click()
    saved = Path(browser.downloads_dir) / f"{batch_id}-output.jsonl"  # type: ignore[attr-defined]
    wait(browser, lambda _: saved.exists() and saved.stat().st_size > 0)
    lines = [json.loads(x) for x in saved.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["r0", "r1"]

    sign_in(browser, server, KEYS["beta"]["key"])
    wait(browser, lambda d: d.find_element(By.ID, "jobs-message").text == "no jobs")
    wait(browser, lambda d: d.find_element(By.ID, "batches-message").text == "no batches")
    assert browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr") == []
    assert browser.find_element(By.ID, "live-denied").is_displayed()
    assert not browser.find_element(By.ID, "live-body").is_displayed()
    with api(server, "beta") as client:
        assert client.get("/console/api/live").status_code == 403
        assert client.get(f"/console/api/batches/{batch_id}/files/output").status_code == 404
        # Naming another tenant changes nothing without an admin key.
        assert client.get("/console/api/jobs?tenant=alpha").json()["data"] == []
        assert client.post(f"/console/api/batches/{batch_id}/cancel").status_code == 404
    assert severe_logs(browser) == []


def test_a_wrong_key_gets_a_clear_message(server: ServerProcess, browser: WebDriver) -> None:
    sign_in(browser, server, "not-a-key")
    message = wait(
        browser,
        lambda d: d.find_element(By.ID, "auth-message").text if "not accepted" in d.find_element(
            By.ID, "auth-message").text else None,
    )  # fmt: skip
    assert "invalid_api_key" in message
    assert not browser.find_element(By.ID, "main").is_displayed()
    assert browser.execute_script("return sessionStorage.length") == 0
