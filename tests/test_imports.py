"""Imports run one way: each module of attnlab imports only what the package table of docs/architecture.md lets its
package import (the "may import" column), function-level imports included, and no two modules import each other."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import attnlab

SRC = Path(attnlab.__file__).parent
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def allowed_table() -> dict[str, set[str] | None]:
    """package -> the packages it may import (None: everything), from the table under "## Packages"."""
    text = DOC.read_text().split("## Packages", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        may = re.sub(r"\([^)]*\)", "", cells[4])
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
        "attnlab.memory:5 imports attnlab.cli.builders (memory may import compat, devices, errors, settings, "
        "traced_step, utils)"]


# what runs below the entry points takes the run's plan or plain values (cli/plan.py), never the raw config
PLAN_ONLY = ("devices.py", "memory.py", "strategies.py", "cli/report.py")


def test_the_modules_below_the_plan_do_not_import_omegaconf():
    for name in PLAN_ONLY:
        path = SRC / name
        found = [f"{name}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "omegaconf" for a in node.names)
                 or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "omegaconf"]
        assert not found, f"these import OmegaConf: {found}"


IMPORT_SYSTEM = r"""
import importlib, pkgutil, sys, types
finders, path_hooks = list(sys.meta_path), list(sys.path_hooks)
import attnlab
assert sys.meta_path == finders and sys.path_hooks == path_hooks, "import attnlab changed the import system"
before = set(sys.modules)
for info in pkgutil.walk_packages(attnlab.__path__, "attnlab."):
    if not info.name.endswith(".__main__"):  # a package's command line, which runs when imported
        importlib.import_module(info.name)
# a stand-in (an object of attnlab's own type), or a module of attnlab's under another package's name
odd = [k for k, m in sys.modules.items() if k not in before and (type(m).__module__.startswith("attnlab") or (
    str(getattr(m, "__name__", "")).startswith("attnlab") and not k.startswith("attnlab")))]
# what the libraries attnlab imports install is theirs (six's, transformers' alias finders); none is attnlab's
ours = [f for f in [*sys.meta_path, *sys.path_hooks] if type(f).__module__.startswith("attnlab")
        or getattr(f, "__module__", "").startswith("attnlab")]
print(ours, odd)
"""


def test_importing_attnlab_leaves_the_import_system_as_it_found_it():
    """In a new process: `import attnlab`, then every module of it, leave sys.meta_path and sys.path_hooks as they
    were (the finders the libraries it imports install are theirs, none is attnlab's), and nothing they put into
    sys.modules is a stand-in of attnlab's or one of its modules under another package's name."""
    out = subprocess.run([sys.executable, "-c", IMPORT_SYSTEM], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().endswith("[] []"), out.stdout + out.stderr[-3000:]


def test_no_module_of_attnlab_writes_the_import_system():
    """Nothing under src/ assigns into sys.modules or touches sys.meta_path / sys.path_hooks."""
    pattern = re.compile(r"sys\.(meta_path|path_hooks)|sys\.modules\s*\[[^\]]*\]\s*=|sys\.modules\.(setdefault|update)")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "src").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _approx(n: int) -> str:
    return f"{round(n, -1) if n < 1000 else round(n, -2):,}"


def _size(names: list[str]) -> tuple[str, str]:
    """A table row's (lines, largest module) as the tree has them: a package's files (`cli/` without `cli/predict/`,
    which has its own row), or the modules the row names."""
    if names[0] == "attnlab":
        return _approx(_lines(SRC / "__init__.py")), "—"
    total, largest = 0, None
    for name in names:
        if not name.endswith("/"):
            total += _lines(SRC / name)
            continue
        folder = SRC / name.rstrip("/")
        files = [p for p in folder.rglob("*.py") if not (name == "cli/" and p.relative_to(folder).parts[0] == "predict")]
        total += sum(map(_lines, files))
        big = max(files, key=_lines)
        if largest is None or _lines(big) > largest[1]:
            largest = (str(big.relative_to(folder)), _lines(big))
    return _approx(total), f"`{largest[0]}` ({_approx(largest[1])})" if largest else "—"


def test_the_package_table_states_each_package_s_size_and_largest_module():
    """The "lines" and "largest module" columns of the package table are the tree's (to the nearest 10, or 100 above
    a thousand): a package that grows or a module that outgrows the others changes the table with it."""
    text = DOC.read_text().split("## Packages", 1)[1].split("\n## ", 1)[0]
    wrong = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`") or cells[0] == "`conf/`":
            continue
        names = [n for n in re.findall(r"`([^`]+)`", cells[0]) if n != "__init__.py"]
        if (cells[2], cells[3]) != _size(names):
            wrong.append(f"{cells[0]}: the table says {cells[2]} lines, {cells[3]}; the tree has {_size(names)}")
    assert wrong == []
    assert max(_lines(p) for p in SRC.rglob("*.py")) <= 400  # no module over 400 lines
