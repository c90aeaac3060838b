"""The sync layer has one exception tree, and exception names mean one thing.

``sdk.sync.errors`` is the root (its docstring draws the tree): ``except SyncError``
must catch any failure of the sync layer, whichever sub-package raised it. And across
``sdk``, ``transports`` and ``store_node`` a class name is not reused for a different
thing (issue 15.5); a re-export (the same class under its own name) is not a reuse.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict
from types import ModuleType

import pytest

from sdk.sync import bamboo_p2p, collection, riblt
from sdk.sync.errors import (
    LimitExceeded,
    LocalProtocolError,
    MalformedMessage,
    RemoteProtocolError,
    SyncError,
)

PACKAGES = ("sdk", "transports", "store_node")

#: The one name pair every package of the house style defines for itself (h11's
#: convention, STYLE.md): the same meaning in each, rooted in that package's tree.
PER_PACKAGE = {"LocalProtocolError", "RemoteProtocolError"}


def _modules(package: str) -> list[ModuleType]:
    root = importlib.import_module(package)
    found = [root]
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        found.append(importlib.import_module(info.name))
    return found


def _classes(package: str) -> set[type]:
    """Every class defined (not only imported) in a module of ``package``."""
    return {
        obj
        for module in _modules(package)
        for obj in vars(module).values()
        if inspect.isclass(obj) and (obj.__module__ or "").split(".")[0] == package
    }


def _sync_exceptions() -> set[type[BaseException]]:
    return {
        c
        for c in _classes("sdk")
        if issubclass(c, BaseException) and c.__module__.startswith("sdk.sync")
    }


def test_every_sync_exception_derives_from_sync_error() -> None:
    found = _sync_exceptions()
    # The walk reaches every sub-package (else this test could not fail).
    names = {c.__name__ for c in found}
    assert {"BadBlob", "CreditViolation", "DecodeLimitExceeded", "RoundTooLong"} <= names
    assert sorted(c.__qualname__ for c in found if not issubclass(c, SyncError)) == []


def test_shared_classes_are_re_exported_not_redefined() -> None:
    for module in (collection.errors, bamboo_p2p.errors, collection, bamboo_p2p):
        assert module.MalformedMessage is MalformedMessage
    for module in (collection.errors, bamboo_p2p.errors, bamboo_p2p):
        assert module.RemoteProtocolError is RemoteProtocolError
    assert collection.LimitExceeded is LimitExceeded
    assert bamboo_p2p.LocalProtocolError is LocalProtocolError


@pytest.mark.parametrize(
    ("error", "shared"),
    [
        (collection.errors.UnknownSnapshot("x"), RemoteProtocolError),
        (collection.errors.CollectionUsageError("x"), LocalProtocolError),
        (bamboo_p2p.errors.CreditViolation("x"), RemoteProtocolError),
        (bamboo_p2p.errors.FramingError("x"), RemoteProtocolError),
        (riblt.DecodeLimitExceeded("x"), LimitExceeded),
        (riblt.SymbolSizeError("x"), LocalProtocolError),
    ],
)
def test_sub_package_errors_sit_under_the_shared_classes(
    error: SyncError, shared: type[SyncError]
) -> None:
    assert isinstance(error, shared)
    with pytest.raises(SyncError):
        raise error


def test_local_protocol_errors_are_value_errors() -> None:
    """Caller misuse stays a ValueError wherever it is raised."""
    assert all(
        issubclass(c, ValueError) for c in _sync_exceptions() if issubclass(c, LocalProtocolError)
    )
    assert not issubclass(MalformedMessage, ValueError)


def _by_name() -> dict[str, set[type]]:
    named: dict[str, set[type]] = defaultdict(set)
    for package in PACKAGES:
        for cls in _classes(package):
            if not cls.__name__.startswith("_"):
                named[cls.__name__].add(cls)
    return named


def test_no_exception_name_is_reused_for_another_class() -> None:
    reused = {
        name: sorted(f"{c.__module__}.{c.__qualname__}" for c in classes)
        for name, classes in _by_name().items()
        if len(classes) > 1 and any(issubclass(c, BaseException) for c in classes)
    }
    for name in PER_PACKAGE:
        # Allowed only as what the name says in every package: roots of one meaning.
        classes = _by_name()[name]
        assert all(issubclass(c, BaseException) for c in classes)
        if name == "LocalProtocolError":
            assert all(issubclass(c, ValueError) for c in classes)
        reused.pop(name, None)
    assert reused == {}


def test_no_other_class_name_is_shared_across_packages() -> None:
    shared = {
        name: {c.__module__ for c in classes}
        for name, classes in _by_name().items()
        if len(classes) > 1 and name not in PER_PACKAGE
    }
    assert shared == {}


def test_the_shared_classes_keep_their_rule_names() -> None:
    """``rule`` is a counter key: stable, and set by each class in its bases."""
    from sdk.sync import errors

    rules = {name: getattr(errors, name).rule for name in errors.__all__}
    assert rules == {
        "ConnectionLost": "connection_lost",
        "InvalidEntry": "invalid_entry",
        "LimitExceeded": "limit",
        "LocalProtocolError": "local",
        "MalformedMessage": "malformed",
        "RemoteProtocolError": "remote",
        "SyncError": "sync",
        "UnexpectedEntry": "unexpected_entry",
        "UnknownSession": "unknown_session",
    }
    # A refinement without a rule of its own counts under its parent's.
    assert type("Refined", (errors.MalformedMessage,), {}).rule == "malformed"
