"""A local mirror of a remote log directory, so that rnnmon's own reader reads remote runs like local ones.

`sync()` lists the objects under the URL and downloads only the objects that are new or changed since the last
sync: compared by size and by the store's version of the object (GCS's generation, S3's ETag, else its
modification time). A listing of the whole URL costs a request per 1,000 objects, and a live job adds ~170 objects
an hour per worker, so while event files are being written a sync lists only the event files of the folders
written to in the last `LIVE_S` (a request each: a segment every 5 minutes fills a page in 83 hours), where those
are fewer than the whole listing's pages, and lists the whole URL again at least every `FULL_LISTING_S` (new runs,
the reading indexes, removed objects). Only event files and the files of rnnmon's run folders are mirrored, never a
checkpoint beside them. An object that grew (the uploader re-puts a growing event file whole) is appended to its
local copy when the copy is a prefix of it, so readers that follow a file (rnnmon's, TensorBoard's) see it grow as
a local live file; any other change replaces the copy in one rename. The mirror keeps the objects' tree as it is
in the bucket, so run names are the same as for a local folder.

Objects are downloaded `PARALLEL_GETS` at a time (the reading indexes first, then the event files) and streamed to
disk a `CHUNK_BYTES` range at a time, never past the size the listing gave (an object that
never ends is read that far); an object that is not an event file is mirrored up to `max_object_bytes`. An object
that cannot be a file of the tree (a key with `//`, a NUL or a name too long for the disk, a key that is also a
folder) is skipped with one WARNING naming it, and a folder marker (a key ending in `/`, as S3's "Create folder"
makes) is no object at all: one odd object never stops the others. The
cache is on disk (`$RNNMON_CACHE_DIR`, else under the temporary folder), so a second process (the next
`rnnmon report`, a restarted TensorBoard) downloads only what changed.

Example:
    >>> mirror = Mirror("gs://bucket/exp1")
    >>> local = mirror.sync()        # "/tmp/rnnmon-cache/bucket_exp1-…/tree"
    >>> read_logdir(local)
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rnnmon.format.eventfile import EVENT_FILE_MARK
from rnnmon.format.index import INDEX_DIR
from rnnmon.format.schema import RUN_SUBDIR
from rnnmon.storage import remote

LOG = logging.getLogger("rnnmon")
_NO_FILE = (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST)  # a key that cannot be a file here
MANIFEST = "manifest.json"
CHUNK_BYTES = 4 << 20  # read from an object at a time
MAX_OBJECT_BYTES = 256 << 20  # an object that is not an event file is mirrored up to this (a profile, an index)
PARALLEL_GETS = 8  # objects downloaded at once (a first sync of 2,500 objects took 122-157 s one at a time)
PAGE = 1000  # objects a listing request returns (S3's and GCS's most)
FULL_LISTING_S = 120.0  # the whole URL is listed at least this often (new runs, indexes, removed objects)
LIVE_S = 600.0  # a folder whose event files changed this recently is listed on its own between whole listings
EVENT_FILE_PREFIX = "events.out.tfevents"  # how TensorBoard's and rnnmon's writers name event files


class Mirror:
    """The objects under `url`, mirrored into a local folder."""

    def __init__(self, url: str, cache_dir: str | None = None, max_object_bytes: int = MAX_OBJECT_BYTES,
                 full_listing_s: float = FULL_LISTING_S) -> None:
        self.url, self.shown = url, remote.redact(url)
        self.max_object_bytes, self.full_listing_s = max_object_bytes, full_listing_s
        self.skipped: dict[str, str] = {}  # objects not mirrored (name as listed -> why), each warned about once
        self._odd: dict[str, list[Any]] = {}  # objects that cannot be a file of the tree -> their version then
        self.folder = cache_dir or remote.local_folder("cache", url)
        self.tree = os.path.join(self.folder, "tree")
        self._fs: Any = None  # built at the first sync (finding credentials may ask a metadata server)
        self._root = ""
        self._lock = threading.Lock()
        self.downloaded = 0  # objects downloaded by the last sync
        self.downloaded_bytes = 0
        self.objects = 0  # objects under the URL at the last whole listing
        self._listed: dict[str, list[Any]] | None = None  # rel -> version, as the last sync listed them
        self._pages = 0  # pages of the last whole listing
        self._full_at = -1e18  # monotonic time of the last whole listing
        self._changed: dict[str, float] = {}  # folder -> monotonic time its event files last changed
        self._seen = self._load()

    def sync(self) -> str:
        """Download the new and changed objects, drop the local copies of removed ones; the mirror's folder.

        Raises OSError (its message without credentials) when the store cannot be listed."""
        with self._lock:
            try:
                if self._fs is None:
                    self._fs, self._root = remote.filesystem(self.url)
                self._fs.invalidate_cache()
                objects = self._list()
            except Exception as error:
                raise OSError(f"cannot list {self.shown}: {type(error).__name__}: "
                              f"{str(error).replace(self.url, self.shown)[:300]}") from None
            self.downloaded = self.downloaded_bytes = 0
            due = [(rel, version) for rel, version in sorted(objects.items())
                   if self._odd.get(rel) != version  # it cannot be a file of the tree as it is: not until it changes
                   and (self._seen.get(rel) != version or not os.path.isfile(self._local(rel)))]
            for indexes in (True, False):  # the reading indexes first, all of them, then the event files
                group = [(rel, version) for rel, version in due if _in_index(rel) == indexes]
                with ThreadPoolExecutor(PARALLEL_GETS, thread_name_prefix="rnnmon-get") as pool:
                    for (rel, version), error in zip(group, pool.map(self._fetch, group)):
                        self._took(rel, version, error)
            for rel in set(self._seen) - set(objects):
                with contextlib.suppress(OSError):
                    os.remove(self._local(rel))
                del self._seen[rel]
            self._save()
            os.makedirs(self.tree, exist_ok=True)
            return self.tree

    def _list(self) -> dict[str, list[Any]]:
        """rel -> version of the objects to mirror: the whole URL listed, or, between whole listings, while fewer
        folders are live than the whole listing has pages, those folders' event files listed and the rest as the
        last sync found it."""
        now = time.monotonic()
        self._changed = {folder: at for folder, at in self._changed.items() if now - at < LIVE_S}
        live = sorted(self._changed)
        if self._listed is None or not live or len(live) >= self._pages or now - self._full_at >= self.full_listing_s:
            found = self._find(self._root)
            objects = self._objects(found)
            self._pages = max(1, -(-len(found) // PAGE))
            self._full_at, self.objects = now, len(found)
        else:
            objects = {rel: version for rel, version in self._listed.items()
                       if not (_folder(rel) in live and _event_file(rel))}
            for folder in live:
                objects.update(self._objects(self._find(remote.join(self._root, folder), EVENT_FILE_PREFIX)))
        for rel, version in objects.items():
            if _event_file(rel) and self._listed is not None and self._listed.get(rel) != version:
                self._changed[_folder(rel)] = now  # written to: listed on its own until LIVE_S after
        self._listed = objects
        return objects

    def _find(self, path: str, prefix: str = "") -> dict[str, Any]:
        """The objects under `path` whose names there start with `prefix` (path -> details); {} for none. The
        library keeps a whole listing's details for reading the objects; those of a listing by prefix are kept
        here alike (without them a read asked for them: a HEAD on S3, two requests on GCS)."""
        try:
            found = self._fs.find(path, detail=True, withdirs=False, prefix=prefix)
        except FileNotFoundError:
            return {}
        if prefix:
            for name, info in found.items():
                self._fs.dircache.setdefault(name.rpartition("/")[0], []).append(info)
        return found

    def _objects(self, found: dict[str, Any]) -> dict[str, list[Any]]:
        """rel -> version of the objects of a listing that are mirrored (odd names skipped with a warning)."""
        objects = {}
        for path, info in found.items():
            if not path.startswith(self._root + "/") or path.endswith("/"):
                continue  # not under the root, or a folder marker
            rel = path[len(self._root) + 1:]
            if not mirrored(rel):
                continue
            if any(part in ("", ".", "..") for part in rel.split("/")) or "\0" in rel:
                self._skip(rel, "its name is no file's name (an empty part, `.`, `..` or a NUL)")
                continue
            objects[rel] = _version(info)
        return objects

    def _local(self, rel: str) -> str:
        return os.path.join(self.tree, *rel.split("/"))

    def _fetch(self, item: tuple[str, list[Any]]) -> Exception | None:
        """Download one object (on a pool thread); the exception that stopped it, if any."""
        try:
            self._download(*item)
        except Exception as error:  # this object only: the others are mirrored
            return error
        return None

    def _took(self, rel: str, version: list[Any], error: Exception | None) -> None:
        if error is None:
            self.downloaded += 1
            self.downloaded_bytes += version[0]
            self.skipped.pop(rel, None)
            self._seen[rel] = version
            return
        self._skip(rel, f"{type(error).__name__}: {str(error).replace(self.url, self.shown)[:200]}")
        if isinstance(error, ValueError) or getattr(error, "errno", None) in _NO_FILE:
            self._odd[rel] = version  # else (the network): tried again at the next sync

    def _skip(self, rel: str, why: str) -> None:
        if self.skipped.get(rel) != why:
            LOG.warning("rnnmon: %r under %s is not mirrored (%s); the other objects are.", rel, self.shown, why)
        self.skipped[rel] = why

    def _download(self, rel: str, version: list[Any]) -> None:
        """Stream the object `rel` (of `size` bytes, as listed) to its copy: appended where the copy is a prefix of
        it, else written beside the tree and renamed into it."""
        size = version[0]
        if size > self.max_object_bytes and EVENT_FILE_MARK not in rel.rsplit("/", 1)[-1]:
            raise ValueError(f"{size} bytes, over the {self.max_object_bytes} mirrored of an object that is not an "
                             "event file")
        path = self._local(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with self._fs.open(remote.join(self._root, rel), "rb", cache_type="none",  # a GET per read,
                           size=size) as source:
            if self._append(source, path, size):
                return
            source.seek(0)
            incoming = os.path.join(self.folder, "incoming")  # outside the tree: no reader sees a half-written file
            os.makedirs(incoming, exist_ok=True)
            temporary = os.path.join(incoming, f"{os.getpid()}.{threading.get_ident()}")
            with open(temporary, "wb") as out:
                _copy(source, out, size)
        os.replace(temporary, path)

    def _append(self, source: Any, path: str, size: int) -> bool:
        """Append the object's new bytes to its copy at `path` where the copy (a regular file) is a shorter prefix
        of it, as a live file grows, an empty copy too (a writer's first upload is an empty event file: a copy
        replaced, not appended to, kept TensorBoard's readers on the old, empty file, and the run unlisted); False
        where it is not."""
        with contextlib.suppress(OSError), open(path, "r+b") as copy:
            have = os.fstat(copy.fileno()).st_size
            if have >= size:
                return False
            at = 0
            while at < size:  # a read of CHUNK_BYTES at a time, as a new copy's: one GET for an object up to it
                piece = source.read(min(CHUNK_BYTES, size - at))
                if not piece:
                    raise ValueError(f"the object ended {size - at} bytes short of its listed size")
                mine = piece[:max(have - at, 0)]
                if mine and copy.read(len(mine)) != mine:
                    return False  # not a prefix (nothing written yet): replaced
                copy.write(piece[len(mine):])
                at += len(piece)
            return True
        return False

    def _load(self) -> dict[str, list[Any]]:
        try:
            with open(os.path.join(self.folder, MANIFEST)) as f:
                seen = json.load(f)
            return seen if isinstance(seen, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        temporary = os.path.join(self.folder, f"{MANIFEST}.{os.getpid()}")
        with open(temporary, "w") as f:
            json.dump(self._seen, f)
        os.replace(temporary, os.path.join(self.folder, MANIFEST))


def _copy(source: Any, out: Any, size: int) -> None:
    """`size` bytes from `source` to `out`, `CHUNK_BYTES` at a time (never more: an object that grows on while it
    is read is taken as it was listed); ValueError where the object ends sooner (S3 reads a key that is also a
    folder as empty)."""
    left = size
    while left:
        piece = source.read(min(CHUNK_BYTES, left))
        if not piece:
            raise ValueError(f"the object ended {left} bytes short of its listed size")
        out.write(piece)
        left -= len(piece)


def mirrored(rel: str) -> bool:
    """An event file, or a file of an rnnmon run folder (its event files, indexes, profiles)."""
    parts = rel.split("/")
    return EVENT_FILE_MARK in parts[-1] or RUN_SUBDIR in parts[:-1]


def _version(info: dict[str, Any]) -> list[Any]:
    """What changes when an object is replaced: its size and the store's version of it."""
    tag = next((info[key] for key in ("generation", "ETag", "etag", "md5Hash", "crc32c") if info.get(key)), None)
    if tag is None:
        tag = str(info.get("LastModified") or info.get("updated") or info.get("mtime") or "")
    return [int(info.get("size") or 0), str(tag)]


def _folder(rel: str) -> str:
    return rel.rpartition("/")[0]


def _event_file(rel: str) -> bool:
    return rel.rpartition("/")[2].startswith(EVENT_FILE_PREFIX)


def _in_index(rel: str) -> bool:
    """A file of a reading index: mirrored before the event files (as the uploader puts them), so a copied index
    never names events the copy of its event file lacks."""
    return f"/{INDEX_DIR}/" in f"/{rel}"
