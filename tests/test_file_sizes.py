"""One concept per file, about 100-400 lines: a longer file says why in its opening comment.

docs/ARCHITECTURE.md ("Layout") sets the size; this keeps it true. The reason is the phrase
"Over 400 lines" in the module's docstring, followed by why (one concept that does not split
without passing its state around, one table of cases, ...): a reviewer reads it, the test only
checks that it was written.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
REASON = "Over 400 lines"


def tracked_python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO_ROOT / name for name in listed if (REPO_ROOT / name).is_file()]


def long_files_without_a_reason(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        text = path.read_text()
        lines = text.count("\n")
        if lines <= MAX_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if REASON not in docstring:
            name = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path.name
            found.append(f"{name}: {lines} lines")
    return found


def test_the_tree_is_read() -> None:
    # A listing that found nothing would pass: make sure the real tree is seen.
    paths = tracked_python_files()
    assert len(paths) > 100
    assert REPO_ROOT / "gateway" / "http" / "app.py" in paths


def test_no_long_file_without_a_reason() -> None:
    missing = long_files_without_a_reason(tracked_python_files())
    assert not missing, "over 400 lines with no reason in the docstring:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("docstring", "flagged"),
    [("One concept.", True), ("One concept. Over 400 lines: one table of cases.", False)],
)
def test_the_check_can_fail(tmp_path: Path, docstring: str, flagged: bool) -> None:
    module = tmp_path / "long.py"
    module.write_text(f'"""{docstring}"""\n' + "x = 1\n" * (MAX_LINES + 1))
    assert bool(long_files_without_a_reason([module])) is flagged
