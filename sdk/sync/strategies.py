"""The two strategies of a replication session: set reconciliation and Log-Height.

**Set reconciliation** (mode 1) runs :class:`~sdk.sync.rbsr.Reconciler` over
the sync range, keys ``(public_key, log_id, seq_num)``. Each learned key tells
a log height: a key the peer holds and we lack is its height of that log; one
we hold that it lacks, with no key of that log from the peer, means it lacks
the log. As soon as we know the peer's height of a log is below ours we send
the missing entries (while reconciliation still runs). A log the peer lacks
altogether is sent as soon as a range that holds all of the log's possible
keys (no bound falls inside the log) is settled without a key of it from the
peer (:attr:`~sdk.sync.rbsr.Reconciler.peer_lacks`); the other logs it never
mentioned are sent when reconciliation has finished. Then SyncDone. A peer
that opens with EmptySet holds nothing: we answer with a bare Terminal and send
all our entries of the session's schemas straight away (spec 2.1), as Log-Height
would, without a list of our logs first.

**Log-Height** (mode 0) is aquadoggo's: the responder sends Have, the
initiator answers with its Have and the entries the responder lacks, the
responder sends what the initiator lacks (``strategies/log_height.rs``).

What reads the store (a round answered over the range index, our heights, the logs
of a Have) leaves as a request (:mod:`sdk.sync.session_state`); the strategies go on
when its answer comes back (``_on_reconciled``, ``_on_have_read``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sdk.sync import rbsr
from sdk.sync.errors import LimitExceeded, MalformedMessage, SyncError, UnexpectedEntry
from sdk.sync.events import Phase
from sdk.sync.messages import (
    LOG_PREFIX_SIZE,
    Have,
    Message,
    Mode,
    RangeSync,
    key_item,
    short_bound,
)
from sdk.sync.send_plan import Wanted
from sdk.sync.session_state import ReadHave, Reconcile, Reconciled, Request, Session, SyncConfig


class Strategies:
    """Both strategies, a part of :class:`~sdk.sync.session.Replication` (the session
    manager): they answer a session's messages and queue what it has to send."""

    config: SyncConfig

    if TYPE_CHECKING:

        def _ask(self, request: Request) -> None: ...
        def _abort(self, session: Session, error: SyncError) -> None: ...
        def _send(self, message: Message) -> None: ...
        def _send_entries(self, session: Session, wanted: Iterable[Wanted]) -> None: ...
        def _send_all_above(self, session: Session) -> None: ...
        def _local_done(self, session: Session) -> None: ...
        def _set_phase(self, session: Session, phase: Phase) -> None: ...

    def _reconciler(self, session: Session) -> rbsr.Reconciler:
        """A reconciler for ``session``; the set it reads is given on the store side."""
        return rbsr.Reconciler(
            None,
            branching=self.config.branching,
            threshold=self.config.threshold,
            limits=rbsr.ReconcilerLimits(
                max_round_messages=self.config.max_round_messages,
                max_key_size=48,
            ),
            shorten=short_bound,
            part_threshold=self.config.part_threshold,
            # A peer opening with EmptySet gets our entries, not a list of our logs first.
            keys_for_empty_set=False,
            # A log the peer holds nothing of is sent as soon as that is known, and
            # its key is not sent back: the entries follow.
            group_prefix=LOG_PREFIX_SIZE,
            send_lacking=False,
        )

    def _on_range(self, session: Session, message: RangeSync) -> None:
        reconciler = session.reconciler
        if reconciler is None or reconciler.finished:
            raise UnexpectedEntry("set reconciliation message outside reconciliation", session.id)
        try:
            round_ = reconciler.collect(message.message)
        except rbsr.RoundTooLong as exc:
            raise LimitExceeded(str(exc), session.id) from exc
        except rbsr.ReconcileError as exc:
            raise MalformedMessage(str(exc), session.id) from exc
        if round_ is not None:
            self._ask(Reconcile(session.id, session.schema_ids, reconciler, round_))

    def _on_reconciled(self, session: Session, request: Reconcile, result: Reconciled) -> None:
        """A round was answered (or the opening round made) on the store side."""
        if result.error is not None:
            self._abort(session, MalformedMessage(str(result.error), session.id))
            return
        reconciler = request.reconciler
        for m in result.reply:
            self._send(RangeSync(session.id, m))
        if request.round is None:
            return
        if reconciler.peer_empty and not session.sent_all:
            # Spec 2.1: EmptySet asks for all entries of the requested schemas, at once.
            session.sent_all = True
            self._send_all_above(session)
        self._apply_differences(session, result)
        if reconciler.finished:
            self._reconciled(session)

    def _apply_differences(self, session: Session, result: Reconciled) -> None:
        wanted: list[Wanted] = []
        heights, lacking = session.peer_heights, session.lacking
        for author, log_id, seq in map(key_item, result.remote_only):
            log = (author, log_id)
            heights[log] = max(heights.get(log, 0), seq)
            # Our height: the key we hold that the peer lacks, else the store's.
            mine = lacking.pop(log, None)
            if mine is None:
                mine = result.heights.get(log, 0)
            if mine > seq:
                wanted.append((author, log_id, seq, mine))
        for author, log_id, seq in map(key_item, result.local_only):
            if (author, log_id) not in heights:
                lacking[author, log_id] = seq
        # Logs the peer holds no entry of, known before the end: sent now, not at the end.
        for author, log_id, seq in map(key_item, result.peer_lacks):
            if (author, log_id) not in heights:
                lacking.pop((author, log_id), None)
                wanted.append((author, log_id, 0, seq))
        self._send_entries(session, wanted)

    def _reconciled(self, session: Session) -> None:
        self._set_phase(session, Phase.EXCHANGING)
        # Logs the peer never mentioned a key of: it has none of them (spec 2.2).
        missing = [(author, log_id, 0, seq) for (author, log_id), seq in session.lacking.items()]
        session.lacking.clear()
        self._send_entries(session, missing)
        self._local_done(session)

    def _send_have(self, session: Session) -> None:
        session.sent_have = True
        self._ask(ReadHave(session.id, session.schema_ids))

    def _on_have_read(
        self, session: Session, heights: tuple[tuple[bytes, tuple[tuple[int, int], ...]], ...]
    ) -> None:
        """Our Have was read from the store side: send it."""
        self._send(Have(session.id, heights))
        if not heights:
            # aquadoggo: nothing to offer means done right away (log_height.rs).
            self._local_done(session)

    def _on_have(self, session: Session, have: Have) -> None:
        if session.mode is not Mode.LOG_HEIGHT:
            raise UnexpectedEntry("Have in a set-reconciliation session", session.id)
        if session.received_have:
            raise UnexpectedEntry("Have received twice", session.id)
        count = sum(len(logs) for _, logs in have.log_heights)
        if count > self.config.max_have_logs:
            raise LimitExceeded(f"Have with {count} logs", session.id)
        session.received_have = True
        if not session.sent_have:
            self._send_have(session)
        remote = {(a, log_id): seq for a, logs in have.log_heights for log_id, seq in logs}
        session.peer_heights.update(remote)
        self._set_phase(session, Phase.EXCHANGING)
        self._send_all_above(session)
        self._local_done(session)


__all__ = ["Strategies"]
