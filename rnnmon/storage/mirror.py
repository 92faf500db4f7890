"""A local mirror of a remote log directory, so that rnnmon's own reader reads remote runs like local ones.

`sync()` lists the objects under the URL (one listing) and downloads only the objects that are new or changed
since the last sync: compared by size and by the store's version of the object (GCS's generation, S3's ETag,
else its modification time). Only event files and the files of rnnmon's run folders are mirrored, never a
checkpoint beside them. An object that grew (the uploader re-puts a growing event file whole) is appended to its
local copy when the copy is a prefix of it, so readers that follow a file (rnnmon's, TensorBoard's) see it grow as
a local live file; any other change replaces the copy in one rename. The mirror keeps the objects' tree as it is
in the bucket, so run names are the same as for a local folder. The
cache is on disk (`$RNNMON_CACHE_DIR`, else under the temporary folder), so a second process (the next
`rnnmon report`, a restarted TensorBoard) downloads only what changed.

Example:
    >>> mirror = Mirror("gs://bucket/exp1")
    >>> local = mirror.sync()        # "/tmp/rnnmon-cache/bucket_exp1-…/tree"
    >>> read_logdir(local)
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

from rnnmon.format.eventfile import EVENT_FILE_MARK
from rnnmon.format.index import INDEX_DIR
from rnnmon.format.schema import RUN_SUBDIR
from rnnmon.storage import remote

MANIFEST = "manifest.json"


class Mirror:
    """The objects under `url`, mirrored into a local folder."""

    def __init__(self, url: str, cache_dir: str | None = None) -> None:
        self.url, self.shown = url, remote.redact(url)
        self.folder = cache_dir or remote.local_folder("cache", url)
        self.tree = os.path.join(self.folder, "tree")
        self._fs: Any = None  # built at the first sync (finding credentials may ask a metadata server)
        self._root = ""
        self._lock = threading.Lock()
        self.downloaded = 0  # objects downloaded by the last sync
        self.downloaded_bytes = 0
        self.objects = 0  # objects under the URL at the last sync
        self._seen = self._load()

    def sync(self) -> str:
        """Download the new and changed objects, drop the local copies of removed ones; the mirror's folder.

        Raises OSError (its message without credentials) when the store cannot be listed."""
        with self._lock:
            try:
                if self._fs is None:
                    self._fs, self._root = remote.filesystem(self.url)
                self._fs.invalidate_cache()
                listing = self._fs.find(self._root, detail=True, withdirs=False)
            except FileNotFoundError:
                listing = {}
            except Exception as error:
                raise OSError(f"cannot list {self.shown}: {type(error).__name__}: "
                              f"{str(error).replace(self.url, self.shown)[:300]}") from None
            self.downloaded = self.downloaded_bytes = 0
            self.objects = len(listing)
            objects = {}
            for path, info in listing.items():
                rel = path[len(self._root):].strip("/") if path.startswith(self._root) else None
                if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
                    continue  # not under the root, or a name that would leave the mirror
                if mirrored(rel):
                    objects[rel] = _version(info)
            for rel, version in sorted(objects.items(), key=_indexes_first):
                if self._seen.get(rel) != version or not os.path.exists(self._local(rel)):
                    self._download(rel)
                    self._seen[rel] = version
            for rel in set(self._seen) - set(objects):
                with contextlib.suppress(OSError):
                    os.remove(self._local(rel))
                del self._seen[rel]
            self._save()
            os.makedirs(self.tree, exist_ok=True)
            return self.tree

    def _local(self, rel: str) -> str:
        return os.path.join(self.tree, *rel.split("/"))

    def _download(self, rel: str) -> None:
        data = self._fs.cat_file(remote.join(self._root, rel))
        path = self._local(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with contextlib.suppress(OSError), open(path, "r+b") as f:
            old = f.read(len(data) + 1)
            if old and len(old) < len(data) and data.startswith(old):  # grown: append, as a live file grows
                f.seek(len(old))
                f.write(data[len(old):])
                self.downloaded += 1
                self.downloaded_bytes += len(data)
                return
        incoming = os.path.join(self.folder, "incoming")  # outside the tree: no reader sees a half-written file
        os.makedirs(incoming, exist_ok=True)
        temporary = os.path.join(incoming, f"{os.getpid()}.{threading.get_ident()}")
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
        self.downloaded += 1
        self.downloaded_bytes += len(data)

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


def _indexes_first(item: tuple[str, Any]) -> tuple[bool, str]:
    """Reading indexes before event files (as the uploader puts them): a copied index never names events the copy
    of its event file lacks."""
    return f"/{INDEX_DIR}/" not in f"/{item[0]}", item[0]
