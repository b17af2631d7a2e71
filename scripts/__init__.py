"""The benchmark and helper scripts, run from the repository root as modules:

    python -m scripts.bench_loop --dataset DIR      # not as a file: siblings import as scripts.X

What they share is in scripts/_common.py. Not part of the wheel (setup.py packages
autotune* only). The bash entry points beside them (setup, demo, test, throttle, slowfs,
gpu_check, docs) run as they are.
"""
