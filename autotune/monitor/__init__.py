"""System monitor: disk (iostat -x formulas), CPU per core, process tree, /dev/shm, GPU.

Importing this package needs no GPU and no pynvml; NVML is imported when first read.
The library never prints: results are records with `to_dict()` and summaries.

    with SystemMonitor(path="/data/imagenet", pid=trainer.pid) as mon:
        ...
    mon.summary(); mon.write_jsonl("metrics.jsonl")
"""

from autotune.monitor.cpu import CpuSnapshot, CpuUsage, cpu_usage, read_cpu_times
from autotune.monitor.diskstats import (DiskCounters, DiskRates, DiskSnapshot, DiskStatsReader,
                                        disk_rates, parse_diskstats, parse_diskstats_line,
                                        resolve_disk)
from autotune.monitor.gpu import GpuDevice, GpuReader, GpuUsage, gpu_snapshot
from autotune.monitor.iostat import iostat_crosscheck, parse_iostat_json
from autotune.monitor.proctree import ProcessTree, TreeUsage
from autotune.monitor.records import Unavailable
from autotune.monitor.sampler import Sample, SystemMonitor
from autotune.monitor.shm import ShmUsage, shm_usage
from autotune.monitor.summary import percentile, summarize

__all__ = [
    "CpuSnapshot", "CpuUsage", "cpu_usage", "read_cpu_times",
    "DiskCounters", "DiskRates", "DiskSnapshot", "DiskStatsReader", "disk_rates",
    "parse_diskstats", "parse_diskstats_line", "resolve_disk",
    "GpuDevice", "GpuReader", "GpuUsage", "gpu_snapshot",
    "ProcessTree", "TreeUsage", "Unavailable", "Sample", "SystemMonitor",
    "ShmUsage", "shm_usage", "percentile", "summarize",
    "iostat_crosscheck", "parse_iostat_json",
]
