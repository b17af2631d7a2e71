"""The CI gate of `autotune probe`: fio's figures against the thresholds a user enforces
(`--min-iops`, `--min-seq-mibps`), judged on figures the storage itself served.

Each check ends one of three ways: passed, failed (the storage was measured and is below
the threshold), or unmeasured (fio missing or failed, a buffered run where O_DIRECT was
refused and the page cache served the reads, RAM-backed scratch, a figure that failed the
disk-counter cross-check). The gate as a whole fails when any check failed, else is
unmeasured when any check is, else passes: a CI job can tell "too slow" from "could not
tell" (different exit statuses in the CLI).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GATES", "GateCheck", "GateResult", "judge"]

# flag -> (fio job, figure attribute, unit as the messages say it)
GATES: dict[str, tuple[str, str, str]] = {
    "--min-iops": ("rand_read", "iops", "random-read IOPS"),
    "--min-seq-mibps": ("seq_read", "bw_mib_s", "sequential MiB/s"),
}

PASSED, FAILED, UNMEASURED = "passed", "failed", "unmeasured"


@dataclass
class GateCheck:
    """One threshold: what was measured against it and how it ended."""

    flag: str
    unit: str
    threshold: float
    measured: float | None      # None when there is no figure the storage served
    outcome: str                # passed, failed or unmeasured
    reason: str | None = None   # why unmeasured, or the failing figure in words

    @property
    def passed(self) -> bool | None:
        return None if self.outcome == UNMEASURED else self.outcome == PASSED

    def line(self) -> str:
        return f"{self.flag} {self.threshold:g}: {self.reason}"


@dataclass
class GateResult:
    """Every check of one probe; `outcome` is the gate's."""

    checks: list[GateCheck] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        kinds = {c.outcome for c in self.checks}
        return FAILED if FAILED in kinds else UNMEASURED if UNMEASURED in kinds else PASSED

    @property
    def passed(self) -> bool | None:
        """True, False (too slow), or None (could not be measured)."""
        o = self.outcome
        return None if o == UNMEASURED else o == PASSED

    def failed(self) -> list[GateCheck]:
        return [c for c in self.checks if c.outcome == FAILED]

    def unmeasured(self) -> list[GateCheck]:
        return [c for c in self.checks if c.outcome == UNMEASURED]

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "passed": self.passed,
                "checks": [dict(asdict(c), passed=c.passed) for c in self.checks]}


def judge(res: Any, thresholds: dict[str, float | None]) -> GateResult | None:
    """The gate of a ProbeResult `res` for {flag: threshold} (None: not enforced); None when
    no threshold is given."""
    fio = getattr(res, "fio", None)
    out = GateResult()
    for flag, threshold in thresholds.items():
        if threshold is None:
            continue
        job, attr, unit = GATES[flag]
        if fio is None:
            why = getattr(res, "fio_error", None) or "fio did not run"
            out.checks.append(GateCheck(flag, unit, threshold, None, UNMEASURED,
                                        f"{unit} not measured ({why})"))
            continue
        j = getattr(fio, job)
        if not j.plausible:
            why = " ".join(j.warnings) or "failed the plausibility check"
            out.checks.append(GateCheck(flag, unit, threshold, None, UNMEASURED,
                                        f"{unit} not the storage's figure ({why})"))
            continue
        value = float(getattr(j, attr))
        if value < threshold:
            out.checks.append(GateCheck(flag, unit, threshold, round(value, 1), FAILED,
                                        f"measured {value:,.0f} {unit} on "
                                        f"{getattr(res, 'path', '?')}"))
        else:
            out.checks.append(GateCheck(flag, unit, threshold, round(value, 1), PASSED))
    return out if out.checks else None
