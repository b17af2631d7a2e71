"""Failure classification on PyTorch's own messages (unit level; the real failures are
produced by real worker processes in test_bench_failures.py)."""

from __future__ import annotations

import signal

import pytest

from autotune.bench.failures import classify_error, classify_exit

WORKER_TB = ("Caught SampleError in DataLoader worker process 1.\nOriginal Traceback (most "
             "recent call last):\n  File \"x.py\", line 1, in f\nautotune_base.errors.SampleError: "
             "/d/c/bad.jpg: cannot decode (UnidentifiedImageError: nope); fix or remove the file")


@pytest.mark.parametrize("err, kind, text", [
    ({"type": "SampleError", "message": WORKER_TB, "phase": "measure"}, "worker_error", "bad.jpg"),
    ({"type": "RuntimeError", "message": "DataLoader worker (pid 77) is killed by signal: Killed.",
      "phase": "measure"}, "worker_killed", "OOM"),
    ({"type": "RuntimeError", "message": "DataLoader worker (pid 77) is killed by signal: Bus "
      "error. It is possible that dataloader's workers are out of shared memory.", "phase": "warmup"},
     "shm", "/dev/shm"),
    ({"type": "RuntimeError", "message": "Caught RuntimeError in DataLoader worker process 0.\n"
      "Original Traceback (most recent call last):\nRuntimeError: unable to write to file "
      "</torch_1_2_3>: No space left on device (28)", "phase": "measure"}, "shm", "torch_1_2_3"),
    ({"type": "RuntimeError", "message": "received 0 items of ancdata", "phase": "measure"},
     "open_files", "limit 1024"),
    ({"type": "OSError", "message": "[Errno 24] Too many open files", "errno": 24,
      "phase": "warmup"}, "open_files", "ulimit -n"),
    # A worker past the limit: torch's message names shared memory, the cause is EMFILE.
    ({"type": "RuntimeError", "message": "Caught RuntimeError in DataLoader worker process 0."
      "\nRuntimeError: unable to open shared memory object </torch_28185_1355_37> in "
      "read-write mode: Too many open files (24)", "phase": "measure"}, "open_files",
     "limit 1024"),
    ({"type": "RuntimeError", "message": "DataLoader timed out after 3.0 seconds",
      "phase": "measure"}, "timeout", "3.0 s"),
    ({"type": "RuntimeError", "message": "DataLoader worker (pid(s) 5, 6) exited unexpectedly",
      "phase": "measure"}, "worker_crashed", "5, 6"),
    ({"type": "ValueError", "message": "boom", "phase": "step"}, "step_error", "boom"),
    ({"type": "ModuleNotFoundError", "message": "No module named 'x'", "phase": "step-import"},
     "step_import", "x"),
])
def test_classify_error(err: dict, kind: str, text: str) -> None:
    f = classify_error(err, {"nofile_limit": 1024, "step": "m:f"})
    assert f.kind == kind, f
    assert text in f.reason + f.hint
    assert f.hint


def test_classify_exit() -> None:
    ctx: dict = {}
    hung = classify_exit(None, timed_out=True, timeout_s=30, phase="measurement", log_tail="",
                         oom_kills=0, ctx=ctx)
    assert hung.kind == "hung" and "30 s" in hung.reason
    oom = classify_exit(-signal.SIGKILL, timed_out=False, timeout_s=30, phase="measurement",
                        log_tail="", oom_kills=1, ctx=ctx)
    assert oom.kind == "oom" and "OOM killer" in oom.reason and "fewer workers" in oom.hint
    bus = classify_exit(-signal.SIGBUS, timed_out=False, timeout_s=30, phase="warm-up",
                        log_tail="", oom_kills=0, ctx=ctx)
    assert bus.kind == "shm"
    crash = classify_exit(2, timed_out=False, timeout_s=30, phase="startup",
                          log_tail="Traceback...\nImportError: no torch", oom_kills=0, ctx=ctx)
    assert crash.kind == "crashed" and "no torch" in crash.reason


def _feed_traceback(error: str, via: str = "    obj = _ForkingPickler.dumps(obj)\n") -> str:
    return ('Traceback (most recent call last):\n'
            '  File "/usr/lib/python3.11/multiprocessing/queues.py", line 244, in _feed\n'
            + via + '  File "/usr/lib/python3.11/multiprocessing/reduction.py", line 51, in '
            'dumps\n    cls(buf, protocol).dump(obj)\n' + error + "\n")


def test_a_workers_pickling_error_is_read_from_its_queue_threads_traceback():
    """The exception line that ends the _feed traceback, whatever its type; not EMFILE
    (the open-files limit), not a failed send, not a '_feed' elsewhere in the text. The
    real run is tests/bench/test_bench_failures.py."""
    from autotune.bench.failures import unsendable_line

    for err in ("TypeError: cannot pickle 'generator' object",
                "RuntimeError: Cowardly refusing to serialize non-leaf tensor which requires_grad",
                "ValueError: ctypes objects containing pointers cannot be pickled",
                "_pickle.PicklingError: Can't pickle <function <lambda> at 0x7f>",
                "RecursionError: maximum recursion depth exceeded while pickling an object"):
        assert unsendable_line(_feed_traceback(err)) == err
        # Two workers' tracebacks interleaved.
        assert unsendable_line("Traceback (most recent call last):\n"
                               + _feed_traceback(err)) == err
    for not_it in (_feed_traceback("OSError: [Errno 24] Too many open files"),
                   _feed_traceback("RuntimeError: unable to open shared memory object "
                                   "</torch_1_2_3> in read-write mode: Too many open files (24)"),
                   _feed_traceback("BrokenPipeError: [Errno 32] Broken pipe",
                                   via="    send_bytes(obj)\n").replace(
                                       "dumps\n    cls(buf, protocol).dump(obj)", "send"),
                   "rss_feed data_feed: TypeError: cannot pickle 'x' object\n"):
        assert unsendable_line(not_it) is None, not_it
