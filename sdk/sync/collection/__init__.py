"""Collection sync (Beelay): learn which of many linked documents changed in one or
two round trips, with RIBLT snapshots (``sdk.sync.riblt``).

:class:`CollectionConnection` gives the client API, ``snapshot(root_document_id)``
and ``listen(snapshot)``; :class:`CollectionService` serves a store over TCP, as the
store node does. Each module says what it holds: the state machines over a
``DocumentStore`` (``server``, ``client``, ``pull``), the sans-I/O connection
(``machine``) and its driver (``connection``), the wire codec (``messages``), the
48-byte items (``symbols``), the collection walk (``reachability``) and the
operation-to-commit mapping (``sedimentree``). See docs/collection-sync.md.
"""

from __future__ import annotations

from sdk.sync.collection import client, connection, errors
from sdk.sync.collection.client import *  # noqa: F403
from sdk.sync.collection.connection import *  # noqa: F403
from sdk.sync.collection.errors import *  # noqa: F403
from sdk.sync.collection.messages import decode_message, encode_message
from sdk.sync.collection.reachability import reachable_documents
from sdk.sync.collection.server import CollectionConfig, CollectionServer, first_batch_size
from sdk.sync.collection.service import CollectionService
from sdk.sync.collection.symbols import DOC_AND_STATE, document_item, document_key

__all__ = [
    "DOC_AND_STATE",
    "CollectionConfig",
    "CollectionServer",
    "CollectionService",
    "decode_message",
    "document_item",
    "document_key",
    "encode_message",
    "first_batch_size",
    "reachable_documents",
]
# Every client class, connection class and error (the typing spec's form of a re-export).
__all__ += client.__all__
__all__ += connection.__all__
__all__ += errors.__all__
