"""The reading index and digest of an event file that has none (written before the index existed, or copied without
`rnnmon-index/`), built once by the first reader that needs them and kept, so every later read costs what an indexed
run costs.

One pass over the file's events, `SCAN_BYTES` at a time: each batch's chunks are decoded as the reader decodes
them, turned into index records (`index_write.IndexBuilder`) and digest records (`digest_file.DigestWriter`), and
appended; what is held is one batch and the digest being filled, never the run. The files are those the writer
writes (docs/format.md), built in a staging folder and renamed into place whole: beside the run where its folder
can be written, else under the user's cache directory (`index.cached_index_folder`). A file a live monitor is
writing is left alone (its writer indexes it), and so is damage: the index ends at the first damaged record, and
readers read the rest from the event file, as they read any file past its index.

Example:
    >>> build_index("runs/old/rnnmon/events.out.tfevents.1.host")   # the folder it wrote, or None
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from rnnmon.format import schema
from rnnmon.format.decode import DOCUMENT, Stored, decode_chunks, marked_event, stored_by, table_width
from rnnmon.format.digest_file import DigestWriter, digested
from rnnmon.format.eventfile import RecordCursor
from rnnmon.format.index import DIRECTORY, DOCUMENTS, cached_index_folder, drawn, found_index_folder, index_folder, seal
from rnnmon.format.index_write import IndexBuilder
from rnnmon.format.run_lock import writer_alive

SCAN_BYTES = 1 << 20  # event bytes decoded at a time: ~4 MB of rows at once
_MARK = (f"{schema.PLUGIN_NAME}/".encode(),)  # every rnnmon tag starts so


def build_index(event_path: str) -> str | None:
    """The index folder of `event_path`: the one it has, else one built now (beside the run, else in the cache);
    None where a monitor is writing the file, neither place can be written, or building fails."""
    found = found_index_folder(event_path)
    if os.path.isdir(found):
        return found
    if writer_alive(os.path.dirname(event_path)):
        return None
    for folder in (index_folder(event_path), cached_index_folder(event_path)):
        try:
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            staging = tempfile.mkdtemp(prefix=".building-", dir=os.path.dirname(folder))
        except OSError:
            continue  # a read-only run folder: the cache
        try:
            _build(event_path, staging)
            os.rename(staging, folder)
            return folder
        except OSError:
            if os.path.isdir(folder):  # another reader built it first
                return folder
        except Exception:  # a file it cannot index (never seen): read as without an index
            return None
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(staging)
    return None


def _build(event_path: str, folder: str) -> None:
    """Write the index and digest of `event_path` into `folder` (OSError where it cannot)."""
    buffers: dict[str, list[bytes]] = {}
    builder = IndexBuilder(lambda name, records: buffers.setdefault(name, []).append(records.tobytes()))
    digest = DigestWriter(folder)
    described: dict[str, Stored] = {}
    cursor = RecordCursor(0)
    more = True
    while more:
        start = cursor.offset
        scan = cursor.scan(event_path, SCAN_BYTES)
        more = scan.more and scan.problem is None
        records = scan.records if scan.problem is None else []  # past damage, where each record lies is unknown
        chunks, documents = _located(records, start, described)
        by_tag: dict[str, list[tuple[int, int, int, Any]]] = {}
        for tag, *located in chunks:
            by_tag.setdefault(tag, []).append(tuple(located))
        decoded = []  # (tag, rows, offset, length) of each chunk kept, as the digest takes them
        for tag, found in by_tag.items():
            rows, counts, kept, _ = decode_chunks(tag, [tensor for *_, tensor in found], described.get(tag))
            steps, offsets, lengths = ([found[i][n] for i in kept] for n in range(3))
            builder.add_many(tag, rows, counts, steps, offsets, lengths)
            starts = np.cumsum([0, *counts])
            decoded += [(tag, rows[starts[n]:starts[n + 1]], offset, length)
                        for n, (offset, length) in enumerate(zip(offsets, lengths, strict=True))]
            if tag == schema.PHASES_TAG:
                documents += zip(offsets, lengths, steps, strict=True)
        digest.add_events(sorted(decoded, key=lambda chunk: chunk[2]))
        if documents:
            listed = sorted(set(documents))  # an event holding two documents (or a document and phases) once
            entries = np.zeros(len(listed), dtype=DIRECTORY)
            entries["offset"], entries["length"], entries["step"] = zip(*listed, strict=True)
            buffers.setdefault(DOCUMENTS, []).append(seal(entries).tobytes())
        for name, parts in sorted(buffers.items()):  # chunk directories first, as the writer writes them
            with open(os.path.join(folder, name), "ab") as out:
                out.write(b"".join(parts))
        buffers.clear()
        digest.flush()


def _located(records: list[bytes], start: int, described: dict[str, Stored]
             ) -> tuple[list[tuple[str, int, int, int, Any]], list[tuple[int, int, int]]]:
    """The table chunks (tag, step, offset, length, tensor) and document events (offset, length, step) of
    `records`, whole records from byte `start` on; learns how the file describes each tag."""
    chunks, documents, position = [], [], start
    for record in records:
        length = len(record) + 16
        event = marked_event(record, _MARK)
        if event is not None:
            for value in event.summary.value:
                stored = stored_by(value)
                if stored is not None:
                    described[value.tag] = stored
                if drawn(value.tag) or digested(value.tag):
                    chunks.append((value.tag, event.step, position, length, value.tensor))
                elif table_width(value.tag) == DOCUMENT:
                    documents.append((position, length, event.step))
        position += length
    return chunks, documents
