"""Settings read from MIXGATE_* variables, and the limits they refuse."""

from __future__ import annotations

import pytest

from gateway.runtime.settings import Settings


def test_environment_sets_typed_values() -> None:
    settings = Settings.from_env(
        {
            "MIXGATE_JOB_INTAKE_CONCURRENCY": "4",
            "MIXGATE_BODY_READ_TIMEOUT_S": "2.5",
            "MIXGATE_JOB_INTAKE_TRICKLE_S": "0.05",
            "MIXGATE_CLAIM_CLASSES": "bulk",
            "MIXGATE_PAGED_ATTENTION_KERNEL": "0",
            "MIXGATE_FUSED_ELEMENTWISE_KERNELS": "off",
        }
    )
    assert settings.paged_attention_kernel is False
    assert settings.fused_elementwise_kernels is False
    assert Settings.from_env({}).paged_attention_kernel is True
    assert Settings.from_env({}).fused_elementwise_kernels is True
    assert settings.job_intake_concurrency == 4
    # The default: nothing new starts while a chat waits, but for the trickle.
    assert settings.job_intake_concurrency_while_chats_wait == 0
    assert settings.job_intake_trickle_s == 0.05
    assert settings.body_read_timeout_s == 2.5
    assert settings.claimed_classes == frozenset({"bulk"})


def test_bulk_claim_pacing_is_a_setting_and_0_turns_it_off() -> None:
    from gateway.dispatch.config import DEFAULT_MAX_UNSTARTED_BULK_JOBS

    assert Settings().bulk_claim_pacing == DEFAULT_MAX_UNSTARTED_BULK_JOBS
    assert Settings.from_env({"MIXGATE_MAX_UNSTARTED_BULK_JOBS": "12"}).bulk_claim_pacing == 12
    assert Settings.from_env({"MIXGATE_MAX_UNSTARTED_BULK_JOBS": "0"}).bulk_claim_pacing is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MIXGATE_JOB_INTAKE_CONCURRENCY", "0"),
        ("MIXGATE_JOB_INTAKE_CONCURRENCY_WHILE_CHATS_WAIT", "-1"),
        ("MIXGATE_JOB_INTAKE_TRICKLE_S", "0"),
        ("MIXGATE_CHAT_INTAKE_HOLD_MAX_S", "0"),
        ("MIXGATE_MAX_UNSTARTED_BULK_JOBS", "-1"),
        ("MIXGATE_BODY_READ_TIMEOUT_S", "0"),
        ("MIXGATE_CLAIM_CLASSES", "realtime"),
        ("MIXGATE_ENGINE", "tgi"),
        ("MIXGATE_DECODE_GRAPHS", "sometimes"),
    ],
)
def test_bad_values_are_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        Settings.from_env({name: value})


def test_the_kernel_switches_reach_the_engine_config() -> None:
    from gateway.runtime.engine_setup import engine_config
    from policies.envelope import Envelope

    off = Settings.from_env(
        {
            "MIXGATE_PAGED_ATTENTION_KERNEL": "false",
            "MIXGATE_FUSED_ELEMENTWISE_KERNELS": "0",
            "MIXGATE_FUSED_STEP_FORWARD": "off",
        }
    )
    assert engine_config(Envelope.default(), off).paged_attention_kernel is False
    assert engine_config(Envelope.default(), off).fused_elementwise_kernels is False
    assert engine_config(Envelope.default(), off).fused_step_forward is False
    on = engine_config(Envelope.default(), Settings())
    assert on.decode_graphs == "auto"
    graphs_off = Settings.from_env({"MIXGATE_DECODE_GRAPHS": "off"})
    assert engine_config(Envelope.default(), graphs_off).decode_graphs == "off"
    assert on.paged_attention_kernel is True
    assert on.fused_elementwise_kernels is True
    assert on.fused_step_forward is True


def test_a_served_engine_prewarms_and_a_bare_engine_config_does_not() -> None:
    from engine.core.config import EngineConfig
    from gateway.runtime.engine_setup import engine_config
    from policies.envelope import Envelope

    assert EngineConfig().prewarm is False
    assert engine_config(Envelope.default(), Settings()).prewarm is True
    cold = Settings.from_env({"MIXGATE_PREWARM": "0"})
    assert engine_config(Envelope.default(), cold).prewarm is False


def test_without_an_envelope_file_the_server_runs_its_engines_built_in_envelope() -> None:
    from gateway.http.app import load_settings_envelope
    from policies.envelope import Envelope

    for engine in ("native", "vllm"):
        assert load_settings_envelope(Settings(engine=engine)) == Envelope.default(engine)
    assert load_settings_envelope(Settings(engine="vllm")).bulk_prefill_chunk_tokens == 128
