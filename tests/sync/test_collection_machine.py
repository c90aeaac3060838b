"""The collection-sync connection machine alone, on a manual clock: request matching,
timeouts, bounds, backpressure, pull-back and the listener's keepalive."""

from __future__ import annotations

import itertools

import pytest

from sdk.sync.collection.errors import (
    CollectionProtocolError,
    CollectionUsageError,
    ConnectionLost,
    LimitExceeded,
    MalformedMessage,
    NotInSnapshot,
)
from sdk.sync.collection.machine import (
    MAX_QUEUED_REQUESTS,
    OUTPUT_BUDGET,
    CollectionMachine,
    Drain,
)
from sdk.sync.collection.messages import (
    BlobRef,
    CommitPart,
    CreateSnapshotRequest,
    ErrorResponse,
    FetchBlobPartResponse,
    FetchSedimentreeRequest,
    ListenRequest,
    ListenResponse,
    MessageLimits,
    Notification,
    Request,
    Response,
    UploadItem,
    decode_message,
    encode_message,
)
from sdk.sync.framing import FrameDecoder, encode_frame

KEY = b"k" * 16
SNAPSHOT = b"s" * 16


def ids() -> itertools.count[int]:
    return itertools.count(1)


def machine(**kwargs: object) -> CollectionMachine:
    numbers = ids()
    return CollectionMachine(new_id=lambda: next(numbers).to_bytes(16, "big"), **kwargs)  # type: ignore[arg-type]


def frame(message: Request | Response | Notification) -> bytes:
    return encode_frame(encode_message(message))


def sent(m: CollectionMachine) -> list[object]:
    return [decode_message(f) for f in FrameDecoder(1 << 24).feed(m.data_to_send())]


def request(n: int) -> Request:
    return Request(n.to_bytes(16, "big"), FetchSedimentreeRequest(KEY))


def notification(n: int) -> Notification:
    return Notification("node", KEY, UploadItem(BlobRef(data=b"x"), CommitPart(bytes([n]) * 32)))


def test_a_response_is_matched_to_its_request() -> None:
    m = machine()
    ours = request(7)
    m.send(ours, now=0)
    assert sent(m) == [ours]
    answer = Response(ours.request_id, FetchBlobPartResponse(b"blob"))
    m.receive_data(frame(answer), now=5)
    assert m.next_event() == answer
    assert m.error is None and m.get_timer() is None
    with pytest.raises(CollectionUsageError):
        m.send(request(8), now=6)
        m.send(request(8), now=6)  # the same id twice while outstanding
    # The same id again once answered is a response to nothing.
    m.receive_data(frame(answer), now=7)
    assert isinstance(m.error, CollectionProtocolError)


def test_an_unanswered_request_times_out() -> None:
    m = machine(timeout_ms=1000)
    m.send(request(1), now=100)
    m.send(request(2), now=600)
    assert m.get_timer() == 1100
    m.receive_data(frame(Response(request(1).request_id, FetchBlobPartResponse(b""))), now=900)
    assert m.get_timer() == 1600  # the first is answered: the second's deadline
    m.handle_timer(1599)
    assert m.error is None
    m.handle_timer(1600)
    assert isinstance(m.error, ConnectionLost)


def test_an_abandoned_request_neither_times_out_nor_breaks_the_connection() -> None:
    m = machine(timeout_ms=1000)
    m.send(request(1), now=0)
    m.abandon(request(1).request_id)
    assert m.get_timer() is None
    m.receive_data(frame(Response(request(1).request_id, ErrorResponse("late"))), now=5000)
    assert m.error is None and m.next_event() is None


def test_notifications_are_bounded_and_only_taken_while_listening() -> None:
    m = machine(max_pending_notifications=2)
    m.receive_data(frame(notification(1)), now=0)
    assert isinstance(m.error, NotInSnapshot)
    m = machine(max_pending_notifications=2)
    m.listen(SNAPSHOT, now=0)
    m.receive_data(frame(notification(1)) + frame(notification(2)), now=1)
    assert m.error is None
    assert m.take_notification() == notification(1)
    m.receive_data(frame(notification(3)), now=2)
    assert m.error is None
    m.receive_data(frame(notification(4)), now=3)  # three unread
    assert isinstance(m.error, LimitExceeded)


def test_a_frame_over_the_limit_ends_the_connection() -> None:
    m = machine(limits=MessageLimits(max_message_bytes=100))
    m.receive_data(encode_frame(b"\x00" * 101)[:10], now=0)
    assert isinstance(m.error, LimitExceeded)


def test_a_peer_that_does_not_read_our_answers_stops_being_read() -> None:
    m = machine(serving=True)
    m.receive_data(b"".join(frame(request(n)) for n in range(MAX_QUEUED_REQUESTS)), now=0)
    assert not m.wants_data  # the queue of its requests is full
    work = m.next_request()
    assert work == request(0)
    assert m.wants_data
    big = Response(request(0).request_id, FetchBlobPartResponse(b"b" * OUTPUT_BUDGET))
    m.request_done(work, big, now=1)
    assert m.next_request() is None  # the answer is not written yet: no more work
    assert sent(m) == [big]
    assert m.next_request() == request(1)
    assert m.stats.requests_served == 1


def test_a_side_that_does_not_serve_refuses_every_request() -> None:
    m = machine()
    m.receive_data(frame(request(3)), now=0)
    assert m.next_request() is None and m.error is None
    (answer,) = sent(m)
    assert isinstance(answer, Response) and isinstance(answer.body, ErrorResponse)


def test_a_snapshot_request_waits_for_the_pull_back() -> None:
    m = machine(serving=True, pull_back=True)
    ask = Request(b"q" * 16, CreateSnapshotRequest(KEY))
    m.receive_data(frame(ask), now=0)
    assert m.next_event() == ask
    assert m.next_request() is None  # not answered until the application says so
    m.serve(ask)
    assert m.next_request() == ask


def test_a_dropped_listener_ends_the_serving_connection() -> None:
    m = machine(serving=True)
    assert m.next_request() is None
    m.notify()
    assert m.next_request() == Drain()
    m.request_done(Drain(), ([encode_message(notification(1))], False), now=0)
    assert sent(m) == [notification(1)] and m.error is None
    m.notify()
    m.request_done(m.next_request(), ([], True), now=1)
    assert isinstance(m.error, ConnectionLost)


def test_a_quiet_listener_repeats_its_listen_request() -> None:
    m = machine(keepalive_ms=1000, timeout_ms=500)
    assert m.get_timer() is None  # not listening: nothing to keep alive
    m.listen(SNAPSHOT, now=0)
    assert m.get_timer() == 1000
    m.listen(None, now=0)
    m.receive_data(frame(Response(b"x" * 16, ListenResponse())), now=0)
    assert isinstance(m.error, CollectionProtocolError)  # nobody asked
    m = machine(keepalive_ms=1000, timeout_ms=500)
    m.listen(SNAPSHOT, now=0)
    m.receive_data(frame(notification(1)), now=600)  # traffic puts it off
    assert m.get_timer() == 1600
    m.handle_timer(1600)
    (keepalive,) = sent(m)
    assert isinstance(keepalive, Request) and keepalive.body == ListenRequest(SNAPSHOT)
    assert m.get_timer() == 2100  # its answer is due within the request timeout
    m.receive_data(frame(Response(keepalive.request_id, ListenResponse())), now=1700)
    assert m.next_event() is None and m.error is None  # the machine's own: no event
    assert m.get_timer() == 2700
    m.handle_timer(2700)
    assert len(sent(m)) == 1
    m.handle_timer(3200)  # the peer is gone: the keepalive is not answered
    assert isinstance(m.error, ConnectionLost)


def test_a_refused_keepalive_ends_the_connection() -> None:
    m = machine(keepalive_ms=1000)
    m.listen(SNAPSHOT, now=0)
    m.handle_timer(1000)
    (keepalive,) = sent(m)
    assert isinstance(keepalive, Request)
    m.receive_data(frame(Response(keepalive.request_id, ErrorResponse("UnknownSnapshot"))), 1001)
    assert isinstance(m.error, CollectionProtocolError)


def test_unsupported_requests_are_refused_and_garbage_ends_the_connection() -> None:
    m = machine(serving=True)
    m.receive_data(encode_frame(b"\x00" + b"q" * 16 + b"\x03\x00"), now=0)  # upload blob
    (answer,) = sent(m)
    assert isinstance(answer, Response) and answer.request_id == b"q" * 16
    assert isinstance(answer.body, ErrorResponse) and m.next_request() is None
    m.receive_data(encode_frame(b"\xff\x00"), now=1)
    assert isinstance(m.error, MalformedMessage)
