"""Reading the process table (/proc) in tests: a server's children, whether a pid lives, and
where a live one waits (py-spy)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after its closing one.
    return text[text.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (an unreaped orphan is dead)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def children(parent_pid: int) -> dict[int, str]:
    """Live children of a process: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and int(fields[1]) == parent_pid and alive(int(entry.name)):
            found[int(entry.name)] = cmdline(int(entry.name))
    return found


def processes_matching(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and text in cmdline(int(entry.name)) and alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Poll until every pid has exited (bounded); returns the ones still alive."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def engine_child(server_pid: int, timeout_s: float = 10.0) -> int:
    """The pid of the server's engine core process."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid, line in children(server_pid).items():
            if "engine.process.main" in line:
                return pid
        time.sleep(0.02)
    raise AssertionError(f"no engine core child of {server_pid}")


def stacks_of(pid: int) -> str:
    """Every thread's Python stack in a live process and its children (py-spy, without
    pausing them), for a test that found a process still running when it should have ended:
    where it waits is what a report of that needs, and the process is gone by the rerun."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    reports = []
    for target in [pid, *children(pid)]:
        try:
            done = subprocess.run(
                [spy, "dump", "--nonblocking", "--pid", str(target)],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            reports.append(
                f"--- pid {target} ({cmdline(target)[:120]})\n{done.stdout}{done.stderr}"
            )
        except (OSError, subprocess.SubprocessError) as error:
            reports.append(f"--- pid {target}: py-spy failed: {error}")
    return "\n".join(reports)
