"""Which worker of a multi-worker job this process is, so that every worker writes a run of its own.

Evidence, in order, from the environment alone: `TF_CONFIG` (`MultiWorkerMirroredStrategy`: the task's type and
index), then torchrun's `RANK` with `WORLD_SIZE` > 1 (`worker-<RANK>`). Reading it starts no framework runtime, so
a monitor may be built before `jax.distributed.initialize()` or `torch.distributed.init_process_group()`. A JAX
multi-process job that names its process in code is found at the fit's start (`jax_worker_name`, called by the
monitor's `on_train_begin` on the JAX backend, whose runtime the fit has started by then).
A worker writes to `<log_dir>/worker-<index>/rnnmon` (`chief-0`, `master-0`, `ps-0`, `evaluator-0` for those task
types), so no two processes ever share a run or an event file.

The folder name comes from the environment, so it must be one `schema.WORKER_DIR` matches (the tab's worker
pattern): a task type TensorFlow knows and an index from 0 to 999,999. Anything else (`../../x`, an absolute path,
quotes or a newline) is refused with one ERROR, and the process records as a single process, in
`<log_dir>/rnnmon`, as with an unreadable `TF_CONFIG`: nothing is written outside `log_dir`.

Example:
    >>> worker_name({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'})
    'worker-1'
    >>> worker_name({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"})     # torchrun
    'worker-3'
    >>> worker_name({})          # one process: no worker folder
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping

from rnnmon.format.schema import TASK_TYPES, WORKER_DIR

LOG = logging.getLogger("rnnmon")
_UNREADABLE_SAID: set[str] = set()  # TF_CONFIG values already called unreadable in this process


def worker_name(environ: Mapping[str, str] | None = None) -> str | None:
    """`<task type>-<index>` for a task of a multi-worker job, or None for a single process."""
    environ = os.environ if environ is None else environ
    spec = environ.get("TF_CONFIG")
    if spec:
        try:
            task = json.loads(spec).get("task") or {}
            kind, index = task.get("type", "worker"), task.get("index", 0)
        except (ValueError, TypeError, AttributeError, RecursionError) as error:
            if spec not in _UNREADABLE_SAID:  # once per process: every monitor (a KerasTuner trial's) asks
                _UNREADABLE_SAID.add(spec)
                LOG.warning("rnnmon: TF_CONFIG is not readable (%s); writing as a single process.", error)
        else:
            if isinstance(index, str) and index.isascii() and index.isdigit():
                index = int(index)
            name = f"{kind}-{index}"
            if isinstance(kind, str) and type(index) is int and WORKER_DIR.fullmatch(name):
                return name
            LOG.error("rnnmon: TF_CONFIG's task type %.80r with index %.20r cannot name a worker's folder (a type "
                      "from %s, an index from 0 to 999999); this process records as a single process, in "
                      "<log_dir>/rnnmon.", kind, index, ", ".join(TASK_TYPES))
            return None
    return _torchrun_worker(environ)


def _torchrun_worker(environ: Mapping[str, str]) -> str | None:
    """`worker-<RANK>` for a rank of a torchrun (or other `RANK`/`WORLD_SIZE`) job of two or more processes."""
    rank, world = environ.get("RANK", ""), environ.get("WORLD_SIZE", "")
    if not (world.isascii() and world.isdigit() and int(world) > 1):
        return None
    name = f"worker-{int(rank)}" if rank.isascii() and rank.isdigit() else ""
    if WORKER_DIR.fullmatch(name) and int(rank) < int(world):
        return name
    LOG.error("rnnmon: RANK %.20r of WORLD_SIZE %.20r cannot name a worker's folder (an index from 0 to "
              "min(WORLD_SIZE, 1000000) - 1); this process records as a single process, in <log_dir>/rnnmon.",
              rank, world)
    return None


def jax_worker_name() -> str | None:
    """`worker-<process index>` in a JAX multi-process job, else None. Call it only once the fit has started JAX's
    runtime: asking JAX before `jax.distributed.initialize()` would start it, and that call would then fail."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        if jax.process_count() > 1:
            return f"worker-{jax.process_index()}"
    except Exception:  # a JAX runtime quirk must not stop monitoring
        return None
    return None
