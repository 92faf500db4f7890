"""`FitRun`: one fit's record, from its first moment to its last write, shared by the callback and the loop.

`UtilizationMonitor` (Keras's `fit`) and `TrainingLoop` (a loop written by hand) each make one when training
starts and drop it when it ends. They differ only in how they see a step begin and end; what a step, a phase and
the end do to the record is written here once: one writer, one recorder, one sampler, one set of threads.

The methods follow a fit: `FitRun(...)` opens the run (the lock, the writer, the sampler, the alerts), `start`
describes it, audits it and starts the threads; then, per step, `step_starts`, `step_begins`, `took_input`
(where the wait is timed during the step) and `step_ends`; between steps `validation_begins`,
`validation_warmed`, `epoch_ends` and `profiler_ran`; and `finish(status)` ends it, from the exit path that comes first.

Example:
    >>> run = FitRun(monitor, model, run_dir, trial=None, input_kind="tf.data")
    >>> run.start(input_wait="measured", x=dataset, batch_size=None, on_stop=stop)
    >>> run.step_starts(); run.step_begins(clock()); run.took_input(0.004, 1, shapes); run.step_ends(clock())
    >>> run.finish("finished")
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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras

from rnnmon.alerts.delivery import Alerting
from rnnmon.alerts.rules import AlertEvent
from rnnmon.analysis.input_advice import input_advice
from rnnmon.audit.pipeline import audit_pipeline, batching_stage, cache_stage
from rnnmon.audit.placement import audit_placement
from rnnmon.audit.preprocessing import audit_preprocessing
from rnnmon.audit.rnn_layers import audit_rnn_layers
from rnnmon.capture.compiles import CompileWatch
from rnnmon.capture.exits import ExitGuard
from rnnmon.capture.fetch_floor import fetch_floors
from rnnmon.capture.input_timing import Shapes
from rnnmon.capture.profiling import ProfileCapture
from rnnmon.capture.recorder import Recorder
from rnnmon.capture.ticker import Ticker
from rnnmon.capture.trials import Trial
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
from rnnmon.gpu.sampler import Sampler
from rnnmon.storage import remote
from rnnmon.storage.uploader import Uploader

if TYPE_CHECKING:
    from rnnmon.monitor import UtilizationMonitor

LOG = logging.getLogger("rnnmon")
NA = math.nan
RUNNING: weakref.WeakSet[FitRun] = weakref.WeakSet()  # runs that have not ended yet
_FINISH_WAIT_S = 5.0  # the longest a fit's end waits for rnnmon's last write
_HOOK_WAIT_S = 3.0  # then the longest it waits for the on_alert hook to take the last alerts
_RETRY_AFTER_FIT_S = 600.0  # a final write the disk refused is retried this long in the background
_SEGMENT_BYTES = 8 << 20  # a remote run's event file is finished at this size (or after `segment_s`)


class FitRun:
    """One fit's state and record: opened by the constructor (which closes what it opened if it fails)."""

    def __init__(self, monitor: UtilizationMonitor, model: Any, run_dir: str, *, trial: Trial | None,
                 input_kind: str | None, per_execution: int = 1, first_step: int = 0, scope: Any = None) -> None:
        self.monitor, self.model, self.run_dir, self.trial, self.scope = monitor, model, run_dir, trial, scope
        self.active = False
        self.global_step = first_step
        self.per_execution = per_execution
        self.input_kind = input_kind
        self.clock = time.perf_counter
        self._pid = os.getpid()
        self._finish_lock = threading.Lock()
        self._wall_offset = time.time() - self.clock()
        # where the step stands
        self.epoch = 0
        self.last_end = self.begin = self._fit_begin = self.clock()
        self.end = NA
        self._wait, self._batches, self._shapes = NA, 0, None
        self._fetched_before = False
        self._last_shapes: Shapes | None = None
        self._seen_shapes: set[Shapes] = set()  # input shapes this fit has stepped on
        self.steps = self.batches = 0  # step records (executions) of this fit, and their batches
        self._open_phase: tuple[str, float] | None = None
        self._profiler_end: float | None = None  # a profiler started or stopped since the last step, until then
        self._warming_up = True
        self._eval_warming_up = True  # the fit's first validation batch traces Keras's test function
        self._model_audit_pending = False
        self._findings: list[Finding] = []
        self._final_info: list[Callable[[], dict[str, Any]]] = []  # more for the final run description
        self._detach: list[Callable[[], None]] = []  # undone at the end: what the fit's observers installed
        self._abandoned: Callable[[], bool] = lambda: False
        self._on_stop: Callable[[], None] = lambda: None
        self.stop_requested = False
        # the callback's observers of a Keras fit (None in a loop written by hand)
        self.callback_timing: Any = None  # rnnmon.capture.callback_timing: the other callbacks' hooks, timed
        self.epoch_timing: Any = None  # torch: the epoch loop's fetches, timed
        self._open(monitor)

    def _open(self, monitor: UtilizationMonitor) -> None:
        """The sampler, the uploader, the run's lock, its writer, the alerts and the recorder."""
        backend = keras.backend.backend()
        self.sampler = self._uploader = self._writer = self._run_lock = None
        try:
            if monitor._nvml.start():
                ordinals = model_cuda_ordinals(self.model, backend) if self.model is not None else None
                self.sampler = Sampler(monitor._nvml, select_devices(monitor._nvml, monitor.devices,
                                                                     model_ordinals=ordinals), self.clock)
            staging = monitor._staging
            run_url = None if staging is None else remote.join(remote.redact(monitor.log_dir),
                                                                os.path.relpath(self.run_dir, staging))
            uploader = None if run_url is None else Uploader(  # before the lock: fsspec may be missing
                self.run_dir, run_url, interval_s=monitor.upload_interval_s)
            self._run_lock = RunLock(self.run_dir)
            self._run_lock.acquire()  # a second writer of this run: monitoring is off for this fit
            segments = {"segment_s": monitor.segment_s, "segment_bytes": _SEGMENT_BYTES} if uploader else {}
            self._writer = SummaryWriter(self.run_dir, **segments)
            self._uploader = uploader  # (None for a local log_dir; a new one each fit)
            if uploader is not None:
                uploader.start()
            self._profile_noted = False
            self.profile = ProfileCapture(self.run_dir, monitor.profile_steps_on_alert, self.model, self._on_profile,
                                          shown_dir=run_url)  # the bucket: staging is emptied after the fit
            self._alerting = Alerting(monitor.thresholds, log_dir=staging or monitor.log_dir, writer=self._writer,
                                      wall_offset_s=self._wall_offset, on_alert=monitor.on_alert,
                                      on_fire=self._on_fire, amend=self._profile_note,
                                      on_change=self._on_thresholds_change, watch_file=monitor.watch_thresholds,
                                      thresholds_root=monitor.thresholds_root,
                                      input_advice=input_advice(self.input_kind, backend))
            self.recorder = Recorder(self._writer, self.sampler, self._wall_offset, idle_pct=monitor.idle_pct,
                                     min_gap_s=monitor.min_gap_s, on_chunk=self._on_chunk)
            if monitor._exporter is not None and self.sampler is not None:
                monitor._exporter.add_devices(d["index"] for d in self.sampler.describe())
        except Exception:
            self.close_opened()
            raise

    def close_opened(self) -> None:
        """What `_open` opened, where the start failed (e.g. an unwritable log_dir): training goes on unmonitored."""
        if self._writer is None and self._run_lock is not None:
            self._run_lock.release()
        if self.sampler is not None:
            self.sampler.close()  # frees its GPM samples
        if self._uploader is not None:
            self._uploader.close()  # uploads what was written, then ends
        self.monitor._nvml.shutdown()
        self.undo()

    # --- the start -------------------------------------------------------------------------------------
    def on_detach(self, undo: Callable[[], None]) -> None:
        """Call `undo()` when the run ends (or fails to start): an observer the fit installed comes off."""
        self._detach.append(undo)

    def undo(self) -> None:
        while self._detach:
            self._detach.pop()()

    def start(self, *, input_wait: str, x: Any = None, batch_size: int | None = None, audit_input: bool = True,
              abandoned: Callable[[], bool] | None = None, on_stop: Callable[[], None] | None = None,
              final_info: Callable[[], dict[str, Any]] | None = None) -> None:
        """Describe the run, audit it, and start its threads. `input_wait` says how the input wait is timed; `x`
        is the training input as the user gave it (None where unknown); `abandoned()` is True once the fit has
        raised past its end (checked on the threads); `on_stop()` stops training (`stop_on_alert`)."""
        if abandoned is not None:
            self._abandoned = abandoned
        if on_stop is not None:
            self._on_stop = on_stop
        if final_info is not None:
            self._final_info.append(final_info)
        self.compile_watch = CompileWatch.for_model(self.model, keras.backend.backend()) \
            if self.model is not None and getattr(self.model, "train_function", None) is not None else CompileWatch()
        self.on_detach(self.compile_watch.close)
        self._run_info = self._describe(input_wait, x)
        self._writer.json(schema.RUN_TAG, self._run_info)
        if self.monitor.audit:
            self._audit_start(x, batch_size, audit_input)
        self.active = True
        if self.monitor._exporter is not None:
            self.monitor._exporter.fit_started()
        RUNNING.add(self)
        self._final_status = "finished"
        self._final_done = threading.Event()
        self._exits = ExitGuard(self.finish)
        self._poller = Ticker(self.monitor.sample_interval_s, self._poll, name="rnnmon-sampler")
        self._flusher = Ticker(self.monitor.flush_secs, self._flush, name="rnnmon-writer", on_stop=self._write_final)
        self._poller.start()
        self._flusher.start()
        self._exits.install()

    def watch_compiles(self, watch: CompileWatch) -> None:
        """Take the compile signal from `watch` (the loop learns the step function after the start)."""
        self.compile_watch.close()
        self.compile_watch = watch
        self.on_detach(watch.close)
        self.describe(compiles=watch.source or None)

    def describe(self, **facts: Any) -> None:
        """Add `facts` to the run's description and write it (e.g. the input a loop was given)."""
        self._run_info.update(facts)
        self._writer.json(schema.RUN_TAG, self._run_info)

    def _describe(self, input_wait: str, x: Any) -> dict[str, Any]:
        monitor, sampler = self.monitor, self.sampler
        return {
            "version": schema.FORMAT_VERSION, "status": "running", "start": time.time(), "end": None,
            "backend": keras.backend.backend(), "keras": keras.__version__, "host": socket.gethostname(),
            "pid": os.getpid(), "worker": monitor.worker, "trial": self.trial.to_dict() if self.trial else None,
            "steps_per_execution": self.per_execution, "input_wait": input_wait,
            "compiles": self.compile_watch.source or None,  # whose compile signal was watched (capture.compiles)
            **self.input_facts(x), "idle_pct": monitor.idle_pct,
            "gpus": sampler.describe() if sampler else [],
            "nvml": "available" if monitor._nvml.available else "unavailable",
            "thresholds": self._alerting.thresholds.to_dict(), "thresholds_source": self._alerting.source,
        }

    def input_facts(self, x: Any) -> dict[str, Any]:
        """What the run description says of the training input `x`: its kind, where it caches (its first epoch,
        filling the cache, is judged apart from the rest), how it pads its batches (the recompile advice)."""
        return {"input_kind": self.input_kind, "input_cache": _read_input(cache_stage, x),
                "input_batching": _read_input(batching_stage, x)}

    def _audit_start(self, x: Any, batch_size: int | None, audit_input: bool) -> None:
        """RNN layers, the user's training input and device placement, checked once before the first step."""
        # An unbuilt model (a Sequential without Input) has its real layers, shapes and masks after the first step.
        self._model_audit_pending = self.model is not None and not self.model.built
        findings = [] if self._model_audit_pending or self.model is None else self._audit_model()
        if audit_input:
            findings += self._audit_input(x, batch_size)
        backend = keras.backend.backend()
        framework = backend_gpu_count(backend)
        nvml = self.monitor._nvml
        if nvml.available and framework is not None:
            nvml_count = len([t for t in nvml_inventory(nvml) if t.mig is None])  # GPUs we may query
            targets = [d.target for d in self.sampler.devices] if self.sampler else []
            findings += audit_placement(nvml_count, framework, process_on_devices(nvml, targets), backend)
        self.report_findings(findings)

    def _audit_input(self, x: Any, batch_size: int | None) -> list[Finding]:
        if x is None:
            LOG.info("rnnmon: the training input could not be reached from the callback; run "
                     "rnnmon.audit(model, dataset) to check it.")
            return []
        try:
            return audit_pipeline(x, batch_size)
        except Exception as error:  # auditing must never stop training
            LOG.info("rnnmon: the input pipeline audit failed (%s: %s)", type(error).__name__, error)
            return []

    def audit_input(self, x: Any, batch_size: int | None = None) -> None:
        """Audit a training input met after the start (a loop's dataset), once the audits are on."""
        if self.monitor.audit:
            self.report_findings(self._audit_input(x, batch_size))

    def _audit_model(self) -> list[Finding]:
        return audit_rnn_layers(self.model) + audit_preprocessing(self.model)

    def report_findings(self, findings: list[Finding]) -> None:
        """Log findings the monitor has not logged before (in this fit or an earlier one) and record the fit's
        whole list, each once (the latest record is the one read; a loop audits each new input it is given)."""
        logged = self.monitor._logged_findings
        for finding in findings:
            if finding in logged:
                continue
            logged.add(finding)
            level = logging.INFO if finding.severity == "info" else logging.WARNING
            LOG.log(level, "rnnmon %s %s at %s: %s Fix: %s", finding.severity, finding.code, finding.where,
                    finding.message, finding.advice)
        self._findings = sort_findings([*self._findings, *(f for f in dict.fromkeys(findings)
                                                             if f not in self._findings)])
        self._writer.json(schema.FINDINGS_TAG, [f.to_dict() for f in self._findings])

    def first_batch(self, batch: Any, iterator: Any) -> None:
        """The fit's first batch and its iterator: what fetching a ready batch costs (rnnmon.capture.fetch_floor)."""
        floors = fetch_floors(batch, iterator)
        self.recorder.fetch_floor_s = floors.get("fetch_floor_ms", 0.0) / 1e3
        if floors:
            self.describe(**floors)

    # --- each step -------------------------------------------------------------------------------------
    def step_starts(self, fetched: tuple[float, int, Shapes | None] | None = None) -> None:
        """A step starts. `fetched` is (wait, batches, shapes) of its batch, fetched just before (torch's epoch
        loop, a loop written by hand); None where the batch is fetched inside the step (`took_input` tells)."""
        self._fetched_before = fetched is not None
        self._wait, self._batches, self._shapes = fetched if fetched is not None else (NA, 0, None)

    def step_begins(self, now: float) -> None:
        """After the last callback's `on_train_batch_begin`: the step's compute starts (and a batch fetched just
        before ended then: the step begins that much earlier, and the hooks are host time)."""
        if not self.active:
            return
        self.begin = now - self._wait if self._fetched_before else now
        if self._open_phase is None and self._profiler_end is not None:  # the whole host gap is the profiler's
            self._open_phase = ("profile", self.last_end)
        if self._open_phase is not None:  # the epoch boundary lasts until the next epoch's first step
            self._close_phase(self.begin)
            self.last_end = self.begin
        self._profiler_end = None

    def outputs_ready(self, now: float) -> None:
        """The step's outputs are numbers by `now` (the first callback's `on_train_batch_end` was called)."""
        self.end = now

    def took_input(self, seconds: float, batches: int, shapes: Shapes | None) -> None:
        """The step's batches were fetched inside it, waiting `seconds` (Keras's train function on TF and JAX)."""
        self._wait, self._batches, self._shapes = seconds, batches, shapes

    def step_ends(self, end: float) -> None:
        """The step's outputs are ready at `end`: record it (its compiles, its input shapes) and go on."""
        if not self.active:
            return
        batches = self._batches or self.per_execution
        gap = self.begin - self.last_end
        shapes = self._shapes
        compiles, compile_s = self.compile_watch.take(self.begin, end, shapes)
        if self._warming_up:  # tracing and iterator creation: neither input wait nor host overhead
            self._warming_up = False
            self.recorder.add_phase("warmup", self._fit_begin, end)
            gap = NA
        elif compiles:
            self.recorder.add_compile(self.global_step + batches, batches, self.begin, end, compiles, compile_s,
                                      self.compile_watch.source, shapes)
        self.recorder.add_step((self.global_step + batches, self.epoch, self.begin, end, self._wait, gap, batches))
        self.global_step += batches
        self.steps += 1
        self.batches += batches
        if shapes is not None:
            self.recorder.shape_steps.add(shapes, batches, end - self.begin, compiles > 0 or math.isnan(gap))
            if shapes != self._last_shapes:
                self._new_shapes(shapes)
        if self._model_audit_pending:
            self._model_audit_pending = False
            self.report_findings(self._audit_model())
        if self.profile.pending:
            tracing, start = self.profile.tracing, self.clock()
            self.profile.on_step()
            if self.profile.tracing != tracing:
                self.profiler_ran(start, self.clock())
        self.last_end = end

    def _new_shapes(self, shapes: Shapes) -> None:
        """Record the step where the fit first met an input shape (its first step's, and each one after)."""
        self._last_shapes = shapes
        if shapes not in self._seen_shapes:
            self._seen_shapes.add(shapes)
            self.recorder.add_shapes(self.global_step, self.begin, shapes)

    # --- between steps ---------------------------------------------------------------------------------
    def validation_begins(self, now: float, warm_up: bool = True) -> None:
        """Validation starts at `now`. The fit's first validation, where `warm_up`, is warm-up until its first
        batch ends (`validation_warmed`): Keras builds its data iterator and its test function then."""
        if not self.active:
            return
        warming = warm_up and self._eval_warming_up
        if not warm_up:
            self._eval_warming_up = False
        if self._open_phase is None:  # validation starts right after the epoch's last step
            self._open_phase = ("warmup" if warming else "epoch_end", self._after_profiler())
        self._close_phase(now)
        self._open_phase = ("warmup" if warming else "eval", now)

    def validation_warmed(self, now: float) -> None:
        """The first validation batch has ended: tracing the test function is not validation's cost."""
        if self.active and self._eval_warming_up:
            self._eval_warming_up = False
            self._close_phase(now)
            self._open_phase = ("eval", now)

    def epoch_ends(self, now: float) -> None:
        """The epoch (with its validation, which lasts until `now`) is over: the boundary lasts until the next
        step begins."""
        if not self.active:
            return
        if self._open_phase is None:  # no validation: the boundary starts at the epoch's last step
            self._open_phase = ("epoch_end", self._after_profiler())
        else:
            self._close_phase(now)
            self._open_phase = ("epoch_end", now)

    def profiler_ran(self, start: float, end: float) -> None:
        """A profiler trace started, or stopped and saved, from `start` to `end` (rnnmon's own capture, or Keras's
        `TensorBoard(profile_batch=...)`): neither host time nor input wait, but a `profile` phase. Between steps
        the phase is the whole gap the call lies in (from the last step's end to the next step's begin, or to the
        end of the call where an epoch boundary follows); inside an open phase it takes over from `start`. In the
        fit's first step it is part of the warm-up."""
        if not self.active or self._warming_up:
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
            return self.last_end
        self.recorder.add_phase("profile", self.last_end, end)
        return end

    def _close_phase(self, now: float) -> None:
        if self._open_phase is not None:
            kind, start = self._open_phase
            self.recorder.add_phase(kind, start, now)
            self._open_phase = None

    # --- the threads -----------------------------------------------------------------------------------
    def _poll(self) -> None:  # on the sampler thread
        if self._abandoned():  # the fit raised past its end (e.g. from a later callback)
            self.finish("failed")
        elif self.sampler is not None:
            self.sampler.poll()

    def _flush(self) -> None:  # on the writer thread
        if self._abandoned():
            self.finish("failed")
        else:
            self.recorder.flush(horizon=self.last_end)

    def _on_chunk(self, chunk: dict[str, Any]) -> None:
        self._alerting.on_chunk(chunk)
        if self.monitor._exporter is not None:
            self.monitor._exporter.on_chunk(chunk, firing=self._alerting.firing)

    def _on_fire(self, event: AlertEvent) -> None:
        stop = self.monitor.stop_on_alert
        if stop is True or (not isinstance(stop, bool) and event.rule in stop):
            LOG.warning("rnnmon: stopping training because %s fired (stop_on_alert).", event.rule)
            self.stop_requested = True
            self._on_stop()
        self.profile.request(event.rule)

    def _profile_note(self, event: AlertEvent) -> AlertEvent:
        """The alert that starts a profile capture says where the Profile tab cannot group this model's steps."""
        if self.profile.will_capture() and self.profile.note and not self._profile_noted:
            self._profile_noted = True
            return dataclasses.replace(event, message=f"{event.message} Profile: {self.profile.note}")
        return event

    def _on_profile(self, record: dict[str, Any]) -> None:
        self.describe(profile=record)

    def _on_thresholds_change(self, alerting: Alerting) -> None:
        self.describe(thresholds=alerting.thresholds.to_dict(), thresholds_source=alerting.source)

    # --- the end ---------------------------------------------------------------------------------------
    def failed(self, error: BaseException) -> None:
        """The fit raised `error` (seen in the call that raised it)."""
        self.finish("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")

    def finish(self, status: str) -> None:
        """Stop sampling, take the observers off, and get everything to disk; safe to call from any exit path and
        thread. The last write runs on the writer thread; the caller waits for it at most `_FINISH_WAIT_S`, then
        for the alert hook to take the last alerts at most `_HOOK_WAIT_S`."""
        with self._finish_lock:
            if not self.active or os.getpid() != self._pid:
                return
            self.active = False
        RUNNING.discard(self)
        if self.scope is not None:
            self.scope.forget()
        self._after_profiler()
        self._close_phase(self.clock())
        self.undo()
        self._final_status = status
        self._poller.stop(timeout_s=0)
        self._flusher.stop(timeout_s=0)  # its thread writes the end (`_write_final`)
        if threading.current_thread() is not self._flusher.thread and not self._final_done.wait(_FINISH_WAIT_S):
            LOG.error("rnnmon: the last write to %s did not finish within %.0f s (a hung disk?); steps after "
                      "%d and the final status may be missing. It goes on in the background.", self.run_dir,
                      _FINISH_WAIT_S, self.recorder.last_step)
        elif self._final_done.is_set():
            self._flusher.stop(timeout_s=1.0)  # it only has to return now
            self._alerting.join_hooks(_HOOK_WAIT_S)  # the record is on disk: a slow hook costs only its alerts
        self._exits.release()

    def _write_final(self) -> None:
        """On the writer thread once it stops: the last chunk and the final status, retried while the disk refuses."""
        written = polled = False
        try:
            polled = self._poller.stop(timeout_s=1.0)  # a last poll, unless the driver hangs
            self.recorder.flush(horizon=math.inf, final=True)
            self._alerting.finish(self.clock())
            if self.monitor._exporter is not None:
                self.monitor._exporter.fit_ended()
            self.profile.close()
            self._run_info.update(status=self._final_status, end=time.time(), steps=self.global_step)
            for info in self._final_info:
                self._run_info.update(info())
            self._writer.json(schema.RUN_TAG, self._run_info)
            written = self._writer.flush()
        finally:
            self._alerting.close()  # the hook thread ends once it has delivered the last alerts
            if self.sampler is not None and polled:
                self.sampler.close()  # (behind a hung call it would wait for the driver's deadline)
            self.monitor._nvml.shutdown()  # a poll still hung in the driver then ends at its next query
            if not written:
                self._final_done.set()  # the fit goes on; the status lands when space returns
                deadline = time.monotonic() + _RETRY_AFTER_FIT_S
                while not written and time.monotonic() < deadline:
                    time.sleep(self.monitor.flush_secs)
                    written = self._writer.flush()
            self._writer.close()
            self._run_lock.release()
            if self._uploader is not None:
                self._uploader.close()  # its last pass runs in the background; the process's exit waits for it
            self._final_done.set()


def _read_input(read: Callable[[Any], str | None], x: Any) -> str | None:
    try:
        return read(x) if x is not None else None
    except Exception as error:  # reading the pipeline must never stop training
        LOG.info("rnnmon: the input pipeline could not be read (%s: %s)", type(error).__name__, error)
        return None
