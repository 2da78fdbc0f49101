"""The package's files import one way: no file of ``scalevec_lit/`` or ``callbacks/`` reaches, directly or
through others, back to a file that imports it. Read from the source (``ast``), every import counted, those
inside functions too (an import deferred into a function still ties the two files together).

A circle is reported with its files and the names each takes from the next, e.g.
``scalevec_lit/scale/ops.py -> scalevec_lit/scale/norm_rope.py: group_norm_rope``.

Between packages, each imports only what docs/development.md's table "Packages, what each owns, what each may
import" allows it: an import outside it is named with its file, the names and the row to change.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import ROOT

#: the top-level callbacks/ folder is installed as scalevec_lit.callbacks (pyproject's package-dir)
ALIASES = {"scalevec_lit.callbacks": "callbacks"}


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root / package`` (a package is its ``__init__``)."""
    out = {}
    for package in packages:
        for f in sorted((root / package).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _known(name: str, files: dict[str, Path]) -> str | None:
    """The module of ``files`` that ``name`` lives in (its longest dotted prefix that is one), after aliases."""
    for alias, real in ALIASES.items():
        if name == alias or name.startswith(alias + "."):
            name = real + name[len(alias):]
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: tuple[str, ...]) -> tuple[dict[str, Path], dict[str, dict[str, set[str]]]]:
    """The modules, and ``graph[a][b]``: the names module ``a`` imports from module ``b`` (both of ``packages``).

    ``from pkg import sub`` where ``sub`` is a module ties the file to ``pkg/sub.py``, not to ``pkg/__init__.py``."""
    files = modules(root, packages)
    graph: dict[str, dict[str, set[str]]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            ties: list[tuple[str | None, str]] = []
            if isinstance(node, ast.Import):
                ties = [(_known(a.name, files), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                for a in node.names:
                    sub = _known(f"{stem}.{a.name}", files)
                    target = sub if sub is not None and sub.startswith(stem + ".") else _known(stem, files)
                    ties.append((target, a.name))
            for target, name in ties:
                if target is not None and target != mod:
                    graph.setdefault(mod, {}).setdefault(target, set()).add(name)
    return files, graph


def circles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(graph) | {b for edges in graph.values() for b in edges})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def describe(comp: list[str], files: dict[str, Path], graph: dict[str, dict[str, set[str]]], root: Path) -> str:
    """One line per tie inside the circle: ``a.py -> b.py: the, names``."""
    rel = {m: files[m].relative_to(root).as_posix() for m in comp}
    return "\n".join(f"  {rel[a]} -> {rel[b]}: {', '.join(sorted(graph[a][b]))}"
                     for a in comp for b in comp if b in graph.get(a, {}))


def test_no_import_circle_between_the_package_files():
    files, graph = import_graph(ROOT, ("scalevec_lit", "callbacks"))
    assert len(files) > 100  # the package was read, not an empty folder
    found = circles(graph)
    report = "\n".join(f"circle {i + 1}:\n{describe(c, files, graph, ROOT)}" for i, c in enumerate(found))
    assert not found, f"{len(found)} import circle(s); the lower file must not reach up for these names:\n{report}"


def _tree(root: Path, sources: dict[str, str]) -> None:
    for rel, text in sources.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_circle_is_found_and_named_with_its_files_and_names(tmp_path):
    """The check itself: a circle through a function-level import and a package ``__init__`` is found and
    reported with the names that tie it; a module imported as ``from pkg import sub`` ties to ``sub`` alone;
    the aliased callbacks folder counts as ``scalevec_lit.callbacks``."""
    _tree(tmp_path, {
        "pkg/__init__.py": "from .low import base_fn\n",
        "pkg/low.py": "def base_fn():\n    from .high import top  # reaches up\n    return top\n",
        "pkg/high.py": "from pkg.low import base_fn\nfrom . import leaf\n\ndef top():\n    return base_fn\n",
        "pkg/leaf.py": "import pkg.sub.deep\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "from scalevec_lit.callbacks.cb import X\n",
        "callbacks/cb.py": "from pkg.sub import deep\nX = 1\n",
    })
    files, graph = import_graph(tmp_path, ("pkg", "callbacks"))
    assert graph["pkg.high"] == {"pkg.low": {"base_fn"}, "pkg.leaf": {"leaf"}}
    assert graph["pkg.leaf"] == {"pkg.sub.deep": {"pkg.sub.deep"}}
    assert graph["callbacks.cb"] == {"pkg.sub.deep": {"deep"}}
    found = circles(graph)
    assert found == [["callbacks.cb", "pkg.sub.deep"], ["pkg.high", "pkg.low"]]
    assert describe(found[1], files, graph, tmp_path) == ("  pkg/high.py -> pkg/low.py: base_fn\n"
                                                          "  pkg/low.py -> pkg/high.py: top")
    assert describe(found[0], files, graph, tmp_path) == ("  callbacks/cb.py -> pkg/sub/deep.py: deep\n"
                                                          "  pkg/sub/deep.py -> callbacks/cb.py: X")


def test_a_one_way_tree_has_no_circle(tmp_path):
    _tree(tmp_path, {"pkg/__init__.py": "from .a import f\n", "pkg/a.py": "from .b import g\nf = g\n",
                     "pkg/b.py": "import os\ng = os.sep\n"})
    files, graph = import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": {"pkg.a": {"f"}}, "pkg.a": {"pkg.b": {"g"}}}
    assert circles(graph) == []


# -- what each package may import (docs/development.md) ------------------------------------------------------
def unit_of(module: str, root: Path) -> str:
    """The row of the table a module belongs to: ``scale/`` (a package of scalevec_lit), ``errors.py`` (a file
    directly in it), ``__init__.py`` (the package itself) or ``callbacks/``."""
    parts = module.split(".")
    if parts[0] == "callbacks":
        return "callbacks/"
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] + "/" if (root / "scalevec_lit" / parts[1]).is_dir() else parts[1] + ".py"


def allowed_imports(page: Path) -> dict[str, set[str]]:
    """The table's rows: unit -> the units it may import."""
    rows = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[2]))
    return rows


def outside_the_table(root: Path, page: Path) -> list[str]:
    files, graph = import_graph(root, ("scalevec_lit", "callbacks"))
    allowed = allowed_imports(page)
    found = []
    for a, targets in sorted(graph.items()):
        ua = unit_of(a, root)
        for b, names in sorted(targets.items()):
            ub = unit_of(b, root)
            if ua == ub:
                continue
            if ua not in allowed:
                found.append(f"{files[a].relative_to(root).as_posix()}: {ua} has no row in the table")
            elif ub not in allowed[ua]:
                found.append(f"{files[a].relative_to(root).as_posix()} -> {files[b].relative_to(root).as_posix()}: "
                             f"{', '.join(sorted(names))} ({ua} may not import {ub})")
    return sorted(set(found))


def test_each_package_imports_only_what_the_layout_table_allows():
    page = ROOT / "docs" / "development.md"
    assert "lit/" in allowed_imports(page)  # the table was read
    found = outside_the_table(ROOT, page)
    assert not found, ("imports that docs/development.md's layout table does not allow (move the import, or "
                       "change the row if the package now owns it):\n  " + "\n  ".join(found))


def test_an_import_outside_the_table_is_named(tmp_path):
    _tree(tmp_path, {"scalevec_lit/__init__.py": "", "scalevec_lit/errors.py": "",
                     "scalevec_lit/scale/__init__.py": "", "scalevec_lit/scale/ops.py": "from ..errors import E\n",
                     "scalevec_lit/model/__init__.py": "", "scalevec_lit/model/m.py": "from ..scale.ops import f\n",
                     "callbacks/c.py": "from scalevec_lit.model.m import g\n"})
    page = tmp_path / "layout.md"
    page.write_text("| unit | owns | may import |\n|---|---|---|\n| `errors.py` | errors | |\n"
                    "| `scale/` | scales | |\n| `model/` | the model | `scale/`, `errors.py` |\n")
    assert allowed_imports(page) == {"errors.py": set(), "scale/": set(), "model/": {"scale/", "errors.py"}}
    assert outside_the_table(tmp_path, page) == [
        "callbacks/c.py: callbacks/ has no row in the table",
        "scalevec_lit/scale/ops.py -> scalevec_lit/errors.py: E (scale/ may not import errors.py)",
    ]
