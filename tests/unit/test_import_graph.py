"""The package's import graph keeps its layers (docs/design.md, "Layers and the import test").

Every ``import`` of a thinwire module counts, function-local ones included (a lazy import is
still a dependency). Four rules:
* no import cycles between modules (a package's ``__init__`` that re-exports is not a member:
  ``from thinwire.cluster import parse_rate`` inside thinwire.cluster is not a cycle);
* the library (what a training script imports) never imports the application or the lab;
* no module imports another module's private name (``from thinwire.x import _name``, or
  ``module._name`` on an imported thinwire module).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "thinwire"
LIBRARY = ("collectives", "state", "ddp", "sync", "compress", "feedback", "topk", "topology",
           "transport", "optim", "local_sgd", "pipeline", "options", "ft", "peer_failure",
           "link_probe", "node_probe", "plan_choice", "ddp_auto")
APP_AND_LAB = ("train", "bench", "sim", "cluster", "recsys", "data", "wavelet", "cli",
               "cliargs")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The thinwire module a dotted name lives in (a name inside a module -> the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _from_targets(node: ast.ImportFrom, module: str) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None where the name is a module itself) for one
    ``from ... import ...`` in ``module`` (relative imports resolved); thinwire's only."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - (node.level - 1)] + ([base] if base else []))
    if base.split(".")[0] != "thinwire":
        return []
    return [(f"{base}.{a.name}", None) if f"{base}.{a.name}" in MODULES else (base, a.name)
            for a in node.names]


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), str(MODULES[module]))


def _imports(module: str) -> list[str]:
    """Every thinwire module or name ``module``'s file imports, wherever the import stands."""
    found = []
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "thinwire"]
        elif isinstance(node, ast.ImportFrom):
            found += [target for target, _ in _from_targets(node, module)]
    return found


def _edges() -> dict[str, set[str]]:
    edges = {m: set() for m in MODULES}
    for module in MODULES:
        for target in _imports(module):
            resolved = _resolve(target)
            if resolved and resolved != module:
                edges[module].add(resolved)
    return edges


def _is_face(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), faces left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if _is_face(w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index and not _is_face(v):
            visit(v)
    return found


def _layer(module: str) -> str | None:
    top = module.split(".")[1] if "." in module else ""
    if top in LIBRARY:
        return "library"
    if top in APP_AND_LAB:
        return "app"
    return None


def upward_arrows(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, w) for m, targets in edges.items() for w in targets
            if _layer(m) == "library" and _layer(w) == "app"}


def private_imports() -> list[str]:
    """``from thinwire.x import _name``, and ``alias._name`` on an imported thinwire module,
    where x is another module."""
    found = []
    for module in MODULES:
        tree = _tree(module)
        aliases = {}  # local name -> the thinwire module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias, (target, name) in zip(node.names, _from_targets(node, module)):
                    if name is None:
                        aliases[alias.asname or alias.name] = target
                    elif _private(name) and _resolve(target) != module:
                        found.append(f"{module}: from {target} import {name}")
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names
                                if a.asname and a.name.split(".")[0] == "thinwire"})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and _private(node.attr) \
                    and aliases[node.value.id] != module:
                found.append(f"{module}: {node.value.id}.{node.attr}")
    return sorted(set(found))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


EDGES = _edges()


def test_no_module_is_part_of_an_import_cycle():
    assert cycles(EDGES) == []


def test_the_library_never_imports_the_application_or_the_lab():
    assert sorted(upward_arrows(EDGES)) == []


def test_no_module_imports_another_modules_private_names():
    assert private_imports() == []


def test_every_top_level_package_has_a_layer():
    """A new top-level module or package is placed in LIBRARY or APP_AND_LAB (or is one of the
    shared helpers), so that the rule above covers it."""
    shared = {"", "output", "ports", "safefile", "rank_exit"}
    tops = {m.split(".")[1] if "." in m else "" for m in MODULES}
    assert sorted(tops - set(LIBRARY) - set(APP_AND_LAB) - shared) == []


def test_the_checker_sees_what_it_must(tmp_path, monkeypatch):
    """The checker itself: a cycle, an upward arrow and private imports in made-up code."""
    edges = {m: set() for m in MODULES}
    edges.update({"thinwire.topk": {"thinwire.train.loop"},
                  "thinwire.train.loop": {"thinwire.topk"}})
    assert cycles(edges) == [["thinwire.topk", "thinwire.train.loop"]]
    assert upward_arrows(edges) == {("thinwire.topk", "thinwire.train.loop")}
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from thinwire.topk import _hidden\n"
                    "    from thinwire.pipeline import config, engine as e\n"
                    "    return e._Sender, config.load\n")
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {**MODULES, "thinwire.fake": fake})
    assert private_imports() == ["thinwire.fake: e._Sender",
                                 "thinwire.fake: from thinwire.topk import _hidden"]
