"""`UtilizationMonitor`: the Keras callback that records why the GPU is idle, step by step.

Example:
    >>> monitor = rnnmon.UtilizationMonitor("runs/exp1")
    >>> model.fit(dataset, epochs=3, callbacks=[monitor])
    >>> # then: rnnmon report runs    or    tensorboard --logdir runs
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, Literal

import keras

from rnnmon.alerts import prometheus
from rnnmon.alerts.rules import AlertEvent
from rnnmon.alerts.thresholds import Thresholds
from rnnmon.audit.pipeline import input_kind
from rnnmon.capture.callback_timing import CallbackTiming
from rnnmon.capture.fit_scope import FitCall, FitScope, HookGuard
from rnnmon.capture.input_timing import (
    SAMPLE_EVERY,
    EpochIteratorTiming,
    unwrap_train_function,
    wrap_jax_train_function,
    wrap_train_function,
)
from rnnmon.capture.trials import Trial, tuner_trial
from rnnmon.capture.workers import jax_worker_name, worker_name
from rnnmon.findings import Finding
from rnnmon.fit_run import RUNNING, FitRun
from rnnmon.format import schema
from rnnmon.gpu.nvml import Nvml
from rnnmon.loop import TrainingLoop
from rnnmon.storage import remote

LOG = logging.getLogger("rnnmon")


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

    It records `fit` (its validation included), and a training loop written by hand through `monitor.loop()`
    (see `loop`). Given to `model.evaluate()` or `predict()` outside a fit, it records nothing and says so once,
    in a warning.

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
        self._logged_findings: set[Finding] = set()  # logged once per monitor (and its copies), not per fit
        self._global_step = 0  # steps of the fits before this one: a fit's steps go on from there
        self._run: FitRun | None = None  # the fit's state, from on_train_begin to on_train_end
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

    def loop(self, model: Any = None) -> TrainingLoop:
        """Record a training loop written by hand as a fit is recorded (see rnnmon.loop):

        ```python
        with monitor.loop(model) as loop:
            for x, y in loop.batches(dataset):   # each next() is the step's input wait; one iteration, one step
                loss = train_step(x, y)
                loop.step_done(loss)             # optional: the step ends when the device has finished
        ```

        `model` (optional) is the Keras model the loop trains: its RNN layers are audited and its devices watched.
        """
        return TrainingLoop(self, model)

    # --- a fit, as it happens --------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        scope = FitScope.find(self.model)
        twin = next((run for run in RUNNING if run.monitor is not self and run.scope is not None
                     and run.scope.same_fit(scope)), None)
        if twin is not None:
            LOG.error("rnnmon: two UtilizationMonitors in one fit; the first (log_dir=%r) records it, this one "
                      "(log_dir=%r) is off for this fit. Pass one monitor per fit.",
                      remote.redact(twin.monitor.log_dir), remote.redact(self.log_dir))
            return
        self.end_stale_runs()
        if self.worker is None and keras.backend.backend() == "jax":  # the fit has started JAX's runtime
            self.learn_jax_worker()
        fit = scope.call()
        trial = tuner_trial(fit.callbacks.callbacks) if fit is not None else None
        self.run_dir = self._run_dir(trial)
        run = None
        try:
            run = FitRun(self, self.model, self.run_dir, trial=trial, scope=scope,
                         input_kind=input_kind(fit.x) if fit is not None else None,
                         per_execution=int(getattr(self.model, "steps_per_execution", 1) or 1),
                         first_step=self._global_step)
            self._run = run
            run.on_detach(lambda: unwrap_train_function(self.model))
            if fit is not None:
                run.callback_timing = CallbackTiming(
                    fit.callbacks.callbacks, skip=self, on_begun=run.step_begins, on_ended=run.outputs_ready,
                    on_epoch_ending=run.epoch_ends, on_profiler=run.profiler_ran)
                run.on_detach(run.callback_timing.remove)
            input_wait = self._time_input(run, fit)
            run.start(input_wait=input_wait, x=fit.x if fit is not None else None,
                      batch_size=fit.batch_size if fit is not None else None, abandoned=scope.over,
                      on_stop=self._stop_training, final_info=lambda: _callback_hook_times(run))
            if fit is not None:  # a later callback that raises ends monitoring in its own call
                guard = HookGuard(fit.callbacks, run.failed)
                run.on_detach(guard.remove)
        except Exception as error:  # e.g. an unwritable log_dir: train anyway, unmonitored
            LOG.error("rnnmon: monitoring is off for this fit: %s: %s", type(error).__name__, error)
            if run is not None:
                run.close_opened()
            else:
                unwrap_train_function(self.model)
            self._run = None

    def end_stale_runs(self) -> None:
        """End the runs of this monitor or model whose fit raised before its end (or loop was left unclosed)."""
        for stale in [run for run in RUNNING if run.monitor is self or
                      (run.model is not None and run.model is self.model)]:
            stale.finish("aborted")
        if self._run is not None:
            self._global_step = self._run.global_step
            self._run = None

    def learn_jax_worker(self) -> None:
        """JAX's runtime has started: a process of several is `worker-<index>` (its series were worker="0")."""
        self.worker = jax_worker_name()
        if self.worker is not None and self._exporter is not None:
            self._exporter = prometheus.relabel(self, self._exporter, worker=self.worker)

    def _time_input(self, run: FitRun, fit: FitCall | None) -> str:
        """Put the input wait's timer in place for this fit; returns how the wait is timed (the run description)."""
        backend = keras.backend.backend()
        if backend == "torch" and fit is not None and self.measure_input_wait is not False:
            run.epoch_timing = EpochIteratorTiming(fit.epoch_iterator)
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

        def live(caller: FrameType) -> bool:  # whether the wrapper, called from `caller`, still times this fit
            return run.active and run.scope.running(caller)

        if backend == "jax":  # the batches are fetched in Python anyway: timing them costs nothing
            wrap_jax_train_function(self.model, run.took_input, run.failed, live)
            return "measured"
        # On TensorFlow a timed execution leaves the in-graph loop: at steps_per_execution > 1 only a sample is.
        every = 1 if run.per_execution == 1 or self.measure_input_wait else SAMPLE_EVERY
        wrap_train_function(self.model, run.took_input, run.failed, live, run.first_batch,
                            run.profile.step_marker, sample_every=every)
        return "measured" if every == 1 else f"sampled: 1 execution in {every}"

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._run is not None:
            self._run.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        run = self._run
        if run is None or not run.active:
            return
        # torch: the batch was fetched before the callbacks' begin hooks
        run.step_starts(run.epoch_timing.take() if run.epoch_timing is not None else None)
        if run.callback_timing is None or not run.callback_timing.stamps_begin:
            run.step_begins(run.clock())  # (else the last callback's begin hook stamps it)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        run = self._run
        if run is None or not run.active:
            return
        stamped = run.callback_timing is not None and run.callback_timing.stamps_end
        run.step_ends(run.end if stamped else run.clock())

    def on_test_begin(self, logs: dict | None = None) -> None:
        run = self._run
        if run is None or not run.active:
            if not FitScope.find(self.model).known:  # validation calls it from fit: a monitor off for this fit
                self._outside_fit("evaluate")
        else:
            run.validation_begins(run.clock())

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._run is not None:
            self._run.validation_warmed(self._run.clock())

    def on_predict_begin(self, logs: dict | None = None) -> None:
        self._outside_fit("predict")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        run = self._run
        if run is not None and (run.callback_timing is None or not run.callback_timing.stamps_epoch_end):
            run.epoch_ends(run.clock())

    def on_train_end(self, logs: dict | None = None) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.finish("finished")
            self._global_step = run.global_step

    # --- what the fit's run asks of the callback ---------------------------------------------------------
    def _stop_training(self) -> None:
        if self.model is not None:
            self.model.stop_training = True

    def _outside_fit(self, call: str) -> None:
        """`model.evaluate()` or `predict()` was given this monitor: say once that only `fit` is recorded."""
        if not self._told_outside_fit:
            self._told_outside_fit = True
            LOG.warning("rnnmon: model.%s() was given this monitor, which records fit() only (its validation "
                        "included): evaluate() and predict() outside fit() are not recorded.", call)


def _callback_hook_times(run: FitRun) -> dict[str, Any]:
    """For the final run description: the other callbacks' batch hook times, and the steps they are per."""
    if run.callback_timing is None:
        return {}
    return {"callback_hooks_s": {name: round(seconds, 6) for name, seconds in run.callback_timing.totals_s().items()},
            "callback_steps": run.steps, "callback_batches": run.batches}


def _require(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}. Received: {name}={value!r}")
