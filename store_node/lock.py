"""One store node per archive: an exclusive lock held for the node's lifetime.

Two nodes writing one archive would both ingest, both run retention and answer
queries from a store that changes under them. The lock makes the second one
fail at start with a one-line error instead:

- SQLite: :func:`fcntl.flock` on a ``<archive>.lock`` file next to the database.
  ``flock`` locks are independent of the POSIX record locks SQLite takes on the
  database itself, so readers (``store-node export``, ``stats``) are unaffected;
  the kernel drops the lock when the process dies, even by ``kill -9``.
- PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) keyed by the
  archive's schema, on a connection kept open while the node runs; the server
  drops it when that connection ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Any

from store_node.config import ArchiveConfig
from store_node.errors import ArchiveLocked, ArchiveUnavailable


def lock_key(schema: str) -> int:
    """The signed 64-bit advisory-lock key of a PostgreSQL archive schema."""
    digest = hashlib.sha256(b"chorus-store-node:" + schema.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class ArchiveLock:
    """Held while a store node owns an archive; :meth:`acquire` raises if another does."""

    def __init__(self, config: ArchiveConfig) -> None:
        self.config = config
        self._fd: int | None = None
        self._conn: Any = None

    @property
    def path(self) -> Path:
        """The lock file of a SQLite archive."""
        return self.config.path.with_name(self.config.path.name + ".lock")

    def acquire(self) -> ArchiveLock:
        """Take the lock or raise :class:`~store_node.errors.ArchiveLocked`."""
        if self.config.backend == "sqlite":
            self._acquire_file()
        else:
            self._acquire_advisory()
        return self

    def _acquire_file(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ArchiveUnavailable(f"cannot open lock file {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ArchiveLocked(
                f"archive {self.config.path} is in use by another store node (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _acquire_advisory(self) -> None:
        import psycopg

        try:
            conn = psycopg.connect(self.config.dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise ArchiveUnavailable(f"cannot connect to PostgreSQL: {exc}") from None
        row = conn.execute(
            "SELECT pg_try_advisory_lock(%s)", (lock_key(self.config.schema),)
        ).fetchone()
        if not row or not row[0]:
            conn.close()
            raise ArchiveLocked(
                f"archive schema {self.config.schema!r} is in use by another store node"
            )
        self._conn = conn

    def release(self) -> None:
        """Give the lock up; idempotent."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def __enter__(self) -> ArchiveLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
