"""Stopping background tasks without losing the caller's own cancellation.

Every adapter, runtime and service here owns a few background tasks (readers,
writers, timers) and stops them on close. The obvious way to do that,
``task.cancel(); with suppress(CancelledError): await task``, has a trap: if
the *closing* task is itself cancelled while it waits, the ``suppress``
swallows that cancellation too, and the closer carries on as if nobody had
asked it to stop (a service loop cancelled during a session close then syncs
forever, and whoever awaits it hangs). :func:`cancel_and_wait` waits with
:func:`asyncio.wait`, which never raises the children's ``CancelledError``
into the caller but does raise the caller's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any] | None],
    timeout: float | None = None,
) -> None:
    """Cancel ``tasks`` (``None`` entries are skipped) and wait until they have ended.

    A task that ends with an exception other than cancellation has it retrieved
    (no "exception was never retrieved" warning) and dropped: the closer has
    nothing useful to do with it. With ``timeout`` (seconds), tasks that have not
    ended by then are left behind, still cancelled. The calling task's own
    cancellation always propagates.
    """
    pending = {t for t in tasks if t is not None and t is not asyncio.current_task()}
    for task in pending:
        task.cancel()
    if not pending:
        return
    done, _ = await asyncio.wait(pending, timeout=timeout)
    for task in done:
        if not task.cancelled():
            task.exception()


__all__ = ["cancel_and_wait"]
