"""The driver's hook for a machine changed outside its run (a store listener, the
application): ``wake()`` says so from any thread, and hands nothing out inside a call
into the machine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from sdk.sync.run import MachineRun, no_requests
from transports.stream import memory_pipe

_T = TypeVar("_T")


class Echo:
    """Echoes each read; finishes at ``bye``. Records the thread of each step and
    whether an event was handed out while a step ran."""

    def __init__(self) -> None:
        self.out = b""
        self.events: list[str] = []
        self.threads: set[int] = set()
        self.in_step = False
        self.finished = False
        self.error: Exception | None = None
        self.during_receive: Callable[[], None] = lambda: None

    @property
    def wants_data(self) -> bool:
        return not self.finished

    def receive_data(self, data: bytes, now: int) -> None:
        self.threads.add(threading.get_ident())
        self.in_step = True
        try:
            self.during_receive()  # a store listener firing inside the step
            self.out += data
            self.events.append("received")
            self.finished = not data or data.endswith(b"bye")
        finally:
            self.in_step = False

    def data_to_send(self) -> bytes:
        self.threads.add(threading.get_ident())
        out, self.out = self.out, b""
        return out

    def next_event(self) -> Any | None:
        return self.events.pop(0) if self.events else None

    def get_timer(self) -> int | None:
        return None

    def handle_timer(self, now: int) -> None:
        pass

    def next_request(self) -> Any | None:
        return None

    def request_done(self, request: Any, result: Any, now: int) -> None:
        raise AssertionError


async def test_wake_from_another_thread_lets_the_writer_look_again() -> None:
    ours, theirs, _ = memory_pipe()
    machine = Echo()
    run = MachineRun(machine, ours, no_requests)
    task = asyncio.ensure_future(run.run())
    try:
        await asyncio.sleep(0.05)  # the run is idle: nothing to read, write or time

        def append_elsewhere() -> None:
            machine.out += b"from a thread"
            run.wake()

        thread = threading.Thread(target=append_elsewhere)
        thread.start()
        thread.join()
        got = b""
        async with asyncio.timeout(5):
            while len(got) < len(b"from a thread"):
                got += await theirs.read()
        assert got == b"from a thread"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_wake_inside_a_step_hands_out_nothing_before_the_step_returned() -> None:
    ours, theirs, _ = memory_pipe()
    machine = Echo()
    handed_out: list[tuple[str, bool]] = []
    run = MachineRun(
        machine, ours, no_requests, on_event=lambda e: handed_out.append((e, machine.in_step))
    )
    machine.events.append("before")
    machine.during_receive = run.wake
    await theirs.write(b"bye")
    async with asyncio.timeout(10):
        await run.run()
    assert ("before", False) in handed_out
    assert all(not in_step for _, in_step in handed_out)
