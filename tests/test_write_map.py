"""The write map in docs/architecture.md lists every function that writes to the
store: a write added to the code without its row there (saying what refuses a
stale holder's write) fails here, and so does a row whose function is gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from jobs.settings import REPO_ROOT

PRODUCT = ("jobs", "plugins", "include", "dags")
# Calls that write whatever their receiver is.
WRITES = {
    "write_bytes",
    "write_text",
    "copy_to",
    "move_to",
    "delete_tree",
    "land",
    "write_deltalake",
    "create_write_transaction",
    "restore",
    "vacuum",
    "compact",
    "create_checkpoint",
    "set_table_properties",
    "add_columns",
    "createIfNotExists",
    "saveAsTable",
    "toTable",
}
# Calls that write when their receiver is a store object or a table (a dict has an
# ``update`` too): told by the receiver's expression.
MAYBE_WRITES = {"create", "update", "delete", "merge"}
STORE_RECEIVER = re.compile(
    r"(?i)deltatable|table|path|location|target|lease|stale|cut_file|seed_file|landing|"
    r"\bloc\b|folder|probe"
)
# A Spark DataFrameWriter's save (``df.write...save``).
SPARK_WRITER = re.compile(r"\.write\b|writer|fenced\(")
# Modules that write only this machine's files, or are the store layer itself.
NOT_THE_STORE = {
    "jobs.broker": "the embedded broker's own data folder",
    "jobs.storage_server": "the embedded S3 server's own data folder",
    "jobs.storage_check": "scratch objects of the store check, under a prefix of their own",
    "jobs.warehouse": "the store layer that every write here goes through",
    "jobs.warm_driver": "the warm driver's token beside a local warehouse",
    "include.local_airflow": "the local Airflow's own folder",
    "include.local_spark": "the local Spark cluster's own folder",
    "include.sample_data": "sample input files for the demo",
}


def writers_in_code() -> dict[str, set[str]]:
    """``module:function`` -> the writes found in it."""
    found: dict[str, set[str]] = {}
    for top in PRODUCT:
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
            if module in NOT_THE_STORE:
                continue
            _visit(ast.parse(path.read_text()), [], module, found)
    return found


def _visit(node: ast.AST, scope: list[str], module: str, found: dict[str, set[str]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _visit(child, [*scope, child.name], module, found)
            continue
        what = _write(child)
        if what is not None:
            key = f"{module}:{'.'.join(scope) or '<module>'}"
            found.setdefault(key, set()).add(f"{what} (line {child.lineno})")  # type: ignore[attr-defined]
        _visit(child, scope, module, found)


def _write(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr == "writeStream":
        return "writeStream"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name):
        return func.id if func.id in WRITES else None
    if not isinstance(func, ast.Attribute):
        return None
    receiver = ast.unparse(func.value)
    if func.attr in WRITES:
        return func.attr
    if func.attr in MAYBE_WRITES and STORE_RECEIVER.search(receiver):
        return func.attr
    if func.attr == "save" and SPARK_WRITER.search(receiver):
        return func.attr
    return None


def writers_in_the_map() -> set[str]:
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The write map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    listed = set()
    for row in rows[1:]:  # the header first
        cells = [c.strip() for c in row.strip("|").split("|")]
        listed |= set(re.findall(r"`([\w.]+:[\w.<>]+)`", cells[1]))
    return listed


def test_every_function_that_writes_to_the_store_is_in_the_write_map() -> None:
    code, listed = writers_in_code(), writers_in_the_map()
    missing = {k: sorted(v) for k, v in code.items() if k not in listed}
    assert not missing, (
        "writes the write map in docs/architecture.md does not list (say what refuses a "
        f"stale holder's write): {missing}"
    )
    assert listed <= set(code), f"rows whose function writes nothing: {sorted(listed - set(code))}"


def test_the_scan_finds_the_writes_it_is_for() -> None:
    """The scan itself: a plain PUT, a conditional create, a Delta commit and a
    Spark writer are each found, and a dict's update is not."""
    source = (
        "def a(target):\n    target.write_bytes(b'')\n"
        "def b(cut_file):\n    cut_file.create(b'')\n"
        "def c(rows):\n    write_deltalake(t, rows)\n"
        "def d(frame):\n    return frame.writeStream\n"
        "def e(found):\n    found.update({})\n"
    )
    found: dict[str, set[str]] = {}
    _visit(ast.parse(source), [], "m", found)
    assert sorted(found) == ["m:a", "m:b", "m:c", "m:d"]
    assert Path(__file__).name == "test_write_map.py"
