"""Acting on alerts: rules are judged on every chunk, and each alert is logged, recorded and handed on.

Runs on rnnmon's writer thread, except the user's `on_alert` hook, which gets the events on a thread of its own
(rnnmon.alerts.hooks) so that a slow hook never holds up the record. Thresholds come from the callback, and a
thresholds file saved by the TensorBoard tab in the run's log directory or a few folders above it (see
rnnmon.alerts.thresholds_file) replaces them within one flush, with or without steps in it.

Example:
    >>> alerting = Alerting(Thresholds(), log_dir="runs/exp1", writer=writer, wall_offset_s=offset)
    >>> alerting.on_chunk(chunk)          # from Recorder(on_chunk=...)
    >>> alerting.finish(time.perf_counter())
    >>> alerting.close()                  # after the last write
    >>> alerting.join_hooks(3.0)          # from the thread that waits for the end of the fit
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

from rnnmon.alerts.hooks import HookThread
from rnnmon.alerts.rules import AlertEngine, AlertEvent
from rnnmon.alerts.thresholds import Thresholds
from rnnmon.alerts.thresholds_file import load_thresholds_file, thresholds_files
from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter

LOG = logging.getLogger("rnnmon")


class Alerting:
    """Feeds chunks to an `AlertEngine` and delivers its events.

    Args:
        thresholds: The thresholds set in code.
        log_dir: The run's log directory, searched (and its parents) for a thresholds file.
        writer: Where alert events are recorded (`rnnmon/alerts`).
        wall_offset_s: Monotonic-to-Unix offset of the chunks' times.
        on_alert: Called with every event, on a thread of its own (see rnnmon.alerts.hooks).
        on_fire: Called with every firing event on the writer thread (stop training, start a profile): it must
            not wait on anything.
        amend: Called with every firing event on the writer thread before it is recorded, logged or delivered;
            returns the event to deliver (its message may say more, e.g. about the profile it starts).
        on_change: Called with this object when a thresholds file replaces the thresholds during the fit, on
            any flush, with steps in it or not.
        watch_file: Follow the thresholds file. Defaults to `True`.
        thresholds_root: The highest folder searched for it (TensorBoard's `--logdir`). Defaults to `None`:
            three levels up, short of shared folders (see `thresholds_files`).
        input_advice: What input-wait alerts advise, for the fit's kind of input
            (rnnmon.analysis.input_advice). Defaults to `None`: tf.data's advice.
    """

    def __init__(self, thresholds: Thresholds, *, log_dir: str, writer: SummaryWriter, wall_offset_s: float,
                 on_alert: Callable[[AlertEvent], None] | None = None,
                 on_fire: Callable[[AlertEvent], None] | None = None,
                 amend: Callable[[AlertEvent], AlertEvent] | None = None,
                 on_change: Callable[[Alerting], None] | None = None, watch_file: bool = True,
                 thresholds_root: str | None = None, input_advice: str | None = None) -> None:
        self._writer = writer
        self._input_advice = input_advice
        self._wall_offset_s = wall_offset_s
        self._hooks = HookThread(on_alert) if on_alert is not None else None
        self._on_fire = on_fire
        self._amend = amend
        self._on_change = on_change
        self._latest = -math.inf  # the latest time the chunks reached: alerts of replaced thresholds end there
        self.source = "callback"  # or the path of the thresholds file in use
        self._files = thresholds_files(log_dir, thresholds_root) if watch_file else []
        self._seen: tuple[str, float] | None = None
        self._engine = AlertEngine(thresholds, wall_offset_s=wall_offset_s, input_advice=input_advice)
        self._reload(during_fit=False)

    @property
    def thresholds(self) -> Thresholds:
        return self._engine.thresholds

    @property
    def firing(self) -> list[str]:
        """The rules firing now, once per firing device."""
        return [event.rule for event in self._engine.active]

    def on_chunk(self, chunk: dict) -> None:
        self._latest = max(self._latest, _latest_time(chunk))
        self._reload(during_fit=True)
        self._deliver(self._engine.update(chunk))

    def finish(self, now: float) -> None:
        self._deliver(self._engine.finish(now))

    def close(self) -> None:
        """No more events: the hook thread ends once it has delivered those it was handed."""
        if self._hooks is not None:
            self._hooks.close()

    def join_hooks(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the hook to take every event; past it, one ERROR names the hook."""
        return self._hooks is None or self._hooks.join(timeout_s)

    def _reload(self, during_fit: bool) -> None:
        """Switch to the nearest thresholds file when it appears or changes; a bad file is logged and skipped."""
        current = self._nearest_file()
        if current == self._seen:
            return
        self._seen = current
        if current is None:
            return
        try:
            thresholds = load_thresholds_file(current[0])
        except (ValueError, OSError) as error:
            LOG.warning("rnnmon: ignoring the thresholds file: %s", error)
            return
        if thresholds is None or thresholds == self._engine.thresholds:
            return
        if during_fit:  # alerts judged by the old thresholds end with the data they judged
            self._deliver(self._engine.finish(self._latest, reason=f"Thresholds changed ({current[0]})"))
        self._engine = AlertEngine(thresholds, wall_offset_s=self._wall_offset_s, input_advice=self._input_advice)
        self.source = current[0]
        LOG.warning("rnnmon: alert thresholds now come from %s", current[0])
        if during_fit and self._on_change is not None:
            self._on_change(self)

    def _nearest_file(self) -> tuple[str, float] | None:
        for path in self._files:
            try:
                return path, os.stat(path).st_mtime
            except OSError:
                continue
        return None

    def _deliver(self, events: list[AlertEvent]) -> None:
        if not events:
            return
        if self._amend is not None:
            events = [self._amend(event) if event.state == "firing" else event for event in events]
        self._writer.json(schema.ALERTS_TAG, [event.to_dict() for event in events])
        for event in events:
            where = "" if event.device is None else f" (GPU {event.device})"
            if event.state == "firing":
                LOG.warning("rnnmon alert %s%s: %s", event.rule, where, event.message)
            else:
                LOG.info("rnnmon alert %s%s resolved: %s", event.rule, where, event.message)
            if self._hooks is not None:
                self._hooks.submit(event)
            if self._on_fire is not None and event.state == "firing":
                self._on_fire(event)


def _latest_time(chunk: dict) -> float:
    """The latest monotonic time a chunk's rows reach (-inf in an empty chunk)."""
    ends = [row[3] for row in chunk["steps"]] + [end for _, _, end in chunk["phases"]]
    ends += [end for _, (_, end, _) in chunk["gaps"]]
    for rows in (*chunk["util"].values(), *chunk["stats"].values(), chunk["host"]):
        ends += [row[0] for row in rows]
    return max(ends, default=-math.inf)
