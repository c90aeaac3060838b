"""Bamboo point-to-point: replicate ranges of Bamboo logs between two endpoints.

The protocol of ``specs/bamboo-point-2-point.md`` as a sans-I/O machine
(:class:`~sdk.sync.bamboo_p2p.machine.BambooMachine`: bytes in, bytes out, events,
and requests for its store), and :class:`Endpoint`: the machine with its requests
carried out on a store at once. See ``docs/bamboo-p2p.md``.

::

    a = Endpoint(Role.PROACTIVE, store_a)          # the side that connected
    b = Endpoint(Role.REACTIVE, store_b)
    b.receive_data(a.data_to_send()); a.receive_data(b.data_to_send())
    a.propose((author, log_id), start=1, end=100)  # once b granted credit
    ...                                            # keep exchanging bytes
    while (event := a.next_event()) is not None: ...
"""

from __future__ import annotations

from sdk.sync.bamboo_p2p import (
    certpool,
    codec,
    endpoint,
    errors,
    events,
    framing,
    messages,
    setup,
    store,
)
from sdk.sync.bamboo_p2p.certpool import *  # noqa: F403
from sdk.sync.bamboo_p2p.codec import *  # noqa: F403
from sdk.sync.bamboo_p2p.endpoint import *  # noqa: F403
from sdk.sync.bamboo_p2p.entries import is_end_of_log, sign_log_entry
from sdk.sync.bamboo_p2p.errors import *  # noqa: F403
from sdk.sync.bamboo_p2p.events import *  # noqa: F403
from sdk.sync.bamboo_p2p.framing import *  # noqa: F403
from sdk.sync.bamboo_p2p.machine import BambooMachine
from sdk.sync.bamboo_p2p.messages import *  # noqa: F403
from sdk.sync.bamboo_p2p.setup import *  # noqa: F403
from sdk.sync.bamboo_p2p.sqlite_store import SqliteLogStore
from sdk.sync.bamboo_p2p.store import *  # noqa: F403

__all__ = [
    "BambooMachine",
    "SqliteLogStore",
    "is_end_of_log",
    "sign_log_entry",
]
# Every public name of these modules (the typing spec's form of a re-export).
__all__ += certpool.__all__
__all__ += codec.__all__
__all__ += endpoint.__all__
__all__ += errors.__all__
__all__ += events.__all__
__all__ += framing.__all__
__all__ += messages.__all__
__all__ += setup.__all__
__all__ += store.__all__
