"""The store clients' exception tree.

::

    StoreError
     └── StoreQueryError    a query failed; ``code`` is the gRPC status code name
          │                 (INVALID_ARGUMENT, UNAUTHENTICATED, UNAVAILABLE, ...)
          └── NotArchived   the store does not archive the channel asked for (NOT_FOUND)

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


#: The gRPC status a store node answers for a channel it does not archive.
NOT_ARCHIVED_CODE = "NOT_FOUND"


class NotArchived(StoreQueryError):
    """The store does not archive the channel queried: no answer from it can be complete.

    Distinct from an empty page (the store archives the channel and holds nothing in
    the range). The runtime reports it once as
    :class:`~sdk.runtime.events.ChannelNotArchived`.
    """

    def __init__(self, channel_id: str, detail: str) -> None:
        super().__init__(NOT_ARCHIVED_CODE, detail)
        self.channel_id = channel_id
