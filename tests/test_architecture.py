"""The layers of ARCHITECTURE.md, enforced: an import that crosses a layer the wrong way, or a cycle, fails here.

Imports are read from the source with ``ast`` (every ``import`` statement, also those inside functions, so a
lazy import cannot hide a wrong-way arrow), so this test needs no heavy library.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LAYERS: dict[str, set[str]] = {
    "schemas": set(),
    "host": {"schemas"},
    "base_models": {"schemas", "host"},
    "serving": {"schemas", "host", "base_models"},
    "workflows": {"schemas"},
    "activities": {"schemas", "host", "base_models", "serving.client"},
    "workers": {"schemas", "host", "base_models", "serving", "activities", "workflows"},
    "dgrpo": {"schemas", "host", "base_models", "serving", "activities", "workflows", "workers"},
    "examples": {"schemas", "dgrpo"},
}
"""Each package, and the first-party packages (or single modules) it may import besides its own."""

HEAVY = {"torch", "transformers", "peft", "vllm", "unsloth", "accelerate", "safetensors", "gguf", "trl"}
"""Libraries that must never load where they are not needed: the Temporal sandbox re-imports workflow
modules, and a control worker or a client stays light."""

LIGHT_ROOTS = (
    "schemas",
    "host",
    "workflows",
    "serving.client",
    "activities.serving",
    "activities.rollouts",
    "dgrpo",
)
"""Modules (and everything they import, transitively, at module level) that import nothing in HEAVY."""


def modules() -> dict[str, Path]:
    out = {}
    for package in LAYERS:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(path: Path, module: str, top_level_only: bool = False) -> Iterator[str]:
    """The absolute module names ``path`` imports; with ``top_level_only``, not those in functions or
    under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip: set[int] = set()
    if top_level_only:
        for node in ast.walk(tree):
            lazy = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            guarded = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            if lazy or guarded:
                skip.update(id(n) for n in ast.walk(node) if n is not node or lazy)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def first_party(name: str, known: dict[str, Path]) -> str | None:
    """The first-party module ``name`` refers to (a module, or the package holding an imported name)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def allowed(importer: str, imported: str) -> bool:
    own = importer.split(".")[0]
    if imported.split(".")[0] == own:
        return True
    return any(imported == rule or imported.startswith(rule + ".") for rule in LAYERS[own])


def test_every_import_points_down_the_layers() -> None:
    known = modules()
    wrong = sorted(
        {
            f"{importer} imports {target}"
            for importer, path in known.items()
            for name in imports(path, importer)
            if (target := first_party(name, known)) is not None and not allowed(importer, target)
        }
    )
    assert not wrong, "imports that cross a layer the wrong way (see ARCHITECTURE.md):\n" + "\n".join(wrong)


def test_no_import_cycles_between_modules() -> None:
    known = modules()
    graph = {
        m: {t for n in imports(p, m) if (t := first_party(n, known)) and t != m and not m.startswith(t + ".")}
        for m, p in known.items()
    }
    # Package __init__ files are reached by importing any submodule; they must not be part of a cycle either.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_light_modules_import_no_heavy_library() -> None:
    known = modules()
    roots = [m for m in known if any(m == r or m.startswith(r + ".") for r in LIGHT_ROOTS)]
    heavy: list[str] = []
    for root in roots:
        seen, todo = {root}, [root]
        while todo:
            module = todo.pop()
            for name in imports(known[module], module, top_level_only=True):
                if name.split(".")[0] in HEAVY:
                    heavy.append(f"{root} loads {name} (via {module})")
                target = first_party(name, known)
                if target is not None and target not in seen:
                    seen.add(target)
                    todo.append(target)
    assert not heavy, "heavy libraries loaded where they must not be:\n" + "\n".join(sorted(set(heavy)))


def test_the_rules_catch_a_wrong_way_import() -> None:
    assert not allowed("schemas.config", "workers.worker")
    assert not allowed("activities.serving", "serving.launchers")
    assert not allowed("serving.server", "activities.object_store")
    assert allowed("activities.serving", "serving.client")
    assert allowed("workers.worker", "activities.rollouts")
