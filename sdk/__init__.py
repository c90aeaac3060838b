"""Chorus SDK: reliable group chat over plain pub/sub.

``sdk.sds`` is the pure SDS protocol core (no I/O, no asyncio, time passed in).
The asyncio runtime, persistence, store client and document layer sit beside it.
"""
