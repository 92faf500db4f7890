"""rnnmon's TensorBoard tab: per-step GPU utilization, idle gaps and their causes, run summaries, live.

Installed as the `rnnmon_tensorboard` package; TensorBoard finds it through the `tensorboard_plugins` entry point
`rnnmon = rnnmon_tensorboard.loader:RnnmonLoader`.

Example:
    $ tensorboard --logdir runs        # then open http://localhost:6006/#rnnmon
"""
