"""The `wds` format: WebDataset tar shards (writer.py, reader.py, tarfmt.py; bucket.py: shards
in a bucket, read through autotune_converters.storage.s3)."""

from __future__ import annotations

from pathlib import Path


def sniff(path: Path) -> bool:
    """A conversion whose manifest.json says wds."""
    from autotune_converters.registry import manifest_format

    return manifest_format(path) == "wds"
