"""Random 4 KiB read IOPS above SMALL_FILE_MIN_IOPS (small-file image training): the rule
the probe passes or fails, with fio's figures."""

from __future__ import annotations

from autotune.verdict.storage._case import SMALL_FILE_MIN_IOPS, StorageCase, StorageRule


class RandomIops(StorageRule):
    name = "random read IOPS"

    def applies(self, case: StorageCase) -> bool:
        return case.fio_plausible

    def conclude(self, case: StorageCase) -> None:
        fio = case.fio
        assert fio is not None
        r, s = fio.rand_read, fio.seq_read
        label = "" if fio.direct else (
            f" (buffered; {fio.device} served {r.device_share:.0%} of the random job's bytes)"
            if r.device_share is not None else " (buffered)")
        ok = r.iops > SMALL_FILE_MIN_IOPS
        case.rules.append({"rule": f"random 4 KiB read IOPS > {SMALL_FILE_MIN_IOPS:,} "
                                   "(small-file image training)",
                           "value": round(r.iops), "pass": ok})
        case.evidence.append(f"fio{label}: {r.iops:,.0f} random 4 KiB IOPS "
                             f"(p99 {r.lat_p99_ms or 0:.2f} ms at depth 256), "
                             f"{s.bw_mib_s:,.0f} MiB/s sequential")
        if not ok and not (case.cap is not None and case.cap.bps):   # bytes: read_cap's advice
            case.advice.append(f"{r.iops:,.0f} random IOPS is below {SMALL_FILE_MIN_IOPS:,}: "
                               "small random reads will starve a fast GPU; repack into shards "
                               "(`autotune convert`) and stage them on local NVMe (`autotune stage`)")
