"""Which log directories are remote, how they are named in messages, and the file system that reaches them.

A remote log directory is a URL of a scheme that fsspec knows (`gs://` through gcsfs, `s3://` through s3fs; see
docs/storage.md for why fsspec). Credentials come from each library's own chain (application default credentials,
AWS profiles and environment); a URL may still carry some (`s3://KEY:SECRET@bucket`, `?token=`), so every message
names a URL through `redact`, never as given, and `check` refuses such a URL for writing or reading.

Example:
    >>> is_remote("gs://bucket/exp1"), is_remote("runs/exp1")
    (True, False)
    >>> redact("s3://AKIA:secret@bucket/exp1?token=x")
    's3://bucket/exp1'
    >>> fs, root = filesystem("s3://bucket/exp1")      # an s3fs.S3FileSystem and "bucket/exp1"
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import tempfile
from typing import Any

SCHEMES = ("gs", "gcs", "s3", "s3a")  # the schemes rnnmon writes and reads; others are local paths as before
_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.I)
TIMEOUT_S = 20.0  # one request's connect and read deadline: a dead network costs an upload pass, not a hang
DEADLINE_S = 60.0  # one call (a put, with the library's retries), given up after this (`RNNMON_REQUEST_DEADLINE_S`)


def is_remote(path: str | os.PathLike | None) -> bool:
    """True for `gs://…` and `s3://…` (a scheme rnnmon writes through fsspec)."""
    match = _URL.match(os.fspath(path)) if path is not None else None
    return bool(match) and match.group(1).lower() in SCHEMES


class CredentialsInURL(ValueError):
    """A log directory URL that carries credentials or a query."""


def check(url: str) -> None:
    """Refuse a URL that carries credentials (user, password or query): they belong in the library's chain."""
    match = _URL.match(url)
    rest = url[match.end():] if match else ""
    if "@" in rest.split("/", 1)[0] or "?" in rest or "#" in rest:
        raise CredentialsInURL(f"a log directory URL must not carry credentials or a query; pass them the storage "
                         f"library's usual way (see docs/storage.md). Received: {redact(url)}")


def redact(url: str) -> str:
    """`url` without what may carry a credential: user and password, query and fragment."""
    match = _URL.match(url)
    if not match:
        return url
    rest = url[match.end():].split("?", 1)[0].split("#", 1)[0]
    host, slash, path = rest.partition("/")
    return f"{match.group(1)}://{host.rpartition('@')[2]}{slash}{path}".rstrip("/")


def join(url: str, *parts: str) -> str:
    """`url/part/part` with single slashes (the URL already redacted or not: only its path is extended)."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p and p != ".")])


def require(url: str) -> None:
    """Import what `url` needs (no request is made); ImportError naming the extra to install."""
    scheme = _URL.match(url).group(1).lower()
    extra, library = ("s3", "s3fs") if scheme.startswith("s3") else ("gcs", "gcsfs")
    try:
        __import__("fsspec")
        __import__(library)
    except ImportError as error:
        raise ImportError(f"{scheme}:// log directories need {library}: pip install \"rnnmon[{extra}]\" "
                          f"({error})") from None


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec file system, path inside it) for `url`, with request deadlines, built anew (the environment of now).

    GCS goes through gcsfs's JSON API file system (`gcsfs.core.GCSFileSystem`): rnnmon puts and gets whole small
    objects, which needs none of the gRPC client that gcsfs's default class first asks each bucket's type with."""
    require(url)
    import fsspec
    from fsspec.config import apply_config

    if _URL.match(url).group(1).lower().startswith("s3"):
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, config_kwargs={
            "connect_timeout": TIMEOUT_S, "read_timeout": TIMEOUT_S, "retries": {"max_attempts": 2}})
        fs.retries = 2  # s3fs's own retries (5 by default) on top of botocore's: the uploader retries anyway
        return fs, path.rstrip("/")
    from gcsfs.core import GCSFileSystem

    fs = GCSFileSystem(**apply_config(GCSFileSystem, {"skip_instance_cache": True, "requests_timeout": TIMEOUT_S,
                                                      "timeout": TIMEOUT_S}))
    return fs, fs._strip_protocol(url).rstrip("/")


class ForeignFolder(PermissionError):
    """A staging or cache folder that is a link, not a folder, or another user's: never written or read."""


def bounded(fs: Any, method: str, *args: Any) -> Any:
    """`fs.<method>(*args)`, given up after `deadline_s()` (fsspec's FSTimeoutError, the call cancelled) where `fs`
    is asynchronous (s3fs, gcsfs): against an endpoint that accepts connections and never answers, a put to S3
    outlasted its 20 s request deadline for good (still running after 200 s here)."""
    call = getattr(fs, f"_{method}", None)
    if not getattr(fs, "async_impl", False) or call is None:
        return getattr(fs, method)(*args)
    from fsspec.asyn import sync

    return sync(fs.loop, call, *args, timeout=deadline_s())


def deadline_s() -> float:
    """`RNNMON_REQUEST_DEADLINE_S`, else `DEADLINE_S`."""
    try:
        return max(float(os.environ.get("RNNMON_REQUEST_DEADLINE_S", DEADLINE_S)), 1.0)
    except ValueError:
        return DEADLINE_S


def local_folder(kind: str, url: str, base: str | None = None) -> str:
    """A folder of this host for `url` (`kind`: "staging" or "cache"): `$RNNMON_<KIND>_DIR`, else under the
    temporary folder, one per redacted URL. The base and the folder are created private (0700) and must be
    folders of this user, not links: one another user made (the temporary folder is everyone's) is refused with
    ForeignFolder, since its owner could read the run or plant links in it."""
    base = base or os.environ.get(f"RNNMON_{kind.upper()}_DIR") or os.path.join(tempfile.gettempdir(),
                                                                                 f"rnnmon-{kind}")
    clean = redact(url)
    digest = hashlib.sha256(clean.encode()).hexdigest()[:16]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", clean.split("://", 1)[1])[-60:]
    folder = os.path.join(base, f"{label}-{digest}")
    os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
    for path in (base, folder):
        _own_folder(kind, path)
    return folder


def _own_folder(kind: str, path: str) -> None:
    """Create `path` (0700) where missing; ForeignFolder where it is not a folder of this user."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    why = ("is not a folder (a link or a file)" if not stat.S_ISDIR(info.st_mode)
           else f"belongs to another user (uid {info.st_uid})" if info.st_uid != os.getuid() else None)
    if why:
        raise ForeignFolder(errno.EACCES, f"the {kind} folder {why}; rnnmon uses only a folder of its own user "
                            f"there: set RNNMON_{kind.upper()}_DIR to one", path)
