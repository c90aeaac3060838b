"""A store node says which channels it archives: a query naming another channel is
NOT_FOUND with a detail saying so (``store_node/service.py``), which the client raises
as :class:`~sdk.store.errors.NotArchived`, never an empty page."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from sdk._proto.store.v1 import store_pb2, store_pb2_grpc
from sdk.store.errors import NotArchived, StoreQueryError
from sdk.store.grpc import GrpcStoreClient
from store_node.config import NodeConfig
from store_node.node import StoreNode
from tests.store_node.store_node_helpers import FeedTransport, node_config, sds_message, wait_for
from transports.base import message_hash, topic_for_channel


async def test_a_channel_the_node_does_not_archive_is_not_found(tmp_path: Path) -> None:
    transport = FeedTransport()
    config = node_config(tmp_path)  # archives "c" and "d"
    assert isinstance(config, NodeConfig)
    node = StoreNode(config, transport=transport)
    await node.start()
    try:
        payload = sds_message("c", 1)
        await transport.publish(topic_for_channel("c"), payload)
        await wait_for(lambda: node.metrics.value("chorus_store_ingest_archived_total") >= 1)
        target = f"127.0.0.1:{node.grpc_port}"
        async with GrpcStoreClient(target) as client:
            with pytest.raises(NotArchived) as raised:
                [page async for page in client.messages_between("lobby", 0)]
            assert raised.value.code == "NOT_FOUND" and raised.value.channel_id == "lobby"
            assert "does not archive channel 'lobby'" in raised.value.detail
            with pytest.raises(NotArchived):
                await client.get_messages("lobby", ["some-id"])
            # An archived channel with nothing in the range is an empty answer, not an error.
            assert [p async for p in client.messages_between("d", 0)] == [[]]
            assert [p async for p in client.messages_between("c", 0)] == [[payload]]
            # A lookup by hash in every channel names none: answered as before.
            hint = message_hash(topic_for_channel("c"), payload)
            assert [m.data for m in await client.lookup_hashes([hint])] == [payload]
        # The status itself, for clients other than ours.
        async with grpc.aio.insecure_channel(target) as channel:
            stub = store_pb2_grpc.StoreStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError) as rpc:
                await stub.Query(store_pb2.StoreQueryRequest(channel_id="lobby", time_start=0))
            assert rpc.value.code() is grpc.StatusCode.NOT_FOUND
        assert issubclass(NotArchived, StoreQueryError)
    finally:
        await node.stop()
