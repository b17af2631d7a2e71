"""Where training runs: recorders for trainers that own the training loop.

- `autotune.integrations.lightning.InstrumentCallback`: a Lightning `Callback` that
  writes the step log of `autotune.instrument` (needs `pip install 'autotune-loader[lightning]'`).

A plain loop, or HuggingFace Accelerate (its prepared loader, `DataLoaderShard`, is a
DataLoader subclass), wraps its loader with `autotune.instrument` and needs nothing here;
Accelerate's `prepare` hands an `autotune.DataLoader` back unchanged (docs/integrations/
accelerate.md says what the script then does itself).
Each module imports its framework itself; importing this package imports none.
"""
