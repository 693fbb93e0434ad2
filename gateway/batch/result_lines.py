"""The lines of a batch's output and error files, in OpenAI's shape::

    {"id": "batch_req_...", "custom_id": "...",
     "response": {"status_code": 200, "request_id": "...", "body": {chat.completion}},
     "error": null}

A successful line's ``body`` is built by the same function as a ``/v1/chat/completions``
response (`gateway.http.schemas.chat_completion_body`), so the two differ only in ``id`` and
``created``. A request that ran and failed has the HTTP error as its response; a line that did
not run (malformed, expired, cancelled) has ``response: null`` and an ``error``.
"""

from __future__ import annotations

import json
from typing import Any, Final

from gateway.batch.lines import LineError
from gateway.batch.records import StopReason
from gateway.http.schemas import chat_completion_body
from gateway.queue import JobRecord, JobStatus
from gateway.queue.payload import JobPayload

__all__ = ["line_job_id", "line_number", "malformed_line", "outcome_line", "skipped_line"]

# Job error codes that mean "the request was bad", not "the server failed".
_CLIENT_ERROR_CODES: Final = frozenset(
    {"invalid_request", "context_length_exceeded", "invalid_value", "invalid_prompt"}
)
_SKIPPED: Final = {
    StopReason.CANCELLED: ("batch_cancelled", "The batch was cancelled before this line ran."),
    StopReason.EXPIRED: (
        "batch_expired",
        "The batch's completion window passed before this line finished.",
    ),
}


def line_job_id(batch_id: str, line: int) -> str:
    """Deterministic, so feeding a line twice (after a crash) finds the first job."""
    return f"{batch_id}-{line}"


def line_number(job_id: str) -> int:
    return int(job_id.rsplit("-", 1)[1])


def _dump(line: dict[str, Any]) -> str:
    return json.dumps(line, separators=(",", ":"))


def _line(job_id: str, custom_id: str | None, response: Any, error: Any) -> str:
    return _dump(
        {"id": f"batch_req_{job_id}", "custom_id": custom_id, "response": response, "error": error}
    )


def malformed_line(batch_id: str, error: LineError) -> str:
    job_id = line_job_id(batch_id, error.line)
    return _line(job_id, error.custom_id, None, {"code": error.code, "message": error.message})


def skipped_line(job_id: str, custom_id: str | None, reason: StopReason) -> str:
    """A line that will not run (or not to its end): the batch was cancelled or expired."""
    code, message = _SKIPPED[reason]
    return _line(job_id, custom_id, None, {"code": code, "message": message})


def outcome_line(job: JobRecord, reason: StopReason) -> tuple[bool, str]:
    """(succeeded, the line) for a job in a terminal status."""
    if job.status is JobStatus.COMPLETED and job.result_json:
        payload = JobPayload.from_json(job.request_json)
        result = json.loads(job.result_json)
        body = chat_completion_body(
            f"chatcmpl-{job.job_id}",
            payload.created_s,
            payload.model,
            result["text"],
            result["finish_reason"],
            result["usage"],
        )
        response = {"status_code": 200, "request_id": job.job_id, "body": body}
        return True, _line(job.job_id, job.custom_id, response, None)
    if job.status is JobStatus.FAILED:
        error = json.loads(job.error_json or "{}")
        code = error.get("code") or "failed"
        status_code = 400 if code in _CLIENT_ERROR_CODES else 500
        body = {
            "error": {
                "message": error.get("message") or "the request failed",
                "type": "invalid_request_error" if status_code == 400 else "server_error",
                "code": code,
                "param": None,
            }
        }
        response = {"status_code": status_code, "request_id": job.job_id, "body": body}
        return False, _line(job.job_id, job.custom_id, response, None)
    # Cancelled, or expired in the queue: it did not run to its end within the batch. A job
    # cancelled by hand (DELETE /v1/jobs/{id}) while the batch runs on counts as cancelled.
    stop = reason
    if stop is StopReason.NONE:
        stop = StopReason.EXPIRED if job.status is JobStatus.EXPIRED else StopReason.CANCELLED
    return False, skipped_line(job.job_id, job.custom_id, stop)
