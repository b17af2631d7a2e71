"""`autotune analyze`: step timings of a training log, joined with system metrics, and a
verdict (storage, decode, loader, compute or unknown) with its evidence.

    from autotune.analyze import analyze
    a = analyze("run/train.log", metrics="run/metrics.jsonl", batch_size=256)
    a.verdict.bottleneck, a.verdict.evidence, a.to_dict()

Parsers stream the log (autotune.analyze.parsers: own, imagenet, timm, lightning, regex);
`rules` holds the verdict, `join` the join with the monitor's metrics.
"""

from autotune.analyze.analysis import Analysis, analyze, detect_format, load_probe
from autotune.verdict import BOTTLENECKS, Verdict

__all__ = ["Analysis", "BOTTLENECKS", "Verdict", "analyze", "detect_format", "load_probe"]
