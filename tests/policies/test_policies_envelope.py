"""The operating envelope: validation, defaults, and a strict TOML round trip."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.admission import LengthLimits
from policies.envelope import Envelope, Provenance, dump_envelope, load_envelope
from policies.request_class import RequestClass
from policies.toml_writer import dump_toml

DEFAULT = Envelope.default()


def test_default_values() -> None:
    env = DEFAULT
    assert (env.max_active_seqs, env.step_token_budget, env.bulk_prefill_chunk_tokens) == (
        32,
        512,
        64,
    )
    assert (env.bulk_min_share, env.bulk_aging_s, env.bulk_class_offset_ms) == (0.2, 5.0, 30_000)
    assert (env.interactive_queue_limit, env.bulk_queue_limit) == (64, 10_000)
    assert env.interactive_limits == LengthLimits(4096, 1024, 8192)
    assert env.bulk_limits == LengthLimits(8192, 4096, 8192)
    assert (env.interactive_ttft_target_s, env.interactive_reserved_seqs) == (2.0, 4)
    assert env.provenance.source == "default"


def test_per_class_accessors() -> None:
    assert DEFAULT.queue_limit(RequestClass.INTERACTIVE) == 64
    assert DEFAULT.queue_limit(RequestClass.BULK) == 10_000
    assert DEFAULT.length_limits(RequestClass.BULK).max_prompt_tokens == 8192
    by_class = DEFAULT.length_limits_by_class()
    assert by_class == {
        RequestClass.INTERACTIVE: DEFAULT.interactive_limits,
        RequestClass.BULK: DEFAULT.bulk_limits,
    }


def test_default_round_trips_through_toml() -> None:
    text = dump_envelope(DEFAULT)
    assert "max_active_seqs = 32\n" in text
    assert "bulk_min_share = 0.2\n" in text
    assert "[interactive]\nqueue_limit = 64\n" in text
    assert "[provenance.slo]" in text
    assert load_envelope(text) == DEFAULT


def test_to_dict_is_json_ready() -> None:
    data = DEFAULT.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["bulk"] == {
        "queue_limit": 10_000,
        "max_prompt_tokens": 8192,
        "max_output_tokens": 4096,
        "max_context_tokens": 8192,
    }
    assert Envelope.from_dict(data) == DEFAULT


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("max_active_seqs = 32", "max_active_seq = 32", "max_active_seq"),
        ("[bulk]\nqueue_limit", "[bulk]\nqueue_limt", "bulk.queue_limt"),
        ('source = "default"', 'source = "default"\nnotez = "x"', "provenance.notez"),
        ("[interactive]", "[interactiv]", "interactiv"),
    ],
)
def test_unknown_keys_are_named(old: str, new: str, key: str) -> None:
    text = dump_envelope(DEFAULT)
    assert old in text
    with pytest.raises(ValueError, match=f"unknown envelope key '{key}'"):
        load_envelope(text.replace(old, new))


def test_missing_keys_are_named() -> None:
    text = dump_envelope(DEFAULT).replace("bulk_aging_s = 5.0\n", "")
    with pytest.raises(ValueError, match="missing envelope key 'bulk_aging_s'"):
        load_envelope(text)
    no_source = dump_envelope(DEFAULT).replace('source = "default"\n', "")
    with pytest.raises(ValueError, match="missing envelope key 'provenance.source'"):
        load_envelope(no_source)


def test_optional_provenance_fields_may_be_left_out() -> None:
    text = dump_envelope(DEFAULT)
    head = text.split("[provenance]")[0]
    env = load_envelope(head + '[provenance]\nsource = "ops/edge.toml"\n')
    assert env.provenance == Provenance(source="ops/edge.toml")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("max_active_seqs",), 32.0, "'max_active_seqs' must be an integer"),
        (("max_active_seqs",), True, "'max_active_seqs' must be an integer"),
        (("bulk_min_share",), "0.2", "'bulk_min_share' must be a number"),
        (("bulk_min_share",), False, "'bulk_min_share' must be a number"),
        (("interactive", "queue_limit"), 64.5, "'interactive.queue_limit' must be an integer"),
        (("bulk",), 3, "'bulk' must be a table"),
        (("provenance", "notes"), 3, "'provenance.notes' must be a string"),
        (("provenance", "slo"), 1, "'provenance.slo' must be a table"),
        (("provenance", "slo", "ttft_p99_s"), "2s", "'provenance.slo.ttft_p99_s' must be a number"),
    ],
)
def test_wrong_types_are_named(path: tuple[str, ...], value: object, message: str) -> None:
    data = DEFAULT.to_dict()
    table = data
    for key in path[:-1]:
        table = table[key]  # type: ignore[assignment]
    table[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        Envelope.from_dict(data)


def test_integers_are_accepted_for_float_fields() -> None:
    env = load_envelope(dump_envelope(DEFAULT).replace("bulk_aging_s = 5.0", "bulk_aging_s = 7"))
    assert env.bulk_aging_s == 7.0
    assert isinstance(env.bulk_aging_s, float)


def test_toml_syntax_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        load_envelope("max_active_seqs = = 3")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_active_seqs": 0}, "max_active_seqs"),
        ({"step_token_budget": 31}, "step_token_budget must be >= max_active_seqs"),
        ({"bulk_prefill_chunk_tokens": 513}, "bulk_prefill_chunk_tokens must not exceed"),
        ({"bulk_min_share": 0.0}, "bulk_min_share"),
        ({"bulk_min_share": 1.0}, "bulk_min_share"),
        ({"bulk_aging_s": -1.0}, "bulk_aging_s"),
        ({"bulk_class_offset_ms": -1}, "bulk_class_offset_ms"),
        ({"interactive_queue_limit": 0}, "interactive_queue_limit"),
        ({"bulk_queue_limit": 0}, "bulk_queue_limit"),
        ({"interactive_ttft_target_s": 0.0}, "interactive_ttft_target_s"),
        ({"interactive_reserved_seqs": 32}, "interactive_reserved_seqs"),
        ({"interactive_reserved_seqs": -1}, "interactive_reserved_seqs"),
    ],
)
def test_invalid_envelopes_raise(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DEFAULT, **changes)


def test_boundary_envelope_is_valid() -> None:
    env = dataclasses.replace(
        DEFAULT,
        max_active_seqs=4,
        step_token_budget=4,  # every running decode just fits
        bulk_prefill_chunk_tokens=4,
        interactive_reserved_seqs=3,
        bulk_aging_s=0.0,
        bulk_class_offset_ms=0,
    )
    assert load_envelope(dump_envelope(env)) == env


def test_provenance_validation_and_copy() -> None:
    with pytest.raises(ValueError, match="source"):
        Provenance(source="")
    with pytest.raises(ValueError, match="ISO 8601"):
        Provenance(created_at="yesterday")
    with pytest.raises(ValueError, match="ttft"):
        Provenance(slo={"ttft": float("inf")})
    with pytest.raises(ValueError, match="must be a number"):
        Provenance(slo={"ok": True})
    slo = {"ttft_p99_s": 2}
    provenance = Provenance(source="sweep", created_at="2026-11-29T10:00:00+00:00", slo=slo)  # type: ignore[dict-item]
    slo["ttft_p99_s"] = 99
    assert provenance.slo == {"ttft_p99_s": 2.0}
    assert isinstance(provenance.slo["ttft_p99_s"], float)


def test_writer_quotes_keys_and_escapes_strings() -> None:
    data = {"a b": 'quote " back \\ nl \n tab \t nul \x00 del \x7f é', "t": {"x.y": {}}}
    text = dump_toml(data)
    assert '"a b" = ' in text
    assert '[t."x.y"]' in text
    assert tomllib.loads(text) == data


def test_writer_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match="list"):
        dump_toml({"xs": [1, 2]})
    with pytest.raises(ValueError, match="NoneType"):
        dump_toml({"t": {"x": None}})


@st.composite
def envelopes(draw: st.DrawFn) -> Envelope:
    def limits() -> LengthLimits:
        context = draw(st.integers(min_value=1, max_value=1 << 20))
        return LengthLimits(
            max_prompt_tokens=draw(st.integers(min_value=1, max_value=context)),
            max_output_tokens=draw(st.integers(min_value=1, max_value=context)),
            max_context_tokens=context,
        )

    max_active = draw(st.integers(min_value=1, max_value=1024))
    budget = draw(st.integers(min_value=max_active, max_value=1 << 16))
    created = draw(st.one_of(st.just(""), st.datetimes().map(datetime.isoformat)))
    finite = st.floats(allow_nan=False, allow_infinity=False)
    return Envelope(
        max_active_seqs=max_active,
        step_token_budget=budget,
        bulk_prefill_chunk_tokens=draw(st.integers(min_value=1, max_value=budget)),
        bulk_min_share=draw(st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)),
        bulk_aging_s=draw(st.floats(min_value=0.0, max_value=1e9)),
        bulk_class_offset_ms=draw(st.integers(min_value=0, max_value=1 << 40)),
        interactive_queue_limit=draw(st.integers(min_value=1, max_value=1 << 30)),
        bulk_queue_limit=draw(st.integers(min_value=1, max_value=1 << 30)),
        interactive_limits=limits(),
        bulk_limits=limits(),
        interactive_ttft_target_s=draw(st.floats(min_value=1e-6, max_value=1e6)),
        interactive_reserved_seqs=draw(st.integers(min_value=0, max_value=max_active - 1)),
        provenance=Provenance(
            source=draw(st.text(min_size=1)),
            created_at=created,
            notes=draw(st.text()),
            workload=draw(st.text()),
            slo=draw(st.dictionaries(st.text(min_size=1), finite, max_size=4)),
        ),
    )


@given(env=envelopes())
def test_any_valid_envelope_round_trips(env: Envelope) -> None:
    assert load_envelope(dump_envelope(env)) == env
    assert Envelope.from_dict(env.to_dict()) == env


def test_envelopes_are_hashable_despite_the_slo_dict() -> None:
    with_slo = dataclasses.replace(
        DEFAULT, provenance=Provenance(source="sweep", slo={"ttft_p99_s": 2.0})
    )
    assert len({DEFAULT, with_slo, Envelope.default()}) == 2


def test_the_built_in_envelope_takes_its_bulk_chunk_from_the_engine() -> None:
    native, vllm = Envelope.default("native"), Envelope.default("vllm")
    assert native == Envelope.default()  # native is the default engine
    assert (native.bulk_prefill_chunk_tokens, vllm.bulk_prefill_chunk_tokens) == (64, 128)
    assert dataclasses.replace(
        vllm, bulk_prefill_chunk_tokens=64, provenance=native.provenance
    ) == (native)  # the chunk is the only knob that differs
    assert "vllm engine" in vllm.provenance.notes
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        Envelope.default("tgi")
