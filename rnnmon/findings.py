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
    speedup: float | None = None  # measured findings: the most that removing the cause can speed up (Amdahl)

    def to_dict(self) -> dict[str, str | float]:
        """The fields; `speedup` only where there is one (recorded static findings have none)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if not (k == "speedup" and v is None)}


def amdahl(removable_share: float) -> float:
    """The most a run speeds up when a cause taking `removable_share` of its time is removed: 1 / (1 - share)."""
    return round(1.0 / max(1.0 - removable_share, 0.01), 2)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Findings with a predicted speed-up first, largest first; then the others, most severe first."""
    return sorted(findings, key=lambda f: (-(f.speedup or 0.0), SEVERITY_ORDER[f.severity]))
