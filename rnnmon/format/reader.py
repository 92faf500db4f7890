"""The one reader of rnnmon runs, for `rnnmon report` and the TensorBoard tab.

Every record is untrusted. A value's type, shape and size are checked before anything is allocated for it
(a chunk holds at most `packing.MAX_ROWS` rows, and its bytes must be there to back them); a chunk or document
that fails a check is dropped and named in the run's `errors`, and the rest of the run, and every other run,
still reads. Event files are walked record by record with their checksums (`rnnmon.format.eventfile`), so a
truncated or bit-flipped file is an error of its run, not silent partial data.

A `RunReader` keeps what it decoded. Each update decodes only chunks it has not seen (from the provider: per tag,
keyed by the datum's step and wall time; from files: the bytes after those already read) and appends them, in
step order, to tables that grow in place, so reloading a live million-step run costs the new chunks, not the run.
Chunks that land before rows already read (a second writer's file) are merged once per update, never chunk by
chunk; a chunk found in two files (a copied file) counts once. Both are named in the run's `notes`, which, unlike
`errors`, leave the run readable. It reads either TensorBoard's data provider (`update_from_provider`) or the
run's event files directly (`update_from_files`: no TensorFlow, checksums verified, only new bytes of each file
read, in bounded batches; a FIFO, device or huge sparse file named like an event file is an error of its run; a
file cut below what was read is read again from its last intact record, see `eventfile.RecordCursor`).

Tables are read by name: each chunk is decoded as its tag's stored metadata describes it (columns, and from
format version 3 the packed layout and storage codes; see `packing.stored_layout`), then its columns are placed by
name into this reader's (`schema.columns_for`): a column the file lacks is NaN, one this reader does not know is
skipped and named in `notes`, as is a format version newer than this reader's. Metadata this reader cannot decode
makes that tag's packed chunks errors, never a guess at a layout.

Example:
    >>> runs = read_logdir("runs")                      # what `rnnmon report` reads: {run name: RunData}
    >>> runs["exp1/rnnmon"].steps[:, 0]                 # global step numbers
    >>> reader = RunReader("exp1/rnnmon")               # held per run by the tab, across reloads
    >>> data = reader.update_from_provider(provider, ctx, experiment_id)   # or .update_from_files(run_dir)
    >>> reader.check_files(run_dir)                     # with the provider: damage it cannot see, cheaply
    >>> RunReader("exp1/rnnmon", tags=frozenset({schema.RUN_TAG})).update_from_files(run_dir).info  # one tag only
    >>> data.errors                                     # [] when every record read
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import functools
import json
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from tensorboard.compat.proto import types_pb2

from rnnmon.format import packing, schema
from rnnmon.format.eventfile import EVENT_FILE_MARK, SCAN_BATCH_BYTES, RecordCursor, truncated_at

ALL_SAMPLES = 10**9  # `downsample` that keeps everything the provider holds
MAX_DOCUMENT_BYTES = 1 << 20  # a run description, findings or alerts chunk: a few KiB in practice
MAX_NOTES = 10  # notes listed per run; the rest are counted
FEW_TAGS_BATCH_BYTES = 4 << 20  # a reader of a few tags (the tab's /runs) walks files in batches this small
TAIL_GRACE_S = 10.0  # a file that ends inside a record for longer than this is truncated, not being written
_SEVERITIES = ("info", "warning", "critical")
_DT_STRING, _DT_DOUBLE = types_pb2.DT_STRING, types_pb2.DT_DOUBLE
_UNSEEN: dict[str, Any] = {}


@dataclasses.dataclass
class RunData:
    """Everything rnnmon wrote for one run, as float64 tables (times in Unix seconds). Treat it as read-only."""

    run: str
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    fits: int = 0
    fit_infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # each fit's latest description
    steps: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(schema.STEP_COLUMNS))))
    phases: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(schema.PHASE_COLUMNS))))
    host: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(schema.HOST_COLUMNS))))
    gaps: np.ndarray = dataclasses.field(default_factory=lambda: np.empty((0, len(schema.GAP_COLUMNS))))
    util: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    stats: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    devices: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    alerts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    shapes: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # {"step", "time", "shapes"}
    # The steps that compiled, by the framework's signal: {"step", "batches", "time", "duration_s", "count", "seconds",
    # "source", "shapes"}; and per input shape its steps' cost, one record per chunk: {"shapes", "steps",
    # "plain_steps", "plain_s"} (rnnmon.capture.compiles)
    compiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    shape_steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    last_write: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # read, but worth knowing: files that overlap
    digest: Any = None  # a `rnnmon.format.digest.RunDigest` read from the run's index: steps, gaps, util, stats empty


class InvalidRecord(ValueError):
    """A value that does not fit rnnmon's format; the message says what and where."""


_INVALID = (InvalidRecord, ValueError, TypeError, UnicodeDecodeError)  # what a bad value raises while checked


class _Table:
    """A float64 table that grows by whole chunks, kept in event-step order."""

    def __init__(self, width: int) -> None:
        self._rows = np.empty((0, width))
        self._size = 0
        self._steps: list[int] = []  # each chunk's event step, ascending
        self._starts: list[int] = []  # each chunk's first row
        self.inserted = 0  # merges that put chunks before rows already there (rows then moved): views of it are stale

    def extend(self, steps: list[int], rows: np.ndarray, counts: list[int]) -> None:
        """Add chunks (`counts[i]` rows at event step `steps[i]`, in any order) held in one array.

        Chunks that follow the rows already there are appended in place. Chunks that land before some of them (a
        second writer's file, read after the first's) are merged with those rows in one sort, into a new array,
        so one update costs its rows plus the rows it passes, never a rebuild per chunk.
        """
        if not steps:
            return
        if steps != sorted(steps):
            steps, rows, counts = _in_step_order(steps, rows, counts)
        at = bisect.bisect(self._steps, steps[0])  # the first chunk already there that the new ones precede
        moved = at < len(self._steps)
        if moved:  # merge the new chunks with those they precede
            first = self._starts[at]
            kept = self._steps[at:]
            kept_counts = np.diff([*self._starts[at:], self._size]).tolist()
            steps, rows, counts = _in_step_order(kept + steps, np.concatenate([self._rows[first:self._size], rows]),
                                                 kept_counts + counts)
            del self._steps[at:], self._starts[at:]
            self._size = first
            self.inserted += 1
        if self._size == 0:  # a first read: keep the array as it is
            self._rows = rows
        else:
            if moved or self._size + len(rows) > len(self._rows):  # moved: views handed out keep the rows they saw
                capacity = self._size + len(rows)
                grown = np.empty((capacity if moved else max(2 * len(self._rows), capacity, 256), self._rows.shape[1]))
                grown[: self._size] = self._rows[: self._size]
                self._rows = grown
            self._rows[self._size: self._size + len(rows)] = rows
        self._starts += (self._size + np.cumsum([0, *counts[:-1]])).tolist()
        self._steps += steps
        self._size += len(rows)

    def view(self) -> np.ndarray:
        return self._rows[: self._size]


def _in_step_order(steps: list[int], rows: np.ndarray, counts: list[int]) -> tuple[list[int], np.ndarray, list[int]]:
    """The chunks sorted by event step (stable: chunks of one step keep their order), rows moved with them."""
    order = np.argsort(np.asarray(steps, dtype=np.int64), kind="stable")
    sizes = np.asarray(counts, dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    moved = sizes[order]
    index = np.repeat(starts[order] - (np.cumsum(moved) - moved), moved) + np.arange(int(moved.sum()))
    return [steps[i] for i in order], rows[index], moved.tolist()


class RunReader:
    """One run's rnnmon data, decoded chunk by chunk and kept; each update decodes only what is new."""

    def __init__(self, run: str, tags: frozenset[str] | None = None) -> None:
        self.run = run
        self._only = tags  # decode only these tags (None: all); from files, only records that name one of them
        self._marks = None if tags is None else tuple(tag.encode() for tag in tags)
        self._batch_bytes = SCAN_BATCH_BYTES if tags is None else FEW_TAGS_BATCH_BYTES  # few records kept: small
        self._content: dict[str, dict[str, Any] | None] = {}  # tag -> its JSON content; None: not rnnmon's
        self._stored: dict[str, Stored] = {}  # tag -> how its values were written, from the latest content read
        self._notes: dict[str, None] = {}  # a newer writer's version and columns this reader does not know
        self._seen: dict[str, set[tuple[int, float]]] = {}  # per tag: provider datums decoded
        self._tables: dict[str, _Table] = {}
        self._documents: dict[str, list[tuple[int, Any]]] = {}
        self._fits: set[tuple[Any, Any]] = set()
        self._errors: dict[str, None] = {}
        self._last_write = 0.0
        self._cursors: dict[str, RecordCursor] = {}  # per event file: where update_from_files is, and check_files
        self._checked: dict[str, RecordCursor] = {}
        self._staged: dict[str, list[tuple[int, bytes | np.ndarray, Stored]]] = {}
        self._events: dict[tuple[int, float], str] = {}  # (step, wall time) of each rnnmon event read -> its file
        self._repeated: dict[tuple[str, str], None] = {}  # (file, an earlier file whose events it repeats)
        self._spans: dict[str, list[int]] = {}  # per file: the first and last step of its rnnmon events
        self.chunks_decoded = 0  # values decoded so far: an update adds only the new ones

    # --- sources -----------------------------------------------------------------------------------------
    def update_from_provider(self, provider: Any, ctx: Any, experiment_id: str = "") -> RunData:
        """Read the run through TensorBoard's data provider; only datums with unseen steps are decoded.

        The provider has already turned every value into an array (TensorBoard does that on each call); a
        value whose shape exceeds what the format allows is refused here before it is used.
        """
        from tensorboard.data import provider as tb_provider

        where = tb_provider.RunTagFilter(runs=[self.run], tags=self._only)
        listing = provider.list_tensors(ctx, experiment_id=experiment_id, plugin_name=schema.PLUGIN_NAME,
                                        run_tag_filter=where).get(self.run, {})
        try:
            data = provider.read_tensors(ctx, experiment_id=experiment_id, plugin_name=schema.PLUGIN_NAME,
                                         downsample=ALL_SAMPLES, run_tag_filter=where).get(self.run, {})
        except Exception:  # TensorBoard could not turn some value into an array: find its tag, read the rest
            data = {}
            for tag in listing:
                try:
                    data.update(provider.read_tensors(
                        ctx, experiment_id=experiment_id, plugin_name=schema.PLUGIN_NAME, downsample=ALL_SAMPLES,
                        run_tag_filter=tb_provider.RunTagFilter(runs=[self.run], tags=[tag])).get(self.run, {}))
                except Exception as error:
                    self._error(f"{tag}: TensorBoard's data provider cannot convert a value "
                                f"({type(error).__name__}: {str(error)[:200]})")
        for tag, series in listing.items():
            if tag not in self._content:
                self._describe(tag, schema.parse_content(series.plugin_content))
            seen = self._seen.setdefault(tag, set())
            for datum in data.get(tag, []):
                self._last_write = max(self._last_write, datum.wall_time)
                key = (datum.step, datum.wall_time)  # two writers may stamp the same step, never the same time too
                if key not in seen:
                    seen.add(key)
                    self._add(tag, datum.step, datum.numpy)
        return self._commit()

    def update_from_files(self, run_dir: str) -> RunData:
        """Read the run's event files in `run_dir` directly: new files and the new bytes of known ones."""
        from google.protobuf.message import DecodeError
        from tensorboard.compat.proto import event_pb2

        for name, records in self._scan(run_dir, self._cursors):
            self._add_records(name, records, event_pb2.Event, DecodeError)
        return self._commit()

    def update_from_records(self, name: str, records: list[bytes]) -> RunData:
        """Add whole, checked records of event file `name` read by the caller (the events a reading index lists,
        or those after a digest: `rnnmon.format.digest_read`)."""
        from google.protobuf.message import DecodeError
        from tensorboard.compat.proto import event_pb2

        self._add_records(name, records, event_pb2.Event, DecodeError)
        return self._commit()

    def _add_records(self, name: str, records: list[bytes], event_type: Any, decode_error: Any) -> None:
        for record in records:
            if self._marks is not None and not any(mark in record for mark in self._marks):
                continue  # cannot hold a wanted tag: not even parsed
            try:
                event = event_type.FromString(record)
            except decode_error:
                self._error(f"{name}: a checksummed record that is not an event")
                continue
            if event.HasField("summary"):
                self._add_file_event(name, event)

    def start_at(self, name: str, offset: int) -> None:
        """Read event file `name` from byte `offset` on (`update_from_records` gave it the events before that the
        caller needs); no effect once the file is being read."""
        self._cursors.setdefault(name, RecordCursor(offset))

    def check_files(self, run_dir: str) -> list[str]:
        """Walk the new bytes of the run's event files for damage (checksums, truncation) without decoding.

        For a reader fed by `update_from_provider`, which cannot see damage: what is found joins the run's
        `errors`. Returns the errors so far. Cost: a CRC pass over the bytes written since the last call.
        """
        for _ in self._scan(run_dir, self._checked):
            pass
        return list(self._errors)

    def _scan(self, run_dir: str, cursors: dict[str, RecordCursor]) -> Iterator[tuple[str, list[bytes]]]:
        """(file name, new whole records) per event file in `run_dir`, a bounded batch at a time; damage, and
        what is not a regular file (a FIFO, a link to a device), is recorded as errors."""
        try:
            names = sorted(name for name in os.listdir(run_dir) if EVENT_FILE_MARK in name)
        except OSError as error:
            self._error(f"cannot list {run_dir}: {error.strerror or error}")
            return
        for name in names:
            cursor = cursors.setdefault(name, RecordCursor())
            more = True
            while more:
                try:
                    scan = cursor.scan(os.path.join(run_dir, name), self._batch_bytes)
                except OSError as error:
                    self._error(f"{name}: cannot read: {error.strerror or error}")
                    break
                if scan.problem:
                    self._error(f"{name}: {scan.problem}")
                if scan.truncated and time.time() - scan.modified > TAIL_GRACE_S:
                    self._error(f"{name}: {truncated_at(scan.offset)}")
                more = scan.more
                yield name, scan.records

    def _add_file_event(self, name: str, event: Any) -> None:
        """Add an event of file `name`, unless another file held an event with its step and wall time.

        Chunks are stamped with a sequence that never repeats (`rnnmon.format.writer`), so the same stamp in two
        files is the same chunk, twice: a copied file. It counts once.
        """
        key = (event.step, event.wall_time)
        first = self._events.get(key, name)
        if first != name:
            self._repeated[(name, first)] = None
            return
        if self._add_event(event):
            self._events.setdefault(key, name)
            span = self._spans.setdefault(name, [event.step, event.step])
            span[0], span[1] = min(span[0], event.step), max(span[1], event.step)

    def _add_event(self, event: Any) -> bool:
        """Stage the rnnmon values of `event`; False when it holds none."""
        step = None
        for value in event.summary.value:
            tag = value.tag
            if self._only is not None and tag not in self._only:
                continue
            content = self._content.get(tag, _UNSEEN)
            if content is _UNSEEN or value.HasField("metadata"):  # each file's first value of a tag carries it
                is_ours = value.metadata.plugin_data.plugin_name == schema.PLUGIN_NAME
                content = (schema.parse_content(value.metadata.plugin_data.content) if is_ours
                           else None if content is _UNSEEN else content)
                self._describe(tag, content)
            if content is None:
                continue  # not rnnmon's (its scalars, another plugin)
            if step is None:  # once per event, not per value
                step, wall_time = event.step, event.wall_time
                self._last_write = max(self._last_write, wall_time)
            self.chunks_decoded += 1
            try:
                if not value.HasField("tensor"):
                    raise InvalidRecord("not a tensor")
                raw = _raw_from_proto(value.tensor)
            except _INVALID as error:
                self._error(f"{tag} at step {step}: {error}")
                continue
            self._stage(tag, step, raw)
        return step is not None

    def _describe(self, tag: str, content: dict[str, Any] | None) -> None:
        """Keep `tag`'s metadata content: what its next values are decoded and mapped by."""
        self._content[tag] = content
        if content is None:
            return
        self._stored[tag] = stored_as(tag, content)
        version = content.get("version")
        if _is_number(version) and version > schema.FORMAT_VERSION:
            self._notes[f"written by a newer rnnmon (format version {version}; this reader knows 1 to "
                        f"{schema.FORMAT_VERSION}): tables are read by column name, and what cannot be read is "
                        "named in errors"] = None

    # --- decoding ----------------------------------------------------------------------------------------
    def _add(self, tag: str, step: int, value: Any) -> None:
        """Stage the provider's array of one value of `tag` for `_commit`."""
        self.chunks_decoded += 1
        try:
            raw = _raw_from_array(value)
        except _INVALID as error:
            self._error(f"{tag} at step {step}: {error}")
            return
        self._stage(tag, step, raw)

    def _stage(self, tag: str, step: int, value: bytes | np.ndarray) -> None:
        """Keep one value (a packed chunk, a v1 table or a document) of `tag` for `_commit`, if it is one."""
        try:
            width = _table_width(tag)
            if width == _DOCUMENT:
                self._add_document(tag, step, _document(value))
                return
            if width == _IGNORED:
                return  # a tag from a newer rnnmon: ignore it
            if width == _BAD_DEVICE:
                raise InvalidRecord("not a device tag (expected a GPU index after 'gpu')")
            stored = self._stored.get(tag) or stored_as(tag, {})
            if isinstance(value, bytes):
                if value[:4] != packing.MAGIC:
                    raise InvalidRecord("a string where a table belongs")
                if stored.problem:
                    raise InvalidRecord(stored.problem)
            elif value.shape[1] != len(stored.columns):
                raise InvalidRecord(f"expected rows of {len(stored.columns)} columns, found shape {value.shape}")
        except _INVALID as error:
            self._error(f"{tag} at step {step}: {error}")
            return
        self._staged.setdefault(tag, []).append((step, value, stored))

    def _commit(self) -> RunData:
        """Decode and check the chunks staged by this update, all of a tag at once, and append the valid ones."""
        for tag, staged in self._staged.items():
            groups: dict[Stored, list[tuple[int, bytes | np.ndarray]]] = {}  # usually one: a writer's metadata
            for step, value, stored in staged:
                groups.setdefault(stored, []).append((step, value))
            decoded = [self._decode(tag, stored, values) for stored, values in groups.items()]
            rows = decoded[0][0] if len(decoded) == 1 else np.concatenate([part[0] for part in decoded])
            steps = [step for part in decoded for step in part[1]]
            counts = [count for part in decoded for count in part[2]]
            try:
                _check_rows(tag, rows)
            except InvalidRecord:  # rare: find the culprits chunk by chunk
                keep = np.ones(len(rows), dtype=bool)
                for i, (step, start) in enumerate(zip(steps, np.cumsum([0, *counts[:-1]]))):
                    try:
                        _check_rows(tag, rows[start:start + counts[i]])
                    except InvalidRecord as error:
                        self._error(f"{tag} at step {step}: {error}")
                        keep[start:start + counts[i]] = False
                        counts[i] = 0
                rows = rows[keep]
            self._tables.setdefault(tag, _Table(rows.shape[1])).extend(steps, rows, counts)
        self._staged = {}
        return self.data()

    def _decode(self, tag: str, stored: Stored, staged: list[tuple[int, bytes | np.ndarray]]
                ) -> tuple[np.ndarray, list[int], list[int]]:
        """(rows in this reader's columns, event steps, row counts) of the chunks of `tag` that decode, all
        written as `stored` says; the others become errors."""
        columns = schema.columns_for(tag) or ()
        if all(isinstance(value, bytes) for _, value in staged):  # the usual case: one batch, no copies
            rows, decoded, failed = packing.decode_many(tag, [value for _, value in staged], stored.layout)
            rows = self._by_name(tag, rows, stored.layout.columns if stored.layout else columns)
            steps = [staged[index][0] for index, _ in decoded]
            counts = [count for _, count in decoded]
        else:
            tables, steps, counts, failed = [], [], [], []
            for index, (step, value) in enumerate(staged):
                try:
                    if isinstance(value, bytes):
                        table = packing.decode(tag, value, stored.layout)
                        table = self._by_name(tag, table, stored.layout.columns)  # type: ignore[union-attr]
                    else:
                        table = self._by_name(tag, np.asarray(value, dtype=np.float64), stored.columns)
                except packing.FormatError as error:
                    failed.append((index, error))
                    continue
                tables.append(table)
                steps.append(step)
                counts.append(len(table))
            rows = np.concatenate(tables) if tables else np.empty((0, len(columns)))
        for index, error in failed:
            self._error(f"{tag} at step {staged[index][0]}: {error}")
        return rows, steps, counts

    def _by_name(self, tag: str, rows: np.ndarray, stored: tuple[str, ...]) -> np.ndarray:
        """`by_name`, naming the columns it skipped in the run's notes."""
        rows, unknown = by_name(tag, rows, stored)
        if unknown:
            table = schema.table_name(tag)
            self._notes[f"{table} has columns this reader does not know, skipped: {', '.join(unknown)[:200]}"] = None
        return rows

    def _add_document(self, tag: str, step: int, doc: Any) -> None:
        if tag == schema.RUN_TAG:
            if not isinstance(doc, dict):
                raise InvalidRecord(f"the run description is a {type(doc).__name__}, not a JSON object")
            _check_description(doc)
            self._fits.add((str(doc.get("pid")), str(doc.get("start"))))
        else:
            if not isinstance(doc, list):
                raise InvalidRecord(f"a {type(doc).__name__} where a JSON list belongs")
            for item in doc:
                _DOCUMENT_CHECKS[tag](item)
        bisect.insort(self._documents.setdefault(tag, []), (step, doc), key=lambda pair: pair[0])

    def _error(self, message: str) -> None:
        self._errors[message] = None

    # --- result ------------------------------------------------------------------------------------------
    @property
    def reordered(self) -> int:
        """How often chunks landed before rows already read (a second writer): each time, rows moved."""
        return sum(table.inserted for table in self._tables.values())

    def notes(self) -> list[str]:
        """A newer writer's version and columns skipped; event files of this run that overlap: copies (each event
        counted once) and interleaved writers."""
        notes = [*self._notes]
        notes += [f"{copy} repeats records of {first} (a copy of the file?): each is counted once"
                  for copy, first in self._repeated]
        reach, reaching = -1, ""  # the latest step of the files swept so far, and the file that holds it
        for name, (first, last) in sorted(self._spans.items(), key=lambda item: item[1]):
            if first < reach:
                notes.append(f"{name} and {reaching} hold records of the same time span: two writers of one run "
                             "(before rnnmon's writer lock, or files copied together); both are shown")
            if last > reach:
                reach, reaching = last, name
        if len(notes) > MAX_NOTES:
            notes[MAX_NOTES - 1:] = [f"{len(notes) - MAX_NOTES + 1} more files overlap others"]
        return notes

    def data(self) -> RunData:
        out = RunData(self.run, last_write=self._last_write, errors=list(self._errors), notes=self.notes())
        descriptions = self._documents.get(schema.RUN_TAG, [])
        if descriptions:
            out.info = descriptions[-1][1]
            out.fits = len(self._fits)
            latest: dict[tuple[str, str], dict[str, Any]] = {}  # in the order the fits started
            for _, doc in descriptions:
                latest[str(doc.get("pid")), str(doc.get("start"))] = doc
            out.fit_infos = list(latest.values())
        findings = self._documents.get(schema.FINDINGS_TAG, [])
        out.findings = findings[-1][1] if findings else []
        out.alerts = [alert for _, chunk in self._documents.get(schema.ALERTS_TAG, []) for alert in chunk]
        out.shapes = [record for _, chunk in self._documents.get(schema.SHAPES_TAG, []) for record in chunk]
        out.compiles = [record for _, chunk in self._documents.get(schema.COMPILES_TAG, []) for record in chunk]
        out.shape_steps = [record for _, chunk in self._documents.get(schema.SHAPE_STEPS_TAG, [])
                           for record in chunk]
        for tag, table in self._tables.items():
            device = schema.device_of(tag)
            if device is not None:
                content = self._content.get(tag) or {}
                described = content.get("device")
                out.devices[device] = described if isinstance(described, dict) else {"index": device}
                (out.util if tag.startswith(schema.UTIL_TAG_PREFIX) else out.stats)[device] = table.view()
            else:
                setattr(out, _TABLE_FIELDS[tag], table.view())
        return out


def by_name(tag: str, rows: np.ndarray, stored: tuple[str, ...]) -> tuple[np.ndarray, list[str]]:
    """`rows`, whose columns are named `stored`, in this reader's columns of `tag` (a column it lacks is NaN), and
    the stored columns it does not know (skipped)."""
    columns = schema.columns_for(tag) or ()
    if stored == columns:
        return rows, []
    out = np.full((len(rows), len(columns)), np.nan)
    for i, name in enumerate(columns):
        if name in stored:
            out[:, i] = rows[:, stored.index(name)]
    return out, [name for name in stored if name not in columns]


@dataclasses.dataclass(frozen=True)
class Stored:
    """How a tag's values were written, from its metadata: the columns of a float64 table, and the layout of a
    packed chunk (None, and `problem` saying why, when the metadata describes one this reader cannot decode)."""

    columns: tuple[str, ...]
    layout: packing.Layout | None
    problem: str = ""


def stored_as(tag: str, content: dict[str, Any]) -> Stored:
    """How `tag`'s values were written, from its metadata content; this reader's own columns where the content names
    none."""
    names = content.get("columns")
    columns = schema.columns_for(tag) or ()
    if isinstance(names, list) and 0 < len(names) <= packing.MAX_COLUMNS and all(isinstance(n, str) for n in names):
        columns = tuple(names)
    try:
        return Stored(columns, packing.stored_layout(tag, content))
    except packing.FormatError as error:
        return Stored(columns, None, f"cannot decode packed chunks as the metadata describes them: {error}")


_TABLE_FIELDS = {schema.STEPS_TAG: "steps", schema.PHASES_TAG: "phases", schema.HOST_TAG: "host",
                 schema.GAPS_TAG: "gaps"}
_DOCUMENT, _IGNORED, _BAD_DEVICE = -1, -2, -3


@functools.lru_cache(maxsize=1024)
def _table_width(tag: str) -> int:
    """The column count of `tag`'s table, or what else the tag is: a document, unknown, a malformed device tag."""
    if tag == schema.RUN_TAG or tag in _DOCUMENT_CHECKS:
        return _DOCUMENT
    columns = schema.columns_for(tag)
    if columns is None:
        return _IGNORED
    if tag.startswith((schema.UTIL_TAG_PREFIX, schema.STATS_TAG_PREFIX)) and schema.device_of(tag) is None:
        return _BAD_DEVICE
    return len(columns)


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
            from rnnmon.format.digest_read import read_run  # it reads through this module

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


def read_runs(provider: Any, ctx: Any, experiment_id: str = "", runs: list[str] | None = None) -> dict[str, RunData]:
    """Read the named runs (default: all rnnmon runs) through a data provider; errors are listed per run."""
    from tensorboard.data import provider as tb_provider

    listing = provider.list_tensors(ctx, experiment_id=experiment_id, plugin_name=schema.PLUGIN_NAME,
                                    run_tag_filter=tb_provider.RunTagFilter(runs=runs))
    return {run: RunReader(run).update_from_provider(provider, ctx, experiment_id)
            for run, tags in listing.items() if tags}


def open_logdir(logdir: str) -> tuple[Any, Any]:
    """A data provider over `logdir` that keeps every rnnmon sample, and the request context it needs."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, event_accumulator, plugin_event_multiplexer

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 1})
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, logdir), context.RequestContext()


# --- values --------------------------------------------------------------------------------------------------
def _raw_from_proto(tensor: Any) -> bytes | np.ndarray:
    """A packed chunk or document (bytes) or a v1 float64 table, from a TensorProto, checked before it is built."""
    dtype, dim = tensor.dtype, tensor.tensor_shape.dim
    if dtype == _DT_STRING:
        strings = tensor.string_val
        if len(strings) != 1 or (dim and any(d.size != 1 for d in dim)):
            raise InvalidRecord(f"a string tensor of shape {[d.size for d in dim]} where one string belongs")
        return strings[0]
    if dtype != _DT_DOUBLE:
        raise InvalidRecord(f"dtype {dtype} where float64 ({_DT_DOUBLE}) or string belongs")
    dims = [d.size for d in dim]
    if len(dims) != 2 or not 0 <= dims[0] <= packing.MAX_ROWS or not 0 < dims[1] <= 64:
        raise InvalidRecord(f"shape {dims}: a table is [rows <= {packing.MAX_ROWS}, columns]")
    count = dims[0] * dims[1]
    if tensor.tensor_content:
        if len(tensor.tensor_content) != 8 * count:
            raise InvalidRecord(f"shape {dims} needs {8 * count} bytes, the record holds {len(tensor.tensor_content)}")
        return np.frombuffer(tensor.tensor_content, dtype="<f8").reshape(dims)
    if len(tensor.double_val) != count:
        raise InvalidRecord(f"shape {dims} needs {count} values, the record holds {len(tensor.double_val)}")
    return np.asarray(tensor.double_val, dtype=np.float64).reshape(dims)


def _raw_from_array(value: Any) -> bytes | np.ndarray:
    """The same, from the array TensorBoard's data provider made of the value."""
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind in "SU":
        if array.size != 1:
            raise InvalidRecord(f"a string tensor of shape {list(array.shape)} where one string belongs")
        item = array.reshape(-1)[0]
        return item if isinstance(item, bytes) else str(item).encode()
    if array.ndim != 2 or array.shape[0] > packing.MAX_ROWS or not 0 < array.shape[1] <= 64:
        raise InvalidRecord(f"shape {list(array.shape)}: a table is [rows <= {packing.MAX_ROWS}, columns]")
    if array.dtype.kind != "f":
        raise InvalidRecord(f"dtype {array.dtype} where float64 or string belongs")
    return array


def _check_rows(tag: str, rows: np.ndarray) -> None:
    """Values the format rules out: non-finite times and counters, out-of-range kinds, causes and devices."""
    def whole(column: np.ndarray, lo: float, hi: float) -> bool:
        return bool(np.isfinite(column).all() and (column == np.rint(column)).all()
                    and (column >= lo).all() and (column <= hi).all())

    if tag == schema.STEPS_TAG:
        s = {name: rows[:, i] for i, name in enumerate(schema.STEP_COLUMNS)}
        if not (np.isfinite(rows[:, :4]).all() and whole(s["batches"], 1, 2**31) and whole(s["step"], 0, 2**53)
                and whole(s["epoch"], 0, 2**31)):
            raise InvalidRecord("a step row with a non-finite or fractional step, epoch, time or batch count")
    elif tag == schema.PHASES_TAG:
        if not (whole(rows[:, 0], 0, len(schema.PHASE_KINDS) - 1) and np.isfinite(rows[:, 1:]).all()):
            raise InvalidRecord(f"a phase with a kind outside 0..{len(schema.PHASE_KINDS) - 1} or a non-finite time")
    elif tag == schema.GAPS_TAG:
        if not (whole(rows[:, 0], schema.STEP_DEVICE, 2**16) and whole(rows[:, 3], 0, len(schema.GAP_CAUSES) - 1)
                and np.isfinite(rows[:, 1:3]).all() and (rows[:, 2] >= rows[:, 1]).all()):
            raise InvalidRecord(f"a gap with a device below {schema.STEP_DEVICE}, a cause outside "
                                f"0..{len(schema.GAP_CAUSES) - 1}, or a bad interval")
    elif not np.isfinite(rows[:, 0]).all():
        raise InvalidRecord("a row with a non-finite time")


def _document(value: bytes | np.ndarray) -> Any:
    if not isinstance(value, bytes):
        raise InvalidRecord("a table where a JSON document belongs")
    if len(value) > MAX_DOCUMENT_BYTES:
        raise InvalidRecord(f"a JSON document of {len(value)} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit")
    try:
        return json.loads(value.decode("utf-8"))
    except RecursionError:
        raise InvalidRecord("a JSON document nested too deeply") from None
    except ValueError as error:
        raise InvalidRecord(f"not JSON: {error}") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_DESCRIPTION_TYPES: dict[str, tuple[type, ...]] = {
    "status": (str,), "backend": (str,), "keras": (str,), "host": (str,), "input_wait": (str,), "input_kind": (str,),
    "nvml": (str,), "gpus": (list,), "worker": (str,), "thresholds": (dict,), "callback_hooks_s": (dict,),
    "trial": (dict,), "input_cache": (str,)}


def _check_description(doc: dict[str, Any]) -> None:
    for key, types in _DESCRIPTION_TYPES.items():
        if doc.get(key) is not None and not isinstance(doc[key], types):
            raise InvalidRecord(f"run description field {key!r} is a {type(doc[key]).__name__}")
    for key in ("start", "end", "idle_pct", "steps", "steps_per_execution", "fetch_floor_ms", "callback_steps",
                "callback_batches", "distributed_split_ms", "partial_batch_ms"):
        if doc.get(key) is not None and not _is_number(doc[key]):
            raise InvalidRecord(f"run description field {key!r} is not a finite number: {doc[key]!r:.40}")


def _check_finding(item: Any) -> None:
    fields = ("code", "severity", "where", "message", "advice")
    if not isinstance(item, dict) or set(item) != set(fields) or not all(isinstance(item[f], str) for f in fields):
        raise InvalidRecord(f"a finding that is not {{{', '.join(fields)}}} strings: {str(item)!r:.60}")
    if item["severity"] not in _SEVERITIES:
        raise InvalidRecord(f"a finding with severity {item['severity']!r:.30}, not one of {', '.join(_SEVERITIES)}")


def _check_alert(item: Any) -> None:
    if not isinstance(item, dict):
        raise InvalidRecord(f"an alert that is a {type(item).__name__}, not a JSON object")
    for key in ("rule", "state", "message"):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise InvalidRecord(f"alert field {key!r} is not a string")
    for key in ("start", "end", "value", "threshold"):
        number = item.get(key)
        if number is not None and not (_is_number(number) or (key in ("value", "threshold") and number != number)):
            raise InvalidRecord(f"alert field {key!r} is not a number")
    device = item.get("device")
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise InvalidRecord("alert field 'device' is not an integer")


def _check_shape(item: Any) -> None:
    """{"step", "time", "shapes"}: a step number, Unix seconds, and a list of shapes (lists of sizes or None)."""
    if not isinstance(item, dict) or not _is_number(item.get("step")) or not _is_number(item.get("time")):
        raise InvalidRecord(f"an input shape record without a step and a time: {str(item)!r:.60}")
    shapes = item.get("shapes")
    if not isinstance(shapes, list) or not all(
            shape is None or (isinstance(shape, list) and all(size is None or _is_number(size) for size in shape))
            for shape in shapes):
        raise InvalidRecord(f"input shapes that are not lists of sizes: {str(shapes)!r:.60}")


def _check_compile(item: Any) -> None:
    """{"step", "time", "duration_s", "count", "seconds", "source", "shapes"} (rnnmon.capture.compiles)."""
    if not isinstance(item, dict) or not all(_is_number(item.get(key)) for key in ("step", "time", "duration_s",
                                                                                   "count")):
        raise InvalidRecord(f"a compile record without a step, time, duration and count: {str(item)!r:.60}")
    if not (item.get("seconds") is None or _is_number(item["seconds"])) or not isinstance(item.get("source"), str):
        raise InvalidRecord(f"a compile record whose seconds or source are off: {str(item)!r:.60}")
    if item.get("shapes") is not None:
        _check_shape({"step": 0, "time": 0, "shapes": item["shapes"]})


def _check_shape_steps(item: Any) -> None:
    """{"shapes", "steps", "plain_steps", "plain_s"}: one input shape's steps in a chunk and what they cost."""
    if not isinstance(item, dict) or not all(_is_number(item.get(key)) for key in ("steps", "plain_steps",
                                                                                   "plain_s")):
        raise InvalidRecord(f"a shape's steps without their counts and cost: {str(item)!r:.60}")
    _check_shape({"step": 0, "time": 0, "shapes": item.get("shapes")})


_DOCUMENT_CHECKS = {schema.FINDINGS_TAG: _check_finding, schema.ALERTS_TAG: _check_alert,
                    schema.SHAPES_TAG: _check_shape, schema.COMPILES_TAG: _check_compile,
                    schema.SHAPE_STEPS_TAG: _check_shape_steps}



def raw_value(tag: str, tensor: Any, stored: Stored | None = None) -> np.ndarray:
    """One table chunk of `tag` from its TensorProto, as float64 rows in this reader's columns, checked as
    `RunReader` checks it (shape and size first, then the rows); InvalidRecord or packing.FormatError when it fails.
    `stored`: how the chunk's file describes the tag (`stored_as`), default as this reader writes it."""
    rows, _, _, failed = decode_chunks(tag, [_raw_from_proto(tensor)], stored)
    if failed:
        raise InvalidRecord(failed[0][1])
    return rows


def decode_chunks(tag: str, tensors: list[Any], stored: Stored | None = None
                  ) -> tuple[np.ndarray, list[int], list[int], list[tuple[int, str]]]:
    """Table chunks of `tag` (TensorProtos, or what `_raw_from_proto` made of them) decoded, mapped by column name
    and checked together, as `RunReader` does: (their rows concatenated, row count and index of each chunk kept,
    (index, error) of each refused). `stored`: how their file describes the tag (`stored_as`), default as this
    reader writes it."""
    stored = stored or stored_as(tag, {})
    width = _table_width(tag)
    raws, failed = [], []
    for index, tensor in enumerate(tensors):
        try:
            raw = tensor if isinstance(tensor, (bytes, np.ndarray)) else _raw_from_proto(tensor)
            if isinstance(raw, bytes) and stored.problem:
                raise InvalidRecord(stored.problem)
            if not isinstance(raw, bytes):
                if raw.shape[1] != len(stored.columns):
                    raise InvalidRecord(f"expected rows of {len(stored.columns)} columns, found shape {raw.shape}")
                raw = by_name(tag, raw, stored.columns)[0]
            raws.append((index, raw))
        except _INVALID as error:
            failed.append((index, str(error)))
    tables, kept = [], []
    packed = [(index, raw) for index, raw in raws if isinstance(raw, bytes)]
    if packed:
        rows, decoded, errors = packing.decode_many(tag, [raw for _, raw in packed], stored.layout)
        rows = by_name(tag, rows, stored.layout.columns if stored.layout else stored.columns)[0]
        failed += [(packed[i][0], str(error)) for i, error in errors]
        starts = np.cumsum([0, *(count for _, count in decoded)])
        tables += [(packed[i][0], rows[starts[n]:starts[n + 1]]) for n, (i, _) in enumerate(decoded)]
    tables += [(index, np.asarray(raw, dtype=np.float64)) for index, raw in raws if not isinstance(raw, bytes)]
    tables.sort(key=lambda pair: pair[0])
    good = []
    try:
        _check_rows(tag, np.concatenate([t for _, t in tables]) if tables else np.empty((0, width)))
        good = tables
    except InvalidRecord:  # rare: find the culprits chunk by chunk
        for index, table in tables:
            try:
                _check_rows(tag, table)
                good.append((index, table))
            except InvalidRecord as error:
                failed.append((index, str(error)))
    kept = [index for index, _ in good]
    rows = np.concatenate([t for _, t in good]) if good else np.empty((0, width))
    return rows, [len(t) for _, t in good], kept, sorted(failed)
