"""PNG plots of a run (a timeline) and of a sweep or comparison (metrics against offered load).

NOTE: figures are built with ``matplotlib.figure.Figure`` on an Agg canvas, never through
pyplot: no global figure registry to leak between runs, no GUI backend picked from the
environment, and safe to call from any thread.

``plot_vs_load`` takes a list of points, one per run::

    {
      "policy": "mixgate",          # one line per policy
      "offered_load": 2.0,          # the x axis (load factor or request rate)
      "classes": {                  # summarize(...)["classes"]: so {"policy", "offered_load",
        "interactive": {...},       #   **summarize(...)} is a valid point
        "bulk": {...},
      },
    }
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.load.records import MetricSample

__all__ = ["VS_LOAD_FILES", "plot_timeline", "plot_vs_load"]

VS_LOAD_FILES = (
    "ttft_p99_vs_load.png",
    "itl_p99_vs_load.png",
    "throughput_vs_load.png",
    "rejection_vs_load.png",
)
_CLASS_STYLE = {"interactive": "-", "bulk": "--"}


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches itself to the figure
    fig.savefig(path, format="png", dpi=100)
    return path


def plot_timeline(samples: Sequence[MetricSample], path: Path) -> Path:
    """KV cache usage (top) and per-class queue depth (bottom) over the run."""
    fig = Figure(figsize=(9, 6), layout="constrained")
    kv_ax, queue_ax = fig.subplots(2, 1, sharex=True)
    times_s = [s.t_s for s in samples]
    kv_ax.plot(times_s, [100 * s.kv_usage for s in samples], color="tab:purple")
    kv_ax.set_ylabel("KV cache used (%)")
    kv_ax.set_ylim(0, 105)
    kv_ax.set_title("KV usage and queue depth")
    classes = sorted({name for s in samples for name in s.queue_depth})
    for name in classes:
        depths = [s.queue_depth.get(name, 0.0) for s in samples]
        queue_ax.plot(times_s, depths, _CLASS_STYLE.get(name, ":"), label=name)
    queue_ax.set_ylabel("queued requests")
    queue_ax.set_xlabel("time since start (s)")
    if classes:
        queue_ax.legend()
    if not samples:
        # An empty run still gets its file, saying so, rather than a missing plot.
        kv_ax.text(0.5, 0.5, "no metric samples", ha="center", transform=kv_ax.transAxes)
    return _save(fig, path)


def _number(point: Mapping[str, Any], request_class: str, *keys: str) -> float | None:
    node: Any = point.get("classes", {}).get(request_class)
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return float(node) if isinstance(node, int | float) else None


def _lines(
    ax: Axes,
    points: Sequence[Mapping[str, Any]],
    classes: Sequence[str],
    value: Callable[[Mapping[str, Any], str], float | None],
) -> None:
    policies = list(dict.fromkeys(str(p["policy"]) for p in points))
    for policy in policies:
        for request_class in classes:
            xy = sorted(
                (float(p["offered_load"]), y)
                for p in points
                if str(p["policy"]) == policy and (y := value(p, request_class)) is not None
            )
            if not xy:
                continue
            label = policy if len(classes) == 1 else f"{policy} ({request_class})"
            style = _CLASS_STYLE.get(request_class, ":")
            ax.plot([x for x, _ in xy], [y for _, y in xy], style, marker="o", label=label)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    ax.set_xlabel("offered load")
    ax.grid(True, alpha=0.3)


def _one(
    points: Sequence[Mapping[str, Any]],
    path: Path,
    title: str,
    ylabel: str,
    classes: Sequence[str],
    value: Callable[[Mapping[str, Any], str], float | None],
) -> Path:
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    _lines(ax, points, classes, value)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    return _save(fig, path)


def _target(path_prefix: Path | str, name: str) -> Path:
    prefix = str(path_prefix)
    if Path(prefix).is_dir() or prefix.endswith("/"):
        return Path(prefix) / name
    return Path(prefix + name)


def plot_vs_load(points: Sequence[Mapping[str, Any]], path_prefix: Path | str) -> list[Path]:
    """The four sweep plots (``VS_LOAD_FILES``), one line per policy (and class).

    ``path_prefix``: an existing folder, or a string ending in "/", gets the files inside it;
    anything else is prepended to each file name (``out/sweep_`` -> ``out/sweep_ttft_...``).
    """
    for point in points:
        if "policy" not in point or "offered_load" not in point:
            raise ValueError("every point needs 'policy' and 'offered_load'")
    ttft, itl, throughput, rejection = (_target(path_prefix, n) for n in VS_LOAD_FILES)
    return [
        _one(
            points,
            ttft,
            "Interactive TTFT p99 vs load",
            "TTFT p99 (s)",
            ["interactive"],
            lambda p, c: _number(p, c, "ttft_s", "p99"),
        ),
        _one(
            points,
            itl,
            "Interactive ITL p99 vs load",
            "ITL p99 (s)",
            ["interactive"],
            lambda p, c: _number(p, c, "itl_s", "p99"),
        ),
        _one(
            points,
            throughput,
            "Output throughput vs load",
            "output tokens/s",
            ["interactive", "bulk"],
            lambda p, c: _number(p, c, "output_tokens_per_s"),
        ),
        _one(
            points,
            rejection,
            "Rejection rate vs load",
            "rejected fraction",
            ["interactive", "bulk"],
            lambda p, c: _number(p, c, "rejection_rate"),
        ),
    ]
