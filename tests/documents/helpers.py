"""Constants and helpers shared by the document layer tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdk.documents import DocumentStore, Schema

# CI clones the repository with `shared` beside it.
VECTORS = Path(__file__).resolve().parents[2] / ".." / "shared" / "vectors"

TODO_SCHEMA = Schema.application(
    "todo",
    ("0020" + "11" * 32,),
    "A shared todo item",
    {"title": "str", "done": "bool", "priority": "int", "weight": "float", "note": "bytes"},
)


def load_vector(name: str) -> Any:
    """One of the shared, byte-exact vector files."""
    return json.loads((VECTORS / name).read_text())


def todo_fields(title: str = "milk") -> dict[str, object]:
    """A complete set of fields for TODO_SCHEMA."""
    return {"title": title, "done": False, "priority": 1, "weight": 0.5, "note": b""}


def snapshot(store: DocumentStore) -> tuple[object, ...]:
    """Everything a store holds: every table's rows and every document's view."""
    db = store._db
    tables = tuple(
        tuple(db.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall())
        for t in ("entries", "logs", "operations", "documents")
    )
    return (*tables, tuple(store.documents(deleted=True)))
