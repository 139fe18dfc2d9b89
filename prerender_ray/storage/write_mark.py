"""A store's write mark: an 8-byte count of its writes in a file beside its RocksDB directory, mapped
by the one writer and by readers in other processes.

A secondary instance sees the primary's writes only after ``try_catch_up_with_primary()``, which
costs about 0.7 ms even when nothing changed (and holds the GIL: a thread would not free the event
loop). The mark tells a reader without a catch-up whether one would show it anything new: the writer
bumps it after each write returned, so a reader that reads value ``m`` and then catches up sees every
write whose bump it could have read. A reader that remembers the value it read before its last
catch-up is current while the mark still holds it (``!=``, never ``<``: any change means "catch up").

The value is one aligned 8-byte word, stored and loaded whole through a ``memoryview`` cast to ``Q``
(a single machine store and load on x86-64 and arm64). A new file starts at a random value, so a
reader that outlived its store's directory cannot take a new count for the one it saw.
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
from pathlib import Path

SIZE = 8
_MASK = (1 << 64) - 1


def mark_path(db_path: str | os.PathLike) -> Path:
    """Beside the directory, not in it: RocksDB owns what is inside."""
    return Path(f"{os.fspath(db_path)}.mark")


class WriteMark:
    __slots__ = ("_ino", "_lock", "_mm", "_word", "path", "writer")

    def __init__(self, path: Path, fd: int, *, writer: bool):
        self.path = path
        self.writer = writer
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writer else 0)
        self._mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, prot)
        self._word = memoryview(self._mm).cast("Q")
        self._ino = os.fstat(fd).st_ino
        self._lock = threading.Lock()

    @classmethod
    def publish(cls, db_path: str | os.PathLike) -> WriteMark:
        """The writer's mark: the file as it is (the count goes on from a restart), or a new one at a
        random value, whole before anyone can open it (written aside, then renamed)."""
        path = mark_path(db_path)
        try:
            fd = os.open(path, os.O_RDWR)
            if os.fstat(fd).st_size != SIZE:
                os.close(fd)
                raise FileNotFoundError(path)
        except FileNotFoundError:
            aside = path.with_name(f"{path.name}.{os.getpid()}.new")
            aside.write_bytes(secrets.randbits(63).to_bytes(SIZE, "little"))
            os.replace(aside, path)
            fd = os.open(path, os.O_RDWR)
        try:
            return cls(path, fd, writer=True)
        finally:
            os.close(fd)

    @classmethod
    def follow(cls, db_path: str | os.PathLike) -> WriteMark | None:
        """A reader's view of the writer's mark; None while there is none (the writer never opened)."""
        path = mark_path(db_path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size != SIZE:
                return None
            return cls(path, fd, writer=False)
        finally:
            os.close(fd)

    def value(self) -> int:
        return self._word[0]

    def bump(self) -> None:
        """After a write returned. Locked: two threads' read-modify-write must not collapse into one
        bump, or a reader could take the first bump for the second write as well."""
        with self._lock:
            self._word[0] = (self._word[0] + 1) & _MASK

    def replaced(self) -> bool:
        """The file at the path is not the one mapped (removed or made again): follow it anew."""
        try:
            return os.stat(self.path).st_ino != self._ino
        except OSError:
            return True

    def close(self) -> None:
        self._word.release()
        self._mm.close()
