"""The floors stay honest: no module imports upward, and no two modules import each other.

Every module of the project's packages is parsed with `ast` (nothing is imported), and every
import counts: module-level, function-local (a local import is still a dependency; it only
moves the failure to run time) and under `if TYPE_CHECKING:`. The layers, bottom up
(docs/ARCHITECTURE.md, "Layers"):

- `policies/`: the service's decisions; the standard library and `policies` only;
- `planning/`: capacity planning; `policies` and libraries, never the engine, the gateway or bench;
- `engine/`: never `gateway` or `bench`;
- `gateway/`: never `bench`;
- `bench/`: what `mixgate bench` runs; only the `mixgate/` CLI reaches into it;
- `mixgate/`: the command; nothing below imports it.

A rule broken by today's code is an entry in EXCEPTIONS with the reason, not a skip: the
test fails when an exception is no longer needed, so the list only shrinks.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("policies", "planning", "engine", "gateway", "bench", "mixgate")
SERVING = ("policies", "engine", "gateway")

# (importer, imported) module pairs that break a rule today, each with why and what ends it.
EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    imported: str  # the dotted name as written (resolved when relative)
    line: int

    @property
    def top(self) -> str:
        return self.imported.split(".")[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
    }


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base.pop()  # a module's package, not the module
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    """Every import anywhere in the file: `from a import b` yields `a`, and `a.b` as well when
    `a.b` is a module of the project."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, path, node)
            yield Import(module, source, node.lineno)
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    yield Import(module, f"{source}.{alias.name}", node.lineno)


def all_imports() -> list[Import]:
    known = project_modules()
    return [found for name, path in known.items() for found in imports_of(name, path, known)]


def _resolve(imported: str, known: dict[str, Path]) -> str | None:
    """The project module an import names (its longest known prefix), if any."""
    parts = imported.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) if parts else None


def broken_rule(found: Import) -> str | None:
    layer = found.importer.split(".")[0]
    if layer == "policies" and found.top not in sys.stdlib_module_names | {"policies"}:
        return "policies import only the standard library and policies"
    if layer == "planning" and found.top in ("engine", "gateway", "bench"):
        return "planning imports policies, never the engine, the gateway or bench"
    if layer == "engine" and found.top in ("gateway", "bench"):
        return "engine never imports gateway or bench"
    if layer == "gateway" and found.top == "bench":
        return "gateway never imports bench"
    if layer != "mixgate" and layer != "bench" and found.top == "bench":
        return "only the mixgate CLI reaches into bench"
    if layer != "mixgate" and found.top == "mixgate":
        return "nothing below the CLI imports mixgate"
    return None


def test_every_package_is_seen() -> None:
    # A parser that found nothing would pass every rule: make sure it reads the real tree.
    modules = project_modules()
    for package in PACKAGES:
        assert sum(name.startswith(package) for name in modules) > 1, package
    cli_imports = [found for found in all_imports() if found.importer.startswith("mixgate")]
    assert any(found.top == "bench" for found in cli_imports)


def test_nothing_imports_upward() -> None:
    known = project_modules()
    broken = []
    for found in all_imports():
        rule = broken_rule(found)
        target = _resolve(found.imported, known) or found.imported
        if rule is not None and (found.importer, target) not in EXCEPTIONS:
            broken.append(f"{found.importer}:{found.line} imports {found.imported}: {rule}")
    assert not broken, "\n".join(broken)


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycles() -> None:
    known = project_modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for found in all_imports():
        target = _resolve(found.imported, known)
        pair = (found.importer, target)
        if target is not None and target != found.importer and pair not in EXCEPTIONS:
            graph[found.importer].add(target)
    assert not _cycles(graph), _cycles(graph)


def test_every_exception_is_still_needed() -> None:
    known = project_modules()
    pairs = {
        (found.importer, _resolve(found.imported, known) or found.imported)
        for found in all_imports()
    }
    breaking = {
        (found.importer, _resolve(found.imported, known) or found.imported)
        for found in all_imports()
        if broken_rule(found) is not None
    }
    graph: dict[str, set[str]] = {name: set() for name in known}
    for importer, target in pairs:
        if target in graph and target != importer:
            graph[importer].add(target)
    in_cycles = {
        (a, b) for component in _cycles(graph) for a in component for b in component if a != b
    }
    stale = [pair for pair in EXCEPTIONS if pair not in breaking | in_cycles]
    assert not stale, f"no longer needed (remove from EXCEPTIONS): {stale}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The cycle test passes on a tree without cycles; this one proves it could fail.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [{"a", "b", "c"}]
