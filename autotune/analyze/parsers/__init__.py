"""Log parsers, one module per format, and the format detection.

Built-in formats: own (autotune.instrument JSONL), imagenet (pytorch/examples),
timm, lightning (SimpleProfiler report). `regex` is built from a user's YAML file.
"""

from __future__ import annotations

from autotune.analyze.parsers._base import (LogParser, ProfileSummary, Skip, StepRecord,
                                            line_timestamp)
from autotune.analyze.parsers.imagenet import ImagenetParser
from autotune.analyze.parsers.lightning import LightningParser
from autotune.analyze.parsers.own import OwnParser
from autotune.analyze.parsers.regex import RegexParser
from autotune.analyze.parsers.timm import TimmParser

# Detection order breaks ties: the most specific format first.
BUILTIN: dict[str, type[LogParser]] = {
    "own": OwnParser, "timm": TimmParser, "imagenet": ImagenetParser,
    "lightning": LightningParser,
}
FORMATS = ("auto", *BUILTIN, "regex")

__all__ = ["BUILTIN", "FORMATS", "ImagenetParser", "LightningParser", "LogParser",
           "OwnParser", "ProfileSummary", "RegexParser", "Skip", "StepRecord", "TimmParser",
           "line_timestamp"]
