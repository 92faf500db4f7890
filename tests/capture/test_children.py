"""Nothing of rnnmon runs in a child process: forked data workers and pools end as they would without it.

Each fit runs in its own Python process with a timeout, so a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import TESTS, read_run

pytestmark = pytest.mark.slow  # a fit in a process of its own with forked workers: 5-7 s each

SCRIPT = textwrap.dedent("""
    import multiprocessing, sys
    sys.path.insert(0, {tests!r})
    import keras
    from conftest import sequences, tiny_model
    from fake_nvml import library_missing
    from rnnmon import UtilizationMonitor

    class Batches(keras.utils.PyDataset):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.x, self.y = sequences(64)

        def __len__(self):
            return 64

        def __getitem__(self, i):
            return self.x[i * 32:(i + 1) * 32], self.y[i * 32:(i + 1) * 32]

    def square(value):
        return value * value

    class PoolInCallback(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pool = multiprocessing.get_context("fork").Pool(2)
            assert pool.map(square, range(8)) == [v * v for v in range(8)]
            pool.terminate()  # SIGTERM to each worker, then joins them
            pool.join()

    with library_missing():
        model = tiny_model()
        monitor = UtilizationMonitor({logdir!r})
        if {case!r} == "pydataset":
            model.fit(Batches(workers=2, use_multiprocessing=True), epochs=2, verbose=0, callbacks=[monitor])
        else:
            x, y = sequences(16)
            model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[monitor, PoolInCallback()])
    print("fit returned", flush=True)
""")


@pytest.mark.parametrize(("case", "steps"), [("pydataset", 128), ("pool_in_callback", 32)])
def test_forked_children_end_and_the_fit_returns(tmp_path, case, steps):
    script = SCRIPT.format(tests=TESTS, logdir=str(tmp_path), case=case)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:  # 2-12 s without the monitor; rnnmon's inherited SIGTERM handler used to hang the workers for ever
        stdout, stderr = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fit with forked children ({case}) hung")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the workers too, should any be left
        child.wait()
    assert child.returncode == 0 and "fit returned" in stdout, stderr[-2000:]
    run = read_run(str(tmp_path))
    assert run.info["status"] == "finished" and len(run.steps) == steps
