"""Sync protocol machines do no I/O: no machine module imports asyncio, socket,
sqlite3 or threading, nor does any module of its own package that it imports
(``sdk.sync.machine`` says why: I/O belongs to the driver, :mod:`sdk.sync.run`)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

FORBIDDEN = frozenset({"asyncio", "socket", "sqlite3", "threading"})

#: The modules of p2panda replication's machine (:class:`sdk.sync.session.Replication`).
REPLICATION = ("session", "send_plan", "session_state")
#: What replication's machine modules may not import either: the store, and the code
#: that carries out the machine's requests on it.
STORE_SIDE = frozenset({"sdk.sync.store", "sdk.sync.store_work", "sdk.documents.store"})

#: Each machine module, and the package whose modules it imports are checked with it.
MACHINES = {
    "sdk.sync.machine": "sdk.sync.machine",
    "store_node.store_sync.machine": "store_node.store_sync",
    "sdk.sync.bamboo_p2p.machine": "sdk.sync.bamboo_p2p",
    "sdk.sync.collection.machine": "sdk.sync.collection",
    # Replication's own modules (each with what it imports of itself).
    **{f"sdk.sync.{name}": f"sdk.sync.{name}" for name in REPLICATION},
}


def _imports(module: str) -> set[str]:
    """The modules ``module``'s source imports (absolute names), anywhere in the file."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text(), spec.origin)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.level:
                base = module.rsplit(".", node.level)[0]
                names.add(f"{base}.{node.module}")
            else:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # ``from package.module import name``: not a module
        return False


def forbidden_imports(
    module: str, package: str, also: frozenset[str] = frozenset()
) -> dict[str, set[str]]:
    """``{module: forbidden modules it imports}`` for ``module`` and, transitively,
    the modules of ``package`` it imports; ``also``: modules forbidden besides I/O."""
    found: dict[str, set[str]] = {}
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or not _is_module(name):
            continue
        seen.add(name)
        imported = _imports(name)
        bad = {
            i
            for i in imported
            if i.split(".")[0] in FORBIDDEN or any(i == a or i.startswith(a + ".") for a in also)
        }
        if bad:
            found[name] = bad
        todo += [i for i in imported if i == package or i.startswith(package + ".")]
    return found


@pytest.mark.parametrize("module", sorted(MACHINES))
def test_a_machine_module_imports_no_io(module: str) -> None:
    assert forbidden_imports(module, MACHINES[module]) == {}


@pytest.mark.parametrize("name", REPLICATION)
def test_replication_s_machine_modules_import_no_store(name: str) -> None:
    """Replication asks its store through requests (``sdk.sync.session_state``), carried
    out by ``sdk.sync.store_work``: none of its machine modules imports the store."""
    module = f"sdk.sync.{name}"
    assert forbidden_imports(module, module, STORE_SIDE) == {}


#: The Bamboo machine's store modules: it asks the store by request, never directly.
BAMBOO_STORES = frozenset(
    f"sdk.sync.bamboo_p2p.{name}" for name in ("store", "sqlite_store", "document_store")
)


def test_the_bamboo_machine_imports_no_store() -> None:
    seen: set[str] = set()
    todo = ["sdk.sync.bamboo_p2p.machine"]
    while todo:
        name = todo.pop()
        if name in seen or not _is_module(name):
            continue
        seen.add(name)
        todo += [i for i in _imports(name) if i.startswith("sdk.sync.bamboo_p2p")]
    assert "sdk.sync.bamboo_p2p.requests" in seen
    assert seen & BAMBOO_STORES == set()
