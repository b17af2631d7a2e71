"""Record types shared by the monitor's readers: a sample, and the "unavailable" marker.

Every record has `to_dict()` giving plain JSON-ready data. A figure the monitor cannot
measure honestly (tmpfs has no disk, no NVIDIA driver, ...) is an `Unavailable` with the
reason, never a zero that could be mistaken for a measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any


@dataclass(frozen=True)
class Unavailable:
    """A figure that cannot be measured here, and why (one line a user can act on)."""

    reason: str

    @property
    def available(self) -> bool:
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"available": False, "reason": self.reason}


def record_dict(obj: Any) -> dict[str, Any]:
    """`asdict` for a measured record, with `"available": true` first so consumers can
    test one key whatever the record type."""
    out: dict[str, Any] = {"available": True}
    out.update(asdict(obj))
    return out


def to_jsonable(value: Any) -> Any:
    """Record, Unavailable, list or None as plain JSON data."""
    if value is None:
        return None
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
