"""The bridge between documents and an SDS channel: bytes in, events out.

:class:`DocumentChannel` never touches a transport or an SDS channel itself
(layering by converting events, STYLE.md). The app (or runtime) wires it::

    payload, event = docs.create(schema_id, {"title": "milk", "done": False})
    sds_channel.send(payload, now)                   # SDS gives reliability + causal order
    ...
    for sds_event in ...:                            # from the SDS channel
        if isinstance(sds_event, MessageDelivered):
            for doc_event in docs.on_delivered(sds_event.content):
                ...                                  # DocumentCreated / Updated / Deleted

Payload framing (the SDS message content): the CBOR array of two byte strings
``[entry, operation]`` — the encoded Bamboo entry and the encoded operation
(``0x82``, then each as a definite-length byte string), decoded strictly.

SDS delivers in causal order per channel, but an entry can still arrive before
what it depends on (its backlink, the operations in ``previous``, a schema
definition), e.g. when the dependency was published on another channel or
retrieved late. Such entries are *held*, at most ``max_pending`` of them and
``max_pending_bytes`` in all (the oldest is dropped when full, counted in
``stats["evicted"]``), and applied as
soon as the dependency is stored: each held entry is indexed by the hash it
waits for, so an arrival finds its dependants in O(1). Input that breaks a rule
becomes an :class:`OperationRejected` event and a count in ``stats``; it never
raises.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping

from sdk.documents import cbor
from sdk.documents.errors import (
    CBORError,
    DocumentError,
    InvalidInput,
    MalformedInput,
    MissingDependency,
    SizeLimitExceeded,
)
from sdk.documents.events import (
    DocumentCreated,
    DocumentDeleted,
    DocumentEvent,
    DocumentUpdated,
    OperationRejected,
)
from sdk.documents.hashing import hash_id
from sdk.documents.keys import KeyPair
from sdk.documents.limits import (
    MAX_ENTRY_SIZE,
    MAX_OPERATION_SIZE,
    MAX_PENDING_BYTES,
    MAX_PENDING_ENTRIES,
)
from sdk.documents.schema import (
    SCHEMA_DEFINITION_V1,
    SCHEMA_FIELD_DEFINITION_V1,
    FieldType,
    Schema,
)
from sdk.documents.store import DocumentStore, Published

#: Largest framed payload: both parts at their limits plus the CBOR heads.
MAX_PAYLOAD_SIZE = MAX_ENTRY_SIZE + MAX_OPERATION_SIZE + 16


def encode_payload(entry: bytes, operation: bytes) -> bytes:
    """Frame an entry and its operation as SDS message content: ``[entry, operation]``."""
    return cbor.encode([entry, operation])


def decode_payload(content: bytes) -> tuple[bytes, bytes]:
    """Split SDS message content into ``(entry, operation)``; only ``MalformedInput`` escapes."""
    if len(content) > MAX_PAYLOAD_SIZE:
        raise SizeLimitExceeded(f"payload of {len(content)} bytes, limit {MAX_PAYLOAD_SIZE}")
    value = cbor.decode(content, max_depth=1)
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], bytes)
        or not isinstance(value[1], bytes)
    ):
        raise CBORError("document payload is the array [entry bytes, operation bytes]")
    return value[0], value[1]


class DocumentChannel:
    """Documents over one SDS channel for one author (``key``), backed by ``store``.

    ``create`` / ``update`` / ``delete`` sign and store a local operation and
    return ``(payload, event)``: pass ``payload`` to the SDS channel's ``send``.
    ``on_delivered`` takes the content of each delivered SDS message and
    returns the document events it caused (including held entries it released).
    """

    def __init__(
        self,
        store: DocumentStore,
        key: KeyPair,
        *,
        max_pending: int = MAX_PENDING_ENTRIES,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ) -> None:
        self.store = store
        self.key = key
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        #: Counters: "applied", "duplicate", "held", "released", "evicted", and one per
        #: rejection rule (e.g. "signature", "backlink", "cbor").
        self.stats: Counter[str] = Counter()
        # entry hash -> (entry, operation, hashes it waits for); insertion order = age.
        self._pending: OrderedDict[str, tuple[bytes, bytes, tuple[str, ...]]] = OrderedDict()
        # missing hash -> entry hashes of held entries waiting for it.
        self._waiting: dict[str, set[str]] = {}
        self._deferred: list[DocumentEvent] = []

    # -- local operations ------------------------------------------------------------

    def create(self, schema_id: str, fields: Mapping[str, object]) -> tuple[bytes, DocumentCreated]:
        """Create a document; return the payload to send and the local event."""
        published = self.store.create(self.key, schema_id, fields)
        event = self._local(published)
        assert isinstance(event, DocumentCreated)
        return encode_payload(published.entry, published.operation), event

    def update(
        self,
        document_id: str,
        fields: Mapping[str, object],
        previous: tuple[str, ...] | None = None,
    ) -> tuple[bytes, DocumentUpdated]:
        """Update fields of a document (building on its current view unless ``previous``)."""
        published = self.store.update(self.key, document_id, fields, previous)
        event = self._local(published)
        assert isinstance(event, DocumentUpdated)
        return encode_payload(published.entry, published.operation), event

    def delete(
        self, document_id: str, previous: tuple[str, ...] | None = None
    ) -> tuple[bytes, DocumentDeleted]:
        """Delete a document; return the payload to send and the local event."""
        published = self.store.delete(self.key, document_id, previous)
        event = self._local(published)
        assert isinstance(event, DocumentDeleted)
        return encode_payload(published.entry, published.operation), event

    def define_schema(
        self, name: str, description: str, fields: Mapping[str, FieldType | str]
    ) -> tuple[tuple[bytes, ...], Schema]:
        """Publish an application schema as p2panda schema documents.

        Creates one ``schema_field_definition_v1`` document per field and a
        ``schema_definition_v1`` document; the schema id is ``<name>_<view id>``
        of the latter. Returns the payloads to send (in order) and the schema.
        """
        payloads: list[bytes] = []
        field_views: list[tuple[str, ...]] = []
        for field_name, field_type in sorted(fields.items()):
            payload, event = self.create(
                SCHEMA_FIELD_DEFINITION_V1.id, {"name": field_name, "type": str(field_type)}
            )
            payloads.append(payload)
            field_views.append(event.view.view_id)
        payload, event = self.create(
            SCHEMA_DEFINITION_V1.id,
            {"name": name, "description": description, "fields": field_views},
        )
        payloads.append(payload)
        schema = self.store.schema(f"{name}_{event.view.view_id_str}")
        return tuple(payloads), schema

    def _local(self, published: Published) -> DocumentEvent:
        self.stats["published"] += 1
        # Peers' entries may have waited for this one (e.g. after restoring a backup);
        # what they cause is returned with the next on_delivered().
        self._deferred += self._release(published.operation_id)
        return published.events[0]

    # -- delivered content -----------------------------------------------------------

    def on_delivered(self, content: bytes) -> list[DocumentEvent]:
        """Handle the content of one delivered SDS message; return the document events."""
        events, self._deferred = self._deferred, []
        try:
            entry, operation = decode_payload(content)
        except MalformedInput as exc:
            return [*events, self._reject(exc)]
        return events + self._ingest(entry, operation)

    @property
    def pending_count(self) -> int:
        """How many entries are held waiting for a dependency."""
        return len(self._pending)

    def _ingest(self, entry: bytes, operation: bytes) -> list[DocumentEvent]:
        stored, events = self._try(entry, operation)
        if stored:
            events += self._release(hash_id(entry))
        return events

    def _try(self, entry: bytes, operation: bytes) -> tuple[bool, list[DocumentEvent]]:
        """Ingest one entry; return whether it is now newly stored, and its events."""
        if self.store.has_entry(hash_id(entry)):
            self.stats["duplicate"] += 1
            return False, []
        try:
            events = self.store.ingest(entry, operation)
        except MissingDependency as exc:
            self._hold(entry, operation, exc.missing)
            return False, []
        except InvalidInput as exc:
            return False, [self._reject(exc)]
        self.stats["applied"] += 1
        return True, list(events)

    def _reject(self, error: DocumentError) -> OperationRejected:
        assert isinstance(error, InvalidInput)
        self.stats[error.rule] += 1
        self.stats["rejected"] += 1
        return OperationRejected(error)

    def _hold(self, entry: bytes, operation: bytes, missing: tuple[str, ...]) -> None:
        entry_hash = hash_id(entry)
        if entry_hash in self._pending:
            return
        size = len(entry) + len(operation)
        while self._pending and (
            len(self._pending) >= self.max_pending
            or self._pending_bytes + size > self.max_pending_bytes
        ):
            oldest, (old_entry, old_operation, waits_for) = self._pending.popitem(last=False)
            self._pending_bytes -= len(old_entry) + len(old_operation)
            self._unindex(oldest, waits_for)
            self.stats["evicted"] += 1
        self._pending[entry_hash] = (entry, operation, missing)
        self._pending_bytes += size
        for dependency in missing:
            self._waiting.setdefault(dependency, set()).add(entry_hash)
        self.stats["held"] += 1

    def _unindex(self, entry_hash: str, waits_for: tuple[str, ...]) -> None:
        for dependency in waits_for:
            waiting = self._waiting.get(dependency)
            if waiting is not None:
                waiting.discard(entry_hash)
                if not waiting:
                    del self._waiting[dependency]

    def _release(self, stored_hash: str) -> list[DocumentEvent]:
        """Retry held entries that waited for ``stored_hash``, and what those release."""
        events: list[DocumentEvent] = []
        ready = [stored_hash]
        while ready:
            for entry_hash in sorted(self._waiting.pop(ready.pop(), ())):
                held = self._pending.pop(entry_hash, None)
                if held is None:
                    continue
                entry, operation, waits_for = held
                self._pending_bytes -= len(entry) + len(operation)
                self._unindex(entry_hash, waits_for)
                self.stats["released"] += 1
                # Retrying re-holds it if it still misses something else.
                stored, new_events = self._try(entry, operation)
                events.extend(new_events)
                if stored:
                    ready.append(entry_hash)
        return events


__all__ = ["MAX_PAYLOAD_SIZE", "DocumentChannel", "decode_payload", "encode_payload"]
