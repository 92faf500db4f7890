"""One writer per run folder: a second process (or monitor) writing the same `log_dir` is refused.

TensorBoard's Python loader follows only the newest event file of a folder, so two live writers interleaving
files lose one of them in the tab. The lock is an `flock` on `rnnmon.lock` in the run folder: the kernel
releases it when its process dies, however it dies.

Example:
    >>> lock = RunLock("runs/exp1/rnnmon")
    >>> lock.acquire()      # RuntimeError naming the holder when another writer has it
    >>> lock.release()
    >>> writer_alive("runs/exp1/rnnmon")    # a reader asks before it builds a missing index
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

LOCK_FILE = "rnnmon.lock"


class RunLock:
    """An exclusive, non-blocking lock on one run folder."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self, own_finish_wait_s: float = 5.0) -> None:
        """Take the lock; a monitor of this same process that is still finishing gets `own_finish_wait_s` to end."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        deadline = time.monotonic() + own_finish_wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                if holder == str(os.getpid()) and time.monotonic() < deadline:
                    time.sleep(0.02)  # e.g. an aborted fit's monitor, ended by its background thread, still writing
                    continue
                os.close(fd)
                raise RuntimeError(f"another monitor (pid {holder}) is writing {os.path.dirname(self.path)}; "
                                   f"give each process its own log_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing drops the flock
            self._fd = None


def writer_alive(run_dir: str) -> bool:
    """A monitor holds the lock of `run_dir` now (it writes the index of its own files). Never creates the lock."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
