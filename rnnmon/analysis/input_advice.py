"""What to do about input wait, for the kind of input a fit reads and the backend it runs on.

The kind (`tf.data`, `DataLoader`, `PyDataset`, `generator`) is named at the start of the fit from the `x`
passed to it (rnnmon.audit.pipeline.input_kind) and recorded in the run description as `input_kind`; the
measured INPUT_BOUND finding and the `input_wait_high` alert and input idle gaps give this advice. Any other
input (arrays, an unknown kind, a run recorded before `input_kind`) gets the tf.data advice, as before.

Example:
    >>> input_advice("DataLoader", "torch")[:60]
    'Load batches ahead in worker processes: `DataLoader(..., num'
"""

from __future__ import annotations

INPUT_KINDS = ("tf.data", "DataLoader", "PyDataset", "generator")

_TF_DATA = ("End the pipeline with `.prefetch(tf.data.AUTOTUNE)`, give `map` and `interleave` "
            "`num_parallel_calls=tf.data.AUTOTUNE`, `.cache()` what is loaded or decoded the same way every "
            "epoch, and move Python preprocessing (`py_function`, generators) into TensorFlow ops.")
_ADVICE = {
    "tf.data": _TF_DATA,
    "DataLoader": ("Load batches ahead in worker processes: `DataLoader(..., num_workers=4, persistent_workers=True, "
                   "prefetch_factor=2)` (each worker keeps `prefetch_factor` batches ready; persistent workers are "
                   "not restarted every epoch), with `pin_memory=True` when training on a GPU; keep `collate_fn` "
                   "and `__getitem__` light (whole-batch tensor ops, no per-sample Python)."),
    "PyDataset": ("Prepare batches ahead in parallel: pass `workers=4, use_multiprocessing=True` to the PyDataset's "
                  "`super().__init__` (threads, `use_multiprocessing=False`, suffice where `__getitem__` releases "
                  "the GIL), with a larger `max_queue_size` where batch times vary."),
    "generator": ("Replace the generator with a `keras.utils.PyDataset` that prepares batches ahead "
                  "(`workers=4, use_multiprocessing=True`), or a tf.data pipeline "
                  "(`.map(..., num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)`)."),
}


def input_advice(kind: str | None, backend: str | None) -> str:
    """The advice against input wait for an input of `kind` (one of `INPUT_KINDS`, else tf.data's) on `backend`."""
    advice = _ADVICE.get(kind or "", _TF_DATA)
    if kind == "generator" and backend == "torch":
        return advice.removesuffix(".") + ", or a torch `DataLoader` with `num_workers`."
    return advice
