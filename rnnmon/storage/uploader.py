"""Uploads a run folder from its local staging copy to object storage, on a background thread.

Object stores cannot append, so the writer writes the run's files locally (the staging folder) and this thread
puts whole files beside each other under the remote run folder: every file of the folder (event files, and any
other file written there: profiles, reading indexes), each whole, once it changed, in passes at most once per
`interval_s` (the growing event file is re-put at that bounded rate; a finished segment is put once more after
its last write). A run's reading index (`rnnmon-index/`) goes with every `INDEX_EVERY`-th pass and the last,
before the event files and its digest after its other files, so the bucket's index never names events its copy
of the event file lacks; readers read the events after it from the event file. Training never waits for it: each
request has a deadline (`remote.TIMEOUT_S`), and each put one in all (`remote.bounded`: a request that outlasts
its own deadline is given up).

A failure (network down, throttled bucket, expired token) logs one warning, then the pass is retried with
backoff (up to `MAX_BACKOFF_S`); the files stay in the staging folder, so nothing written is lost. The next good
pass logs the recovery. `close()` asks for a last pass, retried for `FINAL_RETRY_S` while the process lives; when the
main thread ends (the process exits) the last pass gets at most `EXIT_WAIT_S`. Files still not uploaded then are
named in one warning and left in the staging folder, which a later monitor of the same log directory on this host
uploads. Uploaded files are removed from staging at the end.

Example:
    >>> up = Uploader("/tmp/rnnmon-staging/exp1-…/rnnmon", "s3://bucket/exp1/rnnmon")
    >>> up.start()
    >>> ...                                  # the writer writes into the staging folder
    >>> up.close()                           # a last pass in the background; `wait(s)` to wait for it
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from typing import Any

from rnnmon.format.digest_file import DIGEST_FILE
from rnnmon.format.eventfile import NotRegularFileError, open_regular
from rnnmon.format.index import INDEX_DIR
from rnnmon.storage import remote

LOG = logging.getLogger("rnnmon")
INTERVAL_S = 30.0  # each file is put at most once per this (the growing segment's bounded rate)
MAX_BACKOFF_S = 60.0
EXIT_WAIT_S = 30.0  # at the process's exit, the longest the last uploads are waited for (RNNMON_UPLOAD_EXIT_WAIT_S)
FINAL_RETRY_S = 600.0  # after the end of a fit (the process lives on), the last pass is retried this long
INDEX_EVERY = 10  # the reading index is put with every 10th pass (and the last): readers read the tail after it
SKIPPED = ("rnnmon.lock",)  # the local writer's lock: it means nothing on another host


class Uploader:
    """Puts the files of `local_dir` under `url`, changed ones only, each at most once per `interval_s`."""

    def __init__(self, local_dir: str, url: str, interval_s: float = INTERVAL_S, poll_s: float = 1.0) -> None:
        self.local_dir, self.url, self.shown = local_dir, url, remote.redact(url)
        self.interval_s, self._poll_s = interval_s, poll_s
        remote.require(url)  # a missing extra fails here, at the fit's start; the client is built on the thread
        self._fs: Any = None  # (finding credentials may ask a metadata server: never on the training thread)
        self._root = ""
        self._put: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime ns) last uploaded
        self._last_pass = -1e18  # monotonic time of the last pass that put what was due
        self._passes = 0  # passes that put what was due: every INDEX_EVERY-th (from the first) puts the indexes too
        self._failing = False
        self._refused: set[str] = set()  # paths warned about: not regular files
        self._given_up = False  # the last pass was given up after `close()`, with a warning
        self._closing = threading.Event()
        self._done = threading.Event()
        self.failures = 0  # passes that failed
        # a daemon, waited for at the interpreter's exit before it shuts down what a request needs (threads for
        # name lookups), as concurrent.futures waits for its workers: a pass that hangs (a request past its
        # deadline, a read) holds the exit EXIT_WAIT_S at most, never for good
        self._thread = threading.Thread(target=self._run, name="rnnmon-upload", daemon=True)

    def start(self) -> None:
        self._thread.start()
        threading._register_atexit(self._wait_at_exit)  # the hook concurrent.futures uses

    def _wait_at_exit(self) -> None:
        """At the interpreter's exit: the thread has `exit_wait_s()` for its last pass (it sees the main thread
        gone within `poll_s`); then one warning names what stays in staging, and the exit goes on."""
        self._thread.join(exit_wait_s() + self._poll_s + 1.0)
        if not self._done.is_set() and not self._given_up:
            LOG.warning("rnnmon: %d file(s) were not uploaded to %s within %.0f s of the exit%s; they are kept in %s "
                        "(a later monitor of this log directory on this host uploads them).", len(self.pending()),
                        self.shown, exit_wait_s(), " (a request or a read hangs)" if self._thread.is_alive() else "",
                        self.local_dir)

    def close(self) -> None:
        """Ask for the last pass (every changed file, whatever its interval); returns at once."""
        self._closing.set()

    def wait(self, timeout_s: float) -> bool:
        """Wait for the last pass at most `timeout_s`; True once everything is uploaded."""
        return self._done.wait(timeout_s)

    def pending(self) -> list[str]:
        """Files of the staging folder not uploaded as they are now."""
        return [rel for rel, key in self._files() if self._put.get(rel) != key]

    # --- the thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        """Passes every `poll_s` until `close()` or the end of the main thread (the process exits), then the last
        pass, retried with backoff for `FINAL_RETRY_S` after `close()` or `EXIT_WAIT_S` once the process exits."""
        backoff, deadline = 1.0, None
        while True:
            exiting = not threading.main_thread().is_alive()
            final = exiting or self._closing.is_set()
            if final:
                limit = time.monotonic() + (exit_wait_s() if exiting else FINAL_RETRY_S)
                deadline = limit if deadline is None else min(deadline, limit)
            if self._pass(final):
                backoff = 1.0
                if final:
                    self._cleanup()
                    self._done.set()
                    return
                self._pause(self._poll_s)
                continue
            if final and time.monotonic() + backoff > deadline:
                if exiting:
                    return  # `_wait_at_exit` names what stays
                self._given_up = True
                LOG.warning("rnnmon: %d file(s) were not uploaded to %s; they are kept in %s (a later monitor of "
                            "this log directory on this host uploads them).", len(self.pending()), self.shown,
                            self.local_dir)
                return
            if final:
                time.sleep(backoff)
            else:
                self._pause(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or until `close()` or the end of the main thread (looked at every `poll_s`)."""
        end = time.monotonic() + seconds
        while not self._closing.is_set() and threading.main_thread().is_alive():
            left = end - time.monotonic()
            if left <= 0:
                return
            self._closing.wait(min(left, self._poll_s))

    def _pass(self, final: bool) -> bool:
        """Upload what changed (and is due, unless `final`); False after a failure."""
        now = time.monotonic()
        try:
            if self._fs is None:
                self._fs, self._root = remote.filesystem(self.url)
            if not final and now - self._last_pass < self.interval_s:
                return True
            indexes = final or self._passes % INDEX_EVERY == 0
            for rel, key in self._files():
                if self._put.get(rel) == key or (_in_index(rel) and not indexes):
                    continue
                data = _read_regular(os.path.join(self.local_dir, rel), key[0])
                if data is None:
                    continue  # swapped for a link or a FIFO since the walk
                remote.bounded(self._fs, "pipe_file", remote.join(self._root, rel), data)
                self._put[rel] = (len(data), key[1])
            self._last_pass, self._passes = now, self._passes + 1
        except Exception as error:
            self.failures += 1
            if not self._failing:
                self._failing = True
                LOG.warning("rnnmon: cannot upload to %s (%s); the run is kept in %s and uploaded when the storage "
                            "answers again (retrying with backoff).", self.shown, _describe(error, self.url),
                            self.local_dir)
            return False
        if self._failing:
            self._failing = False
            LOG.warning("rnnmon: uploading to %s again; nothing was lost.", self.shown)
        return True

    def _files(self) -> list[tuple[str, tuple[int, int]]]:
        """(relative path, (size, mtime ns)) of every regular file under the folder: the reading indexes first, then
        the others, each oldest change first. The writer writes an event file before its index, so an index put
        before its event file never names events the bucket's copy lacks (a reader would set it aside). Anything
        else (a link, whatever it points to; a FIFO; a device) is never read: one warning names it."""
        found = []
        for folder, _, names in os.walk(self.local_dir):
            for name in names:
                if name in SKIPPED:
                    continue
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode):
                        self._refuse(path)
                        continue
                    found.append((st.st_mtime_ns, os.path.relpath(path, self.local_dir), st.st_size))
        # the index's files, its digest last (its last record says how far every directory put before it is
        # whole: rnnmon.format.digest_file.covered_through), then the rest, each group oldest first
        return [(rel, (size, mtime)) for *_, mtime, rel, size in sorted(
            (not _in_index(rel), os.path.basename(rel) == DIGEST_FILE, mtime, rel, size) for mtime, rel, size in found)]

    def _refuse(self, path: str) -> None:
        if path not in self._refused:
            self._refused.add(path)
            LOG.warning("rnnmon: %s is not uploaded: only regular files of the staging folder are (it is a link, "
                        "a FIFO or a device).", path)

    def _cleanup(self) -> None:
        """Remove the uploaded files from staging (what was not uploaded stays)."""
        for rel, key in self._files():
            if self._put.get(rel) == key:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.local_dir, rel))


def _read_regular(path: str, size: int) -> bytes | None:
    """At most `size` bytes of the regular file at `path` (the size the walk saw: never a longer, half-written
    tail), opened without following a link and without blocking; None where it is not a regular file."""
    try:
        fd = open_regular(path, follow_links=False)
    except NotRegularFileError:
        return None
    try:
        size = min(size, os.fstat(fd).st_size)
        data = bytearray()
        while len(data) < size:
            piece = os.read(fd, min(size - len(data), 1 << 20))
            if not piece:
                break
            data += piece
        return bytes(data)
    finally:
        os.close(fd)


def exit_wait_s() -> float:
    """How long the process's exit waits for the last uploads: `RNNMON_UPLOAD_EXIT_WAIT_S`, else `EXIT_WAIT_S`."""
    try:
        return max(float(os.environ.get("RNNMON_UPLOAD_EXIT_WAIT_S", EXIT_WAIT_S)), 0.0)
    except ValueError:
        return EXIT_WAIT_S


def _in_index(rel: str) -> bool:
    return rel.split("/", 1)[0] == INDEX_DIR


def _describe(error: BaseException, url: str) -> str:
    """`Type: message` of an upload error, without the URL's credentials and at most 300 characters."""
    text = f"{type(error).__name__}: {error}".replace(url, remote.redact(url))
    return text[:300]
