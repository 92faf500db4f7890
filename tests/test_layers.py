"""Imports follow the layers written in docs/architecture.md: nothing imports from a higher layer."""

from __future__ import annotations

import ast
import functools
import os
import re

from conftest import ROOT

PACKAGE_ROOTS = {"rnnmon": ROOT, "rnnmon_tensorboard": os.path.join(ROOT, "tensorboard_plugin")}


def layers(nested: bool = False) -> dict[str, int]:
    """Module or package name -> layer number, from the numbered list under "## Import layers"; with `nested`, the
    sub-layers listed (indented) inside a folder's layer instead."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        section = f.read().split("## Import layers", 1)[1].split("\n## ", 1)[0]
    found = {}
    for number, line in re.findall(r"^ {3}(\d+)\. (.*)$" if nested else r"^(\d+)\. (.*)$", section, re.M):
        for name in re.findall(r"`(rnnmon[\w.]*)`", line.split(":")[0]):
            found[name] = int(number)
    return found


@functools.cache
def modules() -> dict[str, str]:
    """Every module of rnnmon and of the tab: dotted name -> file (read once a session; not to be changed)."""
    found = {}
    for package, root in PACKAGE_ROOTS.items():
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


@functools.cache
def imports(name: str, path: str) -> frozenset[str]:
    """The rnnmon modules `name` imports, at any depth of its code (late imports count too; those under `if
    TYPE_CHECKING:`, which name a type for annotations and never run, do not). Parsed once a session: three tests
    walk the same trees."""
    known = modules()
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    with open(path) as f:
        tree = ast.parse(f.read())
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for statement in node.body for inner in ast.walk(statement)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            for alias in node.names:
                target = f"{module}.{alias.name}"
                found.add(target if target in known else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return frozenset(target for target in found if target in known)


def layer_of(name: str, table: dict[str, int]) -> int | None:
    """A module's own entry, else its folder's (`rnnmon.gpu.nvml` is in `rnnmon.gpu`); `rnnmon` is only __init__."""
    if name in table:
        return table[name]
    folder = name.rpartition(".")[0]
    return table.get(folder) if "." in folder or folder == "rnnmon_tensorboard" else None


def test_every_module_has_a_layer():
    table = layers()
    assert table, "docs/architecture.md has no '## Import layers' list"
    assert [name for name in modules() if layer_of(name, table) is None] == []


def test_no_module_imports_from_a_higher_layer():
    table, known = layers(), modules()
    upward = []
    for name, path in sorted(known.items()):
        for target in imports(name, path):
            if layer_of(target, table) > layer_of(name, table):
                upward.append(f"{name} (layer {layer_of(name, table)}) imports {target} "
                              f"(layer {layer_of(target, table)})")
    assert upward == []


def test_every_module_of_a_folder_with_sub_layers_has_one():
    inner = layers(nested=True)
    folders = {name.rpartition(".")[0] for name in inner}
    assert folders == {"rnnmon.format"}
    assert [name for name in modules() if name.rpartition(".")[0] in folders and name not in inner] == []


def test_no_module_imports_from_a_higher_sub_layer_of_its_folder():
    inner, known = layers(nested=True), modules()
    upward = []
    for name in sorted(inner):
        for target in imports(name, known[name]):
            if target in inner and target.rpartition(".")[0] == name.rpartition(".")[0] and inner[target] > inner[name]:
                upward.append(f"{name} ({inner[name]}) imports {target} ({inner[target]})")
    assert upward == []


def test_no_import_circle():
    """No module reaches itself through its imports, late ones included (modules of one layer may import each other,
    so the layers alone do not rule a circle out)."""
    known = modules()
    graph = {name: imports(name, path) for name, path in known.items()}
    circles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == []
