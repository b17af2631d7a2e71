"""The verdict: what holds a job back, in one vocabulary for `search` and `analyze`.

    storage   reads from storage cannot keep up (small random reads, latency, a cap)
    decode    the CPUs cannot decode and augment fast enough
    loader    the DataLoader's settings, not the hardware, hold it back
    compute   healthy: the training step is the limit, the input pipeline keeps up
    unknown   the evidence at hand does not tell (the evidence says what would)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BOTTLENECKS = ("storage", "decode", "loader", "compute", "unknown")


@dataclass
class Verdict:
    """A bottleneck named with the evidence that shows it, what to do, and the next
    command that would tell more or fix it."""

    bottleneck: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    next_command: str = ""
    advice: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.bottleneck not in BOTTLENECKS:
            raise ValueError(f"bottleneck must be one of {', '.join(BOTTLENECKS)}, but got "
                             f"{self.bottleneck!r}.")

    def to_dict(self) -> dict[str, Any]:
        return {"bottleneck": self.bottleneck, "summary": self.summary,
                "evidence": self.evidence, "next_command": self.next_command,
                "advice": self.advice}


__all__ = ["BOTTLENECKS", "Verdict"]
