"""One process of a 2-process JAX job on CPU (gloo), for the tests that run one: `python -c JOB log_dir index port
stall_s batches monitor_kwargs_json`. The process sets its index in code; process 1 stalls `stall_s` on each batch
of its shard; every step waits ~50 ms inside the compiled step, as a device computes. The monitor is built before
`jax.distributed.initialize()`, as users write it."""

JOB = """
import json, sys, time
import jax, keras, numpy as np
import rnnmon

log_dir, index, port, stall_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
batches, monitor_kwargs = int(sys.argv[5]), json.loads(sys.argv[6])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
monitor = rnnmon.UtilizationMonitor(log_dir, audit=False, **monitor_kwargs)
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=index)  # the index, set in code
keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))

class Batches(keras.utils.PyDataset):  # this process's shard
    def __len__(self):
        return batches

    def __getitem__(self, i):
        time.sleep(stall_s)
        rng = np.random.default_rng(i)
        return rng.normal(size=(32, 16, 8)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")

class DeviceTime(keras.layers.Layer):  # ~50 ms a step inside the compiled step, as a device computes
    def call(self, x):
        def device():
            time.sleep(0.05)
            return np.float32(0)
        return x + jax.lax.stop_gradient(jax.pure_callback(device, jax.ShapeDtypeStruct((), np.float32)))

    def compute_output_shape(self, shape):
        return shape

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((16, 8)), keras.layers.LSTM(16), keras.layers.Dense(1), DeviceTime()])
model.compile(optimizer="adam", loss="mse")
model.fit(Batches(), epochs=1, verbose=0, callbacks=[monitor])
"""
