"""The thresholds file, `rnnmon_thresholds.json`: where a monitor looks for it, and how it is read and saved.

The TensorBoard tab saves it at the root of the log directory. A running monitor looks for it in its own log
directory and up to `LEVELS_UP` folders above, nearest first (`thresholds_files`), never above a root and never in
a folder another user could plant it in. Reading refuses anything but a small regular file of this user or root,
without following links or blocking on a FIFO; saving is atomic, so a reader sees the old file or the new one.

Example:
    >>> [os.path.dirname(path) for path in thresholds_files("/home/me/runs/a/exp1", root="/home/me/runs")]
    ['/home/me/runs/a/exp1', '/home/me/runs/a', '/home/me/runs']
    >>> save_thresholds_file(os.path.join("runs", THRESHOLDS_FILE), Thresholds.from_dict({"idle_gap": {"min_s": 3}}))
    >>> load_thresholds_file(os.path.join("runs", THRESHOLDS_FILE)).idle_gap.min_s
    3
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile

from rnnmon.alerts.thresholds import Thresholds

THRESHOLDS_FILE = "rnnmon_thresholds.json"
LEVELS_UP = 3  # folders above its log directory that a monitor looks in
MAX_FILE_BYTES = 16 << 10  # a saved file is ~1.5 KiB


def thresholds_files(log_dir: str, root: str | None = None) -> list[str]:
    """Where a saved thresholds file applies to `log_dir`, nearest first.

    `log_dir` and up to `LEVELS_UP` folders above it, never above `root` (when given, and `log_dir` is inside it),
    and never a shared one: the system's temp directory or any folder everyone may write to, where another
    user could plant a file.
    """
    folder = os.path.abspath(log_dir)
    top = os.path.abspath(root) if root is not None else None
    if top is not None and os.path.commonpath([folder, top]) != top:
        top = folder
    shared = os.path.realpath(tempfile.gettempdir())
    paths = [os.path.join(folder, THRESHOLDS_FILE)]
    for _ in range(LEVELS_UP):
        parent = os.path.dirname(folder)
        if parent == folder or folder == top or _shared(parent, shared):
            break
        folder = parent
        paths.append(os.path.join(folder, THRESHOLDS_FILE))
    return paths


def _shared(folder: str, temp_dir: str) -> bool:
    try:
        return os.path.realpath(folder) == temp_dir or bool(os.stat(folder).st_mode & stat.S_IWOTH)
    except OSError:  # not there (yet)
        return False


def read_thresholds_text(path: str | os.PathLike[str]) -> str | None:
    """The text of the thresholds file at `path`, or None when there is none.

    Only a regular file, not a symlink, owned by this user or root, of at most `MAX_FILE_BYTES`, is read
    (opened without following links and without blocking, so a FIFO never hangs); anything else raises
    ValueError naming the reason, never the content.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as error:
        if os.path.islink(path):
            raise ValueError(f"{os.fspath(path)} is a symbolic link; only a regular file is read") from None
        raise ValueError(f"{os.fspath(path)} cannot be opened: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{os.fspath(path)} is not a regular file")
        if info.st_uid not in (os.getuid(), 0):
            raise ValueError(f"{os.fspath(path)} belongs to another user (uid {info.st_uid}); only files of this "
                             f"user or root are followed")
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{os.fspath(path)} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{os.fspath(path)} is not UTF-8 text") from None


def load_thresholds_file(path: str | os.PathLike[str]) -> Thresholds | None:
    """The thresholds saved at `path`, or None when there is no file; a bad or unsafe file raises ValueError."""
    text = read_thresholds_text(path)
    if text is None:
        return None
    try:
        return Thresholds.from_dict(json.loads(text))
    except json.JSONDecodeError as error:
        raise ValueError(f"{os.fspath(path)} is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError(f"{os.fspath(path)} is nested too deeply") from None
    except ValueError as error:
        raise ValueError(f"{os.fspath(path)}: {error}") from None


def save_thresholds_file(path: str | os.PathLike[str], thresholds: Thresholds) -> None:
    """Write `thresholds` to `path` atomically: readers see the old file or the new one, never a part."""
    text = json.dumps(thresholds.to_dict(), indent=2) + "\n"
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".rnnmon_thresholds.",
                                suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, 0o644)  # mkstemp makes it private; TensorBoard may run as another user
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
