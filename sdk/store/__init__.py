"""Clients of a store node: what the runtime asks for missing messages and catch-up.

* :mod:`sdk.store.client`: the :class:`StoreClient` protocol the runtime uses
  (lookup by id / retrieval hint, time-range pages) and :class:`InMemoryStore`,
  a complete in-process archive for tests, the demo and single-process apps;
* :mod:`sdk.store.grpc`: :class:`~sdk.store.grpc.GrpcStoreClient` for a real
  store node (needs the ``client`` extra, grpcio; imported on its own so this
  package stays light);
* :mod:`sdk.store.errors`: the exception tree::

    StoreError
     └── StoreQueryError    a query failed (gRPC status code name in ``code``)
          └── NotArchived   the store does not archive the channel asked for
"""

from __future__ import annotations

from sdk.store.client import InMemoryStore, StoreClient
from sdk.store.errors import NotArchived, StoreError, StoreQueryError

__all__ = ["InMemoryStore", "NotArchived", "StoreClient", "StoreError", "StoreQueryError"]
