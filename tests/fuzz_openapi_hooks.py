"""Schemathesis hooks for fuzzing mixgate's OpenAPI document: the parts of a batch file upload
(multipart part `file`, `application/jsonl`; part `purpose`, `text/plain`).

OpenAPI can say that the part is JSONL but not what JSONL is, so without this a fuzzer fills the
part with arbitrary bytes, which the server rightly refuses. Used by
tests/gateway/test_fuzz_openapi.py and by the CLI: `SCHEMATHESIS_HOOKS=tests.fuzz_openapi_hooks
schemathesis run ...`.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from hypothesis import strategies as st

from gateway.http.openapi_batch import JSONL_MEDIA_TYPE

__all__ = ["jsonl_batch_file"]


def _line(custom_id: str, content: str) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        # Any model name: a line for another model becomes an error line, not a refused file.
        "body": {
            "model": "model",
            "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": 1,
        },
    }


def jsonl_batch_file() -> st.SearchStrategy[bytes]:
    """One to three request lines of UTF-8 JSONL."""
    line = st.builds(
        _line,
        st.from_regex(r"[a-z0-9-]{1,16}", fullmatch=True),
        st.text(max_size=20),
    )
    return st.lists(line, min_size=1, max_size=3, unique_by=lambda d: d["custom_id"]).map(
        lambda lines: "".join(json.dumps(d) + "\n" for d in lines).encode("utf-8")
    )


schemathesis.openapi.media_type(JSONL_MEDIA_TYPE, jsonl_batch_file())
# NOTE: the upload's `purpose` part is `text/plain` (OpenAPI's default for a string part, written
# out in the document). Schemathesis 4.32's coverage phase fills a required form part that has
# no media type strategy with "" whatever its schema says (`const: batch`), then reports the
# server's 400 as a schema-valid request refused; a strategy for the part avoids that. No other
# request in the document is text/plain.
schemathesis.openapi.media_type("text/plain", st.just(b"batch"))
