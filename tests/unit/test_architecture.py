"""The layering rule of ``docs/architecture.md``'s code map: imports point down (a
module imports only its own layer or the layers below), no circles, and the map
names every module and nothing else. Every import counts: under ``TYPE_CHECKING``,
inside functions."""

from __future__ import annotations

import ast
import re

import pytest

from jobs.settings import REPO_ROOT

MAP = REPO_ROOT / "docs" / "architecture.md"
# Where the platform's modules are, and the import name of each folder.
ROOTS = {"jobs": "jobs", "include": "include", "plugins/platform_airflow": "platform_airflow"}
LAYER = re.compile(r"^### (\d+)\. ")
ENTRY = re.compile(r"^((?:jobs|include|plugins|dags)/\S+\.py)\s")


def mapped_layers(text: str) -> dict[str, int]:
    """Each file the code map names, with its layer's number."""
    section = text.split("\n## Code map\n", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    layer = 0
    for line in section.splitlines():
        if heading := LAYER.match(line):
            layer = int(heading.group(1))
        elif entry := ENTRY.match(line):
            assert layer, f"{entry.group(1)} is named before the first layer"
            assert entry.group(1) not in layers, f"{entry.group(1)} is named twice"
            layers[entry.group(1)] = layer
    return layers


def platform_files() -> list[str]:
    found = [
        str(path.relative_to(REPO_ROOT))
        for folder in (*ROOTS, "dags")
        for path in (REPO_ROOT / folder).rglob("*.py")
        if path.name != "__init__.py"
    ]
    return sorted(found)


def module_name(file: str) -> str:
    for folder, package in ROOTS.items():
        if file.startswith(folder + "/"):
            file = package + file[len(folder) :]
    return file.removesuffix(".py").replace("/", ".")


def imported(source: str, name: str, modules: set[str]) -> set[str]:
    """The platform modules that module ``name`` (its text ``source``) imports,
    anywhere in it."""
    package = name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in names:  # ``from jobs import faults`` names the module jobs.faults
            if target in modules and target != name:
                found.add(target)
    return found


def upward(edges: dict[str, set[str]], layer: dict[str, int]) -> list[str]:
    return sorted(
        f"{a} (layer {layer[a]}) imports {b} (layer {layer[b]})"
        for a, targets in edges.items()
        for b in targets
        if layer[b] > layer[a]
    )


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every circle found by a depth-first walk (one per back edge)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                walk(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)
    return found


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], dict[str, int]]:
    layers = {module_name(f): n for f, n in mapped_layers(MAP.read_text()).items()}
    modules = {module_name(f) for f in platform_files()}
    edges = {
        module_name(f): imported((REPO_ROOT / f).read_text(), module_name(f), modules)
        for f in platform_files()
    }
    return edges, layers


def test_the_code_map_names_every_module_and_nothing_else() -> None:
    mapped = set(mapped_layers(MAP.read_text()))
    files = set(platform_files())
    assert sorted(files - mapped) == [], "modules missing from the code map"
    assert sorted(mapped - files) == [], "the code map names files that do not exist"


def test_imports_point_down_the_layers(graph: tuple[dict[str, set[str]], dict[str, int]]) -> None:
    edges, layers = graph
    assert upward(edges, layers) == []


def test_no_modules_import_each_other_round_a_circle(
    graph: tuple[dict[str, set[str]], dict[str, int]],
) -> None:
    edges, _layers = graph
    assert circles(edges) == []


def test_the_checks_find_what_they_look_for() -> None:
    """The rule's own checks, on a graph that breaks it."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c", "a"]]
    assert upward(edges, {"a": 1, "b": 2, "c": 2, "d": 3}) == ["a (layer 1) imports b (layer 2)"]
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import faults\n"
        "if TYPE_CHECKING:\n    from jobs.cut import Cut\n"
        "def f():\n    from jobs import ledger\n"
    )
    modules = {"jobs.cut", "jobs.ledger", "jobs.faults", "jobs.errors"}
    assert imported(source, "jobs.m", modules) == {"jobs.cut", "jobs.ledger", "jobs.faults"}


def test_each_package_declares_its_modules() -> None:
    """A package's ``__all__`` is its public modules (imported on demand: a package
    imports none of them, so a JVM-free tool never loads Spark's side)."""
    for init in sorted(
        path for folder in ROOTS for path in (REPO_ROOT / folder).rglob("__init__.py")
    ):
        folder = init.parent
        modules = sorted(
            [p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")]
            + [p.name for p in folder.iterdir() if (p / "__init__.py").exists()]
        )
        tree = ast.parse(init.read_text())
        declared = next(
            (
                ast.literal_eval(node.value)
                for node in tree.body
                if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["__all__"]
            ),
            None,
        )
        assert declared == modules, f"{init.relative_to(REPO_ROOT)}: __all__"
        assert not any(isinstance(n, ast.Import | ast.ImportFrom) for n in tree.body), init
