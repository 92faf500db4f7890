"""A run's own event files, when TensorBoard reads a local log directory: where they are and when they changed.

With a local `--logdir` the tab reads each run's files through rnnmon's reader: only the bytes written since the
last read, every checksum checked, every value checked before anything is allocated for it. TensorBoard's data
provider instead turns every chunk of the run into an array on every call, before rnnmon sees it. `gs://` and
`s3://` log directories are read the same way from their local mirror (`remote_runs`); other remote ones (hdfs://)
and `--logdir_spec` go through the provider.

Run names are TensorBoard's: the directory relative to the log directory, with "/" between folders, "." for the
log directory itself.

Example:
    >>> files = LocalRuns.of("runs")           # None for "gs://bucket/runs"
    >>> run_dir = files.directory("exp1/rnnmon")   # "/abs/runs/exp1/rnnmon", or None where it is no folder
    >>> files.version(run_dir)                 # changes whenever an event file grows or appears
"""

from __future__ import annotations

import os

from rnnmon.format.eventfile import EVENT_FILE_MARK


def reads_files(logdir: str | None) -> bool:
    """True where the tab reads the runs' event files itself: `--logdir` is a local path (it may not exist yet)."""
    return bool(logdir) and "://" not in logdir


class LocalRuns:
    """The runs of one local log directory."""

    def __init__(self, logdir: str) -> None:
        self.logdir = os.path.abspath(os.path.expanduser(logdir))

    @classmethod
    def of(cls, logdir: str | None) -> LocalRuns | None:
        """The local log directory `logdir`, or None where it is remote or not given (`--logdir_spec`)."""
        return cls(logdir) if reads_files(logdir) else None

    def directory(self, run: str) -> str | None:
        """The folder of `run`, or None where the name is not one of this log directory's folders."""
        if run == ".":
            return self.logdir
        parts = run.split("/")
        if any(part in ("", ".", "..") or os.sep in part for part in parts):
            return None
        path = os.path.join(self.logdir, *parts)
        return path if os.path.isdir(path) else None

    @staticmethod
    def version(run_dir: str) -> tuple[tuple[str, int, int], ...]:
        """(name, size, modification time in ns) of every event file in `run_dir`: equal while nothing was written.

        Never opens a file (a FIFO named like an event file is only looked at); one that cannot be looked at (a
        dangling link) counts with size and time 0, so that the others still tell when the run grows."""
        try:
            with os.scandir(run_dir) as entries:
                found = []
                for entry in entries:
                    if EVENT_FILE_MARK in entry.name:
                        try:
                            stat = entry.stat()
                        except OSError:
                            found.append((entry.name, 0, 0))
                        else:
                            found.append((entry.name, stat.st_size, stat.st_mtime_ns))
        except OSError:
            return ()
        return tuple(sorted(found))
