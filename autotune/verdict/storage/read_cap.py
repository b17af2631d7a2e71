"""A read cap on the dataset's disk in this process's own cgroup (blk-throttle: `docker run
--device-read-iops/-bps`, a systemd unit's IOReadIOPSMax=): every figure the probe took is
held to it, as a job in the same cgroup is. A cap on reads a second is eased by shards
(fewer, larger reads); a cap on bytes a second is not (shards read the same bytes): only a
disk without the cap, or a higher cap, is."""

from __future__ import annotations

from autotune.verdict.storage._case import StorageCase, StorageRule


class ReadCapped(StorageRule):
    name = "read cap"

    def applies(self, case: StorageCase) -> bool:
        return case.cap is not None

    def conclude(self, case: StorageCase) -> None:
        cap = case.cap
        limits = [f"{cap.iops:,} reads/s" if cap.iops else "",
                  f"{cap.bps / 2**20:,.1f} MiB/s" if cap.bps else ""]
        said = " and ".join(x for x in limits if x)
        case.extra["read_cap"] = {"iops": cap.iops, "mib_s": cap.bps / 2**20 if cap.bps else None,
                                  "source": cap.source}
        case.evidence.append(f"this process's cgroup caps reads on {case.fs.device or 'the disk'} "
                             f"at {said} ({cap.source}): every figure here is held to it, as a "
                             "job in this cgroup is, whatever the device could do")
        if cap.bps:
            case.advice.append(
                f"a cap of {cap.bps / 2**20:,.1f} MiB/s holds any format to it (shards read "
                "the same bytes): convert and stage onto a disk without the cap "
                "(`autotune convert SRC /local/disk/train-wds --format wds`, `autotune stage`), "
                "or raise the cap")
        else:
            case.advice.append(f"a cap of {cap.iops:,} reads/s counts requests, not bytes: "
                               "shards (`autotune convert`) read the same bytes in far fewer, "
                               "larger requests")
