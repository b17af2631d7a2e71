"""`python -m autotune.emulate throttle|slowfs ARGS` (scripts/throttle, scripts/slowfs)."""

import sys

from autotune.emulate.cli import slowfs_main, throttle_main

_TOOLS = {"throttle": throttle_main, "slowfs": slowfs_main}

if len(sys.argv) < 2 or sys.argv[1] not in _TOOLS:
    print("usage: python -m autotune.emulate {throttle|slowfs} ARGS (see --help of each)",
          file=sys.stderr)
    sys.exit(2)
sys.exit(_TOOLS[sys.argv[1]](sys.argv[2:]))
