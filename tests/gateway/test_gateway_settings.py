"""Settings read from MIXGATE_* variables, and the limits they refuse."""

from __future__ import annotations

import pytest

from gateway.runtime.settings import Settings


def test_environment_sets_typed_values() -> None:
    settings = Settings.from_env(
        {
            "MIXGATE_JOB_INTAKE_CONCURRENCY": "4",
            "MIXGATE_BODY_READ_TIMEOUT_S": "2.5",
            "MIXGATE_CLAIM_CLASSES": "bulk",
        }
    )
    assert settings.job_intake_concurrency == 4
    assert settings.body_read_timeout_s == 2.5
    assert settings.claimed_classes == frozenset({"bulk"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MIXGATE_JOB_INTAKE_CONCURRENCY", "0"),
        ("MIXGATE_BODY_READ_TIMEOUT_S", "0"),
        ("MIXGATE_CLAIM_CLASSES", "realtime"),
        ("MIXGATE_ENGINE", "tgi"),
    ],
)
def test_bad_values_are_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        Settings.from_env({name: value})
