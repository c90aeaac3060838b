"""Fixtures for the document layer tests."""

from __future__ import annotations

import pytest

from sdk.documents import DocumentStore, KeyPair

from .helpers import TODO_SCHEMA


@pytest.fixture
def store() -> DocumentStore:
    """An in-memory store that knows the todo schema."""
    s = DocumentStore()
    s.add_schema(TODO_SCHEMA)
    return s


@pytest.fixture
def alice() -> KeyPair:
    """A fixed author key."""
    return KeyPair.from_private_key(bytes(range(32)))


@pytest.fixture
def bob() -> KeyPair:
    """Another fixed author key."""
    return KeyPair.from_private_key(bytes(range(1, 33)))
