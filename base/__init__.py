"""The base layer (installed as `autotune_base`): what every other layer stands on.

    errors.py   the exception tree, drawn once (its root, the usage and format errors)
    units.py    sizes and rates: parse_size, fmt_bytes, fmt_rate
    fsutil.py   atomic writes, fsync_dir, the pid lock, hashing
    beneath.py  opening names beneath a directory without following symlinks out
    registry.py a name -> entry table extended at run time (formats, DataLoader settings)
    pathtable.py many paths with one integer each (labels, sizes), no object per path

It imports nothing from the layers above it (`autotune_converters`: storage, formats,
convert and stage; `autotune`: measure, decide, cli); tests/test_layers.py holds that.
"""
