"""WebDataset shards: each worker writes whole shards, published by rename when complete.

Shard k is DST/shard-{k:06d}.tar. Each sample is three members, in this order:
    KEY.cls   the label, ASCII decimal
    KEY.EXT   the image (jpg, png, webp, ...: the original bytes unless re-encoded)
    KEY.json  {"path": original relative path, "size": original bytes[, "reencoded": true]}
KEY is the sample's position in the shuffled plan, 10 digits: unique, no dots or slashes.

A shard is written under DST/.autotune-convert/tmp/, hashed while written, fsynced; then
its result (samples, bytes, sha256, skipped) is recorded in done/, and only then is it
renamed to its final name. A killed run leaves at most a temporary file, which the next
run deletes and redoes; a shard under its final name with a done record is never redone.
One fsync per shard: the record and the rename need none of their own, since losing
either to a power cut only makes the rerun redo that (identical) shard; DST is fsynced
once, before manifest.json is written.
"""

from __future__ import annotations

import json
import os
from typing import Any

from autotune_converters.records import Entry, Sample, SkippedFile, UnitResult
from autotune_converters.wds.tarfmt import BLOCK, TarShardWriter
from autotune_converters.writer import FormatWriter

LAYOUT = ("tar shards shard-NNNNNN.tar; per sample KEY.cls (label), KEY.EXT (image bytes), "
          "KEY.json (path, size); KEY = 10-digit plan position")


def shard_name(unit: int) -> str:
    return f"shard-{unit:06d}.tar"


def sample_key(position: int) -> str:
    return f"{position:010d}"



def _add_cls(tw: TarShardWriter, key: str, label: int) -> None:
    """A sample's KEY.cls member: the label, ASCII decimal."""
    tw.add(f"{key}.cls", b"%d" % label)

class WdsWriter(FormatWriter):
    format = "wds"
    LAYOUT = LAYOUT
    sharded = True
    output_noun = "shards"

    def _open(self) -> list[UnitResult]:
        self._done: dict[int, UnitResult] = {}
        for unit in range(self.plan.units):
            res = self.workdir.read_done(unit)
            if res is None or res.shard is None:
                continue
            final = self.dst / res.shard["file"]
            try:
                ok = final.stat().st_size == res.shard["bytes"]
            except OSError:
                ok = False
            if ok:
                self._done[unit] = res
        return list(self._done.values())

    def _pending(self) -> list[int]:
        return [u for u in range(self.plan.units) if u not in self._done]

    def work(self, unit: int) -> UnitResult:
        name = shard_name(unit)
        tmp = self.workdir.tmp / f"{name}.{os.getpid()}"
        tw = TarShardWriter(tmp)
        res = UnitResult(unit=unit, samples=0, source_bytes=0, stored_bytes=0)
        # Each image is read straight into its place in the shard's staging buffer,
        # after its KEY.cls member and its header's place; a bad image is rolled back.
        cur: dict[str, Any] = {"mark": None}

        def dest(entry: Entry) -> memoryview | None:
            need = 6 * BLOCK + entry.size + 1 + 8 * len(entry.relpath) + 256
            if not tw.reserve(need):
                return None
            cur["mark"] = tw.mark()
            _add_cls(tw, sample_key(entry.position), entry.label)
            return tw.slot()[:entry.size + 1]

        try:
            for s in self.samples_into(unit, dest):
                mark, cur["mark"] = cur["mark"], None
                if isinstance(s, SkippedFile):
                    if mark is not None:
                        tw.rollback(mark)
                    res.skipped.append(s.to_dict())
                    continue
                self._add(tw, s, in_slot=mark is not None)
                res.samples += 1
                res.source_bytes += s.source_bytes
                res.stored_bytes += len(s.data)
                res.reencoded += s.reencoded
            size, sha = tw.finish()
        except BaseException:
            tw.abort()
            raise
        res.shard = {"file": name, "samples": res.samples, "bytes": size, "sha256": sha}
        self.workdir.write_done(res, durable=False)
        os.replace(tmp, self.dst / name)
        return res

    @staticmethod
    def _add(tw: TarShardWriter, s: Sample, in_slot: bool = False) -> None:
        """The sample's members; `in_slot`: KEY.cls is added and the image bytes are in
        the slot after it unless `s.data` is bytes of its own (re-encoded, or a file
        that grew since the scan)."""
        key = sample_key(s.position)
        meta: dict[str, Any] = {"path": s.relpath, "size": s.source_bytes}
        if s.reencoded:
            meta["reencoded"] = True
        if not in_slot:
            _add_cls(tw, key, s.label)
        if in_slot and isinstance(s.data, memoryview):
            tw.commit_slot(f"{key}.{s.ext}", len(s.data))
        else:
            tw.add(f"{key}.{s.ext}", s.data)
        tw.add(f"{key}.json", json.dumps(meta, ensure_ascii=True, sort_keys=True).encode("ascii"))

    def _accept(self, unit: int, out: UnitResult) -> UnitResult:
        self._done[unit] = out
        return out

    def _publish(self, results: list[UnitResult]) -> list[dict[str, Any]]:
        shards = []
        for r in sorted(results, key=lambda r: r.unit):
            assert r.shard is not None
            shards.append(dict(r.shard))
        return shards
