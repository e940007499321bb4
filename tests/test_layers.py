"""The package by concept: one folder per concept, each importing only from the layers
below it (nothing imported upward), and no import cycle between modules. Reads the
sources (no import): every ``import`` outside ``if TYPE_CHECKING:``, local imports too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

# bottom to top: a module may import its own part and the parts of earlier layers
LAYERS: list[set[str]] = [
    {"errors", "tracing"},
    {"protocol"},  # keys, records and codecs, models, validation: no I/O
    {"context", "settings", "logs", "process", "job_functions"},
    {"scripts"},  # each Lua script's call: keys, arguments, reply
    {"transport"},  # connections, cluster, wire, plans and their runners
    {"task"},
    {"queue"},
    {"client"},
    {"torch"},
    {"workers"},
    {"controller"},
    {"dashboard"},
    {"contrib", "rq"},
    {"__init__", "examples"},
    {"otel"},
    {"cli"},
    {"__main__"},
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}
MOST_TOP_LEVEL_MODULES = 12
BASES = {"queueworks": ROOT / "queueworks", "queueworks.workers": ROOT / "workers"}
BASES["queueworks.controller"] = ROOT / "controller"


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, base in BASES.items():
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            if package == "queueworks" and parts[0] in ("workers", "controller"):
                continue  # the symlinks: read from the repository's own folders
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in out if m in known and m != name}


def part_of(module: str) -> str:
    rest = module.split(".")[1:]
    return rest[0] if rest else "__init__"


GRAPH = {name: imports(name, path, set(modules())) for name, path in modules().items()}


@pytest.mark.unit
def test_nothing_is_imported_upward() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if RANK[part_of(b)] > RANK[part_of(a)]
    ]
    assert upward == []


@pytest.mark.unit
def test_every_part_has_a_layer() -> None:
    assert {part_of(m) for m in GRAPH} <= set(RANK)


@pytest.mark.unit
def test_no_import_cycle() -> None:
    """Depth-first: a module met again while on the path is a cycle."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(" -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for target in sorted(GRAPH[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, [])


@pytest.mark.unit
def test_few_top_level_modules_and_each_folder_says_what_it_holds() -> None:
    top = sorted(p.name for p in (ROOT / "queueworks").glob("*.py"))
    assert len(top) <= MOST_TOP_LEVEL_MODULES, top
    for folder in (ROOT / "queueworks").iterdir():
        init = folder / "__init__.py"
        if init.exists():
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            assert len(doc.split()) >= 20, f"{init}: one paragraph of what lives there"


@pytest.mark.unit
def test_no_module_name_means_two_things() -> None:
    """The names the worker side and the core side both used are one side's only."""
    names = [p.stem for p in (ROOT / "workers").glob("*.py")]
    names += [p.stem for p in (ROOT / "queueworks").rglob("*.py") if "workers" not in p.parts]
    for name in ("flow", "membership", "steps", "errors", "settings", "plans"):
        assert names.count(name) <= 1, name


NOT_OURS = {"_replace", "_asdict", "_make", "_getframe", "_exit", "_fields"}


@pytest.mark.unit
def test_no_private_method_is_called_from_another_class() -> None:
    """``x._name(...)`` only on ``self`` or ``cls``: what one class asks of another is public
    (a named method), never a private one reached into."""
    reached: list[str] = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            attr, owner = node.func.attr, node.func.value
            if not attr.startswith("_") or attr.startswith("__") or attr in NOT_OURS:
                continue
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            reached.append(f"{name}:{node.lineno}: {ast.unparse(node.func)}")
    assert reached == []
