"""Device presets (datasheet peaks x effective fractions) and the measured device read from a
calibration file through planning.calibration_file."""

from __future__ import annotations

from pathlib import Path

import pytest

from planning.calibration_file import load_rates, resolve_device, write_calibration
from planning.device_presets import DEVICE_PRESETS, device, device_from_mapping, device_rates


def test_every_preset_says_where_its_numbers_come_from() -> None:
    assert {"h100", "h200", "a100-80gb", "l4"} <= set(DEVICE_PRESETS)
    for preset in DEVICE_PRESETS.values():
        assert "datasheet" in preset.source
        assert preset.peak_flops_per_s > preset.peak_bytes_per_s > 0


def test_h100_rates_are_the_default_fractions_of_its_peaks() -> None:
    rates = device_rates("h100")
    assert rates.flops_per_s == pytest.approx(989.5e12 * 0.7)
    assert rates.bytes_per_s == pytest.approx(3.35e12 * 0.8)
    assert rates.step_overhead_s == 0.0
    assert "H100" in rates.source


def test_an_explicit_fraction_applies_to_both_peaks() -> None:
    rates = device_rates("h200", effective_fraction=0.5)
    assert (rates.flops_per_s, rates.bytes_per_s) == (989.5e12 * 0.5, 4.8e12 * 0.5)
    # H200 has H100's compute and more, faster memory.
    assert device("h200").memory_bytes > device("h100").memory_bytes
    assert device("H100-SXM").name == "h100"  # aliases and case


@pytest.mark.parametrize(
    "call",
    [
        lambda: device_rates("tpu"),
        lambda: device_rates("h100", effective_fraction=0.0),
        lambda: device_rates("h100", effective_fraction=1.5),
        lambda: device_from_mapping({"flops_per_s": 1.0, "bytes_per_s": 1.0}),  # no memory
    ],
)
def test_bad_devices_raise(call: object) -> None:
    assert callable(call)
    with pytest.raises(ValueError):
        call()


def test_measured_device_round_trips_through_the_calibration_file(tmp_path: Path) -> None:
    content = {
        "source": "calibrated in a test",
        "flops_per_s": 1.5e11,
        "bytes_per_s": 2.0e10,
        "kv_bytes_per_s": 5.0e9,
        "step_overhead_s": 0.012,
        "compute_memory_overlap": 0.3,
        "memory_bytes": 16 << 30,
        "threads": 2,
        "rows": {"00": {"kind": "decode", "measured_s": 0.05}},
    }
    path = write_calibration(tmp_path / "nested" / "calibration.toml", content)
    rates = load_rates(path)
    assert (rates.flops_per_s, rates.bytes_per_s, rates.kv_bytes_per_s) == (1.5e11, 2e10, 5e9)
    assert (rates.step_overhead_s, rates.compute_memory_overlap) == (0.012, 0.3)
    measured = resolve_device(f"measured:{path}")
    assert measured.memory_bytes == 16 << 30
    assert measured.rates == rates
    assert resolve_device("l4").name == "l4"


def test_a_missing_or_incomplete_calibration_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="mixgate plan calibrate"):
        resolve_device(f"measured:{tmp_path / 'absent.toml'}")
    with pytest.raises(ValueError):
        write_calibration(tmp_path / "bad.toml", {"flops_per_s": 1.0, "bytes_per_s": 1.0})
    assert not (tmp_path / "bad.toml").exists()
