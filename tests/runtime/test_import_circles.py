"""No import circles in the SDS core and the runtime, ``TYPE_CHECKING`` imports included.

Two circles were untied (issue 28): ``sdk.runtime.reliable_channel`` knows its
node only as a ``ChannelHost`` protocol, not ``sdk.runtime.node``; and
``sdk.sds.journal`` no longer needs ``sdk.sds.channel``. The graph is read from
the sources with ``ast`` (nothing is imported), over every import statement.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sdk/sds", "sdk/runtime")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of PACKAGES it imports (``from pkg import sub`` counts as sub)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if sub in modules:
                        targets.add(sub)
                    elif node.module in modules:
                        targets.add(node.module)
        targets.discard(name)
        graph[name] = targets
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return False


def test_the_channel_does_not_import_the_node() -> None:
    graph = _graph()
    assert "sdk.runtime.reliable_channel" in graph and "sdk.runtime.node" in graph
    assert not _reaches(graph, "sdk.runtime.reliable_channel", "sdk.runtime.node")


def test_the_journal_does_not_import_the_channel() -> None:
    graph = _graph()
    assert not _reaches(graph, "sdk.sds.journal", "sdk.sds.channel")


def test_no_module_of_the_core_or_runtime_imports_itself_back() -> None:
    graph = _graph()
    circles = sorted(m for m in graph if any(_reaches(graph, t, m) for t in graph[m]))
    assert circles == []
