"""The ceilings measured apart from the judged figures (the probe's, the search's storage
ceiling, the decode ceiling): what they are, whether the job reaches them, and what they
say of the verdict the time budget gave."""

from __future__ import annotations

from typing import Any

from autotune.monitor.figures import SystemFigures
from autotune.monitor.quota import quota_line
from autotune.thresholds import AT_CEILING, QUOTA_THROTTLED
from autotune.verdict._types import Verdict
from autotune.verdict.rules._inputs import RuleInputs, num


def _probe_ceiling(probe: dict[str, Any] | None) -> tuple[float | None, float | None, int | None]:
    """(files/s ceiling of the replay, fio random-read IOPS, best concurrency) of a probe;
    a conversion's probe gives its samples/s through the format's reader instead."""
    if not probe:
        return None, None, None
    v = probe.get("verdict") or {}
    files = v.get("storage_samples_per_s") or v.get("storage_files_per_s")
    best_c = v.get("samples_best_concurrency") or v.get("best_concurrency")
    fio = probe.get("fio") or {}
    iops = (fio.get("rand_read") or {}).get("iops") if fio.get("plausible", True) else None
    return (float(files) if files else None, float(iops) if iops else None, best_c)


def storage_ceiling(inp: RuleInputs) -> tuple[float | None, float | None, int | None, str]:
    """(ceiling, fio IOPS, reads in flight at the ceiling, unit): the one given, else the
    probe's (none when a trial overtook it: a wrong measurement)."""
    files, iops, best_c = _probe_ceiling(inp.probe)
    if inp.storage_overtaken:
        files = None
    if inp.storage_ceiling:
        return inp.storage_ceiling, iops, inp.storage_concurrency or best_c, inp.storage_unit
    unit = "samples/s" if (inp.probe or {}).get("verdict", {}).get("storage_samples_per_s") \
        else "files/s"
    return files, iops, best_c, unit


def levels(probe: dict[str, Any] | None) -> tuple[list[tuple[int, float]], str]:
    """The probe's (concurrency, rate) levels: a conversion's reader's, else the replay's
    steady-state pass, else its cold pass."""
    p = probe or {}
    for sec, key, unit in (("samples", "samples_per_s", "samples/s"),
                           ("replay", "files_per_s", "files/s")):
        d = p.get(sec) or {}
        for levels in (d.get("steady"), d.get("by_concurrency")):
            pts = [(int(lv["concurrency"]), float(lv[key])) for lv in levels or []
                   if lv.get("concurrency") and lv.get(key) is not None]
            if pts:
                return sorted(pts), unit
    return [], "files/s"


def ceilings(inp: RuleInputs, ev: list[str]) -> dict[str, Any]:
    """The ceilings measured apart from the judged figures, and whether they are reached."""
    s = inp.system
    med = SystemFigures.med
    out: dict[str, Any] = {"storage": "", "decode": False}
    storage, iops, best_c, unit = storage_ceiling(inp)
    ips = inp.images_per_s
    if storage and ips:
        ev.append(f"reads {ips:,.0f} images/s = {ips / storage:.0%} of the storage ceiling "
                  f"{storage:,.0f} {unit} ({'measured apart' if inp.storage_ceiling else 'probe'}, "
                  f"best at {best_c or '?'} reads in flight)")
        if ips >= AT_CEILING * storage:
            out["storage"] = ("at the probe's storage ceiling" if not inp.storage_ceiling else
                              f"at the storage ceiling ({storage:,.0f} {unit}, measured apart "
                              "from the trials)")
    rps = med(s.disk_reads_per_s) if s is not None else None
    if iops and rps is not None:
        ev.append(f"disk r/s {rps:,.0f} = {rps / iops:.0%} of fio's {iops:,.0f} random-read IOPS")
        if rps >= AT_CEILING * iops and not out["storage"]:
            out["storage"] = f"at fio's random-read IOPS ({iops:,.0f})"
    out["cap"], out["cap_bytes"] = _read_cap(s, ev) if s is not None else ("", False)
    out["quota"] = _cpu_quota(s, ev) if s is not None else None
    dc = inp.decode_ceiling
    if dc and ips:
        ev.append(f"reads {ips:,.0f} images/s = {ips / dc:.0%} of the decode ceiling {dc:,.0f} "
                  "images/s (the pipeline from memory x the usable cores, measured apart)")
        out["decode"] = ips >= AT_CEILING * dc
    if s is not None:
        _disk_evidence(s, ev)
    return out


def _read_cap(s: SystemFigures, ev: list[str]) -> tuple[str, bool]:
    """Behind the job's cgroup read cap on the disk (a limit set by configuration, not a
    figure measured from the job): what the job was charged against it, and, when it
    reaches the cap, how the verdict says so ("" when it does not), and whether the cap
    it reaches is one on bytes/s (shards read the same bytes: converting on that disk
    does not help)."""
    cap = s.disk_read_cap
    if not cap:
        return "", False
    # The mean, not the median: blk-throttle charges a queue of throttled bios in bursts
    # when it dispatches them (cgroup v1 io_serviced), so most half-second samples of a job
    # held at its cap read 0-4 reads/s and a few read several times the cap; the total
    # charged over the window (the samples' mean) is what meets the cap.
    def mean(f: dict[str, float] | None) -> float | None:
        return None if f is None else f.get("mean", f["median"])

    reached = []
    for limit, rate, unit in ((cap.get("iops"), mean(s.disk_cap_reads_per_s), "reads/s"),
                              (cap.get("mib_s"), mean(s.disk_cap_read_mib_s), "MiB/s")):
        if not limit or rate is None:
            continue
        fmt = "{:,.0f}" if unit == "reads/s" else "{:,.1f}"
        ev.append(f"the job's cgroup caps reads on {s.disk_device or 'its disk'} at "
                  f"{fmt.format(limit)} {unit} (blk-throttle); it charged the job "
                  f"{fmt.format(rate)} {unit} = {rate / limit:.0%} of it (mean over the samples)")
        if rate >= AT_CEILING * limit:
            reached.append(f"{fmt.format(rate)} {unit} of the {fmt.format(limit)} allowed")
    text = ("at its cgroup's read cap (" + "; ".join(reached) + ")") if reached else ""
    return text, any(" MiB/s of the " in r for r in reached)


def _cpu_quota(s: SystemFigures, ev: list[str]) -> dict[str, Any] | None:
    """The job's cgroup CPU quota (a limit set by configuration) and the share of its
    periods in which it ran out (the kernel then stops the job's tasks to the next
    period): the quota, when that share reaches QUOTA_THROTTLED; else None."""
    q = s.cpu_quota
    if not q:
        if "cpu_quota" in s.unavailable:
            ev.append(f"CPU quota: not seen ({s.unavailable['cpu_quota']})")
        return None
    if q.get("cores") is None:
        return None
    share = q.get("throttled_share")
    ev.append(quota_line(q))
    return q if share is not None and share >= QUOTA_THROTTLED else None


def _disk_evidence(s: SystemFigures, ev: list[str]) -> None:
    med = SystemFigures.med
    if s.disk_util_pct is not None:
        ev.append(f"disk {s.disk_device or '?'}: %util {med(s.disk_util_pct):.0f} (p95 "
                  f"{s.disk_util_pct['p95']:.0f}), r/s {num(med(s.disk_reads_per_s))}, r_await "
                  f"{num(med(s.disk_r_await_ms), '{:.1f}')} ms; iowait "
                  f"{num(med(s.cpu_iowait_pct), '{:.0f}')} %")
    elif "disk" in s.unavailable:
        ev.append(f"disk: not measured ({s.unavailable['disk']})")
    ev.append(f"system figures: {s.samples} monitor samples, joined by {s.joined_by}")


def confirm(v: Verdict, at: dict[str, Any], ev: list[str]) -> None:
    """What the ceilings measured apart say of the budget's verdict."""
    if at["storage"]:
        ev.append(f"the storage ceiling measured apart {'agrees' if v.bottleneck == 'storage' else 'disagrees'}: "
                  f"the job reads {at['storage']}")
    if at["decode"]:
        ev.append(f"the decode ceiling measured apart {'agrees' if v.bottleneck == 'decode' else 'disagrees'}: "
                  "the job reads at it")


__all__ = ["ceilings", "confirm", "levels", "storage_ceiling"]
