"""The Batch API end to end: a real `mixgate serve` (tiny preset), a real redis-server and the
official `openai` client, the way existing batch scripts use it."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.live.processes import ServerProcess
from tests.gateway.test_gateway_e2e import new_server

pytestmark = [pytest.mark.redis, pytest.mark.slow]
KEYS = {"keys": [{"key": "sk-alpha", "tenant": "alpha"}, {"key": "sk-beta", "tenant": "beta"}]}
FAST_SUPERVISOR = {"MIXGATE_BATCH_POLL_INTERVAL_S": "0.05"}
TERMINAL = {"completed", "failed", "expired", "cancelled"}
URL = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    proc = new_server(
        tiny_model_dir,
        redis_server,
        tmp_path_factory.mktemp("batch"),
        api_keys_json=json.dumps(KEYS),
        extra_env=FAST_SUPERVISOR,
    ).start()
    yield proc
    assert proc.stop() == 0, proc.logs()


@pytest.fixture
def closer() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as stack:
        yield stack


def client(server: ServerProcess, closer: contextlib.ExitStack, key: str = "sk-alpha") -> Any:
    return closer.enter_context(openai.OpenAI(base_url=server.url + "/v1", api_key=key))


def model_of(oc: Any) -> str:
    return str(oc.models.list().data[0].id)


def line(model: str, custom_id: str, content: str, max_tokens: int, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    request = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return {"custom_id": custom_id, "method": "POST", "url": URL, "body": {**request, **body}}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def submit(oc: Any, lines: list[Any], window: str = "24h", **extra: Any) -> Any:
    uploaded = oc.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
    return oc.batches.create(
        input_file_id=uploaded.id, endpoint=URL, completion_window=window, **extra
    )


def wait_batch(oc: Any, batch_id: str, timeout_s: float = 90, until: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = oc.batches.retrieve(batch_id)
        if (until or (lambda b: b.status in TERMINAL))(batch):
            return batch
        assert time.monotonic() < deadline, f"batch stuck: {batch}"
        time.sleep(0.05)


def rows(oc: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in oc.files.content(file_id).text.splitlines()]


def test_openai_client_runs_200_lines_like_chat_completions(
    server: ServerProcess, closer: contextlib.ExitStack
) -> None:
    oc = client(server, closer)
    model = model_of(oc)
    lines = [
        line(model, f"req-{i}", f"Question {i}: tell me about the number {i * 7}.", 3 + i % 7)
        for i in range(200)
    ]
    created = submit(oc, lines, metadata={"run": "e2e"})
    assert created.status == "validating" and created.request_counts.total == 200
    assert created.expires_at == created.created_at + 24 * 3600
    done = wait_batch(oc, created.id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (200, 0)
    assert done.error_file_id is None and done.errors is None
    assert done.metadata == {"run": "e2e"}
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = rows(oc, done.output_file_id)
    by_custom_id = {r["custom_id"]: r for r in output}
    assert len(output) == len(by_custom_id) == 200
    assert len({r["response"]["request_id"] for r in output}) == 200
    http = closer.enter_context(
        httpx.Client(base_url=server.url, headers={"Authorization": "Bearer sk-alpha"}, timeout=60)
    )

    def same_as_chat(request: dict[str, Any]) -> bool:
        direct = http.post(URL, json=request["body"]).json()
        result = by_custom_id[request["custom_id"]]
        assert result["error"] is None and result["response"]["status_code"] == 200
        body = result["response"]["body"]
        keys = ("object", "model", "choices", "usage")
        return {k: body[k] for k in keys} == {k: direct[k] for k in keys}

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(same_as_chat, lines))
    assert created.id in {b.id for b in oc.batches.list(limit=100).data}
    output_file = oc.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.bytes > 0


def test_malformed_lines_are_reported_per_line_and_valid_lines_run(
    server: ServerProcess, closer: contextlib.ExitStack
) -> None:
    oc = client(server, closer)
    model = model_of(oc)
    wrong_url = {**line(model, "c", "hi", 4), "url": "/v1/embeddings"}
    wrong_method = {**line(model, "e", "hi", 4), "method": "GET"}
    lines: list[Any] = [
        line(model, "a", "first", 4),  # 1: runs
        "{not json",  # 2
        wrong_url,  # 3
        line(model, "a", "again", 4),  # 4: duplicate custom_id
        line(model, "d", "x" * 2000, 4),  # 5: longer than the tiny model's context
        wrong_method,  # 6
        line(model, "g", "second", 4),  # 7: runs
        line("no-such-model", "h", "hi", 4),  # 8
        line(model, "i", "hi", 4, n=3),  # 9: a body the chat endpoint refuses
    ]
    done = wait_batch(oc, submit(oc, lines).id)
    assert done.status == "completed", done
    # A body the chat endpoint refuses is refused with the chat endpoint's own code.
    auth = {"Authorization": "Bearer sk-alpha"}
    direct = httpx.post(server.url + URL, json=lines[8]["body"], headers=auth)
    refused = direct.json()["error"]["code"]
    assert done.request_counts.model_dump() == {"total": 9, "completed": 2, "failed": 7}
    codes = {e.line: e.code for e in done.errors.data}
    assert codes == {
        2: "invalid_json_line",
        3: "invalid_url",
        4: "duplicate_custom_id",
        5: "context_length_exceeded",
        6: "invalid_method",
        8: "model_not_found",
        9: refused,
    }
    assert sorted(r["custom_id"] for r in rows(oc, done.output_file_id)) == ["a", "g"]
    errors = rows(oc, done.error_file_id)
    assert [r["custom_id"] for r in errors] == [None, "c", "a", "d", "e", "h", "i"]
    assert [r["error"]["code"] for r in errors] == [codes[n] for n in sorted(codes)]
    assert all(r["response"] is None for r in errors)
    # Nothing valid at all: the batch fails at once, with the reasons and no files.
    failed = submit(oc, ["[1, 2]", wrong_url])
    assert failed.status == "failed" and failed.failed_at is not None
    assert [e.code for e in failed.errors.data] == ["invalid_json_line", "invalid_url"]
    assert failed.output_file_id is None and failed.error_file_id is None


def test_tenants_see_only_their_files_and_batches(
    server: ServerProcess, closer: contextlib.ExitStack
) -> None:
    alpha, beta = client(server, closer), client(server, closer, "sk-beta")
    batch = submit(alpha, [line(model_of(alpha), "only", "mine", 2)])
    done = wait_batch(alpha, batch.id)
    for call in (
        lambda: beta.batches.retrieve(batch.id),
        lambda: beta.batches.cancel(batch.id),
        lambda: beta.files.retrieve(batch.input_file_id),
        lambda: beta.files.content(done.output_file_id),
        lambda: beta.files.delete(batch.input_file_id),
        lambda: beta.batches.create(input_file_id=batch.input_file_id, endpoint=URL,
                                    completion_window="24h"),
    ):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in {b.id for b in beta.batches.list().data}
    assert batch.input_file_id not in {f.id for f in beta.files.list().data}
    assert alpha.files.delete(batch.input_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        alpha.files.retrieve(batch.input_file_id)


def test_cancel_mid_batch_keeps_finished_lines(
    server: ServerProcess, closer: contextlib.ExitStack
) -> None:
    oc = client(server, closer)
    model = model_of(oc)
    # Two one-token lines first, then 38 of 900 tokens: the cancel lands once the short two are
    # done, while every long line still has ~900 decode steps to go (a count of steps, not a
    # time: with 40 equal lines a fast engine finished them all before the cancel arrived).
    max_tokens = {f"c{i}": 1 if i < 2 else 900 for i in range(40)}
    lines = [line(model, cid, f"count {cid}", n, ignore_eos=True) for cid, n in max_tokens.items()]
    batch = submit(oc, lines)
    wait_batch(oc, batch.id, until=lambda b: b.request_counts.completed >= 2)
    assert oc.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait_batch(oc, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    finished, skipped = rows(oc, done.output_file_id), rows(oc, done.error_file_id)
    assert 2 <= len(finished) == done.request_counts.completed < 40
    assert len(skipped) == done.request_counts.failed == 40 - len(finished)
    assert {r["error"]["code"] for r in skipped} == {"batch_cancelled"}
    assert all(
        r["response"]["body"]["usage"]["completion_tokens"] == max_tokens[r["custom_id"]]
        for r in finished
    )
    ids = sorted(r["custom_id"] for r in finished + skipped)
    assert ids == sorted(f"c{i}" for i in range(40))
    with pytest.raises(openai.ConflictError):
        oc.batches.cancel(wait_batch(oc, submit(oc, lines[:1]).id).id)


def test_a_batch_that_cannot_finish_in_its_window_is_refused(
    server: ServerProcess, closer: contextlib.ExitStack
) -> None:
    oc = client(server, closer)
    model = model_of(oc)
    # 2.7M output tokens in one second: past any CPU's decode rate. A one-minute window asks
    # 45k tokens/s, within reach of the tiny model's aggregate rate as the engine measures it
    # from its recent steps: the whole suite saw that batch accepted, three runs of three.
    lines = [line(model, f"big-{i}", "go", 900, ignore_eos=True) for i in range(3000)]
    with pytest.raises(openai.RateLimitError) as refused:
        submit(oc, lines, window="1s")
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "deadline_unmeetable"
    assert "completion window" in error["message"]
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert not any(b.input_file_id and b.status == "validating" for b in oc.batches.list().data)


def test_sigkill_mid_batch_then_restart_finishes_every_line_once(
    tiny_model_dir: Path, redis_server: str, tmp_path: Path, closer: contextlib.ExitStack
) -> None:
    env = {**FAST_SUPERVISOR, "MIXGATE_BATCH_LOCK_S": "1"}
    first = new_server(tiny_model_dir, redis_server, tmp_path, extra_env=env).start()
    oc = client(first, closer)
    # More lines than the engine runs at once, so the kill lands between waves.
    total = 60
    lines = [line(model_of(oc), f"k{i}", f"line {i}", 40, ignore_eos=True) for i in range(total)]
    batch = submit(oc, lines)
    before = wait_batch(oc, batch.id, until=lambda b: b.request_counts.completed >= 1)
    first.kill()
    assert before.request_counts.completed < total, "the batch finished before the kill"
    second = ServerProcess(**{**first.__dict__, "process": None}).start()
    try:
        oc = client(second, closer)
        done = wait_batch(oc, batch.id, 120)
        assert done.status == "completed", (done, second.logs())
        assert (done.request_counts.completed, done.request_counts.failed) == (total, 0)
        output = rows(oc, done.output_file_id)
        assert sorted(r["custom_id"] for r in output) == sorted(f"k{i}" for i in range(total))
        assert all(r["response"]["body"]["usage"]["completion_tokens"] == 40 for r in output)
    finally:
        second.stop()
