"""A `gs://` or `s3://` log directory, read by the tab through an on-disk mirror (`rnnmon.storage.mirror`).

TensorBoard's own loader cannot read every remote store (TensorFlow's file systems have no `s3://` any more, and
without TensorFlow there is no `gs://`), and reading through it would skip rnnmon's checks. So the tab mirrors the
log directory's objects into a local cache on a background thread (`rnnmon-mirror`), downloading only new and
changed objects, every `SYNC_S`, and reads the mirror as a local log directory: the same reader, checks and
incremental reads as local runs. Where TensorBoard reads the scheme itself (`gs://` with TensorFlow), the runs'
listing comes from a multiplexer over the mirror, reloaded after each sync. Where it cannot (`s3://` with
TensorFlow but without tensorflow-io: TensorBoard would not start), the loader points `--logdir` at the mirror
(`mirror_logdir`), so TensorBoard and all its tabs read the mirror as a local folder. A store that cannot be listed
keeps the last mirror and logs one warning (without credentials).

Example:
    >>> runs = RemoteRuns("s3://bucket/exp1")
    >>> runs.start()
    >>> runs.wait_synced(60)
    >>> runs.provider.list_tensors(ctx, experiment_id="", plugin_name="rnnmon")
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from rnnmon.storage import remote
from rnnmon.storage.mirror import Mirror

LOG = logging.getLogger("rnnmon")
SYNC_S = 15.0  # between syncs (`$RNNMON_SYNC_S`): 240 an hour, a LIST per live run each (see Mirror), a GET per change
FIRST_SYNC_WAIT_S = 60.0  # a request before the first sync waits this long for it


class RemoteRuns:
    """The mirror of one remote log directory and a data provider over it."""

    def __init__(self, url: str, sync_s: float | None = None) -> None:
        from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

        self.shown = remote.redact(url)
        self.mirror = Mirror(url)
        self.tree = self.mirror.tree
        self._sync_s = sync_s or float(os.environ.get("RNNMON_SYNC_S") or SYNC_S)
        # the listing only (runs, tags, newest step and time): the data is read from the mirror's files
        self._multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 1})
        self._provider = data_provider.MultiplexerDataProvider(self._multiplexer, self.tree)
        self.provider = _AfterFirstSync(self)
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="rnnmon-mirror", daemon=True)
        self._start_lock = threading.Lock()
        self._started = False

    @classmethod
    def of(cls, logdir: str | None) -> RemoteRuns | None:
        """The remote log directory `logdir` (or the one whose mirror `logdir` is); None where it is local or not
        given. Its syncs start with the first use of its `provider`."""
        if logdir and logdir in _BY_TREE:
            return _BY_TREE[logdir]
        return cls(logdir) if remote.is_remote(logdir) else None

    def start(self) -> None:
        """Start the background syncs (once)."""
        with self._start_lock:
            if not self._started:
                self._started = True
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout_s: float = FIRST_SYNC_WAIT_S) -> bool:
        """Wait for the first sync (or the first failed one); True once one has run."""
        return self._synced.wait(timeout_s)

    def sync(self) -> None:
        """Download what changed and reload the listing; a failure is logged once until a sync works again."""
        try:
            self.mirror.sync()
        except Exception as error:  # any failure: the thread lives on and syncs again (a NUL in a key killed it)
            if not self._failing:
                self._failing = True
                LOG.warning("rnnmon: the tab cannot read %s (%s); it shows the copy last read and retries every "
                            "%.0f s.", self.shown, error, self._sync_s)
        else:
            if self._failing:
                self._failing = False
                LOG.warning("rnnmon: the tab reads %s again.", self.shown)
            self._multiplexer.AddRunsFromDirectory(self.tree)
            self._multiplexer.Reload()
        finally:
            self._synced.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sync()
            self._stop.wait(self._sync_s)


_BY_TREE: dict[str, RemoteRuns] = {}  # mirrors TensorBoard reads as its --logdir


def mirror_logdir(logdir: str) -> str | None:
    """For a remote `logdir` TensorBoard cannot read itself: the local folder of its mirror (syncing in the
    background), to read in its place; else None."""
    if not remote.is_remote(logdir) or readable_by_tensorboard(logdir):
        return None
    runs = RemoteRuns(logdir)
    os.makedirs(runs.tree, exist_ok=True)
    _BY_TREE[runs.tree] = runs
    runs.start()
    return runs.tree


def readable_by_tensorboard(logdir: str) -> bool:
    """Whether TensorBoard's file layer (TensorFlow's, or its own without TensorFlow) has `logdir`'s scheme."""
    from tensorboard.compat import tf

    scheme = logdir.split("://", 1)[0].lower()
    try:
        return scheme in tf.io.gfile.get_registered_schemes()
    except AttributeError:  # TensorBoard's own file layer (no TensorFlow): fsspec's schemes are all there
        return True


class _AfterFirstSync:
    """The mirror's data provider: its first use starts the syncs; each call is made once the first sync has run
    (waited for at most `FIRST_SYNC_WAIT_S`)."""

    def __init__(self, runs: RemoteRuns) -> None:
        self._runs = runs

    def __getattr__(self, name: str) -> Any:
        self._runs.start()
        self._runs.wait_synced()
        return getattr(self._runs._provider, name)
