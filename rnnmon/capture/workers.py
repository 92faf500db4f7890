"""Which worker of a multi-worker job this process is, so that every worker writes a run of its own.

Evidence, in order: `TF_CONFIG` (`MultiWorkerMirroredStrategy`: the task's type and index), then JAX's
multi-process runtime (`jax.process_index()` when `jax.process_count() > 1`, only if JAX is already imported).
A worker writes to `<log_dir>/worker-<index>/rnnmon` (`chief-0`, `evaluator-0` for those task types), so no two
processes ever share a run or an event file.

Example:
    >>> worker_name({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'})
    'worker-1'
    >>> worker_name({})          # one process: no worker folder
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping

LOG = logging.getLogger("rnnmon")
_UNREADABLE_SAID: set[str] = set()  # TF_CONFIG values already called unreadable in this process


def worker_name(environ: Mapping[str, str] | None = None) -> str | None:
    """`worker-<index>` for a task of a multi-worker job, or None for a single process."""
    environ = os.environ if environ is None else environ
    spec = environ.get("TF_CONFIG")
    if spec:
        try:
            task = json.loads(spec).get("task") or {}
            kind, index = str(task.get("type", "worker")), int(task.get("index", 0))
        except (ValueError, TypeError, AttributeError) as error:
            if spec not in _UNREADABLE_SAID:  # once per process: every monitor (a KerasTuner trial's) asks
                _UNREADABLE_SAID.add(spec)
                LOG.warning("rnnmon: TF_CONFIG is not readable (%s); writing as a single process.", error)
        else:
            return f"{kind}-{index}"
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            if jax.process_count() > 1:
                return f"worker-{jax.process_index()}"
        except Exception:  # a JAX runtime quirk must not stop monitoring
            return None
    return None
