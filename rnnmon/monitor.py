"""`UtilizationMonitor`: the Keras callback that records why the GPU is idle, step by step.

Example:
    >>> monitor = rnnmon.UtilizationMonitor("runs/exp1")
    >>> model.fit(dataset, epochs=3, callbacks=[monitor])
    >>> # then: rnnmon report runs    or    tensorboard --logdir runs
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Literal

import keras

from rnnmon.alerts import prometheus
from rnnmon.alerts.delivery import Alerting
from rnnmon.alerts.rules import AlertEvent
from rnnmon.alerts.thresholds import Thresholds
from rnnmon.analysis.input_advice import input_advice
from rnnmon.audit.pipeline import audit_pipeline, batching_stage, cache_stage, input_kind
from rnnmon.audit.placement import audit_placement
from rnnmon.audit.preprocessing import audit_preprocessing
from rnnmon.audit.rnn_layers import audit_rnn_layers
from rnnmon.capture.callback_timing import CallbackTiming
from rnnmon.capture.compiles import CompileWatch
from rnnmon.capture.exits import ExitGuard
from rnnmon.capture.fetch_floor import fetch_floors
from rnnmon.capture.fit_scope import FitScope, HookGuard
from rnnmon.capture.input_timing import (
    SAMPLE_EVERY,
    EpochIteratorTiming,
    Shapes,
    unwrap_train_function,
    wrap_jax_train_function,
    wrap_train_function,
)
from rnnmon.capture.profiling import ProfileCapture
from rnnmon.capture.recorder import Recorder
from rnnmon.capture.ticker import Ticker
from rnnmon.capture.trials import Trial, tuner_trial
from rnnmon.capture.workers import jax_worker_name, worker_name
from rnnmon.findings import Finding, sort_findings
from rnnmon.format import schema
from rnnmon.format.run_lock import RunLock
from rnnmon.format.writer import SummaryWriter
from rnnmon.gpu.devices import (
    backend_gpu_count,
    model_cuda_ordinals,
    nvml_inventory,
    process_on_devices,
    select_devices,
)
from rnnmon.gpu.nvml import Nvml
from rnnmon.gpu.sampler import Sampler
from rnnmon.storage import remote
from rnnmon.storage.uploader import Uploader

LOG = logging.getLogger("rnnmon")
NA = math.nan
_RUNNING: weakref.WeakSet[UtilizationMonitor] = weakref.WeakSet()  # monitors whose fit has not ended yet
_FINISH_WAIT_S = 5.0  # the longest a fit's end waits for rnnmon's last write
_HOOK_WAIT_S = 3.0  # then the longest it waits for the on_alert hook to take the last alerts
_RETRY_AFTER_FIT_S = 600.0  # a final write the disk refused is retried this long in the background
_SEGMENT_BYTES = 8 << 20  # a remote run's event file is finished at this size (or after `segment_s`)


class UtilizationMonitor(keras.callbacks.Callback):
    """Times every training step (input wait, compute, host gap), samples NVML, and writes TensorBoard data.

    Per step it stores begin, end, the time blocked on the input pipeline and the host gap since the previous
    step; validation and epoch ends are stored as phases. A background thread samples each GPU this process
    uses (utilization at the driver's ~6 Hz, memory, power, clocks, temperature, PCIe, throttling, and SM
    activity where GPM exists) and writes everything to `log_dir/rnnmon` every `flush_secs`.

    Args:
        log_dir: The run's log directory; rnnmon writes to its `rnnmon` subdirectory. A `gs://` or `s3://` URL
            (needs `rnnmon[gcs]` or `rnnmon[s3]`) is written to a local staging folder and uploaded from there
            in the background; see docs/storage.md.
        devices: "auto" (the GPUs the model computes on, found through CUDA's device UUIDs; a MIG device is
            watched as itself), "all", or a list of NVML indices. Defaults to "auto".
        sample_interval_s: Seconds between NVML polls. Defaults to `0.5`.
        flush_secs: Seconds between writes to disk, at most 5. Defaults to `2.0`.
        idle_pct: Utilization at or below which the GPU counts as idle. Defaults to `5.0`.
        min_gap_ms: Without a GPU, the shortest non-compute stretch reported as a gap. Defaults to `10.0`.
        measure_input_wait: Time the input wait (inside Keras's train function on TensorFlow and JAX, around
            the epoch loop's fetch on torch). `None` times every step, except on TensorFlow with
            `steps_per_execution > 1`: there a timed execution pulls its batches in Python in place of the
            in-graph loop (0.2-0.9 ms more per batch), so one execution in 16 is timed and the input share is
            judged on those (`input_wait` "sampled: 1 execution in 16" in the run description). True times every
            execution; False none. Defaults to `None`.
        thresholds: Alert thresholds, a `rnnmon.Thresholds` or a dict of the same shape. A thresholds file
            saved by the TensorBoard tab in `log_dir` or up to three folders above it replaces them within one
            flush while `watch_thresholds` is True. Defaults to `Thresholds()`.
        on_alert: Called with each `AlertEvent` (firing and resolved), in order, on a thread of its own
            (`rnnmon-hooks`), so a slow hook never holds up the record. At most 100 events wait for it; later
            ones are dropped (and counted in a warning) until it catches up. The end of a fit waits for it at
            most 3 s, after everything is on disk. Defaults to `None`.
        stop_on_alert: Stop training when an alert fires: True for any rule, or a list of rule names.
            Defaults to `False`.
        profile_steps_on_alert: Capture a profiler trace of this many steps after the first alert, into
            `log_dir/rnnmon` (TensorBoard's Profile tab). Defaults to `0` (off).
        watch_thresholds: Follow the thresholds file saved by the tab. Defaults to `True`.
        thresholds_root: The highest folder searched for that file, e.g. TensorBoard's `--logdir`. Only a
            regular file owned by this user or root, of at most 16 KiB, is followed, and never one in the
            system's temp directory or a world-writable folder. Defaults to `None` (up to three folders up).
        audit: Check the model's RNN layers, the input pipeline and device placement at the start and record
            the findings. Defaults to `True`.
        prometheus_port: Serve Prometheus metrics on this port plus the process's local rank (`LOCAL_RANK`
            and the like; 0 picks a free port and logs it); see docs/prometheus.md. One endpoint per process
            serves every live monitor; it closes when the last monitor is garbage-collected. Needs
            `prometheus_client`. A port in use logs one error and training goes on unexported. Defaults to
            `None` (off).
        prometheus_addr: The address the endpoint binds to. Defaults to `"127.0.0.1"` (this machine only).
        prometheus_job: The `job` label of every series. Defaults to `"rnnmon"`.
        prometheus_sd_dir: Also write a Prometheus `file_sd_configs` target file for the endpoint into this
            folder (removed when the endpoint closes). Defaults to `None`.
        upload_interval_s: With a `gs://` or `s3://` log_dir, each changed file is uploaded at most once per this
            many seconds (the growing event file's bounded rate). Defaults to `30.0`.
        segment_s: With a `gs://` or `s3://` log_dir, a new event file is started after this many seconds (or at
            8 MiB), so finished files are uploaded once and never change. Defaults to `300.0`.

    In multi-worker training (`TF_CONFIG`, torchrun's `RANK`/`WORLD_SIZE`, or JAX with several processes) each
    worker writes to its own run, `log_dir/worker-<index>/rnnmon` (`chief-0`, `ps-0`, ... by task type). Building
    the monitor starts no framework runtime: build it before or after `jax.distributed.initialize()`. A
    `TF_CONFIG` task that cannot name such a folder (`../../x`) is refused with one ERROR; the process then
    records in `log_dir/rnnmon`. In a KerasTuner search each trial writes to its own run,
    `log_dir/trial_<id>/rnnmon`: pass the monitor in `tuner.search(..., callbacks=[...])`; KerasTuner gives each
    trial a copy (`copy.deepcopy`), a fresh monitor with the same settings.

    Its place in the callbacks list does not matter: every callback's batch hooks count as host time between
    steps, wherever it sits.

    It records `fit` (its validation included). Given to `model.evaluate()` or `predict()` outside a fit, it
    records nothing and says so once, in a warning.

    Example:
        ```python
        model.fit(dataset, epochs=3, callbacks=[rnnmon.UtilizationMonitor("runs/exp1")])
        ```
    """

    def __init__(self, log_dir: str, *, devices: Literal["auto", "all"] | Sequence[int] = "auto",
                 sample_interval_s: float = 0.5, flush_secs: float = 2.0, idle_pct: float = 5.0,
                 min_gap_ms: float = 10.0, measure_input_wait: bool | None = None,
                 thresholds: Thresholds | dict[str, Any] | None = None,
                 on_alert: Callable[[AlertEvent], None] | None = None,
                 stop_on_alert: bool | Sequence[str] = False, profile_steps_on_alert: int = 0,
                 watch_thresholds: bool = True, thresholds_root: str | None = None,
                 audit: bool = True, prometheus_port: int | None = None,
                 prometheus_addr: str = "127.0.0.1", prometheus_job: str = "rnnmon",
                 prometheus_sd_dir: str | None = None, upload_interval_s: float = 30.0,
                 segment_s: float = 300.0) -> None:
        self._arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}  # for copies
        super().__init__()
        _require(0.05 <= sample_interval_s <= 60, "sample_interval_s", sample_interval_s, "between 0.05 and 60")
        _require(0 < flush_secs <= 5, "flush_secs", flush_secs, "in (0, 5]")
        _require(0 <= idle_pct < 100, "idle_pct", idle_pct, "in [0, 100)")
        _require(min_gap_ms >= 0, "min_gap_ms", min_gap_ms, ">= 0")
        if not (devices in ("auto", "all") or (not isinstance(devices, str)
                                                and all(isinstance(i, int) for i in devices))):
            raise ValueError(f"devices must be 'auto', 'all' or a list of NVML indices. Received: devices={devices!r}")
        _require(prometheus_port is None or (isinstance(prometheus_port, int) and 0 <= prometheus_port < 65536),
                 "prometheus_port", prometheus_port, "None or a port number in [0, 65535]")
        _require(upload_interval_s > 0, "upload_interval_s", upload_interval_s, "> 0")
        _require(segment_s > 0, "segment_s", segment_s, "> 0")
        self.log_dir = log_dir
        self.upload_interval_s, self.segment_s = upload_interval_s, segment_s
        # gs:// and s3://: the run is written to a local staging folder and uploaded from there (rnnmon.storage)
        if remote.is_remote(log_dir):
            remote.check(log_dir)
        self._staging = remote.local_folder("staging", log_dir) if remote.is_remote(log_dir) else None
        self._uploader: Uploader | None = None
        self.worker = worker_name()  # from the environment only; JAX's process index is asked at the fit's start
        self.run_dir = self._run_dir(None)
        self.devices = devices
        self.sample_interval_s = sample_interval_s
        self.flush_secs = flush_secs
        self.idle_pct = idle_pct
        self.min_gap_s = min_gap_ms / 1e3
        self.measure_input_wait = measure_input_wait
        self.thresholds = thresholds if isinstance(thresholds, Thresholds) else Thresholds.from_dict(thresholds or {})
        rules = [f.name for f in dataclasses.fields(Thresholds)]
        if not isinstance(stop_on_alert, bool):
            unknown = [rule for rule in stop_on_alert if rule not in rules]
            _require(not unknown, "stop_on_alert", list(stop_on_alert), f"True, False or rule names from {rules}")
        _require(isinstance(profile_steps_on_alert, int) and profile_steps_on_alert >= 0, "profile_steps_on_alert",
                 profile_steps_on_alert, "an integer >= 0")
        self.on_alert = on_alert
        self.stop_on_alert = stop_on_alert
        self.profile_steps_on_alert = profile_steps_on_alert
        self.watch_thresholds = watch_thresholds
        self.thresholds_root = thresholds_root
        self.audit = audit
        self._exporter, self.prometheus_port = (None, None) if prometheus_port is None else prometheus.attach(
            self, port=prometheus_port, addr=prometheus_addr, job=prometheus_job, worker=self.worker or "0",
            sd_dir=prometheus_sd_dir)
        self._nvml = Nvml()
        self._sampler: Sampler | None = None
        self._active = False
        self._global_step = 0
        self._logged_findings: set[Finding] = set()
        self._exits = ExitGuard(self._finish)
        self._finish_lock = threading.Lock()
        self._pid = os.getpid()
        self._scope = FitScope(None, 0)
        self._trial: Trial | None = None
        self._callback_timing: CallbackTiming | None = None
        self._told_outside_fit = False  # evaluate() or predict() was given this monitor outside a fit

    def __deepcopy__(self, memo: dict[int, Any]) -> UtilizationMonitor:
        """A fresh, unstarted monitor with this one's settings: KerasTuner copies the callbacks for each trial.

        The copy shares what must stay one per process or per user: the `on_alert` hook (not a copy of its
        object), the Prometheus endpoint, and the memory of findings and device warnings already logged, so a
        search logs each of them once, not once per trial.
        """
        twin = type(self)(**{**self._arguments, "prometheus_port": None})
        twin._exporter, twin.prometheus_port = self._exporter, self.prometheus_port
        if self._exporter is not None:
            prometheus.share(twin, self._exporter)
        twin._arguments = self._arguments
        twin._logged_findings = self._logged_findings
        twin._nvml = self._nvml.fresh()
        memo[id(self)] = twin
        return twin

    def _run_dir(self, trial: Trial | None) -> str:
        """`log_dir[/trial_<id>][/<worker>]/rnnmon`: the run a fit writes to."""
        parts = [*([trial.folder] if trial else []), *([self.worker] if self.worker else [])]
        return os.path.join(self._staging or self.log_dir, *parts, schema.RUN_SUBDIR)

    # --- fit lifecycle ---------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        scope = FitScope.find(self.model)
        twin = next((m for m in _RUNNING if m is not self and m._scope.same_fit(scope)), None)
        if twin is not None:
            LOG.error("rnnmon: two UtilizationMonitors in one fit; the first (log_dir=%r) records it, this one "
                      "(log_dir=%r) is off for this fit. Pass one monitor per fit.", remote.redact(twin.log_dir),
                      remote.redact(self.log_dir))
            return
        for stale in [m for m in _RUNNING if m is self or m.model is self.model]:
            stale._finish("aborted")  # its fit raised before on_train_end
        self._scope = scope
        if self.worker is None and keras.backend.backend() == "jax":  # the fit has started JAX's runtime
            self.worker = jax_worker_name()
            if self.worker is not None and self._exporter is not None:  # its series were worker="0" so far
                self._exporter = prometheus.relabel(self, self._exporter, worker=self.worker)
        fit = scope.call()
        self._trial = tuner_trial(fit.callbacks.callbacks) if fit is not None else None
        self.run_dir = self._run_dir(self._trial)
        try:
            self._start()
        except Exception as error:  # e.g. an unwritable log_dir: train anyway, unmonitored
            LOG.error("rnnmon: monitoring is off for this fit: %s: %s", type(error).__name__, error)
            if getattr(self, "_writer", None) is None and getattr(self, "_run_lock", None) is not None:
                self._run_lock.release()
            if self.model is not None:
                unwrap_train_function(self.model)
            if self._sampler is not None:
                self._sampler.close()  # frees its GPM samples
            if self._uploader is not None:
                self._uploader.close()  # uploads what was written, then ends
            self._nvml.shutdown()

    def _start(self) -> None:
        self._clock = time.perf_counter
        self._pid = os.getpid()
        self._wall_offset = time.time() - self._clock()
        self._epoch = 0
        self._last_end = self._clock()
        self._begin = self._last_end
        self._wait, self._batches, self._shapes = NA, 0, None
        self._last_shapes: Shapes | None = None
        self._seen_shapes: set[Shapes] = set()  # input shapes this fit has stepped on
        self._epoch_timing: EpochIteratorTiming | None = None
        self._model_audit_pending = False
        fit = self._scope.call()
        self._callback_timing = None if fit is None else CallbackTiming(
            fit.callbacks.callbacks, skip=self, on_begun=self._step_begins, on_ended=self._step_ends,
            on_epoch_ending=self._epoch_ends, on_profiler=self._profiler_ran)
        self._end = NA
        self._input_kind = input_kind(fit.x) if fit is not None else None
        self._hook_guard: HookGuard | None = None
        self._fit_steps = 0  # step records (executions) of this fit, and their batches: what its callback hook
        self._fit_batches = 0  # times are per
        self._open_phase: tuple[str, float] | None = None
        self._profiler_end: float | None = None  # a profiler started or stopped since the last step, until then
        self._fit_begin = self._clock()
        self._warming_up = True
        self._eval_warming_up = True  # the fit's first validation batch traces Keras's test function
        self._per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)

        self._sampler = sampler = None
        if self._nvml.start():
            ordinals = model_cuda_ordinals(self.model, keras.backend.backend())
            self._sampler = sampler = Sampler(
                self._nvml, select_devices(self._nvml, self.devices, model_ordinals=ordinals), self._clock)
        run_url = None if self._staging is None else remote.join(remote.redact(self.log_dir),
                                                                  os.path.relpath(self.run_dir, self._staging))
        uploader = None if run_url is None else Uploader(  # before the lock: fsspec may be missing
            self.run_dir, run_url, interval_s=self.upload_interval_s)
        self._run_lock = RunLock(self.run_dir)
        self._run_lock.acquire()  # a second writer of this run: monitoring is off for this fit
        try:
            segments = {"segment_s": self.segment_s, "segment_bytes": _SEGMENT_BYTES} if uploader else {}
            self._writer = SummaryWriter(self.run_dir, **segments)
        except BaseException:
            self._run_lock.release()
            raise
        self._uploader = uploader  # (None for a local log_dir; a new one each fit)
        if uploader is not None:
            uploader.start()
        self._profile_noted = False
        self._profile = ProfileCapture(self.run_dir, self.profile_steps_on_alert, self.model, self._on_profile,
                                       shown_dir=run_url)  # the bucket: staging is emptied after the fit
        self._alerting = Alerting(self.thresholds, log_dir=self._staging or self.log_dir, writer=self._writer,
                                  wall_offset_s=self._wall_offset, on_alert=self.on_alert, on_fire=self._on_fire,
                                  amend=self._profile_note,
                                  on_change=self._on_thresholds_change, watch_file=self.watch_thresholds,
                                  thresholds_root=self.thresholds_root,
                                  input_advice=input_advice(self._input_kind, keras.backend.backend()))
        self._recorder = Recorder(self._writer, sampler, self._wall_offset, idle_pct=self.idle_pct,
                                  min_gap_s=self.min_gap_s, on_chunk=self._on_chunk)
        if self._exporter is not None and sampler is not None:
            self._exporter.add_devices(d["index"] for d in sampler.describe())
        self._input_timing = self._install_input_timing()
        self._compile_watch = CompileWatch.for_model(self.model, keras.backend.backend())
        self._run_info = self._describe_run(sampler)
        self._writer.json(schema.RUN_TAG, self._run_info)
        self._findings: list[Finding] = []
        if self.audit:
            self._audit_setup()
        if fit is not None:  # a later callback that raises ends monitoring in its own call
            self._hook_guard = HookGuard(fit.callbacks, self._on_error)
        self._active = True
        if self._exporter is not None:
            self._exporter.fit_started()
        _RUNNING.add(self)
        self._final_status = "finished"
        self._final_done = threading.Event()
        self._poller = Ticker(self.sample_interval_s, self._poll, name="rnnmon-sampler")
        self._flusher = Ticker(self.flush_secs, self._flush, name="rnnmon-writer", on_stop=self._write_final)
        self._poller.start()
        self._flusher.start()
        self._exits.install()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if not self._active:
            return
        self._wait, self._batches, self._shapes = NA, 0, None
        if self._epoch_timing is not None:  # torch: the batch was fetched before the callbacks' begin hooks
            self._wait, self._batches, self._shapes = self._epoch_timing.take()
        if self._callback_timing is None or not self._callback_timing.stamps_begin:
            self._step_begins(self._clock())

    def _step_begins(self, now: float) -> None:
        """After the last callback's `on_train_batch_begin`: the step's compute starts (and, on torch, its fetch
        ended just before those hooks: the step begins that much earlier, and the hooks are host time)."""
        if not self._active:
            return
        self._begin = now - self._wait if self._epoch_timing is not None else now
        if self._open_phase is None and self._profiler_end is not None:  # the whole host gap is the profiler's
            self._open_phase = ("profile", self._last_end)
        if self._open_phase is not None:  # the epoch boundary lasts until the next epoch's first step
            self._close_phase(self._begin)
            self._last_end = self._begin
        self._profiler_end = None

    def _step_ends(self, now: float) -> None:
        """When the first callback's `on_train_batch_end` is called: the step's outputs are numbers by then."""
        self._end = now

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self._active:
            return
        stamped = self._callback_timing is not None and self._callback_timing.stamps_end
        end = self._end if stamped else self._clock()
        batches = self._batches or self._per_execution
        gap = self._begin - self._last_end
        shapes = self._shapes
        compiles, compile_s = self._compile_watch.take(self._begin, end, shapes)
        if self._warming_up:  # tracing and iterator creation: neither input wait nor host overhead
            self._warming_up = False
            self._recorder.add_phase("warmup", self._fit_begin, end)
            gap = NA
        elif compiles:
            self._recorder.add_compile(self._global_step + batches, batches, self._begin, end, compiles, compile_s,
                                       self._compile_watch.source, shapes)
        self._recorder.add_step((self._global_step + batches, self._epoch, self._begin, end, self._wait, gap,
                                 batches))
        self._global_step += batches
        self._fit_steps += 1
        self._fit_batches += batches
        if shapes is not None:
            self._recorder.shape_steps.add(shapes, batches, end - self._begin, compiles > 0 or math.isnan(gap))
            if shapes != self._last_shapes:
                self._new_shapes(shapes)
        if self._model_audit_pending:
            self._model_audit_pending = False
            self._report_findings(self._audit_model())
        if self._profile.pending:
            tracing, start = self._profile.tracing, self._clock()
            self._profile.on_step()
            if self._profile.tracing != tracing:
                self._profiler_ran(start, self._clock())
        self._last_end = end

    def on_test_begin(self, logs: dict | None = None) -> None:
        if not self._active:
            if not FitScope.find(self.model).known:  # validation calls it from fit: a monitor off for this fit
                self._outside_fit("evaluate")
        else:
            now = self._clock()
            if self._open_phase is None:  # validation starts right after the epoch's last step
                # Before the fit's first validation Keras builds its data iterator (distributes it, under a
                # strategy) and its test function: warm-up, as the first step is.
                self._open_phase = ("warmup" if self._eval_warming_up else "epoch_end", self._after_profiler())
            self._close_phase(now)
            self._open_phase = ("warmup" if self._eval_warming_up else "eval", now)

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._active and self._eval_warming_up:  # tracing the test function is not validation's cost
            self._eval_warming_up = False
            now = self._clock()
            self._close_phase(now)
            self._open_phase = ("eval", now)

    def on_predict_begin(self, logs: dict | None = None) -> None:
        self._outside_fit("predict")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._active and (self._callback_timing is None or not self._callback_timing.stamps_epoch_end):
            self._epoch_ends(self._clock())

    def _epoch_ends(self, now: float) -> None:
        """When the first callback's `on_epoch_end` is called. Validation lasts until then: `evaluate()` goes on
        after `on_test_end` (on TensorFlow it frees its iterator there, about a second)."""
        if not self._active:
            return
        if self._open_phase is None:  # no validation: the boundary starts at the epoch's last step
            self._open_phase = ("epoch_end", self._after_profiler())
        else:
            self._close_phase(now)
            self._open_phase = ("epoch_end", now)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._finish("finished")

    # --- helpers ---------------------------------------------------------------------------------------
    def _outside_fit(self, call: str) -> None:
        """`model.evaluate()` or `predict()` was given this monitor: say once that only `fit` is recorded."""
        if not self._told_outside_fit:
            self._told_outside_fit = True
            LOG.warning("rnnmon: model.%s() was given this monitor, which records fit() only (its validation "
                        "included): evaluate() and predict() outside fit() are not recorded.", call)

    def _on_wait(self, seconds: float, batches: int, shapes: Shapes | None) -> None:
        self._wait, self._batches, self._shapes = seconds, batches, shapes

    def _new_shapes(self, shapes: Shapes) -> None:
        """Record the step where the fit first met an input shape (its first step's, and each one after)."""
        self._last_shapes = shapes
        if shapes not in self._seen_shapes:
            self._seen_shapes.add(shapes)
            self._recorder.add_shapes(self._global_step, self._begin, shapes)

    def _is_live(self, caller: FrameType) -> bool:
        """Whether the train-function wrapper, called from `caller`, still times this monitor's fit."""
        return self._active and self._scope.running(caller)

    def _on_error(self, error: BaseException) -> None:
        self._finish("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")

    def _on_chunk(self, chunk: dict[str, Any]) -> None:
        self._alerting.on_chunk(chunk)
        if self._exporter is not None:
            self._exporter.on_chunk(chunk, firing=self._alerting.firing)

    def _profiler_ran(self, start: float, end: float) -> None:
        """A profiler trace started, or stopped and saved, from `start` to `end` (rnnmon's own capture, or Keras's
        `TensorBoard(profile_batch=...)`): neither host time nor input wait, but a `profile` phase. Between steps
        the phase is the whole gap the call lies in (from the last step's end to the next step's begin, or to the
        end of the call where an epoch boundary follows); inside an open phase it takes over from `start`. In the
        fit's first step it is part of the warm-up."""
        if not self._active or self._warming_up:
            return
        if self._open_phase is None:
            self._profiler_end = end
        elif self._open_phase[0] != "profile":
            self._close_phase(start)
            self._open_phase = ("profile", start)

    def _after_profiler(self) -> float:
        """Where a phase opening at the last step's end starts: after the profile phase of a profiler call since."""
        end, self._profiler_end = self._profiler_end, None
        if end is None:
            return self._last_end
        self._recorder.add_phase("profile", self._last_end, end)
        return end

    def _close_phase(self, now: float) -> None:
        if self._open_phase is not None:
            kind, start = self._open_phase
            self._recorder.add_phase(kind, start, now)
            self._open_phase = None

    def _poll(self) -> None:  # on the sampler thread
        if self._scope.over():  # fit raised past on_train_end (e.g. from a later callback)
            self._finish("failed")
        elif self._sampler is not None:
            self._sampler.poll()

    def _flush(self) -> None:  # on the writer thread
        if self._scope.over():
            self._finish("failed")
        else:
            self._recorder.flush(horizon=self._last_end)

    def _finish(self, status: str) -> None:
        """Stop sampling, restore Keras, and get everything to disk; safe to call from any exit path and thread.

        The last write runs on the writer thread; the caller waits for it at most `_FINISH_WAIT_S`, then for the
        alert hook to take the last alerts at most `_HOOK_WAIT_S`.
        """
        with self._finish_lock:
            if not self._active or os.getpid() != self._pid:
                return
            self._active = False
        _RUNNING.discard(self)
        self._scope.forget()
        self._after_profiler()
        self._close_phase(self._clock())
        if self.model is not None:
            unwrap_train_function(self.model)
        if self._callback_timing is not None:
            self._callback_timing.remove()
        self._compile_watch.close()
        if self._hook_guard is not None:
            self._hook_guard.remove()
        self._final_status = status
        self._poller.stop(timeout_s=0)
        self._flusher.stop(timeout_s=0)  # its thread writes the end (`_write_final`)
        if threading.current_thread() is not self._flusher.thread and not self._final_done.wait(_FINISH_WAIT_S):
            LOG.error("rnnmon: the last write to %s did not finish within %.0f s (a hung disk?); steps after "
                      "%d and the final status may be missing. It goes on in the background.", self.run_dir,
                      _FINISH_WAIT_S, self._recorder.last_step)
        elif self._final_done.is_set():
            self._flusher.stop(timeout_s=1.0)  # it only has to return now
            self._alerting.join_hooks(_HOOK_WAIT_S)  # the record is on disk: a slow hook costs only its alerts
        self._exits.release()

    def _write_final(self) -> None:
        """On the writer thread once it stops: the last chunk and the final status, retried while the disk refuses."""
        written = polled = False
        try:
            polled = self._poller.stop(timeout_s=1.0)  # a last poll, unless the driver hangs
            self._recorder.flush(horizon=math.inf, final=True)
            self._alerting.finish(self._clock())
            if self._exporter is not None:
                self._exporter.fit_ended()
            self._profile.close()
            self._run_info.update(status=self._final_status, end=time.time(), steps=self._global_step)
            if self._callback_timing is not None:
                self._run_info.update(callback_hooks_s={name: round(seconds, 6) for name, seconds
                                                        in self._callback_timing.totals_s().items()},
                                      callback_steps=self._fit_steps, callback_batches=self._fit_batches)
            self._writer.json(schema.RUN_TAG, self._run_info)
            written = self._writer.flush()
        finally:
            self._alerting.close()  # the hook thread ends once it has delivered the last alerts
            if self._sampler is not None and polled:
                self._sampler.close()  # (behind a hung call it would wait for the driver's deadline)
            self._nvml.shutdown()  # a poll still hung in the driver then ends at its next query
            if not written:
                self._final_done.set()  # the fit goes on; the status lands when space returns
                deadline = time.monotonic() + _RETRY_AFTER_FIT_S
                while not written and time.monotonic() < deadline:
                    time.sleep(self.flush_secs)
                    written = self._writer.flush()
            self._writer.close()
            self._run_lock.release()
            if self._uploader is not None:
                self._uploader.close()  # its last pass runs in the background; the process's exit waits for it
            self._final_done.set()

    def _install_input_timing(self) -> str:
        backend = keras.backend.backend()
        per_execution = self._per_execution
        fit = self._scope.call()
        if backend == "torch" and fit is not None and self.measure_input_wait is not False:
            self._epoch_timing = EpochIteratorTiming(fit.epoch_iterator)
            return "measured"
        if backend not in ("tensorflow", "jax"):
            if self.measure_input_wait:
                LOG.warning("rnnmon: input wait is measured on the TensorFlow, JAX and torch backends only; on %s "
                            "it is part of the host gap.", backend)
            return f"not measured: the {backend} backend"
        if self.measure_input_wait is False:
            return "not measured: measure_input_wait=False"
        if getattr(self.model, "train_function", None) is None:
            self.model.make_train_function()
        if backend == "jax":  # the batches are fetched in Python anyway: timing them costs nothing
            wrap_jax_train_function(self.model, self._on_wait, self._on_error, self._is_live)
            return "measured"
        # On TensorFlow a timed execution leaves the in-graph loop: at steps_per_execution > 1 only a sample is.
        every = 1 if per_execution == 1 or self.measure_input_wait else SAMPLE_EVERY
        wrap_train_function(self.model, self._on_wait, self._on_error, self._is_live, self._on_first_batch,
                            self._profile.step_marker, sample_every=every)
        return "measured" if every == 1 else f"sampled: 1 execution in {every}"

    def _on_first_batch(self, batch: Any, iterator: Any) -> None:
        floors = fetch_floors(batch, iterator)
        self._recorder.fetch_floor_s = floors.get("fetch_floor_ms", 0.0) / 1e3
        if floors:
            self._run_info.update(floors)
            self._writer.json(schema.RUN_TAG, self._run_info)

    def _on_profile(self, record: dict[str, Any]) -> None:
        self._run_info.update(profile=record)
        self._writer.json(schema.RUN_TAG, self._run_info)

    def _on_thresholds_change(self, alerting: Alerting) -> None:
        self._run_info.update(thresholds=alerting.thresholds.to_dict(), thresholds_source=alerting.source)
        self._writer.json(schema.RUN_TAG, self._run_info)

    def _on_fire(self, event: AlertEvent) -> None:
        stop = self.stop_on_alert
        if stop is True or (not isinstance(stop, bool) and event.rule in stop):
            LOG.warning("rnnmon: stopping training because %s fired (stop_on_alert).", event.rule)
            self.model.stop_training = True
        self._profile.request(event.rule)

    def _profile_note(self, event: AlertEvent) -> AlertEvent:
        """The alert that starts a profile capture says where the Profile tab cannot group this model's steps."""
        if self._profile.will_capture() and self._profile.note and not self._profile_noted:
            self._profile_noted = True
            return dataclasses.replace(event, message=f"{event.message} Profile: {self._profile.note}")
        return event

    def _audit_setup(self) -> None:
        """RNN layers, the user's training input and device placement, checked once per fit before the first step."""
        # An unbuilt model (a Sequential without Input) has its real layers, shapes and masks after the first step.
        self._model_audit_pending = not self.model.built
        findings = [] if self._model_audit_pending else self._audit_model()
        fit = self._scope.call()
        if fit is None:
            LOG.info("rnnmon: the training input could not be reached from the callback; run "
                     "rnnmon.audit(model, dataset) to check it.")
        else:
            try:
                findings += audit_pipeline(fit.x, fit.batch_size)
            except Exception as error:  # auditing must never stop training
                LOG.info("rnnmon: the input pipeline audit failed (%s: %s)", type(error).__name__, error)
        backend = keras.backend.backend()
        framework = backend_gpu_count(backend)
        if self._nvml.available and framework is not None:
            nvml_count = len([t for t in nvml_inventory(self._nvml) if t.mig is None])  # GPUs we may query
            targets = [d.target for d in self._sampler.devices] if self._sampler else []
            findings += audit_placement(nvml_count, framework, process_on_devices(self._nvml, targets), backend)
        self._report_findings(findings)

    def _audit_model(self) -> list[Finding]:
        return audit_rnn_layers(self.model) + audit_preprocessing(self.model)

    def _report_findings(self, findings: list[Finding]) -> None:
        """Log findings this monitor has not logged before (in this fit or an earlier one) and record the fit's
        whole list (the latest record is the one read)."""
        for finding in findings:
            if finding in self._logged_findings:
                continue
            self._logged_findings.add(finding)
            level = logging.INFO if finding.severity == "info" else logging.WARNING
            LOG.log(level, "rnnmon %s %s at %s: %s Fix: %s", finding.severity, finding.code, finding.where,
                    finding.message, finding.advice)
        self._findings = sort_findings([*self._findings, *findings])
        self._writer.json(schema.FINDINGS_TAG, [f.to_dict() for f in self._findings])

    def _describe_run(self, sampler: Sampler | None) -> dict[str, Any]:
        return {
            "version": schema.FORMAT_VERSION, "status": "running", "start": time.time(), "end": None,
            "backend": keras.backend.backend(), "keras": keras.__version__, "host": socket.gethostname(),
            "pid": os.getpid(), "worker": self.worker, "trial": self._trial.to_dict() if self._trial else None,
            "steps_per_execution": self._per_execution, "input_wait": self._input_timing,
            "compiles": self._compile_watch.source or None,  # whose compile signal was watched (capture.compiles)
            "input_kind": self._input_kind, "input_cache": self._read_input(cache_stage),
            "input_batching": self._read_input(batching_stage), "idle_pct": self.idle_pct,
            "gpus": sampler.describe() if sampler else [],
            "nvml": "available" if self._nvml.available else "unavailable",
            "thresholds": self._alerting.thresholds.to_dict(), "thresholds_source": self._alerting.source,
        }


    def _read_input(self, read: Callable[[Any], str | None]) -> str | None:
        """What `read` finds in the fit's input: where it caches (its first epoch, filling the cache, is judged
        apart from the rest), how it pads its batches (the recompile advice)."""
        fit = self._scope.call()
        try:
            return read(fit.x) if fit is not None else None
        except Exception as error:  # reading the pipeline must never stop training
            LOG.info("rnnmon: the input pipeline could not be read (%s: %s)", type(error).__name__, error)
            return None


def _require(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}. Received: {name}={value!r}")
