"""One DataLoader configuration to measure, and its validation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from autotune.data.presets import load_preset
from autotune.data.transforms import TransformSpec
from autotune.errors import UsageError
from autotune.params import PARAMS, LoaderSettings, need_int
from autotune_converters import registry

DEFAULT_PRESET = "resnet50"
# Startup (torch import, a cold directory scan, worker start) and shutdown are not in the
# measured window but are in the hard timeout; a first cold batch on slow storage can take
# tens of seconds (a 300-IOPS disk: 7-10 s).
_STARTUP_ALLOWANCE_S = 180.0
MIN_WINDOW_BATCHES = 10
MIN_WARMUP_BATCHES = 5
WINDOW_EXTENSION_MIN_S = 10.0
DEFAULT_SECONDS = 20.0


@dataclass
class BenchConfig:
    """What to measure. Build it from a preset: `BenchConfig.from_preset("resnet50", num_workers=8)`.

    batch_size, num_workers, prefetch_factor, pin_memory, persistent_workers: as for
        torch.utils.data.DataLoader. prefetch_factor is None when num_workers is 0.
    compute_ms: emulated step, the time the accelerator holds each batch (a sleep, which
        leaves the CPU to the workers). 0 means no step: images/s is the loader alone.
    step: 'module:function' or 'path/file.py:function' called with each batch
        (images float32 [B,3,H,W] as the preset makes them, labels int64 [B]) instead of the emulated step. It must
        return when its work is done (call torch.cuda.synchronize() at its end on a GPU).
    seconds: length of the measured window (after warm-up). from_preset() without one
        takes the longer of its default and window_needed_s: a long emulated step gets a
        window that holds the batches a figure needs; validate() refuses a shorter one.
    warmup_batches: batches excluded before the window; None = max(5, workers x prefetch),
        i.e. at least every batch requested when the loader started.
    windows: the window is split into this many parts; images/s is their median.
    cold: drop the dataset's pages before the run (else: labelled warm).
    batch_timeout_s: DataLoader `timeout`: a worker that delivers no batch for this long
        fails the run (workers > 0 only).
    timeout_s: hard limit for the whole measurement process; None = seconds x 2 + 180.
    max_open_files: RLIMIT_NOFILE for the measurement process (to reproduce a cluster's
        `ulimit -n`); None keeps the current limit.
    in_memory: hold this many images (a seeded random subset) in the measurement
        process's memory and decode from there: the CPU ceiling, with storage and the
        page cache out of the picture. Labelled FROM MEMORY; needs cold=False.
    """

    batch_size: int = 256
    compute_ms: float = 104.0
    step: str | None = None
    transform: TransformSpec = field(default_factory=lambda: TransformSpec(crop_mode="random", flip=True))
    num_workers: int = 4
    prefetch_factor: int | None = 2
    pin_memory: bool = False
    persistent_workers: bool = False
    seconds: float = DEFAULT_SECONDS
    warmup_batches: int | None = None
    windows: int = 5
    cold: bool = True
    format: str = "auto"
    batch_timeout_s: float = 120.0
    timeout_s: float | None = None
    max_open_files: int | None = None
    in_memory: int | None = None
    shuffle: bool = True
    seed: int = 0
    monitor_interval_s: float = 0.5
    preset: str | None = None
    # DataLoader settings of the search's parameter registry that are not fields here.
    loader_extra: dict[str, Any] = field(default_factory=dict)
    # The user's own dataset: 'file.py:function' or 'module:function', called with the
    # dataset path in each measurement process (autotune.bench.factory).
    dataset_factory: str | None = None
    # Ranks on the node, each with its own DataLoader over its share (DDP-like).
    procs_per_node: int = 1

    @classmethod
    def from_preset(cls, preset: str = DEFAULT_PRESET, *, default_seconds: float | None = None,
                    **overrides: Any) -> BenchConfig:
        """The preset's batch size, step, transform and loader settings, then `overrides`
        (keys of BenchConfig; None values are ignored, so CLI options can pass through).

        Without `seconds` the window is the longer of `default_seconds` (None: 20) and
        window_needed_s, whole seconds: it follows from the step and the prefetch queue.

        A preset's prefetch_factor is dropped when the resulting num_workers is 0; an
        explicit prefetch_factor with num_workers 0 is an error (see validate()).
        """
        p = load_preset(preset)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names - set(PARAMS))
        if unknown:
            raise UsageError(f"unknown bench setting(s) {', '.join(unknown)}.")
        given = {k: v for k, v in overrides.items() if v is not None}
        extra = {k: given.pop(k) for k in list(given) if k not in names}
        base = cls(batch_size=p.batch_size, compute_ms=p.compute_ms, transform=p.transform,
                   num_workers=p.loader.num_workers, prefetch_factor=p.loader.prefetch_factor,
                   pin_memory=p.loader.pin_memory, persistent_workers=p.loader.persistent_workers,
                   preset=p.name)
        cfg = replace(base, **given, loader_extra={**base.loader_extra, **extra})
        # A preset's worker-only settings do not apply without workers; given ones are
        # refused by validate() in their own words. Extra settings that do not apply are
        # dropped: loader_extra reaches DataLoader as it is.
        for name, off in cfg.loader.not_applied().items():
            if name not in given:
                setattr(cfg, name, off)
        cfg.loader_extra = {k: v for k, v in cfg.loader_extra.items()
                            if PARAMS[k].applies({"num_workers": cfg.num_workers})}
        if "step" in given:
            cfg.compute_ms = 0.0 if "compute_ms" not in given else cfg.compute_ms
        if "seconds" not in given:
            cfg.seconds = float(DEFAULT_SECONDS if default_seconds is None else default_seconds)
            need = cfg.window_needed_s
            if need is not None and need > cfg.seconds:
                cfg.seconds = float(math.ceil(need))
        return cfg

    def validate(self) -> BenchConfig:
        """Raise UsageError, in the words of the setting, for anything DataLoader would
        refuse or that cannot give an honest figure. Returns self."""
        need_int("batch_size", self.batch_size, 1)
        need_int("num_workers", self.num_workers, 0)
        need_int("windows", self.windows, 1)
        _need_number("compute_ms", self.compute_ms, allow_zero=True)
        _need_number("seconds", self.seconds)
        _need_number("batch_timeout_s", self.batch_timeout_s)
        _need_number("monitor_interval_s", self.monitor_interval_s)
        if self.timeout_s is not None:
            _need_number("timeout_s", self.timeout_s)
        if self.warmup_batches is not None:
            need_int("warmup_batches", self.warmup_batches, 0)
        if self.max_open_files is not None:
            need_int("max_open_files", self.max_open_files, 8)
        if self.in_memory is not None:
            need_int("in_memory", self.in_memory, 1)
            if self.cold:
                raise UsageError("in_memory reads no storage, so it cannot be cold: set "
                                 "cold=False; it is labelled FROM MEMORY.",
                                 setting=("in_memory", "cold"))
        self.loader.validate()
        need_int("procs_per_node", self.procs_per_node, 1)
        if self.dataset_factory is not None and not _is_callable_ref(self.dataset_factory):
            raise UsageError(f"dataset_factory must be 'file.py:function' or 'module:function', "
                             f"but got {self.dataset_factory!r}.", setting="dataset_factory")
        if self.dataset_factory and self.in_memory:
            raise UsageError("in_memory holds images of autotune's own pipeline; it does not "
                             "apply to a dataset_factory.", setting=("in_memory", "dataset_factory"))
        if self.step is not None:
            if not _is_callable_ref(self.step):
                raise UsageError(f"step must be 'module:function' or 'file.py:function', "
                                 f"but got {self.step!r}.", setting="step")
            if self.compute_ms:
                raise UsageError("give either compute_ms (an emulated step) or step (a real "
                                 f"one), not both (compute_ms={self.compute_ms:g}).",
                                 setting=("compute_ms", "step"))
        if self.format not in registry.choices():
            raise UsageError(f"format must be one of {', '.join(registry.choices())}, but got "
                             f"{self.format!r}.", setting="format")
        if not isinstance(self.transform, TransformSpec):
            raise UsageError("transform must be a TransformSpec.")
        if self.transform.decoder == "simplejpeg" and self.dataset_factory is None:
            # Here, with the install command (exit 2), not in the measurement process as a
            # failed start-up that points at the dataset's path.
            from autotune.data.decode import require_simplejpeg

            require_simplejpeg()
        short = self.short_window()
        if short:
            raise UsageError(short, setting="seconds")
        if self.timeout_s is not None and self.timeout_s <= self.seconds:
            raise UsageError(f"timeout_s ({self.timeout_s:g} s) must be longer than the measured "
                             f"window ({self.seconds:g} s) plus startup and warm-up.",
                             setting=("timeout_s", "seconds"))
        return self

    @property
    def loader(self) -> LoaderSettings:
        """Its built-in DataLoader settings (num_workers, prefetch_factor, ...) as one value."""
        return LoaderSettings(**{k: getattr(self, k) for k in LoaderSettings.names()})

    def loader_settings(self) -> dict[str, Any]:
        """The DataLoader settings of the parameter registry as this configuration sets
        them: its fields, then loader_extra (registered by the caller; already applicable)."""
        names = {f.name for f in fields(self)}
        return {**{k: getattr(self, k) for k in PARAMS if k in names}, **self.loader_extra}

    @property
    def prefetch_queue(self) -> int:
        """Batches the loader requests at start: num_workers x prefetch_factor."""
        return self.loader.queue

    @property
    def effective_warmup(self) -> int:
        """Warm-up batches: as given, else every batch the loader requests at start."""
        if self.warmup_batches is not None:
            return self.warmup_batches
        return max(MIN_WARMUP_BATCHES, self.prefetch_queue)

    @property
    def fewest_batches(self) -> int:
        """The batches the cheapest configuration's measurement needs (its warm-up and
        MIN_WINDOW_BATCHES measured): fewer in a cold pass, and no configuration can be
        measured in it."""
        warmup = MIN_WARMUP_BATCHES if self.warmup_batches is None else self.warmup_batches
        return warmup + MIN_WINDOW_BATCHES

    @property
    def min_batches(self) -> int:
        """Fewest measured batches that make a figure: 10, and twice the prefetch queue
        (batches made during warm-up can still be draining when the window opens)."""
        return max(MIN_WINDOW_BATCHES, 2 * self.prefetch_queue)

    @property
    def window_extension_s(self) -> float:
        """How long past --seconds a window that holds fewer than min_batches stays open
        for them: as long again, and at least WINDOW_EXTENSION_MIN_S (well inside the hard
        timeout of 2 x seconds + the start-up allowance)."""
        return max(self.seconds, WINDOW_EXTENSION_MIN_S)

    @property
    def window_needed_s(self) -> float | None:
        """Seconds that hold the warm-up and the fewest batches a figure needs at the demand
        rate (batch_size / step time): (effective_warmup + min_batches) x the emulated step.
        None without an emulated step (a real step's time is known only once measured)."""
        if self.step is not None or not self.compute_ms:
            return None
        return (self.effective_warmup + self.min_batches) * self.compute_ms / 1000.0

    def short_window(self, seconds: float | None = None, flag: str = "--seconds") -> str | None:
        """Why a window of `seconds` (default: this one) cannot hold a measurement at the
        demand rate, in one line naming the seconds it needs; None when it can."""
        need = self.window_needed_s
        seconds = self.seconds if seconds is None else seconds
        if need is None or seconds >= need:
            return None
        return (f"{flag} {seconds:g} is too short for a {self.compute_ms:g} ms step per batch of "
                f"{self.batch_size}: a measurement needs {self.effective_warmup} warm-up + "
                f"{self.min_batches} measured batches ({self.num_workers} workers x prefetch "
                f"{self.prefetch_factor or 0}) at the demand rate of "
                f"{self.batch_size * 1000 / self.compute_ms:,.3g} images/s, {need:,.1f} s; give "
                f"{flag} {math.ceil(need)} or more, or leave {flag} out (the window then "
                "follows from the step).")

    @property
    def effective_timeout(self) -> float:
        return self.timeout_s if self.timeout_s is not None else self.seconds * 2 + _STARTUP_ALLOWANCE_S

    @property
    def has_step(self) -> bool:
        return self.step is not None or self.compute_ms > 0

    def describe(self) -> str:
        """A short label: 'resnet50 bs=256 w=4 pf=2 step=104ms cold'."""
        parts = [self.preset or "custom", f"bs={self.batch_size}", f"w={self.num_workers}"]
        if self.prefetch_factor is not None:
            parts.append(f"pf={self.prefetch_factor}")
        if self.pin_memory:
            parts.append("pin")
        if self.persistent_workers:
            parts.append("persistent")
        parts.append(f"step={self.step}" if self.step else f"step={self.compute_ms:g}ms")
        parts.append(f"FROM MEMORY ({self.in_memory} images)" if self.in_memory
                     else "cold" if self.cold else "WARM")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["transform"] = self.transform.to_dict()
        d["effective_warmup_batches"] = self.effective_warmup
        d["effective_timeout_s"] = self.effective_timeout
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchConfig:
        """Inverse of to_dict (the derived effective_* keys are ignored)."""
        d = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        d["transform"] = TransformSpec.from_dict(d.get("transform"))
        return cls(**d)


def _need_number(name: str, v: Any, allow_zero: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < 0 or (v == 0 and not allow_zero):
        word = "a number >= 0" if allow_zero else "positive"
        raise UsageError(f"{name} must be {word}, but got {v!r}.", setting=name)


def _is_callable_ref(ref: Any) -> bool:
    """'module:function' or 'file.py:function' in form (it is imported in the run)."""
    return isinstance(ref, str) and ":" in ref and not ref.endswith(":")
