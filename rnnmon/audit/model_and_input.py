"""Audit a model and its training input before training: why the GPU will wait, without running a step.

Example:
    >>> import rnnmon
    >>> for finding in rnnmon.audit(model, train_ds):
    ...     print(finding.severity, finding.where, finding.message, "->", finding.advice)
    warning lstm 'lstm' (LSTM) cannot use the cuDNN kernel: recurrent_dropout=0.2 (...) -> ...
"""

from __future__ import annotations

from typing import Any

from rnnmon.audit.pipeline import audit_pipeline
from rnnmon.audit.preprocessing import audit_preprocessing
from rnnmon.audit.rnn_layers import audit_rnn_layers
from rnnmon.findings import Finding, sort_findings


def audit(model: Any, dataset: Any = None, *, batch_size: int | None = None) -> list[Finding]:
    """RNN-layer, in-model preprocessing and input-pipeline findings, most severe first.

    `dataset` is what you pass to `fit` as `x` (a tf.data.Dataset, a generator, a PyDataset, arrays or
    None); `batch_size` is fit's batch size where the input does not batch itself.
    """
    return sort_findings(audit_rnn_layers(model) + audit_preprocessing(model) + audit_pipeline(dataset, batch_size))
