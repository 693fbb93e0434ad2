"""The runners `bench compare` and `bench sweep` take: one loop each, whatever runs the points.

A runner runs one `RunPoint` (a workload under a policy, optionally with its own envelope
file), writes the point's run folder and returns its summary:

- `LiveRunner`: a fresh `mixgate serve` per point (bench/live/run.py), or a vLLM policy
  (bench/baselines/vllm_baseline.py: a plain vLLM server, or mixgate on vLLM), all on one Redis;
- `SimRunner`: the engine's own scheduler in virtual time (bench/sim/simulate.py); its points
  are independent, so `run_all` runs them in `--jobs` forked processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.baselines.vllm_baseline import is_vllm_policy, run_policy
from bench.live.processes import redis_url
from bench.live.run import RunSpec, run_live
from bench.load.workload import Workload, load_workload
from bench.sim.simulate import SimSpec, run_simulated, sim_spec_from_args
from bench.sim.workloads import load_sim_workload
from engine.model.make_model import make_model
from policies.envelope import Envelope, load_envelope
from policies.scheduling_policy import SchedulingPolicy

__all__ = ["LiveRunner", "RunPoint", "Runner", "SimRunner", "ensure_model", "runner_from_args"]


@dataclass(frozen=True, slots=True)
class RunPoint:
    policy: str
    workload: Workload
    folder: Path
    title: str
    extra: dict[str, Any]
    # The point's envelope as a TOML file (a live server reads a file; the simulator reads the
    # same file, so both run exactly what the folder records). None: the runner's base.
    envelope_file: Path | None = None


class Runner(Protocol):
    @property
    def simulated(self) -> bool:
        """True for virtual time: titles and messages say "(simulated)"."""

    @property
    def base_envelope(self) -> Envelope:
        """The envelope a sweep's knobs are applied to."""

    def load_workload(self, name: str) -> Workload: ...

    def check_policy(self, name: str) -> None:
        """Raise ValueError when this runner cannot run the policy."""

    def run(self, point: RunPoint) -> dict[str, Any]: ...

    def run_all(self, points: list[RunPoint]) -> list[dict[str, Any]]: ...


def ensure_model(model: str | None, out: Path, preset: str) -> Path:
    if model is not None:
        return Path(model)
    model_dir = out / "model"
    if not (model_dir / "config.json").is_file():
        make_model(model_dir, preset, seed=0)
    return model_dir


@dataclass(frozen=True, slots=True)
class LiveRunner:
    model_dir: Path
    redis_url: str
    threads: int
    simulated: bool = False
    # The envelope every point's server runs (--envelope) unless the point brings its own
    # (a sweep point's knobs applied to it); None: the server's built-in default.
    envelope_file: Path | None = None

    @property
    def base_envelope(self) -> Envelope:
        if self.envelope_file is None:
            return Envelope.default()
        return load_envelope(self.envelope_file.read_text())

    def load_workload(self, name: str) -> Workload:
        return load_workload(name)

    def check_policy(self, name: str) -> None:
        # NOTE: the vLLM policies (bench/baselines/vllm_baseline.py) are names, not engine presets.
        if not is_vllm_policy(name):
            SchedulingPolicy(name)

    def run(self, point: RunPoint) -> dict[str, Any]:
        spec = RunSpec(
            self.model_dir,
            self.redis_url,
            point.policy,
            threads=self.threads,
            envelope_path=point.envelope_file or self.envelope_file,
        )
        args = (spec, point.workload, point.folder, point.title, point.extra)
        if is_vllm_policy(point.policy):
            return run_policy(point.policy, *args)
        return run_live(*args)

    def run_all(self, points: list[RunPoint]) -> list[dict[str, Any]]:
        # One server at a time: the points share this machine's cores and one Redis.
        return [self.run(point) for point in points]


@dataclass(frozen=True, slots=True)
class SimRunner:
    spec: SimSpec
    jobs: int | None = None  # processes at once; None: the CPU count
    simulated: bool = True

    @property
    def base_envelope(self) -> Envelope:
        return self.spec.envelope or Envelope.default()

    def load_workload(self, name: str) -> Workload:
        return load_sim_workload(name)

    def check_policy(self, name: str) -> None:
        known = {p.value for p in SchedulingPolicy}
        if name not in known:
            raise ValueError(f"cannot simulate {name!r}: only {sorted(known)} run in the simulator")

    def run(self, point: RunPoint) -> dict[str, Any]:
        envelope = self.spec.envelope
        if point.envelope_file is not None:
            envelope = load_envelope(point.envelope_file.read_text())
        spec = dataclasses.replace(self.spec, policy=point.policy, envelope=envelope)
        return run_simulated(spec, point.workload, point.folder, point.title, point.extra)

    def workers(self, points: int) -> int:
        return max(1, min(self.jobs or os.cpu_count() or 1, points))

    def run_all(self, points: list[RunPoint]) -> list[dict[str, Any]]:
        workers = self.workers(len(points))
        if workers == 1:
            return [self.run(point) for point in points]
        # NOTE: fork, so workers inherit the imported modules (torch, matplotlib) instead of
        # importing them again; nothing here has started threads yet.
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            return list(pool.map(self.run, points))


@contextmanager
def runner_from_args(args: argparse.Namespace, out: Path) -> Iterator[Runner]:
    """`--simulate`: a SimRunner on the cost model's target; else a LiveRunner on the model
    folder (made from `--preset` when `--model` is not given) and a Redis (a throwaway
    redis-server unless `--redis-url`), which lives as long as the `with` block."""
    if getattr(args, "simulate", False):
        spec = sim_spec_from_args(args, args.model or args.preset)
        yield SimRunner(spec, jobs=getattr(args, "jobs", None))
        return
    model_dir = ensure_model(args.model, out, args.preset)
    with redis_url(args.redis_url, out / "redis") as url:
        envelope = getattr(args, "envelope", None)
        yield LiveRunner(
            model_dir,
            url,
            threads=args.threads,
            envelope_file=Path(envelope) if envelope else None,
        )
