"""fio's figures against the replay: the files/s that sequential bandwidth and random
IOPS allow for the dataset's mean file; a replay well above the bandwidth bound was
probably served from a cache autotune cannot drop."""

from __future__ import annotations

import math

from autotune.verdict.storage._case import READAHEAD_BYTES, StorageCase, StorageRule


class CrossCheck(StorageRule):
    name = "fio against the replay"

    def applies(self, case: StorageCase) -> bool:
        return case.fio_plausible and case.rp is not None and case.rp.mean_file_bytes > 0

    def conclude(self, case: StorageCase) -> None:
        assert case.fio is not None and case.rp is not None
        r, s = case.fio.rand_read, case.fio.seq_read
        mean = case.rp.mean_file_bytes
        bw_bound = s.bw_mib_s * 2**20 / mean
        ios_per_file = 1 + math.ceil(mean / READAHEAD_BYTES)
        iops_bound = r.iops / ios_per_file
        case.evidence.append(f"cross-check: sequential bandwidth / mean file = {bw_bound:,.0f} "
                             f"files/s; random IOPS / {ios_per_file} I/Os per file = "
                             f"{iops_bound:,.0f} files/s")
        ceiling = case.ceiling
        if ceiling is not None and ceiling > 1.5 * bw_bound and case.fs.klass != "memory":
            case.advice.append(f"the replay ({ceiling:,.0f} files/s) beat the sequential "
                               f"bandwidth bound ({bw_bound:,.0f}): its files were probably "
                               "served from a cache (a host or server cache autotune cannot "
                               "drop); the storage ceiling may be lower when the cache is cold")
