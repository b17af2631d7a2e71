"""Dataset converters (image folder -> LMDB / WebDataset shards), readers and staging.

Filled in by the convert and stage work; kept as an import package from the start so the
layout in DESIGN.md holds and `autotune` can import readers lazily from here.
"""
