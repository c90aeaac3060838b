"""The store clients' exception tree.

::

    StoreError
     └── StoreQueryError    a query failed; ``code`` is the gRPC status code name
                            (INVALID_ARGUMENT, UNAUTHENTICATED, UNAVAILABLE, ...)

Timeouts the runtime applies (``RuntimeOptions.store_timeout``) surface as
``TimeoutError`` inside :class:`~sdk.runtime.events.StoreRetrievalFailed` events.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error a store client raises."""


class StoreQueryError(StoreError):
    """A store query failed; ``code`` is the gRPC status code name."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
