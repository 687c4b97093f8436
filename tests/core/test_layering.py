"""The engine is pure Python: importing it loads neither airflow nor pyspark (docs/architecture.md, layers)."""

from __future__ import annotations

import subprocess
import sys


def test_core_imports_neither_airflow_nor_pyspark() -> None:
    probe = (
        "import sys, pkgutil, importlib, airflow_plugin.core as core\n"
        "for m in pkgutil.walk_packages(core.__path__, 'airflow_plugin.core.'): importlib.import_module(m.name)\n"
        "import airflow_plugin.cli\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('airflow', 'pyspark')))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_no_engine_module_imports_itself_back() -> None:
    """No cycle among the engine's modules (imports under TYPE_CHECKING included): each folder's files can be read
    from the bottom up (docs/architecture.md, "Layers")."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    core = root / "airflow_plugin" / "core"

    def module_of(path: Path) -> str:
        parts = list(path.relative_to(root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {module_of(p): p for p in core.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:  # `from . import x` names a module; `from .x import y` names x
                candidate = f"{target}.{alias.name}"
                found = candidate if candidate in modules else target
                if found in modules and found != name:
                    edges.add(found)

    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph.get(name, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)
