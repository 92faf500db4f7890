"""One diagnosis: what is wrong, where, the numbers behind it, and the change that fixes it.

Example:
    >>> Finding("INPUT_BOUND", "critical", "input pipeline",
    ...         "Input wait is 41% of step time.", "Add .prefetch(tf.data.AUTOTUNE).").to_dict()["code"]
    'INPUT_BOUND'
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    where: str
    message: str
    advice: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])
