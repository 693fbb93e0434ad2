"""`mixgate envelope derive DIR --slo slo.toml --out envelope.toml [--base envelope.toml]`.

DIR is a sweep folder: every folder below it (any depth) holding a ``config.json`` with a
``sweep_point`` entry is one run folder (``bench.report.run_folder.write_run_folder``)::

    "sweep_point": {
      "offered_load": 2.0,
      "knobs": {"max_active_seqs": 16, "step_token_budget": 256, "bulk_prefill_chunk_tokens": 64},
      "workload": "mixed",                      # optional: else config "workload_name",
                                                #   else workload.toml's name, else "DIR"'s name
      "length_limits": {"interactive": {"max_prompt_tokens": .., "max_output_tokens": ..,
                                        "max_context_tokens": ..}}    # optional
    }

The measurements come from the folder's ``summary.json``. The derived envelope is written as
TOML; the choice and every rejected point (with its reasons) are printed.

Arguments (``args`` attributes; the parser lives in mixgate/cli.py, see
``add_envelope_derive_arguments``): ``dir`` (path), ``slo`` (path to an SLO TOML,
``planning.slo``), ``out`` (path to write), ``base`` (path to an envelope TOML or None: the
built-in default). Exit status: 0 written, 1 bad input or no point meets the SLO.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from planning.envelope_derive import Derivation, Knobs, SweepPoint, derive_envelope
from planning.slo import load_slo
from policies.admission import LengthLimits
from policies.envelope import Envelope, dump_envelope, load_envelope

__all__ = [
    "add_envelope_derive_arguments",
    "read_sweep",
    "run_envelope_derive",
    "sweep_point_from_run",
]

_CLASSES = ("interactive", "bulk")


def add_envelope_derive_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``run_envelope_derive`` reads, for whoever builds the parser."""
    parser.add_argument("dir", type=Path, help="sweep folder (run folders below it)")
    parser.add_argument("--slo", type=Path, required=True, help="SLO spec TOML")
    parser.add_argument("--out", type=Path, required=True, help="envelope TOML to write")
    parser.add_argument("--base", type=Path, default=None, help="envelope TOML to start from")


def _measured(summary: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    measured: dict[str, dict[str, float | None]] = {}
    for name, block in summary.get("classes", {}).items():
        values: dict[str, float | None] = {
            key: block.get(key)
            for key in (
                "rejection_rate",
                "expiry_rate",
                "ok_rate",
                "output_tokens_per_s",
                "output_tokens_per_busy_s",
            )
        }
        # Every percentile the summary has, under SloTarget.measured_key's names.
        for metric in ("ttft_s", "itl_s", "e2e_s", "queue_delay_s"):
            for pct_key, value in (block.get(metric) or {}).items():
                values[f"{metric.removesuffix('_s')}_{pct_key}_s"] = value
        measured[name] = values
    return measured


def _length_limits(raw: dict[str, Any]) -> dict[str, LengthLimits]:
    return {name: LengthLimits(**limits) for name, limits in raw.items()}


def _workload_name(run_dir: Path, config: dict[str, Any], sweep_dir: Path) -> str:
    point = config["sweep_point"]
    if point.get("workload"):
        return str(point["workload"])
    if config.get("workload_name"):
        return str(config["workload_name"])
    workload_toml = run_dir / "workload.toml"
    if workload_toml.is_file():
        name = tomllib.loads(workload_toml.read_text()).get("name")
        if isinstance(name, str) and name:
            return name
    return sweep_dir.name


def sweep_point_from_run(run_dir: Path, config: dict[str, Any]) -> SweepPoint:
    """The SweepPoint of one run folder whose ``config.json`` is ``config``."""
    raw = config["sweep_point"]
    summary = json.loads((run_dir / "summary.json").read_text())
    return SweepPoint(
        offered_load=float(raw["offered_load"]),
        knobs=Knobs(**raw["knobs"]),
        measured=_measured(summary),
        length_limits=_length_limits(raw.get("length_limits", {})),
        label=str(run_dir),
    )


def read_sweep(sweep_dir: Path) -> tuple[list[SweepPoint], str]:
    """Every run folder below ``sweep_dir`` as a SweepPoint, and the one workload they ran."""
    points: list[SweepPoint] = []
    workloads: set[str] = set()
    for config_path in sorted(Path(sweep_dir).rglob("config.json")):
        config = json.loads(config_path.read_text())
        if "sweep_point" not in config:
            continue
        run_dir = config_path.parent
        try:
            points.append(sweep_point_from_run(run_dir, config))
        except (KeyError, TypeError, OSError) as exc:
            raise ValueError(f"{run_dir}: bad sweep run folder: {exc!r}") from None
        workloads.add(_workload_name(run_dir, config, Path(sweep_dir)))
    if not points:
        raise ValueError(f"no run folders with a sweep_point under {sweep_dir}")
    if len(workloads) > 1:
        # One envelope is derived for one workload; a mix of them has no meaning.
        raise ValueError(f"the sweep mixes workloads {sorted(workloads)}")
    return points, workloads.pop()


def _print_derivation(console: Console, derivation: Derivation, out: Path) -> None:
    chosen = derivation.chosen
    console.print(f"[bold]chosen[/bold]: {chosen.describe()}")
    console.print(
        f"max sustainable load {derivation.max_sustainable_load:g}, "
        f"admitted load {derivation.admitted_load:g}; wrote {out}"
    )
    if not derivation.rejected:
        return
    rejected = Table(title="rejected points")
    for column in ("load", "knobs", "reasons"):
        rejected.add_column(column)
    for point, reasons in derivation.rejected:
        rejected.add_row(f"{point.offered_load:g}", point.knobs.describe(), "; ".join(reasons))
    console.print(rejected)


def run_envelope_derive(args: argparse.Namespace) -> int:
    console = Console()
    try:
        spec = load_slo(Path(args.slo).read_text())
        base = (
            load_envelope(Path(args.base).read_text())
            if getattr(args, "base", None)
            else Envelope.default()
        )
        points, workload = read_sweep(Path(args.dir))
        derivation = derive_envelope(
            points,
            spec.slo(),
            base,
            headroom=spec.headroom,
            workload_name=workload,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
    except (OSError, ValueError) as exc:
        console.print(f"[red]envelope derive failed[/red]: {exc}")
        return 1
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump_envelope(derivation.envelope))
    _print_derivation(console, derivation, out)
    return 0
