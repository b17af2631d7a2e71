"""`python -m autotune.monitor.burst PID SECONDS [WORKER,PID,...]`: the time budget of PID's
process tree over SECONDS, one JSON line on stdout (the monitor's "budget" section); with
worker pids, only those of PID's other processes are counted (the loader's own workers).

A process of its own, so that the sampler's sweeps never take the training process's GIL;
it is a child of the training process, so it leaves its own threads out of the tree.
It lives under `autotune.monitor`, whose package imports only the monitor's readers: `-m`
imports every package above the module, and `autotune.online`'s imports the loader and
torch (about 210 MiB and a second or more of CPU in a process that only reads /proc).
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    from autotune.monitor.run import budget_section
    from autotune.monitor.tasks import TaskSampler

    pid, seconds = int(argv[1]), float(argv[2])
    restrict = len(argv) > 3              # "none": no worker (num_workers=0)
    only = {int(x) for x in argv[3].split(",") if x.isdigit()} if restrict else set()

    class _Sampler(TaskSampler):
        def _add(self, p: int, tid: int, now: float) -> None:
            # Nothing else the training process runs when the loader's workers are named
            # (the sampler itself, in the tree it samples, is autotune's own: never added).
            if not restrict or p == pid or p in only:
                super()._add(p, tid, now)

    try:
        tasks = _Sampler(pid, psi=False).start()
    except Exception as e:  # noqa: BLE001  (a figure, never a reason to fail the caller)
        print(json.dumps({"available": False, "reason": f"{type(e).__name__}: {e}"}))
        return 0
    time.sleep(seconds)
    out = budget_section(tasks)
    tasks.stop()
    print(json.dumps(out or {"available": False, "reason": "no window"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
