"""One diagnosis (what is wrong, where, the numbers behind it, the fix) and the registry of finding codes.

Each code is declared once in `CODES`: found by the static audit or in what a run measured, its default
severity, its family (the part of training it concerns) and what it means. Producers build findings with
`Finding.of`, which refuses an undeclared code; findings read back from a run keep whatever code they carry.
To add a finding: declare its code here, build it with `Finding.of`, and give it a row in the README's
findings table (tests/test_findings.py checks that the table lists exactly the declared codes).

Example:
    >>> Finding.of("INPUT_BOUND", "input pipeline", "Input wait is 41% of step time.",
    ...            "Add .prefetch(tf.data.AUTOTUNE).").severity
    'critical'
    >>> sorted(codes("placement"))
    ['JAX_NO_GPU', 'PROCESS_NOT_ON_GPU', 'TF_NO_GPU', 'TORCH_NO_GPU']
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Severity = Literal["info", "warning", "critical"]
Kind = Literal["static", "measured"]  # the audit of model and input before training, or a run's own numbers
Family = Literal["input pipeline", "work per step", "host loop", "validation", "rnn kernel", "model", "placement",
                 "multi-device"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}


@dataclasses.dataclass(frozen=True)
class Code:
    """What one finding code is: how it is found, how severe it usually is, what it concerns, what it means."""

    kind: Kind
    severity: Severity  # the default; a producer may pass another where its evidence is weaker or stronger
    family: Family
    meaning: str


CODES: dict[str, Code] = {
    "INPUT_BOUND": Code("measured", "critical", "input pipeline",
                        "steps wait for the input pipeline, beyond the fetch floor, as long as the verdict's "
                        "input-bound share"),
    "CACHE_FILL": Code("measured", "info", "input pipeline",
                       "the first epoch waited for the input pipeline while it filled `.cache()`; the epochs after "
                       "it are judged on their own"),
    "EAGER_STEP": Code("measured", "critical", "host loop",
                       "a loop written by hand runs its training step op by op from Python (no tf.function or "
                       "jax.jit)"),
    "RECOMPILE": Code("measured", "warning", "input pipeline",
                      "steps on input shapes new to the fit (a partial batch, a new sequence length) compiled the "
                      "training step again"),
    "SMALL_STEP": Code("measured", "warning", "work per step",
                       "fetching a batch that is already there is a large part of the median step"),
    "HOST_BOUND": Code("measured", "warning", "host loop",
                       "host gaps between steps reach the verdict's host-bound share of step time"),
    "EVAL_IDLE": Code("measured", "warning", "validation",
                      "the GPU idles for a large part of training in validation and epoch ends"),
    "LOW_WORK_PER_STEP": Code("measured", "warning", "work per step",
                              "neither input- nor host-bound, yet the GPU's utilization or SM activity is low"),
    "DEVICE_IMBALANCE": Code("measured", "warning", "multi-device",
                             "one GPU of a process idles far more than the others, waiting for them"),
    "STRAGGLER": Code("measured", "warning", "multi-device",
                      "one worker of a multi-worker job holds the others back at every step"),
    "DISTRIBUTED_SPLIT": Code("measured", "warning", "multi-device",
                              "a tf.distribute iterator's own cost of splitting each ready batch across the "
                              "replicas is a large part of the median step"),
    "RNN_NO_FAST_KERNEL": Code("static", "warning", "rnn kernel",
                               "an LSTM/GRU setting keeps the layer off the backend's fused (cuDNN) kernel"),
    "RNN_MASK_RIGHT_PADDING": Code("static", "info", "rnn kernel",
                                   "an LSTM/GRU is fed a mask, and cuDNN takes only strictly right-padded masks"),
    "PREPROCESSING_IN_MODEL": Code("static", "warning", "model",
                                   "a string or lookup preprocessing layer runs inside the model, on the CPU"),
    "PIPELINE_NO_PREFETCH": Code("static", "warning", "input pipeline",
                                 "the user's tf.data pipeline does not end with a prefetch"),
    "PIPELINE_SERIAL_MAP": Code("static", "warning", "input pipeline",
                                "a map or interleave in the user's pipeline has no num_parallel_calls"),
    "PIPELINE_PY_FUNCTION": Code("static", "warning", "input pipeline",
                                 "a stage of the user's pipeline runs Python (py_function, numpy_function, "
                                 "from_generator)"),
    "PIPELINE_NO_CACHE": Code("static", "info", "input pipeline",
                              "a stage that reads files has no later .cache()"),
    "DATA_NOT_TF": Code("static", "warning", "input pipeline",
                        "the input is a Python generator, or a PyDataset without parallel workers"),
    "DATALOADER_NO_WORKERS": Code("static", "warning", "input pipeline",
                                  "the input is a torch DataLoader with num_workers=0: batches are loaded in the "
                                  "training loop"),
    "SMALL_BATCH": Code("static", "warning", "work per step", "the batch is small for an accelerator"),
    "TF_NO_GPU": Code("static", "critical", "placement", "NVML sees a GPU, TensorFlow (the Keras backend) none"),
    "JAX_NO_GPU": Code("static", "critical", "placement", "NVML sees a GPU, JAX (the Keras backend) none"),
    "TORCH_NO_GPU": Code("static", "critical", "placement", "NVML sees a GPU, torch (the Keras backend) none"),
    "PROCESS_NOT_ON_GPU": Code("static", "warning", "placement",
                               "the backend sees a GPU, but the process has no context on the watched GPU"),
}


def codes(family: Family, kind: Kind | None = None) -> frozenset[str]:
    """The declared codes of `family` (of `kind` only, if given)."""
    return frozenset(name for name, code in CODES.items()
                     if code.family == family and kind in (None, code.kind))


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    where: str
    message: str
    advice: str
    speedup: float | None = None  # measured findings: the fit's training time over that time without the cause

    @classmethod
    def of(cls, code: str, where: str, message: str, advice: str, speedup: float | None = None, *,
           severity: Severity | None = None) -> Finding:
        """A finding of the declared `code`, at the code's default severity unless `severity` is given."""
        if code not in CODES:
            raise ValueError(f"rnnmon: finding code {code!r} is not declared in rnnmon.findings.CODES")
        return cls(code, severity or CODES[code].severity, where, message, advice, speedup)

    def to_dict(self) -> dict[str, str | float]:
        """The fields; `speedup` only where there is one (recorded static findings have none)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if not (k == "speedup" and v is None)}


def amdahl(removable_share: float) -> float:
    """The most a run speeds up when a cause taking `removable_share` of its time is removed: 1 / (1 - share)."""
    return round(1.0 / max(1.0 - removable_share, 0.01), 2)


def training_speedup(training_s: float, without_s: float) -> float:
    """How many times shorter a fit's training gets without a cause: `training_s / without_s` (at most 100x)."""
    return round(training_s / max(without_s, training_s / 100, 1e-9), 2)


def training_sentence(training_s: float, without_s: float) -> str:
    """What removing a cause predicts, in time and ratio, for the fit's wall time after its warm-up (its training
    time): "this fit would take 3.1 min instead of 4.4 min after its warm-up: 1.42x"."""
    return (f"this fit would take {duration_text(without_s)} instead of {duration_text(training_s)} after its "
            f"warm-up: {training_speedup(training_s, without_s):.2f}x")


def duration_text(seconds: float) -> str:
    """Seconds as a person reads them: "8.2 s", "4.4 min", "2.1 h"."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Findings with a predicted speed-up first, largest first; then the others, most severe first."""
    return sorted(findings, key=lambda f: (-(f.speedup or 0.0), SEVERITY_ORDER[f.severity]))
