"""The tab's alert thresholds: one JSON file at the root of TensorBoard's log directory, read and saved.

The file is `rnnmon.alerts.thresholds_file`'s: a running monitor looks for it in its own log directory and up to
`LEVELS_UP` folders above, and switches to it within one flush (see `rnnmon.alerts.delivery`), so saving it here
reaches every run up to that many folders below the root. What is the tab's own is here: where it saves, the
version a save must edit (two tabs never undo each other's edits), and why saving may be off.

Saving is the only write the plugin ever does, so checking whether it can save writes nothing: it is refused, with
the reason, for a log directory that is not a local folder (`gs://...`), for TensorBoard started with
`--logdir_spec` (no single root), for a folder on a read-only file system or without write permission
(`os.access`, which answers for root too on a read-only mount; root may write into a `chmod 555` folder, and so
may the tab), and when the file's path is taken by something that is not a file. What no check can foresee (a
pseudo file system such as `/proc`, a full disk) fails at the write itself, with the operating system's reason.

Example:
    >>> store = ThresholdsStore("runs")
    >>> store.read()["source"]
    'defaults'
    >>> store.save({"gpu_util_low": {"pct": 10, "resolve_pct": 15}})["source"]
    'file'
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from rnnmon.alerts.thresholds import Thresholds
from rnnmon.alerts.thresholds_file import (
    LEVELS_UP,
    MAX_FILE_BYTES,
    THRESHOLDS_FILE,
    load_thresholds_file,
    save_thresholds_file,
)
from rnnmon.format.eventfile import open_regular


class NotWritableError(Exception):
    """The thresholds file cannot be written; the message says where and why."""


class StaleVersionError(Exception):
    """A save that edits an older version of the file than the one on disk."""


_SAVE_LOCK = threading.Lock()  # one compare-and-save at a time (TensorBoard serves requests on threads)


class ThresholdsStore:
    """The thresholds file of the log directory `logdir` (None or "" when TensorBoard has no single one)."""

    def __init__(self, logdir: str | None) -> None:
        self.logdir = logdir or ""
        self.local = bool(self.logdir) and "://" not in self.logdir
        if self.local:
            self.path: str | None = os.path.join(os.path.abspath(os.path.expanduser(self.logdir)), THRESHOLDS_FILE)
        else:
            self.path = f"{self.logdir.rstrip('/')}/{THRESHOLDS_FILE}" if self.logdir else None

    def read(self) -> dict[str, Any]:
        """The `GET /thresholds` answer: the saved thresholds (or the defaults), where, whether saving works, and
        what the tab's form is built from: the rules' schema and how far the file reaches."""
        thresholds, source, error = Thresholds(), "defaults", None
        if self.local and os.path.isfile(self.path):  # never open a folder or a FIFO here (a FIFO would block)
            try:
                saved = load_thresholds_file(self.path)
            except (ValueError, OSError) as problem:
                error = f"The saved thresholds cannot be used (running monitors ignore them): {problem}"
            else:
                if saved is not None:
                    thresholds, source = saved, "file"
        reason = self.unwritable_reason()
        return {"thresholds": thresholds.to_dict(), "source": source, "path": self.path, "writable": reason is None,
                "reason": reason, "error": error, "defaults": Thresholds().to_dict(), "version": self.version(),
                "rules": Thresholds.schema(), "levels_up": LEVELS_UP, "file_name": THRESHOLDS_FILE}

    def version(self) -> str:
        """What a save must say it edits: a digest of the file's bytes, or "none" while there is no file."""
        if not self.local:
            return "none"
        try:  # never blocks: a FIFO (or a link to a device) at the path is no file, so "none"
            with os.fdopen(open_regular(self.path), "rb") as file:
                return hashlib.sha256(file.read(MAX_FILE_BYTES + 1)).hexdigest()[:16]
        except OSError:
            return "none"

    def save(self, data: Any, edits: str | None = None) -> dict[str, Any]:
        """Validate `data` (raises ValueError naming the rule and value) and write it atomically; the new `read()`.

        `edits` is the `version` the editor read: when the file has changed since, StaleVersionError (two tabs
        never undo each other's edits). Raises NotWritableError when the file cannot be written.
        """
        thresholds = Thresholds.from_dict(data)
        reason = self.unwritable_reason()
        if reason is not None:
            raise NotWritableError(reason)
        with _SAVE_LOCK:
            if edits is not None and edits != self.version():
                raise StaleVersionError("The thresholds changed elsewhere since they were loaded: reload them, "
                                        f"then save again. Received: version {edits[:20]!r}")
            try:
                save_thresholds_file(self.path, thresholds)
            except OSError as error:  # became unwritable since the check, or the disk is full
                raise NotWritableError(f"cannot write {self.path}: {error.strerror or error}") from None
        return self.read()

    def unwritable_reason(self) -> str | None:
        """Why the file cannot be saved, or None when it can."""
        if not self.logdir:
            return ("TensorBoard has no single log directory (it was started with --logdir_spec): "
                    "there is no root to save the thresholds file in")
        if not self.local:
            return f"log directory is not a local folder, so the tab does not write to it: {self.logdir}"
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            return f"log directory is not a folder on this machine: {folder}"
        if os.path.lexists(self.path) and not os.path.isfile(self.path):
            return f"the thresholds file cannot be saved: {self.path} exists and is not a file"
        if not os.access(folder, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
            why = "a read-only file system" if _read_only_mount(folder) else "no write permission for TensorBoard"
            return f"log directory is read-only: {folder} ({why})"
        return None


def reaches(run: str) -> bool:
    """Whether the file saved at the log directory's root applies to `run` (`[folders/]rnnmon`, as /runs names
    it): its monitor's log directory is at most `LEVELS_UP` folders below the root."""
    return run.count("/") <= LEVELS_UP


def _read_only_mount(folder: str) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (AttributeError, OSError):  # no statvfs (Windows)
        return False
