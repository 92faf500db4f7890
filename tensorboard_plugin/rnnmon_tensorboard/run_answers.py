"""What every route says of a run's data: its name, its cuts among its notes, a summary in words, an unreadable run.

Example:
    >>> display_name("exp1/rnnmon")
    'exp1'
    >>> with_words(summarize(data), data.run)["verdict_text"]
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tensorboard import errors

from rnnmon.analysis import verdict
from rnnmon.format import schema
from rnnmon.format.eventfile import is_cut
from rnnmon.format.reader import RunData


class RunDataError(errors.PublicError):
    """A run whose rnnmon data cannot be read (HTTP 422: the request was fine, the data is not; 500 is for bugs)."""

    http_code = 422


def cuts_noted(data: RunData) -> RunData:
    """`data` as the routes serve it: a cut through records (`is_cut`: a file that ends inside a record, a record
    cut and written after) among its notes, not its errors, so the records around it are shown."""
    cuts = [error for error in data.errors if is_cut(error)]
    if not cuts:
        return data
    return dataclasses.replace(data, errors=[error for error in data.errors if not is_cut(error)],
                               notes=[*data.notes, *cuts])


def unreadable(run: str, problems: list[str]) -> str:
    return f"Run {run!r} has unreadable rnnmon data: {'; '.join(problems)}"


def with_words(summary: dict[str, Any], run: str) -> dict[str, Any]:
    """`summary` (`rnnmon.analysis.summary.summarize`) with the verdict in words, its advice and the run's name."""
    summary["verdict_text"] = verdict.label(summary["verdict"])
    summary["verdict_advice"] = verdict.ADVICE.get(summary["verdict"])
    summary["name"] = display_name(run)
    return summary


def display_name(run: str) -> str:
    """'exp1/rnnmon' -> 'exp1': rnnmon writes into its own subdirectory of the user's run directory."""
    suffix = "/" + schema.RUN_SUBDIR
    return run[: -len(suffix)] if run.endswith(suffix) and len(run) > len(suffix) else run
