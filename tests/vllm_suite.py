"""The vLLM environment's suite (tests/vllm_inside/) as one background pytest subprocess per
session, shared by every pytest process of it: a plain run, or pytest-xdist's workers.

Most of the suite's minute is vLLM loading two engines, so it starts as soon as a process of the
session has collected the test that waits for it (tests/conftest.py), and runs beside the rest.
Its files live in a folder every process of the session knows from the environment
(`MIXGATE_VLLM_SUITE_DIR`, set by the controlling process before xdist starts its workers):
- `started`: made with O_EXCL by the one process that starts the suite, so it runs once;
- `lock`: held exclusively, from before `started` exists until the suite has exited, by the
  shell that runs it; the waiting test takes it shared, which returns when the suite is done
  (no polling);
- `output.txt`, `returncode` (written last, by the shell, after pytest exits), `pid`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

__all__ = ["VLLM_PYTHON", "configure_session", "finish_session", "start", "wait"]

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
FOLDER_ENV = "MIXGATE_VLLM_SUITE_DIR"
# The shell between us and the suite: it closes the lock's descriptor for pytest ({fd}>&-), so
# no process the suite leaves behind can hold the lock, and it writes the exit status last.
_started: list[subprocess.Popen[bytes]] = []
# Whether this process made the folder (and so removes it at the end).
_owns_folder = False
_RUN = (
    '"$1" -m pytest tests/vllm_inside -q -p no:cacheprovider > "$2/output.txt" 2>&1 '
    "{LOCK_FD}>&-; "
    'echo $? > "$2/returncode.tmp" && mv "$2/returncode.tmp" "$2/returncode"'
)


def configure_session() -> None:
    """In the session's first process (the plain pytest, or xdist's controller, configured
    before it starts its workers): the folder, in the environment that the workers inherit.
    Processes that inherit the variable (workers, the suite's own pytest) do not own it."""
    global _owns_folder
    if FOLDER_ENV not in os.environ:
        os.environ[FOLDER_ENV] = tempfile.mkdtemp(prefix="mixgate-vllm-suite-")
        _owns_folder = True


def _folder() -> Path:
    return Path(os.environ[FOLDER_ENV])


def start() -> None:
    """Start the suite, unless a process of this session already has (or it has finished)."""
    folder = _folder()
    lock_fd = os.open(folder / "lock", os.O_CREAT | os.O_WRONLY)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another process is starting it, or its shell runs it
        try:
            os.close(os.open(folder / "started", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # it ran and finished
        process = subprocess.Popen(
            ["bash", "-c", _RUN, "bash", str(VLLM_PYTHON), str(folder)],
            cwd=ROOT,
            env={**os.environ, "LOCK_FD": str(lock_fd)},
            pass_fds=(lock_fd,),
            stdin=subprocess.DEVNULL,
            # Its own process group: finish_session kills the suite and whatever it started.
            start_new_session=True,
        )
        (folder / "pid").write_text(str(process.pid))
        _started.append(process)  # held: a Popen collected while its child runs warns
    finally:
        # The shell keeps the lock through its inherited descriptor (a flock belongs to the
        # open file, which stays open while any descriptor of it does).
        os.close(lock_fd)


def wait() -> tuple[int | None, str]:
    """Block until the suite has exited: its exit status (None if it never wrote one: killed)
    and its output."""
    folder = _folder()
    lock_fd = os.open(folder / "lock", os.O_CREAT | os.O_RDONLY)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
    finally:
        os.close(lock_fd)
    returncode_path = folder / "returncode"
    output_path = folder / "output.txt"
    output = output_path.read_text(errors="replace") if output_path.is_file() else ""
    if not returncode_path.is_file():
        return None, output
    return int(returncode_path.read_text()), output


def finish_session() -> None:
    """In the process that made the folder, once every worker is done: end a suite that nobody
    waited for (an interrupted session) and remove the folder."""
    if not _owns_folder:
        return
    folder = _folder()
    pid_path = folder / "pid"
    if pid_path.is_file() and not (folder / "returncode").is_file():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid_path.read_text()), signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)
    del os.environ[FOLDER_ENV]
