"""planning.envelope_derive + planning.slo + planning.envelope_command on fixed, recorded sweep
results."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import planning.envelope_command as envelope_cli
import planning.envelope_derive as derive_module
import planning.slo as slo_module
from planning.envelope_command import read_sweep, run_envelope_derive
from planning.envelope_derive import (
    Knobs,
    Slo,
    SloTarget,
    SweepPoint,
    derive_envelope,
)
from planning.slo import load_slo
from policies.admission import LengthLimits
from policies.envelope import Envelope, dump_envelope, load_envelope

SLO_TOML = """
headroom = 0.2
max_rejection_rate = 0.01

[[target]]
class = "interactive"
metric = "ttft_s"
percentile = 99
max = 0.5
workload = "mixed"

[[target]]
class = "interactive"
metric = "itl_s"
percentile = 99
max = 0.1
workload = "mixed"

[[target]]
class = "bulk"
metric = "completion_within_deadline"
min = 0.99
"""

SMALL = Knobs(max_active_seqs=8, step_token_budget=128, bulk_prefill_chunk_tokens=32)
LARGE = Knobs(max_active_seqs=32, step_token_budget=1024, bulk_prefill_chunk_tokens=512)
MEDIUM = Knobs(max_active_seqs=16, step_token_budget=256, bulk_prefill_chunk_tokens=64)
CREATED_AT = "2025-01-02T03:04:05+00:00"


def _point(
    load: float,
    knobs: Knobs,
    *,
    ttft: float = 0.2,
    itl: float = 0.05,
    rejected: float = 0.0,
    bulk_ok: float = 1.0,
    bulk_tps: float = 100.0,
) -> SweepPoint:
    return SweepPoint(
        offered_load=load,
        knobs=knobs,
        measured={
            "interactive": {
                "ttft_p99_s": ttft,
                "itl_p99_s": itl,
                "rejection_rate": rejected,
                "ok_rate": 1.0,
                "output_tokens_per_s": 50.0,
            },
            "bulk": {"rejection_rate": 0.0, "ok_rate": bulk_ok, "output_tokens_per_s": bulk_tps},
        },
    )


# A recorded sweep: SMALL holds to load 3; LARGE is fast but its big step budget breaks ITL;
# MEDIUM passes at 4, fails TTFT at 5, and "passes" again at 6 (noise, not capacity).
RECORDED = [
    _point(1.0, SMALL),
    _point(2.0, SMALL, ttft=0.3),
    _point(3.0, SMALL, ttft=0.45),
    _point(4.0, SMALL, ttft=0.9),
    _point(2.0, LARGE, itl=0.15),
    _point(6.0, LARGE, itl=0.25),
    _point(2.0, MEDIUM),
    _point(4.0, MEDIUM, ttft=0.4),
    _point(5.0, MEDIUM, ttft=0.7),
    _point(6.0, MEDIUM, ttft=0.45),
]


def _slo() -> Slo:
    return load_slo(SLO_TOML).slo()


def test_all_exports_exist() -> None:
    for module in (derive_module, slo_module, envelope_cli):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_picks_the_largest_load_meeting_the_slo_with_headroom() -> None:
    base = Envelope.default()
    derivation = derive_envelope(RECORDED, _slo(), base, 0.2, "mixed", CREATED_AT)
    assert derivation.chosen.knobs == MEDIUM
    assert derivation.chosen.offered_load == 4.0
    assert derivation.max_sustainable_load == 4.0
    assert derivation.admitted_load == pytest.approx(3.2)
    env = derivation.envelope
    assert env.max_active_seqs == 16
    assert env.step_token_budget == 256
    assert env.bulk_prefill_chunk_tokens == 64
    # Queue limits scaled by 1 - headroom; length limits kept from base.
    assert env.interactive_queue_limit == int(base.interactive_queue_limit * 0.8)
    assert env.bulk_queue_limit == int(base.bulk_queue_limit * 0.8)
    assert env.interactive_limits == base.interactive_limits
    assert env.bulk_limits == base.bulk_limits
    assert env.interactive_ttft_target_s == 0.5


def test_ties_on_load_go_to_the_most_room_under_the_slo() -> None:
    # Every point serves the offered load in full, so tokens/s differ only by noise: the one
    # with the lowest latency against its bounds wins, even with a hair fewer tokens/s.
    tied = [
        _point(2.0, LARGE, ttft=0.45, bulk_tps=100.5),
        _point(2.0, SMALL, ttft=0.1, bulk_tps=100.0),
        _point(2.0, MEDIUM, ttft=0.3, bulk_tps=100.2),
    ]
    derivation = derive_envelope(tied, _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)
    assert derivation.chosen.knobs == SMALL
    # The larger load still wins over room to spare.
    more_load = [*tied, _point(3.0, LARGE, ttft=0.45)]
    derivation = derive_envelope(more_load, _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)
    assert derivation.chosen.knobs == LARGE


def test_rejected_points_carry_their_reasons() -> None:
    derivation = derive_envelope(RECORDED, _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)
    reasons = {(p.offered_load, p.knobs): r for p, r in derivation.rejected}
    # The knob setting whose large step budget breaks ITL is rejected for ITL.
    large_reasons = reasons[(2.0, LARGE)]
    assert len(large_reasons) == 1
    assert "interactive itl_p99_s" in large_reasons[0]
    assert "> max 0.1" in large_reasons[0]
    assert any("ttft_p99_s" in r for r in reasons[(4.0, SMALL)])
    # A pass above a failing load is not trusted.
    assert "or less with these knobs failed" in reasons[(6.0, MEDIUM)][0]
    assert (3.0, SMALL) not in reasons
    assert len(derivation.rejected) == 5


def test_rejection_rate_bound_applies_to_every_class() -> None:
    points = [_point(1.0, SMALL), _point(2.0, SMALL, rejected=0.05)]
    derivation = derive_envelope(points, _slo(), Envelope.default(), 0.0, "mixed", CREATED_AT)
    assert derivation.chosen.offered_load == 1.0
    assert derivation.admitted_load == 1.0
    ((point, reasons),) = derivation.rejected
    assert point.offered_load == 2.0
    assert reasons == ("interactive rejection_rate 0.05 > max 0.01",)


def test_bulk_completion_target() -> None:
    points = [_point(1.0, SMALL, bulk_ok=0.9)]
    with pytest.raises(ValueError, match=r"bulk ok_rate 0.9 < min 0.99"):
        derive_envelope(points, _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)


def test_nothing_meets_the_slo_names_the_closest_point() -> None:
    points = [
        _point(1.0, SMALL, ttft=0.9, itl=0.3),
        _point(2.0, LARGE, itl=0.2),
        _point(1.5, MEDIUM, itl=0.12),
    ]
    with pytest.raises(ValueError, match="no sweep point meets the SLO") as info:
        derive_envelope(points, _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)
    message = str(info.value)
    # Two points miss one target each; the higher load is the closest.
    assert "load=2 max_active_seqs=32" in message
    assert "itl_p99_s 0.2 > max 0.1" in message


def test_missing_measurement_fails_the_target() -> None:
    point = SweepPoint(
        offered_load=1.0, knobs=SMALL, measured={"bulk": {"ok_rate": 1.0}, "interactive": {}}
    )
    with pytest.raises(ValueError, match="interactive ttft_p99_s not measured"):
        derive_envelope([point], _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)


def test_provenance_is_filled() -> None:
    derivation = derive_envelope(RECORDED, _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)
    provenance = derivation.envelope.provenance
    assert provenance.source == "sweep"
    assert provenance.workload == "mixed"
    assert provenance.created_at == CREATED_AT
    assert provenance.slo == {
        "interactive_ttft_p99_s_max": 0.5,
        "interactive_itl_p99_s_max": 0.1,
        "bulk_ok_rate_min": 0.99,
        "max_rejection_rate": 0.01,
        "headroom": 0.2,
    }
    assert "max_sustainable_load=4" in provenance.notes
    assert "admitted_load=3.2" in provenance.notes
    assert "max_active_seqs=16" in provenance.notes


def test_round_trip_through_toml() -> None:
    derivation = derive_envelope(RECORDED, _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)
    assert load_envelope(dump_envelope(derivation.envelope)) == derivation.envelope


def test_length_limits_from_the_chosen_point() -> None:
    limits = LengthLimits(max_prompt_tokens=512, max_output_tokens=256, max_context_tokens=768)
    point = SweepPoint(
        offered_load=1.0,
        knobs=SMALL,
        measured=_point(1.0, SMALL).measured,
        length_limits={"interactive": limits},
    )
    base = Envelope.default()
    env = derive_envelope([point], _slo(), base, 0.2, "mixed", CREATED_AT).envelope
    assert env.interactive_limits == limits
    assert env.bulk_limits == base.bulk_limits


def test_reserved_seqs_clamped_to_small_knobs() -> None:
    tiny = Knobs(max_active_seqs=2, step_token_budget=64, bulk_prefill_chunk_tokens=16)
    env = derive_envelope(
        [_point(1.0, tiny)], _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT
    ).envelope
    assert env.interactive_reserved_seqs == 1


def test_targets_for_another_workload_are_skipped_loudly() -> None:
    slo = Slo(
        targets=(
            SloTarget("interactive", "ttft_s", percentile=99, max_value=0.5, workload="chat"),
        ),
        max_rejection_rate=0.01,
    )
    with pytest.raises(ValueError, match="no SLO target applies to workload 'mixed'"):
        derive_envelope(RECORDED, slo, Envelope.default(), 0.2, "mixed", CREATED_AT)


def test_derive_validates_inputs() -> None:
    with pytest.raises(ValueError, match="no sweep points"):
        derive_envelope([], _slo(), Envelope.default(), 0.2, "mixed", CREATED_AT)
    with pytest.raises(ValueError, match="headroom"):
        derive_envelope(RECORDED, _slo(), Envelope.default(), 1.0, "mixed", CREATED_AT)
    with pytest.raises(ValueError, match="step_token_budget"):
        Knobs(max_active_seqs=64, step_token_budget=32, bulk_prefill_chunk_tokens=16)
    with pytest.raises(ValueError, match="offered_load"):
        _point(0.0, SMALL)


# ---- SLO spec ------------------------------------------------------------------------------


def test_load_slo() -> None:
    spec = load_slo(SLO_TOML)
    assert spec.headroom == 0.2
    assert spec.max_rejection_rate == 0.01
    assert [t.name for t in spec.targets] == [
        "interactive_ttft_p99_s_max",
        "interactive_itl_p99_s_max",
        "bulk_ok_rate_min",
    ]
    assert spec.targets[0].workload == "mixed"
    assert spec.targets[2].min_value == 0.99


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("headroom = 0.2", "at least one"),
        ("bogus = 1\n[[target]]\nclass='bulk'", "unknown SLO key"),
        ("headroom = 1.5\n" + SLO_TOML.split("\n", 2)[2], "headroom"),
        ('[[target]]\nclass="interactive"\nmetric="ttft_s"\nmax=0.5', r"target\[0\].*percentile"),
        ('[[target]]\nclass="chat"\nmetric="ttft_s"\npercentile=99\nmax=0.5', "class must be"),
        ('[[target]]\nclass="bulk"\nmetric="speed"', "unknown SLO metric"),
        ('[[target]]\nclass="bulk"\nmetric="completion_within_deadline"\nmin=1.5', r"\[0, 1\]"),
        ('[[target]]\nclass="bulk"\nmetric="completion_within_deadline"\nmax=0.5', "min"),
        ('[[target]]\nclass="bulk"\nmetric="itl_s"\npercentile=99\nmax="fast"', "number"),
        ('[[target]]\nclass="bulk"\nmetric="itl_s"\npercentile=99\nmax=0.1\nmaxx=1', "maxx"),
        (
            "max_rejection_rate = 2\n"
            '[[target]]\nclass="bulk"\nmetric="itl_s"\npercentile=99\nmax=0.1',
            "max_rejection_rate",
        ),
        (
            '[[target]]\nclass="bulk"\nmetric="itl_s"\npercentile=99\nmax=0.1\n'
            '[[target]]\nclass="bulk"\nmetric="itl_s"\npercentile=99\nmax=0.2',
            "duplicate",
        ),
    ],
)
def test_load_slo_rejects_bad_specs(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_slo(text)


# ---- the CLI over a sweep folder -------------------------------------------------------------


def _class_summary(ttft: float, itl: float, ok_rate: float) -> dict[str, object]:
    return {
        "count": 10,
        "rejection_rate": 0.0,
        "expiry_rate": 0.0,
        "ok_rate": ok_rate,
        "output_tokens_per_s": 10.0,
        "ttft_s": {"p50": ttft / 2, "p90": ttft, "p99": ttft},
        "itl_s": {"p50": itl / 2, "p99": itl},
        "e2e_s": {"p50": 1.0, "p99": 2.0},
        "queue_delay_s": {"p50": None, "p99": None},
    }


def _write_run(root: Path, name: str, load: float, knobs: Knobs, ttft: float, itl: float) -> None:
    run = root / name
    run.mkdir(parents=True)
    config = {
        "sweep_point": {
            "offered_load": load,
            "knobs": {
                "max_active_seqs": knobs.max_active_seqs,
                "step_token_budget": knobs.step_token_budget,
                "bulk_prefill_chunk_tokens": knobs.bulk_prefill_chunk_tokens,
            },
        }
    }
    summary = {
        "classes": {
            "interactive": _class_summary(ttft, itl, 1.0),
            "bulk": _class_summary(5.0, 0.0, 1.0),
        }
    }
    (run / "config.json").write_text(json.dumps(config))
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "workload.toml").write_text('name = "mixed"\n')


def test_cli_derives_and_writes_the_envelope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep"
    _write_run(sweep, "medium/load1", 1.0, MEDIUM, 0.2, 0.05)
    _write_run(sweep, "medium/load2", 2.0, MEDIUM, 0.3, 0.06)
    _write_run(sweep, "large/load2", 2.0, LARGE, 0.3, 0.3)
    (sweep / "notes").mkdir()
    (sweep / "notes" / "config.json").write_text("{}")  # not a run: skipped
    slo_path = tmp_path / "slo.toml"
    slo_path.write_text(SLO_TOML)
    out = tmp_path / "out" / "envelope.toml"
    args = argparse.Namespace(dir=sweep, slo=slo_path, out=out, base=None)
    assert run_envelope_derive(args) == 0
    env = load_envelope(out.read_text())
    assert env.max_active_seqs == MEDIUM.max_active_seqs
    assert env.provenance.workload == "mixed"
    assert env.provenance.source == "sweep"
    printed = capsys.readouterr().out
    assert "rejected points" in printed
    assert "itl_p99_s" in printed


def test_cli_reports_failure_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_run(tmp_path / "sweep", "a", 1.0, LARGE, 0.3, 0.3)
    slo_path = tmp_path / "slo.toml"
    slo_path.write_text(SLO_TOML)
    base_path = tmp_path / "base.toml"
    base_path.write_text(dump_envelope(Envelope.default()))
    out = tmp_path / "envelope.toml"
    args = argparse.Namespace(dir=tmp_path / "sweep", slo=slo_path, out=out, base=base_path)
    assert run_envelope_derive(args) == 1
    assert not out.exists()
    assert "no sweep point meets the SLO" in capsys.readouterr().out


def test_read_sweep_needs_points(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no run folders"):
        read_sweep(tmp_path)
