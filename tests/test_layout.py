"""The code's shape, kept true: short functions, a one-way import graph, packages that ship whole.

Read from the source with `ast` (nothing is imported): in `srtcli/` no function is over 40
lines (a module is as long as its one concept needs); in every package, no module imports a
private name (`_x`) of another module, and the modules of `srtcli/`, `cache_store/` and
`attention/` import each other without a cycle, counting imports inside functions too; the
`cache_store` tests do not import `srtcli`; every folder of Python modules is a package (the wheel
finds packages by their `__init__.py`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("srtcli", "cache_store", "attention")
MAX_FUNCTION_LINES = 40


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the three packages."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


MODULES = modules()


def imports(name: str) -> list[tuple[str, list[str], int]]:
    """(module imported from, names taken, line) for every import statement of a module."""
    tree = ast.parse(MODULES[name].read_text())
    is_pkg = MODULES[name].name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


def is_extension(name: str) -> bool:
    """A compiled module (`cache_store._stree`): private by convention, imported by its wrapper."""
    path = ROOT.joinpath(*name.split("."))
    return any(path.parent.glob(path.name + ".*.so")) or path.with_suffix(".c").exists()


def edges(name: str) -> set[str]:
    """The package modules a module imports (a name that is a submodule counts as that module)."""
    out = set()
    for base, names, _ in imports(name):
        targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in MODULES] or [base]
        out.update(t for t in targets if t in MODULES and t != name)
    return out


def test_no_srtcli_function_is_over_40_lines() -> None:
    long = {}
    for n, f in MODULES.items():
        if not n.startswith("srtcli"):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long[f"{n}.{node.name}:{node.lineno}"] = size
    assert long == {}


def test_no_module_imports_a_private_name_of_another() -> None:
    private = [f"{n}:{line}: {base}.{x}" for n in MODULES for base, names, line in imports(n)
               for x in names if x.startswith("_") and not x.startswith("__") and base != n
               and not is_extension(f"{base}.{x}")]
    assert private == []


def test_the_import_graph_has_no_cycle() -> None:
    graph = {n: edges(n) for n in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(" -> ".join(path[path.index(m):] + [m]))
            elif m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert cycles == []


@pytest.mark.parametrize("pkg", ["cache_store", "attention"])
def test_the_libraries_never_import_srtcli(pkg: str) -> None:
    bad = [f"{n}:{line}" for n in MODULES if n.startswith(pkg) for base, _, line in imports(n)
           if base.split(".")[0] == "srtcli"]
    assert bad == []


def test_the_cache_store_tests_never_import_srtcli() -> None:
    """`cache_store` is specified by its own tests, with no part of the CLI standing in."""
    bad = [f"{f.relative_to(ROOT)}:{node.lineno}" for f in sorted((ROOT / "tests" / "cache_store").rglob("*.py"))
           for node in ast.walk(ast.parse(f.read_text()))
           if isinstance(node, (ast.Import, ast.ImportFrom))
           and any(n.split(".")[0] == "srtcli" for n in
                   ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]))]
    assert bad == []


def test_every_folder_of_modules_is_a_package() -> None:
    """A folder without `__init__.py` would be left out of the wheel (`packages.find`)."""
    folders = {f.parent for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")}
    assert sorted(str(d.relative_to(ROOT)) for d in folders if not (d / "__init__.py").exists()) == []


def top_level_names(name: str) -> set[str]:
    """What a module defines or imports at its top level (what `module.name` can refer to)."""
    out = set()
    for node in ast.parse(MODULES[name].read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def resolves(ref: str) -> bool:
    """`pkg.module[.name...]` names a module, or a module and something it defines."""
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        if mod in MODULES or is_extension(mod):
            return i == len(parts) or is_extension(mod) or parts[i] in top_level_names(mod)
    return False


DOTTED = re.compile(r"(?<![\w./-])((?:srtcli|cache_store|attention)(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(r"(?<![\w./-])((?:srtcli|cache_store|attention|tests|bench|examples|docs)/[\w./-]*[\w/])(?![\w*/-]|\.\w)")


def test_every_module_the_source_names_exists() -> None:
    """Docstrings and comments name modules as `srtcli.x.y` (and what they define): none is stale."""
    stale = [f"{n}: {m}" for n, f in MODULES.items() for m in DOTTED.findall(f.read_text())
             if not resolves(m.rstrip("."))]
    assert stale == []


@pytest.mark.parametrize("doc", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_every_path_the_docs_name_exists(doc: str) -> None:
    text = (ROOT / doc).read_text()
    missing = sorted({p for p in PATH.findall(text) if not (ROOT / p.rstrip(".")).exists()
                      and not any(c in p for c in "*{<")})
    assert missing == []
