"""The replay of the dataset's own files: its best rate, and its steady state (page cache
dropped, inodes kept), which the storage ceiling uses."""

from __future__ import annotations

from autotune_base.units import fmt_bytes

from autotune.verdict.storage._case import StorageCase, StorageRule


class Replay(StorageRule):
    name = "replay"

    def applies(self, case: StorageCase) -> bool:
        return case.rp is not None

    def conclude(self, case: StorageCase) -> None:
        rp = case.rp
        assert rp is not None
        best = rp.best
        case.evidence.append(f"replay of {rp.files_sampled} files (mean {fmt_bytes(rp.mean_file_bytes)}, "
                             f"{rp.cold_method}): best {best.files_per_s:,.0f} files/s at concurrency "
                             f"{best.concurrency}, p50 {best.lat_p50_ms:.2f} ms")
        st = rp.best_steady
        if st is not None:
            case.evidence.append(f"steady state (page cache dropped, inodes kept): best "
                                 f"{st.files_per_s:,.0f} files/s at concurrency {st.concurrency} "
                                 f"({st.files_per_s / max(best.files_per_s, 1e-9):.1f}x the fully "
                                 "cold pass, whose metadata reads a long run pays once); the "
                                 "storage ceiling uses it")
