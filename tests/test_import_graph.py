"""The import graph of the installed packages: no circles, and the layers DESIGN.md names
(kernels below engine below the gateway; the server side never imports the client side)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "realtime", "kernels")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "voicewire." + ".".join(parts)


def _graph() -> dict[str, set[str]]:
    """module -> the tree's modules it imports at import time (TYPE_CHECKING blocks excluded)."""
    files = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for n in ast.walk(node)}
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            deps |= {t for t in targets if t in files and t != mod}
        graph[mod] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _is_package_face(module: str) -> bool:
    """A package's ``__init__`` importing its own submodules is the package handing names on,
    not a circle of concepts."""
    return (ROOT / module.removeprefix("voicewire.").replace(".", "/") / "__init__.py").exists()


def test_no_import_circles() -> None:
    graph = _graph()
    # An __init__ -> its own submodule edge is how a package exports; drop it before looking.
    faceless = {
        m: {d for d in deps if not (_is_package_face(m) and d.startswith(m + "."))}
        for m, deps in graph.items()
    }
    assert _cycles(faceless) == []


def test_layers() -> None:
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith(("voicewire.engine", "voicewire.kernels")):
            assert not any(d.startswith("voicewire.realtime") for d in deps), (mod, deps)
        if mod.startswith("voicewire.kernels"):
            assert not any(d.startswith("voicewire.engine") for d in deps), (mod, deps)
        if mod.startswith("voicewire.realtime") and not mod.startswith("voicewire.realtime.client"):
            if mod == "voicewire.realtime.cli":
                continue  # dispatches `voicewire probe` lazily, inside a function
            assert not any(d.startswith("voicewire.realtime.client") for d in deps), (mod, deps)


def test_the_graph_sees_imports() -> None:
    """The checks above cannot pass by reading nothing."""
    graph = _graph()
    assert "voicewire.engine.engine" in graph["voicewire.realtime.session"] or any(
        d.startswith("voicewire.engine") for d in graph["voicewire.realtime.session"]
    )
    assert "voicewire.kernels.decode_attention" in graph["voicewire.engine.qwen3.fused_decode"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
