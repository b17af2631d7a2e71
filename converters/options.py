"""What one conversion is asked to do (`ConvertOptions`, checked as a whole) and what it
reports while it runs (`ConvertProgress`); `autotune_converters.conversion` runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune_base.errors import UsageError
from autotune_converters import registry
from autotune_converters.images import VERIFY_LEVELS

ON_ERROR = ("skip", "fail")
ENGINES = ("local", "ray")
DEFAULT_SHARD_SIZE = 64 << 20
DEFAULT_READERS = 32


@dataclass(frozen=True)
class ConvertOptions:
    """Options of one conversion. Those in `fingerprint()` fix the output; `workers`,
    `on_error` and `map_size` do not change a successful conversion's bytes."""

    format: str
    shard_size: int = DEFAULT_SHARD_SIZE
    workers: int = 1
    seed: int = 0
    max_side: int | None = None
    quality: int = 90
    on_error: str = "skip"
    verify: str = "header"
    readers: int = DEFAULT_READERS
    file_list: str | None = None
    map_size: int | None = None  # LMDB: initial map size (default from the source size)
    # Beyond one machine (autotune_converters.ranks, autotune_converters.ray_engine); none of these changes
    # the output's bytes. world_size > 1: this process is rank `rank` of `world_size`.
    rank: int | None = None
    world_size: int | None = None
    plan_timeout: float = 1800.0  # how long ranks > 0 wait for rank 0's plan (seconds)
    engine: str = "local"  # "local" (this process and its workers) or "ray" (Ray tasks)
    ray_address: str | None = None  # the head's GCS address; default RAY_ADDRESS, else local
    # An s3:// SRC's endpoint (default AWS_ENDPOINT_URL when the conversion starts): carried
    # to the workers with the options, not read from their environment. Not in the output.
    endpoint_url: str | None = None

    def validate(self) -> None:
        if self.format not in registry.names(writable=True):
            raise UsageError(f"format must be one of {', '.join(registry.names(writable=True))}, "
                             f"but got {self.format!r}.", setting="format")
        if self.on_error not in ON_ERROR:
            raise UsageError(f"on_error must be skip or fail, but got {self.on_error!r}.",
                             setting="on_error")
        if self.verify not in VERIFY_LEVELS:
            raise UsageError(f"verify must be header or decode, but got {self.verify!r}.",
                             setting="verify")
        if self.shard_size < 1 << 16:
            raise UsageError(f"shard_size must be at least 64KiB, but got {self.shard_size} "
                             "bytes (shards of one image each defeat the purpose).",
                             setting="shard_size")
        if self.workers < 1:
            raise UsageError(f"workers must be at least 1, but got {self.workers}.",
                             setting="workers")
        if self.readers < 1:
            raise UsageError(f"readers must be at least 1, but got {self.readers}.",
                             setting="readers")
        if not -(1 << 63) <= self.seed < 1 << 63:
            raise UsageError(f"seed must fit in 64 bits, but got {self.seed}.", setting="seed")
        if self.max_side is not None and self.max_side < 16:
            raise UsageError(f"max_side must be at least 16 pixels, but got {self.max_side}.",
                             setting="max_side")
        if not 1 <= self.quality <= 100:
            raise UsageError(f"quality must be between 1 and 100, but got {self.quality}.",
                             setting="quality")
        if self.map_size is not None and self.map_size < 1 << 16:
            raise UsageError(f"map_size must be at least 64KiB, but got {self.map_size}.",
                             setting="map_size")
        self._validate_distributed()

    def _validate_distributed(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"engine must be one of {', '.join(ENGINES)}, but got "
                             f"{self.engine!r}.", setting="engine")
        if self.ray_address and self.engine != "ray":
            raise UsageError("ray_address is for engine ray; add it, or drop the address.",
                             setting=("ray_address", "engine"))
        if self.world_size is None:
            if self.rank not in (None, 0):
                raise UsageError(f"rank {self.rank} needs a world size (the number of ranks); "
                                 "give both.", setting=("rank", "world_size"))
            return
        if self.world_size < 1:
            raise UsageError(f"world_size must be at least 1, but got {self.world_size}.",
                             setting="world_size")
        if self.rank is None or not 0 <= self.rank < self.world_size:
            raise UsageError(f"rank must be between 0 and {self.world_size - 1} (world size "
                             f"{self.world_size}), but got {self.rank}.", setting="rank")
        if self.plan_timeout <= 0:
            raise UsageError(f"plan_timeout must be positive, but got {self.plan_timeout:g}.",
                             setting="plan_timeout")
        if self.world_size > 1:
            if not registry.get(self.format).writer_class().sharded:
                raise UsageError(
                    f"{self.format} has one writer (one environment, committed in order): it "
                    f"cannot be written by {self.world_size} ranks. Convert it with world size "
                    "1 (its --workers processes read in parallel; --engine ray spreads the "
                    "reading over a cluster), or choose wds, whose shards ranks write apart.",
                    setting=("world_size", "format"))
            if self.engine != "local":
                raise UsageError("engine ray runs the whole conversion from one driver: give "
                                 "either ranks (world_size > 1) or engine ray, not both.",
                                 setting=("engine", "world_size"))

    def fingerprint(self, src: str) -> dict[str, Any]:
        d: dict[str, Any] = {"format": self.format, "source": src, "seed": self.seed,
                             "verify": self.verify, "max_side": self.max_side,
                             "file_list": self.file_list}
        if self.max_side:
            d["quality"] = self.quality
        d["shard_size"] = self.shard_size  # WebDataset shard / LMDB commit batch
        if registry.get(self.format).writer_class().sharded:
            d["readers"] = self.readers
        return d


@dataclass
class ConvertProgress:
    """A snapshot for a progress display."""

    phase: str  # "scan", "convert", "publish"
    samples: int  # files scanned (scan) / processed (convert)
    total: int  # 0 while scanning
    source_bytes: int
    total_bytes: int
    elapsed: float
    units_done: int = 0
    units: int = 0
