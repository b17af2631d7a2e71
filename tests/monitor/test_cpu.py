"""System CPU % from /proc/stat: recorded text, then a real busy loop."""

from __future__ import annotations

import time

import pytest

from autotune.monitor import cpu_usage, read_cpu_times
from autotune.monitor.cpu import parse_proc_stat

BEFORE = """cpu  1000 0 500 8000 100 0 0 0 0 0
cpu0 600 0 300 3000 50 0 0 0 0 0
cpu1 400 0 200 5000 50 0 0 0 0 0
intr 12345 0 0
"""
# cpu0: +90 user +10 system, 0 idle -> 100 %; cpu1: +20 user, +60 idle, +20 iowait -> 20 %.
AFTER = """cpu  1110 0 510 8060 120 0 0 0 0 0
cpu0 690 0 310 3000 50 0 0 0 0 0
cpu1 420 0 200 5060 70 0 0 0 0 0
intr 99999 0 0
"""


def test_recorded_proc_stat() -> None:
    u = cpu_usage(parse_proc_stat(BEFORE), parse_proc_stat(AFTER))
    assert u.per_core_pct == [100.0, 20.0]
    assert u.busiest_core_pct == 100.0 and u.cores == 2
    assert u.total_pct == pytest.approx(120 / 200 * 100)
    assert u.iowait_pct == pytest.approx(20 / 200 * 100)


def test_steal_and_irq_count_as_busy_guest_not_twice() -> None:
    a = parse_proc_stat("cpu  0 0 0 0 0 0 0 0 0 0\n")
    # user 50 (of which guest 40), irq 10, softirq 10, steal 30, idle 100
    b = parse_proc_stat("cpu  50 0 0 100 0 10 10 30 40 0\n")
    assert cpu_usage(a, b).total_pct == pytest.approx(100 / 200 * 100)


def test_idle_going_backwards_is_clamped() -> None:
    a = parse_proc_stat("cpu  100 0 0 1000 50 0 0 0 0 0\n")
    b = parse_proc_stat("cpu  200 0 0 1100 40 0 0 0 0 0\n")   # iowait -10 (NO_HZ estimate)
    u = cpu_usage(a, b)
    assert 0.0 <= u.iowait_pct <= 100.0 and 0.0 <= u.total_pct <= 100.0


def test_real_busy_loop_shows_on_one_core() -> None:
    before = read_cpu_times()
    end = time.monotonic() + 0.6
    x = 0
    while time.monotonic() < end:
        x += 1
    u = cpu_usage(before, read_cpu_times())
    assert u.cores >= 1 and len(u.per_core_pct) == u.cores
    assert u.busiest_core_pct > 50.0
    assert u.total_pct >= 100.0 / u.cores * 0.5
