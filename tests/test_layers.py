"""Imports follow the layers written in docs/architecture.md: nothing imports from a higher layer."""

from __future__ import annotations

import ast
import os
import re

from conftest import ROOT

PACKAGE_ROOTS = {"rnnmon": ROOT, "rnnmon_tensorboard": os.path.join(ROOT, "tensorboard_plugin")}


def layers() -> dict[str, int]:
    """Module or package name -> layer number, from the numbered list under "## Import layers"."""
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        section = f.read().split("## Import layers", 1)[1].split("\n## ", 1)[0]
    found = {}
    for number, line in re.findall(r"^(\d+)\. (.*)$", section, re.M):
        for name in re.findall(r"`(rnnmon[\w.]*)`", line.split(":")[0]):
            found[name] = int(number)
    return found


def modules() -> dict[str, str]:
    """Every module of rnnmon and of the tab: dotted name -> file."""
    found = {}
    for package, root in PACKAGE_ROOTS.items():
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: str, known: dict[str, str]) -> set[str]:
    """The rnnmon modules `name` imports, at any depth of its code (late imports count too)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            for alias in node.names:
                target = f"{module}.{alias.name}"
                found.add(target if target in known else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {target for target in found if target in known}


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
        for target in imports(name, path, known):
            if layer_of(target, table) > layer_of(name, table):
                upward.append(f"{name} (layer {layer_of(name, table)}) imports {target} "
                              f"(layer {layer_of(target, table)})")
    assert upward == []
