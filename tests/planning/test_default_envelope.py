"""The envelope scripts/serve runs is a measured one: a sweep's, derived against the SLO file
it names, and it parses as the server will read it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from policies.envelope import load_envelope

ROOT = Path(__file__).resolve().parents[2]


def test_scripts_serve_runs_the_committed_sweep_envelope() -> None:
    serve = (ROOT / "scripts" / "serve").read_text()
    match = re.search(r"mixgate serve --envelope (\S+) \"\$@\"", serve)
    assert match, "scripts/serve must pass --envelope before the user's arguments"
    envelope = load_envelope((ROOT / match.group(1)).read_text())
    assert envelope.provenance.source == "sweep"
    assert envelope.provenance.workload == "chat-over-backlog"
    assert envelope.provenance.created_at


def test_the_default_envelope_was_derived_against_the_slo_file() -> None:
    envelope = load_envelope((ROOT / "bench" / "envelopes" / "small.toml").read_text())
    slo = tomllib.loads((ROOT / "bench" / "slos" / "chat-over-backlog.toml").read_text())
    by_metric = {t["metric"]: t["max"] for t in slo["target"] if t["class"] == "interactive"}
    assert envelope.provenance.slo["interactive_ttft_p99_s_max"] == by_metric["ttft_s"]
    assert envelope.provenance.slo["interactive_itl_p99_s_max"] == by_metric["itl_s"]
    assert envelope.provenance.slo["headroom"] == slo["headroom"]
    # Admission's TTFT target is the SLO's, so a chat is refused only past what the SLO allows.
    assert envelope.interactive_ttft_target_s == by_metric["ttft_s"]
