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
    >>> runs = read_logdir("runs")                      # rnnmon.format.logdir: what `rnnmon report` reads
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
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from rnnmon.format import packing, schema
from rnnmon.format.decode import (
    BAD_DEVICE,
    DOCUMENT,
    DOCUMENT_CHECKS,
    IGNORED,
    INVALID,
    InvalidRecord,
    Stored,
    by_name,
    check_description,
    check_rows,
    is_number,
    json_document,
    raw_from_array,
    raw_from_proto,
    stored_as,
    table_width,
)
from rnnmon.format.eventfile import EVENT_FILE_MARK, SCAN_BATCH_BYTES, TAIL_GRACE_S, RecordCursor, truncated_at
from rnnmon.format.growing_table import GrowingTable

ALL_SAMPLES = 10**9  # `downsample` that keeps everything the provider holds
MAX_NOTES = 10  # notes listed per run; the rest are counted
FEW_TAGS_BATCH_BYTES = 4 << 20  # a reader of a few tags (the tab's /runs) walks files in batches this small
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



class RunReader:
    """One run's rnnmon data, decoded chunk by chunk and kept; each update decodes only what is new."""

    def __init__(self, run: str, tags: frozenset[str] | None = None, tag_prefixes: tuple[str, ...] = ()) -> None:
        """`tags`: decode only these tags, and those that start with one of `tag_prefixes` (a GPU's tags); None:
        all. From files, only records that name one of them are parsed."""
        self.run = run
        self._only = tags
        self._prefixes = tag_prefixes if tags is not None else ()
        self._marks = None if tags is None else tuple(mark.encode() for mark in (*tags, *tag_prefixes))
        self._batch_bytes = SCAN_BATCH_BYTES if tags is None else FEW_TAGS_BATCH_BYTES  # few records kept: small
        self._content: dict[str, dict[str, Any] | None] = {}  # tag -> its JSON content; None: not rnnmon's
        self._stored: dict[str, Stored] = {}  # tag -> how its values were written, from the latest content read
        self._notes: dict[str, None] = {}  # a newer writer's version and columns this reader does not know
        self._seen: dict[str, set[tuple[int, float]]] = {}  # per tag: provider datums decoded
        self._tables: dict[str, GrowingTable] = {}
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

        where = tb_provider.RunTagFilter(runs=[self.run], tags=None if self._prefixes else self._only)
        listing = provider.list_tensors(ctx, experiment_id=experiment_id, plugin_name=schema.PLUGIN_NAME,
                                        run_tag_filter=where).get(self.run, {})
        if self._prefixes:  # the provider filters by whole names: the tags those prefixes start
            listing = {tag: series for tag, series in listing.items() if self._wanted(tag)}
            where = tb_provider.RunTagFilter(runs=[self.run], tags=list(listing))
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
            if not self._wanted(tag):
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
                raw = raw_from_proto(value.tensor)
            except INVALID as error:
                self._error(f"{tag} at step {step}: {error}")
                continue
            self._stage(tag, step, raw)
        return step is not None

    def _wanted(self, tag: str) -> bool:
        return self._only is None or tag in self._only or tag.startswith(self._prefixes)

    def _describe(self, tag: str, content: dict[str, Any] | None) -> None:
        """Keep `tag`'s metadata content: what its next values are decoded and mapped by."""
        self._content[tag] = content
        if content is None:
            return
        self._stored[tag] = stored_as(tag, content)
        version = content.get("version")
        if is_number(version) and version > schema.FORMAT_VERSION:
            self._notes[f"written by a newer rnnmon (format version {version}; this reader knows 1 to "
                        f"{schema.FORMAT_VERSION}): tables are read by column name, and what cannot be read is "
                        "named in errors"] = None

    # --- decoding ----------------------------------------------------------------------------------------
    def _add(self, tag: str, step: int, value: Any) -> None:
        """Stage the provider's array of one value of `tag` for `_commit`."""
        self.chunks_decoded += 1
        try:
            raw = raw_from_array(value)
        except INVALID as error:
            self._error(f"{tag} at step {step}: {error}")
            return
        self._stage(tag, step, raw)

    def _stage(self, tag: str, step: int, value: bytes | np.ndarray) -> None:
        """Keep one value (a packed chunk, a v1 table or a document) of `tag` for `_commit`, if it is one."""
        try:
            width = table_width(tag)
            if width == DOCUMENT:
                self._add_document(tag, step, json_document(value))
                return
            if width == IGNORED:
                return  # a tag from a newer rnnmon: ignore it
            if width == BAD_DEVICE:
                raise InvalidRecord("not a device tag (expected a GPU index after 'gpu')")
            stored = self._stored.get(tag) or stored_as(tag, {})
            if isinstance(value, bytes):
                if not packing.is_packed(value):
                    raise InvalidRecord("a string where a table belongs")
                if stored.problem:
                    raise InvalidRecord(stored.problem)
            elif value.shape[1] != len(stored.columns):
                raise InvalidRecord(f"expected rows of {len(stored.columns)} columns, found shape {value.shape}")
        except INVALID as error:
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
                check_rows(tag, rows)
            except InvalidRecord:  # rare: find the culprits chunk by chunk
                keep = np.ones(len(rows), dtype=bool)
                for i, (step, start) in enumerate(zip(steps, np.cumsum([0, *counts[:-1]]))):
                    try:
                        check_rows(tag, rows[start:start + counts[i]])
                    except InvalidRecord as error:
                        self._error(f"{tag} at step {step}: {error}")
                        keep[start:start + counts[i]] = False
                        counts[i] = 0
                rows = rows[keep]
            self._tables.setdefault(tag, GrowingTable(rows.shape[1])).extend(steps, rows, counts)
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
            check_description(doc)
            self._fits.add((str(doc.get("pid")), str(doc.get("start"))))
        else:
            if not isinstance(doc, list):
                raise InvalidRecord(f"a {type(doc).__name__} where a JSON list belongs")
            for item in doc:
                DOCUMENT_CHECKS[tag](item)
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
                described = content.get("device")  # on the GPU's first table only (both before format 5)
                if isinstance(described, dict):
                    out.devices[device] = described
                else:
                    out.devices.setdefault(device, {"index": device})
                (out.util if tag.startswith(schema.UTIL_TAG_PREFIX) else out.stats)[device] = table.view()
            else:
                setattr(out, _TABLE_FIELDS[tag], table.view())
        return out


_TABLE_FIELDS = {schema.STEPS_TAG: "steps", schema.PHASES_TAG: "phases", schema.HOST_TAG: "host",
                 schema.GAPS_TAG: "gaps"}


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
