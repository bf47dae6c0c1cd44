"""Imports run one way: each module of attnlab imports only what the package table of docs/architecture.md lets its
package import (the "may import" column), function-level imports included, and no two modules import each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attnlab

SRC = Path(attnlab.__file__).parent
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def allowed_table() -> dict[str, set[str] | None]:
    """package -> the packages it may import (None: everything), from the table under "## Packages"."""
    text = DOC.read_text().split("## Packages", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        may = re.sub(r"\([^)]*\)", "", cells[2])
        allowed = None if may.strip() == "everything" else {
            m.strip().strip("`").rstrip("/").removesuffix(".py") for m in may.split(",") if m.strip() not in ("", "—")}
        for name in re.findall(r"`([^`]+)`", cells[0]):
            name = name.rstrip("/").removesuffix(".py")
            if "/" not in name:  # a subpackage (cli/predict) lives under its package's row
                table[name] = allowed
    return table


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """attnlab.cli.predict.translation -> cli; attnlab.config -> config; attnlab -> attnlab."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "attnlab"


def imports_of(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every attnlab import in a file, at any depth (functions, conditionals)."""
    module, found = module or module_name(path), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "attnlab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "attnlab":
                continue
            if target == "attnlab":  # `from attnlab import settings`: the module named, else the package's own names
                found += [(node.lineno, f"attnlab.{a.name}" if _is_module(a.name) else "attnlab") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _is_module(name: str) -> bool:
    return (SRC / name / "__init__.py").exists() or (SRC / f"{name}.py").exists()


def violations(path: Path, table: dict, module: str | None = None) -> list[str]:
    module = module or module_name(path)
    own = package_of(module)
    may = table.get(own, set())
    wrong = []
    for line, target in imports_of(path, module):
        other = package_of(target)
        if may is None or other in (own, "attnlab") or other in may:
            continue
        wrong.append(f"{module}:{line} imports {target} ({own} may import {', '.join(sorted(may)) or 'nothing'})")
    return wrong


def test_the_table_names_every_package_and_module():
    table = allowed_table()
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    missing = (packages | modules) - set(table)
    assert not missing, f"docs/architecture.md's package table has no row for {sorted(missing)}"


def test_every_import_goes_the_way_the_table_allows():
    table = allowed_table()
    wrong = [w for path in sorted(SRC.rglob("*.py")) for w in violations(path, table)]
    assert wrong == [], "\n".join(wrong)


def test_no_two_modules_import_each_other():
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        graph[module_name(path)] = {t for _, t in imports_of(path)}
    pairs = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                    if b != a and a in graph.get(b, ()) and not (a.startswith(b + ".") or b.startswith(a + "."))})
    assert pairs == []


def test_the_check_finds_a_function_level_import_going_the_wrong_way(tmp_path):
    path = tmp_path / "memory.py"
    path.write_text("import torch\n\n\ndef f():\n    from attnlab.cli.builders import device_count\n"
                    "    from . import settings\n")
    assert violations(path, allowed_table(), module="attnlab.memory") == [
        "attnlab.memory:5 imports attnlab.cli.builders (memory may import devices, errors, settings, utils)"]


# what runs below the entry points takes the run's plan or plain values (cli/plan.py), never the raw config
PLAN_ONLY = ("devices.py", "memory.py", "strategies.py", "cli/report.py")


def test_the_modules_below_the_plan_do_not_import_omegaconf():
    for name in PLAN_ONLY:
        path = SRC / name
        found = [f"{name}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "omegaconf" for a in node.names)
                 or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "omegaconf"]
        assert not found, f"these import OmegaConf: {found}"
