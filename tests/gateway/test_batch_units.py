"""Fast checks of the Batch API's pure parts: line parsing, file storage, the window
prediction, the request schema and the object shapes the official client parses."""

from __future__ import annotations

import json
from pathlib import Path

import openai.types
import pytest

from gateway.batch.feasibility import BatchWork, predict_batch
from gateway.batch.file_storage import LocalFileStorage
from gateway.batch.files import FileRecord, file_object
from gateway.batch.lines import count_lines, parse_input_lines
from gateway.batch.records import BatchRecord, batch_object
from gateway.batch.schemas import parse_batch_request
from gateway.http.errors import APIError
from policies.admission import AdmissionConfig, EngineRates, QueueState
from policies.request_class import RequestClass

URL = "/v1/chat/completions"


def _line(custom_id: object, **over: object) -> bytes:
    data = {"custom_id": custom_id, "method": "POST", "url": URL, "body": {"model": "m"}, **over}
    return json.dumps(data).encode()


def test_each_malformed_line_gets_its_own_error_with_its_line_number() -> None:
    raw = b"\n".join(
        [
            _line("a"),
            b"",  # blank: skipped, not counted
            b"{oops",
            b"[1]",
            _line("b", url="/v1/embeddings"),
            _line("c", method="GET"),
            _line("a"),
            _line(""),
            _line("d", body="text"),
            _line("e", extra=1),
            _line("f"),
            b"NaN",
        ]
    )
    parsed = parse_input_lines(raw, URL)
    assert [(x.line, x.custom_id) for x in parsed.lines] == [(1, "a"), (11, "f")]
    assert [(e.line, e.code) for e in parsed.errors] == [
        (3, "invalid_json_line"),
        (4, "invalid_json_line"),
        (5, "invalid_url"),
        (6, "invalid_method"),
        (7, "duplicate_custom_id"),
        (8, "invalid_custom_id"),
        (9, "invalid_body"),
        (10, "invalid_request"),
        (12, "invalid_json_line"),
    ]
    assert parsed.total == count_lines(raw) == 11
    assert parsed.errors[4].batch_error() == {
        "code": "duplicate_custom_id",
        "message": parsed.errors[4].message,
        "param": "custom_id",
        "line": 7,
    }


def test_local_storage_replaces_atomically_and_refuses_path_games(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path / "files")
    storage.put("file-1", b"old")
    storage.put("file-1", b"x" * (3 << 20))
    assert storage.get("file-1") == b"x" * (3 << 20)
    assert b"".join(storage.open_chunks("file-1")) == storage.get("file-1")
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == ["file-1"]  # no temp left
    storage.delete("file-1")
    storage.delete("file-1")
    with pytest.raises(FileNotFoundError):
        storage.get("file-1")
    for bad in ("../etc", "a/b", ""):
        with pytest.raises(ValueError):
            storage.put(bad, b"")


def _queues(bulk_tokens: int) -> dict[RequestClass, QueueState]:
    return {
        RequestClass.INTERACTIVE: QueueState(0, 0, 64),
        RequestClass.BULK: QueueState(10, bulk_tokens, 100),
    }


def test_a_batch_fits_its_window_only_with_the_queue_ahead_drained_in_time() -> None:
    rates = EngineRates(1000.0, 100.0, 0, 0, True)
    work = BatchWork(prompt_tokens=10_000, output_tokens=5_000)  # 10 s + 50 s of its own
    idle = predict_batch(work, 100.0, _queues(0), rates, AdmissionConfig())
    assert idle.fits and idle.finish_s == pytest.approx(60.0)
    busy = predict_batch(work, 100.0, _queues(3_000), rates, AdmissionConfig())
    assert busy.ahead_s == pytest.approx(30.0) and not busy.fits
    assert "completion window" in busy.refusal_message() and busy.retry_after_s >= 1


def test_the_create_body_is_checked_like_openais() -> None:
    ok = parse_batch_request(
        {"input_file_id": "file-1", "endpoint": URL, "completion_window": "90m"}
    )
    assert ok.window_s == 5400.0
    for body, param in (
        ({"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": "24h"},
         "endpoint"),
        ({"input_file_id": "f", "endpoint": URL, "completion_window": "soon"},
         "completion_window"),
        ({"input_file_id": "f", "endpoint": URL, "completion_window": "999h"},
         "completion_window"),
        ({"endpoint": URL, "completion_window": "24h"}, "input_file_id"),
    ):  # fmt: skip
        with pytest.raises(APIError) as error:
            parse_batch_request(body)
        assert error.value.status == 400 and error.value.param == param


def test_objects_parse_with_the_official_client_types() -> None:
    file = FileRecord("file-1", "t", 12, 1_700_000_000, "in.jsonl", "batch")
    assert openai.types.FileObject.model_validate(file_object(file)).purpose == "batch"
    raw = {
        "id": "batch_1", "tenant": "t", "status": "in_progress", "stop": "",
        "endpoint": URL, "input_file_id": "file-1", "completion_window": "24h",
        "model": "tiny", "metadata": '{"k": "v"}', "created_at": "100", "expires_at": "200",
        "in_progress_at": "101", "total": "3", "completed": "1", "failed": "1",
        "errors": json.dumps([{"code": "invalid_url", "message": "m", "param": "url",
                               "line": 2}]),
    }  # fmt: skip
    batch = openai.types.Batch.model_validate(batch_object(BatchRecord.from_hash(raw)))
    assert batch.status == "in_progress" and batch.finalizing_at is None
    assert batch.request_counts is not None and batch.request_counts.total == 3
    assert batch.errors is not None and batch.errors.data is not None
    assert batch.errors.data[0].line == 2 and batch.metadata == {"k": "v"}
