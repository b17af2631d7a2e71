"""The `lmdb` format: one LMDB environment plus its index (writer.py, reader.py, layout.py)."""

from __future__ import annotations

from pathlib import Path


def sniff(path: Path) -> bool:
    """A conversion whose manifest.json says lmdb."""
    from autotune_converters.registry import manifest_format

    return manifest_format(path) == "lmdb"
