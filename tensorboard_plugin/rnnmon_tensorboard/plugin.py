"""The rnnmon tab's HTTP backend: run list, downsampled timelines, summaries, alert thresholds, static files.

Routes are thin; the work is in the `*_impl` methods, which return plain data. With a local log directory each
run's own event files are read through rnnmon's reader (only new bytes, checksums checked, values checked before
they are expanded; see `run_files`), and a live run's reader and timeline index are kept and extended at each
change; otherwise run data comes through TensorBoard's data provider, so the Rust data server and the Python
loader both work. TensorBoard's data provider always says which runs exist. A `gs://` or `s3://` log directory is
mirrored into a local cache and read as a local one, its runs listed by a provider over the mirror (`remote_runs`).
The one write is `POST /thresholds`, which saves the thresholds file at the log directory's root (see
`thresholds_store`); it takes JSON only, with a header a cross-site form cannot send, the version of the file it
edits, and a small body.
See `http_api.md`.

Example:
    >>> plugin = RnnmonPlugin(base_plugin.TBContext(logdir="runs", data_provider=provider))
    >>> plugin.timeline_impl(ctx, "", "exp1/rnnmon", start=None, end=None, points=800)["steps"]["total"]
    1200
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import ipaddress
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider as tb_provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from rnnmon.analysis import verdict
from rnnmon.analysis.stragglers import compare_workers, worker_of, worker_order
from rnnmon.analysis.summary import summarize
from rnnmon.format import schema
from rnnmon.format.digest_read import DigestReader, documents_reader
from rnnmon.format.eventfile import is_cut
from rnnmon.format.reader import ALL_SAMPLES, RunData, RunReader

from . import plotly_bundle
from .indexed_timeline import IndexedTimeline
from .labels import LABELS
from .read_ahead import ReadAhead
from .remote_runs import RemoteRuns
from .run_files import LocalRuns
from .thresholds_store import NotWritableError, StaleVersionError, ThresholdsStore, reaches
from .timeline import TimelineIndex, array_bytes
from .workers_view import WorkerEntry, heatmap, worker_entry, worker_reader

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}  # every such file in STATIC_DIR is served
LIVE_WINDOW_S = 30.0  # a running run whose last write is older than this is shown as stalled
DEFAULT_POINTS, MAX_POINTS = 1000, 20000
CACHE_RUNS = 10
CACHE_JOBS = 4  # multi-worker jobs whose workers' summaries /workers keeps
CACHE_BYTES = 64 * 2**20  # what the cached indexes and summaries may hold, all runs together, one run included
INDEX_FROM_BYTES = 2**20  # runs with this much in event files (~65k steps) are drawn from their reading index
DERIVED = ("timeline", "summary")  # what the routes build from a run's tables
READ_AHEAD_RUNS = 3  # runs /runs reads ahead (local log directories): the tab's first, then the newest
READ_AHEAD_BYTES = CACHE_BYTES // 2  # what their indexes may hold, estimated from their event files' size
INDEX_BYTES_PER_FILE_BYTE = 5  # a 1M-step run: 4.6 (input-bound, a gap every step), 2.3 (GPU run)
VERSION_HEADER = "X-Rnnmon-Version"  # the `version` a save edits (GET /thresholds answers it)
SAVE_HEADER, SAVE_HEADER_VALUE = "X-Rnnmon-Request", "save"  # a cross-site form post cannot set a header
MAX_BODY_BYTES = 16 * 1024  # a thresholds document is under 2 KiB


@dataclasses.dataclass
class _LiveRun:
    """A running run's reader, kept across versions, and its newest timeline index, which the next version
    extends instead of building anew while the reader only appended rows (`reordered` unchanged)."""

    reader: RunReader
    timeline: TimelineIndex | None = None
    reordered: int = 0


@dataclasses.dataclass
class _CachedRun:
    """One version of a run: its tables until everything in DERIVED is built from them, then only those."""

    version: Any
    data: RunData | None = None
    errors: list[str] | None = None  # None until read
    derived: dict[str, Any] = dataclasses.field(default_factory=dict)
    nbytes: int = 0  # held in the arrays of `derived`
    live: _LiveRun | None = None  # while the run is running
    base: TimelineIndex | None = None  # an index of an earlier version of these tables, to extend
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass
class _Indexed:
    """A run drawn from its reading index (`indexed_timeline`), the version of its files it last took in, and what
    it holds in memory; `lock` is held while it reads."""

    timeline: IndexedTimeline
    version: Any = None
    nbytes: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass
class _Digested:
    """A large local run's summary from its digest, the version of its files it was built from, and the reader that
    takes in only what was written since (a live run's next summary costs its new chunks); `lock` is held while it
    reads."""

    reader: DigestReader
    version: Any = None
    summary: dict[str, Any] | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass
class _Described:
    """What /runs knows of a local run: the reader of its descriptions, and the version of its files it last read
    with what that gave (one value, replaced whole); `lock` is held while it reads."""

    reader: RunReader | None = None
    read: tuple[Any, RunData] | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass
class _Job:
    """/workers' last answer for a multi-worker job, the versions of its workers' data it was built from, and each
    worker's entry; `lock` is held while its workers are summarized."""

    answer: dict[str, Any] | None = None
    versions: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    workers: dict[str, WorkerEntry] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class RunDataError(errors.PublicError):
    """A run whose rnnmon data cannot be read (HTTP 422: the request was fine, the data is not; 500 is for bugs)."""

    http_code = 422


class RequestRefused(errors.PublicError):
    """A refused `POST /thresholds`, with its HTTP status (405, 409, 413, 415, 428); the message says what to
    change."""

    def __init__(self, http_code: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.http_code = http_code
        self.headers = headers or []


class RnnmonPlugin(base_plugin.TBPlugin):
    """Serves the rnnmon tab. TensorBoard lists it as active when the data provider holds rnnmon data."""

    plugin_name = schema.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext, read_ahead_runs: int = READ_AHEAD_RUNS,
                 read_ahead_bytes: int = READ_AHEAD_BYTES, live_window_s: float = LIVE_WINDOW_S,
                 cache_bytes: int = CACHE_BYTES, index_from_bytes: int = INDEX_FROM_BYTES) -> None:
        self._data_provider = context.data_provider
        self._cache: collections.OrderedDict[tuple[str, str], _CachedRun] = collections.OrderedDict()
        self._indexed: collections.OrderedDict[tuple[str, str], _Indexed] = collections.OrderedDict()
        self._digested: collections.OrderedDict[tuple[str, str], _Digested] = collections.OrderedDict()
        self._cache_bytes, self._index_from_bytes = cache_bytes, index_from_bytes
        self._live: dict[tuple[str, str], _LiveRun] = {}  # running runs: decoded chunks, kept across versions
        self._lock = threading.Lock()
        self._local = LocalRuns.of(context.logdir)  # None: read through the data provider
        self._remote = RemoteRuns.of(context.logdir)  # gs://, s3://: read through a local mirror, as local runs
        if self._remote is not None:
            if context.logdir != self._remote.tree:  # TensorBoard reads the URL itself: the runs listed from the mirror
                self._data_provider = self._remote.provider
            self._local = LocalRuns(self._remote.tree)
        self._descriptions: dict[tuple[str, str], _Described] = {}  # local runs, for /runs
        self._descriptions_lock = threading.Lock()  # held only to find or add a run's entry, never while reading
        self._plotly_gz: bytes | None = None
        self._thresholds = ThresholdsStore(self._remote.shown if self._remote else context.logdir)
        self._read_ahead_runs, self._read_ahead_bytes = read_ahead_runs, read_ahead_bytes
        self._live_window_s = live_window_s
        self.read_ahead = ReadAhead()  # reads runs /runs listed before the tab asks for them (local log directories)
        self._jobs: collections.OrderedDict[tuple[str, str], _Job] = collections.OrderedDict()  # for /workers
        self.workers_summarized = 0  # worker summaries /workers computed: once per version of a worker's data

    def get_plugin_apps(self) -> dict[str, Any]:
        static = {f"/{name}": _static_file(name, STATIC_TYPES[os.path.splitext(name)[1]])
                  for name in sorted(os.listdir(STATIC_DIR)) if os.path.splitext(name)[1] in STATIC_TYPES}
        return {
            **static,
            "/plotly.min.js": self._serve_plotly,
            "/runs": self._serve_runs,
            "/timeline": self._serve_timeline,
            "/summary": self._serve_summary,
            "/workers": self._serve_workers,
            "/thresholds": self._serve_thresholds,
        }

    def is_active(self) -> bool:
        # only asked when TensorBoard's provider lists no rnnmon data (see `data_plugin_names`): a remote log
        # directory is read by the tab itself
        return self._remote is not None

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="RNN Monitor")

    # --- routes ----------------------------------------------------------------------------------------
    @wrappers.Request.application
    def _serve_plotly(self, request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, self._plotly_bundle(), "text/javascript", content_encoding="gzip",
                                 expires=3600)

    @wrappers.Request.application
    def _serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment = plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)
        return http_util.Respond(request, self.runs_impl(ctx, experiment), "application/json")

    @wrappers.Request.application
    def _serve_timeline(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment = plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)
        args = request.args
        start, end = _number(args, "start"), _number(args, "end")
        if start is not None and end is not None and start >= end:
            raise errors.InvalidArgumentError(f"start must be less than end: start={start!r}, end={end!r}")
        points = _points(args.get("points"))
        body = self.timeline_impl(ctx, experiment, _run(args), start, end, points)
        return http_util.Respond(request, body, "application/json")

    @wrappers.Request.application
    def _serve_summary(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment = plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)
        return http_util.Respond(request, self.summary_impl(ctx, experiment, _run(request.args)), "application/json")

    @wrappers.Request.application
    def _serve_workers(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment = plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)
        return http_util.Respond(request, _as_json(self.workers_impl(ctx, experiment, _run(request.args))),
                                 "application/json")

    @wrappers.Request.application
    def _serve_thresholds(self, request: wrappers.Request) -> wrappers.Response:
        if request.method in ("GET", "HEAD"):
            return http_util.Respond(request, self.thresholds_impl(), "application/json")
        if request.method != "POST":
            raise RequestRefused(405, f"/thresholds answers GET and POST only. Received: {request.method}",
                                 [("Allow", "GET, HEAD, POST")])
        _check_host(request)
        edits = _edited_version(request)
        return http_util.Respond(request, self.save_thresholds_impl(_json_body(request), edits), "application/json")

    # --- work --------------------------------------------------------------------------------------------
    def runs_impl(self, ctx: Any, experiment: str) -> dict[str, Any]:
        """Every run with rnnmon data: status from its newest run description, and whether it is live."""
        listing = self._data_provider.list_tensors(ctx, experiment_id=experiment, plugin_name=schema.PLUGIN_NAME)
        described = {} if self._local else self._data_provider.read_tensors(
            ctx, experiment_id=experiment, plugin_name=schema.PLUGIN_NAME, downsample=ALL_SAMPLES,
            run_tag_filter=tb_provider.RunTagFilter(tags=[schema.RUN_TAG]))
        now = time.time()
        runs = []
        file_bytes: dict[str, int] = {}
        for run in sorted(name for name, tags in listing.items() if tags):
            last_write = max(series.max_wall_time for series in listing[run].values())
            notes: list[str] = []
            if self._local:  # from the files: nothing of them is expanded by the provider, and newer than its reload
                info, problems, notes, written, file_bytes[run] = self._description(experiment, run)
                last_write = max(last_write, written)
                indexed = self._indexed.get((experiment, run))
                notes = notes + (indexed.timeline.notes if indexed is not None else [])
            else:
                info, error = _newest_json(described.get(run, {}).get(schema.RUN_TAG, []))
                problems = [error] if error else []
            status = str(info.get("status", "unknown"))
            if status == "running":
                status = "live" if now - last_write <= self._live_window_s else "stalled"
            job = worker_of(run)
            runs.append({"run": run, "name": _display_name(run), "job": job[0] if job else None,
                         "status": status, "live": status == "live",
                         "last_write": last_write, "age_s": round(now - last_write, 1),
                         "start": info.get("start"), "errors": problems, "notes": notes,
                         "thresholds_reach": reaches(run)})
        if self._local:
            self._offer_reads(ctx, experiment, runs, file_bytes)
        return {"runs": runs, "live_window_s": self._live_window_s, "labels": LABELS}

    def _offer_reads(self, ctx: Any, experiment: str, runs: list[dict[str, Any]], file_bytes: dict[str, int]) -> None:
        """Offer the background reader the runs the tab is likely to open next: the one it shows first (the first
        listed), then the most recently written, as many as `read_ahead_runs` whose estimated indexes fit in
        `read_ahead_bytes`. Each run is offered once per process; `read_ahead_run` skips one already read."""
        likely = runs[:1] + sorted(runs[1:], key=lambda run: -run["last_write"])
        budget = self._read_ahead_bytes
        for run in likely[:self._read_ahead_runs]:
            estimate = file_bytes.get(run["run"], 0) * INDEX_BYTES_PER_FILE_BYTE
            if estimate > budget:
                break
            budget -= estimate
            self.read_ahead.offer((experiment, run["run"]),
                                  functools.partial(self.read_ahead_run, ctx, experiment, run["run"], estimate))

    def read_ahead_run(self, ctx: Any, experiment: str, run: str, estimate_bytes: int = 0) -> bool:
        """Read `run` and build what the tab asks for first (its timeline index and summary), unless it was read
        already or its index (`estimate_bytes`) would not fit beside the cached ones: it never evicts a run.
        True when it was read."""
        key = (experiment, run)
        run_dir = self._run_dir(run)
        if run_dir is not None and self._drawn_from_index(LocalRuns.version(run_dir)):
            with self._lock:
                if key in self._indexed:
                    return False
            with contextlib.suppress(RunDataError, errors.NotFoundError):
                self.timeline_impl(ctx, experiment, run, None, None, DEFAULT_POINTS)
                self.summary_impl(ctx, experiment, run)  # from its digest
            return True
        with self._lock:
            if key in self._cache or key in self._live:
                return False
            if len(self._cache) >= CACHE_RUNS or self._cached_bytes() + estimate_bytes > self._cache_bytes:
                return False
        with contextlib.suppress(RunDataError, errors.NotFoundError):  # its routes report that
            self._derived(ctx, experiment, run, "timeline", self._timeline)
            self._derived(ctx, experiment, run, "summary", self._summary)  # the tables are dropped after both
        return True

    def timeline_impl(self, ctx: Any, experiment: str, run: str, start: float | None, end: float | None,
                      points: int) -> dict[str, Any]:
        """`run`'s series over [start, end] (seconds since its origin), about `points` points per series."""
        run_dir = self._run_dir(run)
        if run_dir is not None:
            version = LocalRuns.version(run_dir)
            if self._drawn_from_index(version):
                return self._from_index(ctx, experiment, run, run_dir, version, (start, end, points))
        return self._derived(ctx, experiment, run, "timeline", self._timeline).view(start, end, points)

    def _drawn_from_index(self, version: Any) -> bool:
        return sum(size for _, size, _ in version) >= self._index_from_bytes

    def _from_index(self, ctx: Any, experiment: str, run: str, run_dir: str, version: Any,
                    window: tuple[float | None, float | None, int]) -> dict[str, Any]:
        """The run's timeline over `window` (start, end, points) from its index, which first takes in what was
        written since its last version (one request at a time per run); its memory counts in the cache's budget
        like every cached index."""
        listing = self._data_provider.list_tensors(ctx, experiment_id=experiment, plugin_name=schema.PLUGIN_NAME,
                                                   run_tag_filter=tb_provider.RunTagFilter(runs=[run]))
        if not listing.get(run):
            raise errors.NotFoundError(f"No rnnmon data for run {run!r}")
        key = (experiment, run)
        with self._lock:
            entry = self._indexed.pop(key, None)
        if entry is None:
            entry = _Indexed(IndexedTimeline(run, run_dir))
        with self._lock:
            self._indexed[key] = entry  # the most recently asked last
        with entry.lock:
            if entry.version != version:
                entry.timeline.refresh()
                entry.version, entry.nbytes = version, entry.timeline.nbytes()
            problems = [error for error in entry.timeline.errors if not is_cut(error)]
            answer = None if problems else entry.timeline.view(*window)
            if answer is not None:  # cuts through records: what is around them is drawn, the cut named
                answer["notes"] = [*answer["notes"], *(error for error in entry.timeline.errors if is_cut(error))]
            entry.nbytes = entry.timeline.nbytes()  # a disagreement found while viewing indexes the file in memory
        self._trim()
        if answer is None:
            raise RunDataError(_unreadable(run, problems))
        return answer

    def summary_impl(self, ctx: Any, experiment: str, run: str) -> dict[str, Any]:
        """`rnnmon.analysis.summary.summarize` for `run`, with the verdict in words and its advice; a large local run
        from its documents and digest (`rnnmon.format.digest_read`), never its tables."""
        run_dir = self._run_dir(run)
        indexed = run_dir is not None and self._drawn_from_index(LocalRuns.version(run_dir))
        if indexed:
            summary = self._digested_summary(ctx, experiment, run, run_dir)
            if summary is not None:
                return summary
        return self._derived(ctx, experiment, run, "summary", self._summary,
                             ("summary",) if indexed else DERIVED)  # its timeline comes from its index

    def _digested_summary(self, ctx: Any, experiment: str, run: str, run_dir: str) -> dict[str, Any] | None:
        """The summary of this version of `run`'s files from its digest; None where a file has no index."""
        listing = self._data_provider.list_tensors(ctx, experiment_id=experiment, plugin_name=schema.PLUGIN_NAME,
                                                   run_tag_filter=tb_provider.RunTagFilter(runs=[run]))
        if not listing.get(run):
            raise errors.NotFoundError(f"No rnnmon data for run {run!r}")
        key, version = (experiment, run), LocalRuns.version(run_dir)
        with self._lock:
            entry = self._digested.pop(key, None) or _Digested(DigestReader(run_dir, run))
            self._digested[key] = entry  # the most recently asked last
            while len(self._digested) > CACHE_RUNS:
                self._digested.popitem(last=False)
        with entry.lock:
            if entry.version != version:
                data = entry.reader.read()
                if data is None:
                    return None
                data = _cuts_noted(data)
                entry.version, entry.errors = version, list(data.errors)
                entry.summary = None if data.errors else self._described(summarize(data), run)
        if entry.errors:
            raise RunDataError(_unreadable(run, entry.errors))
        return entry.summary

    def _timeline(self, cached: _CachedRun) -> TimelineIndex:
        """The index of this version: the previous version's, extended by the new rows, where that works."""
        index = cached.base.appended(cached.data) if cached.base is not None else None
        index = index or TimelineIndex(cached.data)
        cached.base = None
        if cached.live is not None:
            cached.live.timeline = index
        return index

    def _summary(self, cached: _CachedRun) -> dict[str, Any]:
        return self._described(summarize(cached.data), cached.data.run)  # idle_gaps: the longest 20

    @staticmethod
    def _described(summary: dict[str, Any], run: str) -> dict[str, Any]:
        summary["verdict_text"] = verdict.label(summary["verdict"])
        summary["verdict_advice"] = verdict.ADVICE.get(summary["verdict"])
        summary["name"] = _display_name(run)
        return summary

    def workers_impl(self, ctx: Any, experiment: str, run: str) -> dict[str, Any]:
        """The workers of `run`'s multi-worker job side by side, the straggler first, with STRAGGLER, those left
        out of the comparison with the reason (unreadable data, too few steps) and the worker x time view; no
        workers for other runs. Each worker is summarized once per version of its data; the job's answer is kept
        until one of its workers changes (see `workers_view`)."""
        job = worker_of(run)
        if job is None:
            return {"job": None, "workers": [], "findings": [], "left_out": [], "heatmap": None}
        listing = self._data_provider.list_tensors(ctx, experiment_id=experiment, plugin_name=schema.PLUGIN_NAME)
        siblings = sorted(((found[1], name) for name, tags in listing.items()
                           if tags and (found := worker_of(name)) is not None and found[0] == job[0]),
                          key=lambda pair: worker_order(pair[0]))
        versions = [(name, self._worker_version(name, listing[name])) for _, name in siblings]
        with self._lock:
            kept = self._jobs.pop((experiment, job[0]), None) or _Job()
            self._jobs[(experiment, job[0])] = kept  # the most recently asked last
            while len(self._jobs) > CACHE_JOBS:
                self._jobs.pop(next(iter(self._jobs)))
        with kept.lock:  # one summarizing pass per job at a time; a request behind it gets its answer
            if kept.answer is None or kept.versions != versions:
                entries = {name: self._worker_entry(ctx, experiment, name, version, kept.workers.get(name))
                           for name, version in versions}
                kept.answer, kept.versions, kept.workers = _job_answer(job[0], siblings, entries), versions, entries
            return kept.answer

    def _worker_version(self, run: str, tags: dict[str, Any]) -> Any:
        """What changes whenever a worker's data does: its files' version, or the provider's newest samples."""
        run_dir = self._run_dir(run)
        if run_dir is not None:
            return LocalRuns.version(run_dir)
        return sorted((tag, series.max_step, series.max_wall_time) for tag, series in tags.items())

    def _worker_entry(self, ctx: Any, experiment: str, run: str, version: Any, kept: WorkerEntry | None) -> WorkerEntry:
        """`kept` while the worker's data is at `version`, else its figures and step bins read anew."""
        if kept is not None and kept.version == version:
            return kept
        self.workers_summarized += 1
        reader = worker_reader(run)  # the tables its figures need
        run_dir = self._run_dir(run)
        data = _cuts_noted(reader.update_from_files(run_dir) if run_dir is not None
                           else reader.update_from_provider(self._data_provider, ctx, experiment))
        if data.errors:
            return WorkerEntry(version, reason=_unreadable(run, data.errors))
        return worker_entry(version, data)

    def thresholds_impl(self) -> dict[str, Any]:
        """The saved thresholds (or the defaults), the file's path, and whether the tab can save it."""
        return self._thresholds.read()

    def save_thresholds_impl(self, data: Any, edits: str) -> dict[str, Any]:
        """Validate and save `data` as the thresholds file, if it still is at version `edits`; `thresholds_impl()`
        afterwards."""
        try:
            return self._thresholds.save(data, edits)
        except (ValueError, TypeError, RecursionError) as error:
            raise errors.InvalidArgumentError(str(error) or "the thresholds document is nested too deeply") from None
        except (NotWritableError, StaleVersionError) as error:
            raise RequestRefused(409, str(error)) from None

    # --- helpers -----------------------------------------------------------------------------------------
    def _derived(self, ctx: Any, experiment: str, run: str, name: str, build: Callable[[_CachedRun], Any],
                 needed: tuple[str, ...] = DERIVED) -> Any:
        """`build(cached)` for the run's current data, built once per version of it (see `_CachedRun`); the run's
        tables are dropped once everything `needed` is built."""
        cached = self._read(ctx, experiment, run)
        with cached.lock:
            if name not in cached.derived:
                cached.derived[name] = build(cached)
                cached.nbytes += array_bytes(cached.derived[name])
                if set(needed) <= set(cached.derived):
                    cached.data = RunData(run)  # the tables were only needed to build these
            built = cached.derived[name]
        self._trim()
        return built

    def _read(self, ctx: Any, experiment: str, run: str) -> _CachedRun:
        """The run's cache entry, read again only when a tag has new samples; raises for unknown or unreadable runs."""
        listing = self._data_provider.list_tensors(ctx, experiment_id=experiment, plugin_name=schema.PLUGIN_NAME,
                                                   run_tag_filter=tb_provider.RunTagFilter(runs=[run]))
        tags = listing.get(run)
        if not tags:
            raise errors.NotFoundError(f"No rnnmon data for run {run!r}")
        run_dir = self._run_dir(run)
        if run_dir is not None:
            version: Any = LocalRuns.version(run_dir)
        else:
            version = sorted((tag, series.max_step, series.max_wall_time) for tag, series in tags.items())
        key = (experiment, run)
        with self._lock:
            cached = self._cache.get(key)
            if cached is None or cached.version != version:
                cached = self._cache[key] = _CachedRun(version)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_RUNS:
                self._cache.popitem(last=False)  # the least recently used run
        with cached.lock:  # one reader per run and version; other requests for it wait for its result
            if cached.errors is None:
                with self._lock:
                    live = self._live.pop(key, None)
                reader = live.reader if live else RunReader(run)
                if run_dir is not None:
                    data = reader.update_from_files(run_dir)  # new bytes only
                else:
                    data = reader.update_from_provider(self._data_provider, ctx, experiment)  # new chunks only
                data = _cuts_noted(data)
                if live is not None and live.reordered == reader.reordered:
                    cached.base = live.timeline  # the new rows follow the rows it indexed
                if data.info.get("status") == "running":  # more chunks will come: keep what is decoded
                    live = cached.live = _LiveRun(reader, cached.base, reader.reordered)
                    with self._lock:
                        self._live[key] = live
                        while len(self._live) > CACHE_RUNS:
                            self._live.pop(next(iter(self._live)))
                cached.data, cached.errors = data, list(data.errors)
        if cached.errors:
            raise RunDataError(_unreadable(run, cached.errors))
        return cached

    def _run_dir(self, run: str) -> str | None:
        """The folder of a local log directory's run; None: read it through the data provider."""
        return self._local.directory(run) if self._local else None

    def _cached_bytes(self) -> int:
        """What the cached indexes and summaries hold (the caller holds `_lock`)."""
        return sum(entry.nbytes for entry in self._cache.values()) + sum(e.nbytes for e in self._indexed.values())

    def cached_bytes(self) -> int:
        """What the cache holds now: never more than its budget once a request is answered."""
        with self._lock:
            return self._cached_bytes()

    def _trim(self) -> None:
        """Evict the least recently used runs until the cache fits its budget; a run that alone is over it is
        answered, then dropped (the budget is a bound, also for one run)."""
        with self._lock:
            while self._cached_bytes() > self._cache_bytes:
                (self._cache if self._cache else self._indexed).popitem(last=False)

    def _description(self, experiment: str, run: str) -> tuple[dict[str, Any], list[str], list[str], float, int]:
        """A local run's newest description, its errors (the description's, and damage to its files), its notes
        (event files that overlap), when its files last changed and their size; reads only the bytes written since
        the last call and parses only records that name the description's tag.

        Each run is read under its own lock, never under one shared by all runs: while another request reads
        this run, its last description is used instead of waiting (waited for only when there is none yet)."""
        run_dir = self._run_dir(run)
        if run_dir is None:
            return {}, [], [], 0.0, 0
        version = LocalRuns.version(run_dir)
        with self._descriptions_lock:
            described = self._descriptions.setdefault((experiment, run), _Described())
        if described.lock.acquire(blocking=described.read is None):
            try:
                if described.reader is None:  # its first read: the events its index lists, then what follows
                    described.reader = documents_reader(run_dir, run, frozenset({schema.RUN_TAG}))
                if described.read is None or described.read[0] != version:
                    described.read = version, described.reader.update_from_files(run_dir)
            finally:
                described.lock.release()
        version, data = described.read
        data = _cuts_noted(data)
        return (data.info, data.errors, data.notes, max((mtime_ns / 1e9 for _, _, mtime_ns in version), default=0.0),
                sum(size for _, size, _ in version))

    def _plotly_bundle(self) -> bytes:
        """plotly.js gzipped (`plotly_bundle`: the partial bundle when fetched, else the full one), read once."""
        if self._plotly_gz is None:
            self._plotly_gz = plotly_bundle.gzipped()
            if self._plotly_gz is None:
                raise errors.NotFoundError("The plotly package is not installed: pip install plotly")
        return self._plotly_gz


def _job_answer(job: str, siblings: list[tuple[str, str]], entries: dict[str, WorkerEntry]) -> dict[str, Any]:
    """/workers' answer for a job from its workers' entries (`siblings`: (worker, run) in index order)."""
    figures, left_out = [], []
    for worker, name in siblings:
        entry = entries[name]
        if entry.figures is None:
            left_out.append({"worker": worker, "run": name, "reason": entry.reason})
            continue
        if not entry.figures["judged"]:  # compare_workers leaves it out
            left_out.append({"worker": worker, "run": name, "reason": "too few steps to compare"})
        figures.append(entry.figures)
    groups = compare_workers(figures)
    group = groups[0] if groups else {"job": job, "workers": [], "findings": []}
    straggler = next((f["where"] for f in group["findings"] if f["code"] == "STRAGGLER"), None)

    def first(row: dict[str, Any]) -> tuple[bool, float]:  # the straggler, then the longest stall per step
        return row["worker"] != straggler, -((row["input_wait_ms"] or 0.0) + row["host_gap_ms"])

    # `order`: the row's place by worker (worker-2 before worker-10), for the tab's sort by that column
    workers = sorted(({**row, "order": order} for order, row in enumerate(group["workers"])), key=first)
    bins = [(worker, entries[name].bins) for worker, name in siblings if entries[name].figures is not None]
    return {**group, "workers": workers, "straggler": straggler, "left_out": left_out, "heatmap": heatmap(bins)}


def _as_json(answer: dict[str, Any]) -> str | dict[str, Any]:
    """`answer` as JSON text where it holds JSON's values only (no NaN or infinity, no bytes or sets), else itself for
    `Respond`, whose `json_util.Cleanse` walks every value in Python (2,000 workers' heatmap: 0.25 s)."""
    try:
        return json.dumps(answer, allow_nan=False)
    except (ValueError, TypeError):
        return answer


def _cuts_noted(data: RunData) -> RunData:
    """`data` as the routes serve it: a cut through records (`is_cut`: a file that ends inside a record, a record
    cut and written after) among its notes, not its errors, so the records around it are shown."""
    cuts = [error for error in data.errors if is_cut(error)]
    if not cuts:
        return data
    return dataclasses.replace(data, errors=[error for error in data.errors if not is_cut(error)],
                               notes=[*data.notes, *cuts])


def _unreadable(run: str, problems: list[str]) -> str:
    return f"Run {run!r} has unreadable rnnmon data: {'; '.join(problems)}"


def _static_file(name: str, mimetype: str) -> Any:
    @wrappers.Request.application
    def serve(request: wrappers.Request) -> wrappers.Response:
        with open(os.path.join(STATIC_DIR, name), "rb") as f:
            return http_util.Respond(request, f.read(), mimetype)

    return serve


def _edited_version(request: wrappers.Request) -> str:
    """The `version` of the thresholds a save edits, after the header check that keeps other sites out: every
    client must say it (428 without), so a save never overwrites a file it has not seen."""
    if request.headers.get(SAVE_HEADER, "").strip().lower() != SAVE_HEADER_VALUE:
        raise errors.PermissionDeniedError(
            f"POST /thresholds needs the header {SAVE_HEADER}: {SAVE_HEADER_VALUE} (a cross-site form cannot send it)")
    edits = request.headers.get(VERSION_HEADER, "").strip()
    if not edits:
        raise RequestRefused(428, f"POST /thresholds needs the header {VERSION_HEADER}: the version that GET "
                                  "/thresholds answered (\"none\" while there is no file), so that a save never "
                                  "overwrites changes it has not seen")
    return edits


def _json_body(request: wrappers.Request) -> Any:
    """The JSON document of a save request, after the checks that keep large bodies out."""
    if request.mimetype != "application/json":
        raise RequestRefused(415, "POST /thresholds takes JSON: send Content-Type: application/json. "
                                  f"Received: {request.content_type or 'no Content-Type'}")
    too_large = f"The thresholds document must be at most {MAX_BODY_BYTES} bytes"
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise RequestRefused(413, f"{too_large}. Received: Content-Length {request.content_length}")
    body = request.stream.read(MAX_BODY_BYTES + 1)  # without a Content-Length (chunked), read one byte past the limit
    if len(body) > MAX_BODY_BYTES:
        raise RequestRefused(413, f"{too_large}. Received: a longer body, sent without Content-Length")
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise errors.InvalidArgumentError(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise errors.InvalidArgumentError("the body is nested too deeply") from None


def _check_host(request: wrappers.Request) -> None:
    """Refuse a save addressed to a foreign host name or sent from another origin (DNS rebinding), as Jupyter does.

    Allowed: localhost, IP literals, this machine's names, and the names in RNNMON_ALLOWED_HOSTS (comma
    separated; "*" allows any).
    """
    host = request.host or ""
    if host.startswith("["):  # [IPv6]:port
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.rstrip(".").lower()
    allowed = {h.strip().lower() for h in os.environ.get("RNNMON_ALLOWED_HOSTS", "").split(",") if h.strip()}
    if not ("*" in allowed or name in allowed or _local_name(name)):
        raise errors.PermissionDeniedError(
            f"POST /thresholds refuses Host {host[:80]!r}: reach TensorBoard at localhost, an IP address or this "
            "machine's name, or list the name in RNNMON_ALLOWED_HOSTS (a guard against DNS rebinding)")
    origin = request.headers.get("Origin")
    if origin and origin != "null" and urllib.parse.urlsplit(origin).netloc.lower() != host.lower():
        raise errors.PermissionDeniedError(f"POST /thresholds refuses a request from another origin: {origin[:80]!r}")


def _local_name(name: str) -> bool:
    if name in ("localhost", socket.gethostname().lower(), socket.getfqdn().lower()) or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _run(args: Any) -> str:
    run = args.get("run")
    if not run:
        raise errors.InvalidArgumentError("Missing required parameter: run (a run name from /runs)")
    return run


def _number(args: Any, name: str) -> float | None:
    raw = args.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise errors.InvalidArgumentError(f"{name} must be a number of seconds since the run's origin: {name}={raw!r}")
    return value


def _points(raw: str | None) -> int:
    if raw in (None, ""):
        return DEFAULT_POINTS
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 10 <= int(raw) <= MAX_POINTS:  # no ²²
        raise errors.InvalidArgumentError(f"points must be an integer from 10 to {MAX_POINTS}: points={raw!r}")
    return int(raw)


def _display_name(run: str) -> str:
    """'exp1/rnnmon' -> 'exp1': rnnmon writes into its own subdirectory of the user's run directory."""
    suffix = "/" + schema.RUN_SUBDIR
    return run[: -len(suffix)] if run.endswith(suffix) and len(run) > len(suffix) else run


def _newest_json(datums: list[Any]) -> tuple[dict[str, Any], str | None]:
    """The newest run description, and a message when it is not readable."""
    if not datums:
        return {}, None
    datum = max(datums, key=lambda d: d.step)
    try:
        raw = datum.numpy.item() if hasattr(datum.numpy, "item") else datum.numpy
        doc = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        return {}, f"{schema.RUN_TAG}: {error}"
    return (doc, None) if isinstance(doc, dict) else ({}, f"{schema.RUN_TAG}: not a JSON object")
