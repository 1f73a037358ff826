"""The layers of ARCHITECTURE.md, enforced: an import that crosses a layer the wrong way, or a cycle, fails here.

Imports are read from the source with ``ast`` (every ``import`` statement, also those inside functions or under
``TYPE_CHECKING``, and every ``importlib.import_module("a.literal.name")``, so a lazy import cannot hide a
wrong-way arrow or a cycle), so this test needs no heavy library. A cycle fails wherever it is: between layers
or among the modules of one package.
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

CLI = "dgrpo.cli"
"""The ``dgrpo`` command, a layer on top of ``dgrpo``'s façade: it may import anything ``dgrpo`` may, and no
module outside it imports it (the CLI is not ART's API, and the façade must not need it)."""
ART_SERVER = "dgrpo.art_server"
"""``dgrpo art-server``, a server with its own entry point on top of the façade: only the CLI imports it."""

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
        if isinstance(node, ast.Call) and _called_name(node.func) == "import_module" and node.args:
            name = node.args[0]
            if (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and not name.value.startswith(".")
            ):
                yield name.value
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def first_party(name: str, known: dict[str, Path]) -> str | None:
    """The first-party module ``name`` refers to (a module, or the package holding an imported name)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def allowed(importer: str, imported: str) -> bool:
    if within(imported, CLI) and not within(importer, CLI):
        return False
    if within(imported, ART_SERVER) and not (within(importer, ART_SERVER) or within(importer, CLI)):
        return False
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


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's first-party imports (not itself, not a package it is in: importing a submodule runs its
    package's __init__ first, which is no cycle)."""
    return {
        m: {t for n in imports(p, m) if (t := first_party(n, known)) and t != m and not m.startswith(t + ".")}
        for m, p in known.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets, each as the path that closes it."""
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
    return cycles


def test_no_import_cycles_between_modules() -> None:
    # Package __init__ files are reached by importing any submodule; they must not be part of a cycle either.
    cycles = import_cycles(import_graph(modules()))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_a_cycle_inside_one_package_is_caught_also_through_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    sources = {
        "pkg": "",
        "pkg.model": "from pkg.trained import Trained\n",
        "pkg.trained": "import importlib\n\n\ndef base():\n    return importlib.import_module('pkg.model')\n",
        "pkg.other": "from pkg import model\n",
    }
    known = {}
    for name, source in sources.items():
        path = tmp_path / (name.replace(".", "/") + ("/__init__.py" if name == "pkg" else ".py"))
        path.write_text(source)
        known[name] = path
    assert import_cycles(import_graph(known)) == [["pkg.model", "pkg.trained", "pkg.model"]]


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
    assert not allowed("dgrpo.model", "dgrpo.cli.runs")  # the façade never needs the CLI
    assert not allowed("dgrpo", "dgrpo.cli") and not allowed("examples.arithmetic", "dgrpo.cli")
    assert not allowed("dgrpo.model", "dgrpo.art_server.models") and allowed(
        "dgrpo.cli.art_server", "dgrpo.art_server"
    )
    assert allowed("dgrpo.cli.runs", "dgrpo.client.run_control") and allowed(
        "dgrpo.cli.worker", "workers.worker"
    )
