"""Directory and file plumbing shared by the page log's writer and readers: names, listing, the
writer's lock, durable creation, and the read of one body."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from prerender_ray.storage.pagelog.records import (
    PageLogError,
    PageLogFull,
    body_checksum,
    index_name,
    parse_name,
    segment_name,
)

Write = Callable[[int, bytes, int], int]  # os.pwrite's shape: (fd, data, offset) -> bytes written
Sync = Callable[[int], None]  # os.fdatasync's shape
_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_full(e: OSError) -> bool:
    return e.errno in _FULL


def failure(what: str, e: OSError, committed: int = 0) -> PageLogError:
    """The typed error for a failed write: PageLogFull when the disk is full, else PageLogError."""
    msg = f"{what}: {e.strerror or e}"
    return PageLogFull(msg, committed) if is_full(e) else PageLogError(msg)


def generations(path: Path) -> list[int]:
    return sorted(g for name in os.listdir(path) if (g := parse_name(name, "index-", ".log")) is not None)


def segments(path: Path) -> list[int]:
    return sorted(s for name in os.listdir(path) if (s := parse_name(name, "seg-", ".dat")) is not None)


def index_path(path: Path, generation: int) -> Path:
    return path / index_name(generation)


def segment_path(path: Path, segment: int) -> Path:
    return path / segment_name(segment)


def lock(path: Path) -> int:
    """The one-writer lock (flock on ``LOCK``): a second writer is refused, never let in beside the
    first. Released by the kernel when the process dies."""
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise PageLogError(f"page log {path} already has a writer") from None
    return fd


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(write: Write, fd: int, data: bytes, offset: int) -> int:
    """Write ``data`` at ``offset`` whole; returns the bytes written before an OSError, which is
    raised with ``written`` set on it (a short write is continued, as write(2) allows)."""
    done = 0
    view = memoryview(data)
    while done < len(data):
        try:
            n = write(fd, bytes(view[done:]) if done else data, offset + done)
        except OSError as e:
            e.written = done  # type: ignore[attr-defined]
            raise
        if n <= 0:
            err = OSError(errno.EIO, "write returned no progress")
            err.written = done  # type: ignore[attr-defined]
            raise err
        done += n
    return done


def create_durable(path: Path, final: Path, data: bytes, write: Write, fsync: Sync, sync: bool) -> None:
    """``final`` with ``data``, or nothing: written to ``path``, synced, renamed, directory synced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(write, fd, data, 0)
        if sync:
            fsync(fd)
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(path, final)
    if sync:
        sync_dir(final.parent)


def read_body(fd: int, offset: int, length: int, checksum: int) -> bytes | None:
    """The body at ``offset``, or None when it is short or its checksum does not match."""
    data = os.pread(fd, length, offset)
    if len(data) != length or body_checksum(data) != checksum:
        return None
    return data


COMPLETE = "COMPLETE"  # made once the log holds every page its store holds (a first build ended)


def is_complete(path: Path) -> bool:
    """Readers follow a log only once it is complete: a log being built from the store anew (a first
    start on pages written before the log, or one rebuilt after damage) would answer misses for pages
    the store holds."""
    return (path / COMPLETE).exists()


def mark_complete(path: Path) -> None:
    if not is_complete(path):
        create_durable(path / (COMPLETE + ".tmp"), path / COMPLETE, b"", os.pwrite, os.fdatasync, True)


def unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
