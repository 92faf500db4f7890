"""A log directory's rnnmon runs, found as TensorBoard finds runs and read from their event files (what `rnnmon
report` reads); above the reader and the digest's reader, which read one run each.

Example:
    >>> runs = read_logdir("runs")                          # {run name: RunData}
    >>> runs = read_logdir("runs", digest=True)             # long runs read for their summary, through the index
"""

from __future__ import annotations

import errno
import os

from rnnmon.format import schema
from rnnmon.format.digest_read import read_run
from rnnmon.format.eventfile import EVENT_FILE_MARK
from rnnmon.format.reader import RunData, RunReader


def read_logdir(logdir: str, runs: list[str] | None = None, digest: bool = False) -> dict[str, RunData]:
    """Every rnnmon run under `logdir` (or the named ones), read from its event files; no TensorFlow.

    With `digest`, a run whose event files all have a reading index is read for its summary only: its documents
    and phases, its large tables as a digest (`rnnmon.format.digest_read`). A folder that cannot be listed (no
    permission) is a run of its own name with that error, since runs inside it cannot be seen."""
    result = {}
    found, unlisted = _run_dirs(logdir)
    for run, run_dir in found:
        if runs is not None and run not in runs:
            continue
        if digest:
            summarized = read_run(run_dir, run)
            if summarized is not None:
                if (summarized.info or summarized.errors or summarized.notes or len(summarized.steps)
                        or (summarized.digest is not None and summarized.digest.steps.rows)):
                    result[run] = summarized
                continue
        reader = RunReader(run)
        data = reader.update_from_files(run_dir)
        if reader._tables or reader._documents or (data.errors and os.path.basename(run_dir) == schema.RUN_SUBDIR):
            result[run] = data
    for run, error in unlisted:
        if runs is None or run in runs:
            result[run] = RunData(run, errors=[f"cannot list the folder {run}: {error}; runs inside it, if any, "
                                               "are not shown"])
    return result


def _run_dirs(logdir: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(run name, directory) for every directory under `logdir` holding event files, named as TensorBoard does;
    and (name, error) for every directory that could not be listed."""
    found, visited, unlisted = [], set(), []

    def unlistable(error: OSError) -> None:
        if error.errno not in (errno.ENOENT, errno.ENOTDIR):  # not one removed while walking
            relative = os.path.relpath(error.filename or logdir, logdir).replace(os.sep, "/")
            unlisted.append((relative, error.strerror or str(error)))

    # linked runs count, as in TensorBoard
    for directory, subdirs, files in os.walk(logdir, onerror=unlistable, followlinks=True):
        real = os.path.realpath(directory)
        if real in visited:  # a link loop
            subdirs.clear()
            continue
        visited.add(real)
        if any(EVENT_FILE_MARK in name for name in files):
            relative = os.path.relpath(directory, logdir)
            found.append((relative.replace(os.sep, "/"), directory))
    return sorted(found), sorted(unlisted)
