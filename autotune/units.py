"""Moved to converters.units (the lower package both use); kept until imports move."""
from converters.units import fmt_bytes, fmt_rate, parse_size  # noqa: F401
