"""Static audits: the model and its training input, checked before a step runs."""
