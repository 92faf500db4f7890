"""Loads the rnnmon tab, makes TensorBoard keep every rnnmon sample where the tab needs them, and reload a live
run sooner.

With a local log directory the tab reads the runs' own event files (see `run_files`), so TensorBoard's own
sampling does not limit it; so with `gs://` and `s3://`, read from a local mirror. Otherwise (`--logdir_spec`,
other remote schemes) it reads through the data provider, and
TensorBoard keeps 10 tensor samples per tag (Python loader) or 100 (Rust data server) for plugins it does not
know; rnnmon writes a chunk every 2 s, so a long run would lose data. `fix_flags` runs before the data ingester
is built, so there it sets `--samples_per_plugin rnnmon=0` ("all") unless the user chose a value for rnnmon.
A `gs://` or `s3://` log directory whose scheme TensorBoard cannot read is replaced by rnnmon's local mirror of it
(see `remote_runs`).

TensorBoard rereads the log directory every `--reload_interval` seconds (5 by default), which alone puts up to
5 s between a step and the tab; with TensorBoard's default, `fix_flags` sets 2 s (the rnnmon writer's own
interval) for a local log directory. Reloads read only what is new; any other value the user passes is kept. A
remote one keeps TensorBoard's default: where TensorBoard reads `gs://` itself, each reload lists the bucket (2 s
cost about 10,700 LISTs an hour), and the mirror the tab reads syncs every 15 s anyway.

Example:
    >>> flags = argparse.Namespace(logdir="hdfs://namenode/runs", samples_per_plugin={"images": 50})
    >>> RnnmonLoader().fix_flags(flags)
    >>> flags.samples_per_plugin
    {'images': 50, 'rnnmon': 0}
"""

from __future__ import annotations

import argparse
import logging

from tensorboard.plugins import base_plugin

from rnnmon.format.schema import PLUGIN_NAME
from rnnmon.storage import remote

from .remote_runs import mirror_logdir
from .run_files import reads_files

KEEP_ALL = 0  # a sample count of 0 keeps every sample, in both loaders
TENSORBOARD_RELOAD_S, LIVE_RELOAD_S = 5.0, 2.0  # TensorBoard's default --reload_interval, and rnnmon's
LOG = logging.getLogger(__name__)


class RnnmonLoader(base_plugin.TBLoader):
    """The `tensorboard_plugins` entry point: keep all rnnmon samples, then build `RnnmonPlugin`."""

    def define_flags(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument_group("rnnmon").add_argument(
            "--rnnmon_index_from_bytes", type=int, default=None,
            help="local runs with at least this many bytes of event files are drawn from their reading index "
                 "(default 1 MiB, about 65k steps; 0: every run)")

    def fix_flags(self, flags: argparse.Namespace) -> None:
        samples = dict(getattr(flags, "samples_per_plugin", None) or {})
        logdir = getattr(flags, "logdir", None)
        if remote.is_remote(logdir):
            try:
                remote.check(logdir)  # a URL carrying credentials: refused, as the monitor and the report refuse it
            except remote.CredentialsInURL as error:
                raise base_plugin.FlagsError(f"rnnmon: {error}") from None  # TensorBoard prints it and exits
        if not reads_files(logdir) and not remote.is_remote(logdir):  # the tab reads through the data provider
            samples.setdefault(PLUGIN_NAME, KEEP_ALL)
        flags.samples_per_plugin = samples
        mirror = mirror_logdir(getattr(flags, "logdir", None) or "")
        if mirror is not None:  # a scheme TensorBoard cannot read (s3:// without tensorflow-io): read the mirror
            LOG.warning("rnnmon: TensorBoard cannot read %s itself; it reads rnnmon's local mirror of it, %s, "
                        "updated every few seconds.", remote.redact(flags.logdir), mirror)
            flags.logdir = mirror
        if getattr(flags, "reload_interval", None) == TENSORBOARD_RELOAD_S and not remote.is_remote(logdir):
            flags.reload_interval = LIVE_RELOAD_S

    def load(self, context: base_plugin.TBContext) -> base_plugin.TBPlugin | None:
        try:
            from rnnmon_tensorboard.plugin import RnnmonPlugin
        except ImportError as error:  # a broken install must not take TensorBoard down with it
            LOG.error("rnnmon: the TensorBoard tab is unavailable: %s", error)
            return None
        threshold = getattr(context.flags, "rnnmon_index_from_bytes", None)
        return RnnmonPlugin(context) if threshold is None else RnnmonPlugin(context, index_from_bytes=threshold)
