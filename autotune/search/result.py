"""The result of a search: everything it measured and concluded; `to_dict()` is
search.json (schema autotune.search/2).

Schema 2 added `batch_size_from` (where the measured batch size came from: "option",
the user's --batch-size; "searched", the space's; "preset", the preset's, never chosen by
the user) and `train` (the recommended data and the lines that train on it: `dataset`,
`format`, `iterable`, `code`); `loader_kwargs` no longer holds `shuffle`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.search import recommend as rec_mod
from autotune.search.ceilings import Ceilings
from autotune.search.records import TrialRecord
from autotune.verdict import Verdict

SCHEMA = "autotune.search/2"


@dataclass
class SearchResult:
    dataset: str
    study: str
    storage: str
    options: dict[str, Any]
    space: dict[str, Any]
    ceilings: Ceilings
    trials: list[TrialRecord]
    baseline: TrialRecord | None
    best: TrialRecord | None
    recommended: TrialRecord | None
    verdict: Verdict | None
    stop_reason: str
    seconds: float
    batch_size: int
    out_dir: str
    report_html: str | None = None
    json_file: str | None = None
    warnings: list[str] = field(default_factory=list)
    confirmations: list[TrialRecord] = field(default_factory=list)
    # The baseline's configuration measured in the longer window (when it was confirmed).
    baseline_confirmed: TrialRecord | None = None
    dataset_format: str = "folder"
    # This host, and every class of hosts that measured trials of the study (shared studies).
    host: dict[str, Any] | None = None
    hosts: list[dict[str, Any]] = field(default_factory=list)
    # What the job's container allows (Environment.to_dict()), and the memory bound each
    # configuration was held to: {"mib", "source"}.
    environment: dict[str, Any] | None = None
    max_memory: dict[str, Any] | None = None
    # /dev/shm: the first batch's bytes, the per-rank budget, the configurations not run
    # because their batches do not fit, and the size that runs them (autotune.search.shmgate).
    shm: dict[str, Any] | None = None
    # The trials' open-files limit: the tensors a batch, the configurations not run
    # because their pools would pass it (autotune.search.filesgate).
    open_files: dict[str, Any] | None = None
    # Whether a worker could send the first batch: the pickling error, the configurations
    # with workers not run for it (autotune.search.sendgate).
    sendable: dict[str, Any] | None = None
    # An s3:// dataset's endpoint as the search read it (no user:password): the training
    # code must read the bucket there too.
    endpoint: str | None = None
    # The whole run (autotune.search.runcache): which epochs the verdict describes.
    run: dict[str, Any] | None = None

    @property
    def iterable(self) -> bool:
        """Whether the dataset is read as an IterableDataset (streamed shards)."""
        return self.ceilings.iterable

    @property
    def ranks(self) -> int:
        """The ranks a node each measurement ran, each its share (options' procs_per_node:
        --procs-per-node, else LOCAL_WORLD_SIZE, as the search resolved it)."""
        n = self.options.get("procs_per_node")
        return n if isinstance(n, int) and n > 1 else 1

    @property
    def batch_size_from(self) -> str:
        """Who chose the batch size measured: "searched" (the space), "option" (the
        user's --batch-size, or tune(batch_size=)) or "preset" (nobody: the preset's)."""
        if self.recommended is not None and "batch_size" in self.recommended.params:
            return "searched"
        return "option" if self.options.get("batch_size") is not None else "preset"

    def train(self) -> dict[str, Any] | None:
        """The recommended data and the lines that train on it (open_dataset + DataLoader)."""
        rec = self.recommended
        if rec is None:
            return None
        bs = rec.params.get("batch_size", self.batch_size)
        return {"dataset": self.dataset, "format": self.dataset_format,
                "iterable": self.iterable,
                "code": rec_mod.train_code(self.dataset, rec.params, bs, iterable=self.iterable,
                                           batch_size_from=self.batch_size_from,
                                           factory=self.options.get("dataset_factory"),
                                           ranks=self.ranks, endpoint=self.endpoint)}

    @property
    def cold(self) -> bool:
        return bool(self.options.get("cold")) and not self.ceilings.ram_backed

    @property
    def cold_reason(self) -> str | None:
        if self.ceilings.ram_backed:
            return self.ceilings.ram_backed
        return None if self.options.get("cold") else "--warm: the page cache was kept"

    @property
    def gain_vs_baseline(self) -> float | None:
        if not (self.recommended and self.baseline and self.baseline.ok):
            return None
        base = like_for_like_baseline(self.recommended, self.baseline, self.baseline_confirmed)
        return self.recommended.images_per_s / base.images_per_s  # type: ignore[operator]

    def _brief(self, t: TrialRecord | None) -> dict[str, Any] | None:
        if t is None:
            return None
        return {"config": t.params, "images_per_s": t.images_per_s, "au": t.au,
                "data_wait_fraction": t.data_wait_fraction, "peak_rss_mib": t.peak_rss_mib,
                "peak_pss_mib": t.peak_pss_mib,
                "trial": t.number, "state": t.state, "reason": t.reason,
                "timeline_file": t.timeline_file, "window_s": t.window_s,
                "first_images_per_s": t.first_images_per_s, "per_rank": t.per_rank}

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {
            "schema": SCHEMA, "dataset": self.dataset, "study": self.study,
            "storage": self.storage, "options": self.options, "space": self.space,
            "cold": self.cold, "cold_reason": self.cold_reason, "batch_size": self.batch_size,
            "ceilings": self.ceilings.to_dict(),
            "recommended": self._brief(rec), "best": self._brief(self.best),
            "baseline": self._brief(self.baseline),
            "baseline_confirmed": self._brief(self.baseline_confirmed),
            "gain_vs_baseline": self.gain_vs_baseline,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "snippet": rec_mod.dataloader_snippet(rec.params, self.batch_size,
                                                  iterable=self.iterable,
                                                  ranks=self.ranks) if rec else None,
            "dataset_format": self.dataset_format,
            "yaml": rec_mod.yaml_block(rec.params, self.batch_size,
                                       iterable=self.iterable) if rec else None,
            "loader_kwargs": rec_mod.kwargs_of(rec.params, self.batch_size,
                                               iterable=self.iterable) if rec else None,
            "batch_size_from": self.batch_size_from, "train": self.train(),
            "trials": [t.to_dict() for t in self.trials],
            "confirmed": [t.to_dict() for t in self.confirmations],
            "host": self.host, "hosts": self.hosts,
            "stop_reason": self.stop_reason, "seconds": self.seconds,
            "report_html": self.report_html, "warnings": self.warnings,
            "environment": self.environment, "max_memory": self.max_memory,
            "shm": self.shm, "open_files": self.open_files, "sendable": self.sendable,
            "endpoint": self.endpoint,
            "run": self.run,
        }


def like_for_like_baseline(rec: TrialRecord, baseline: TrialRecord,
                           confirmed: TrialRecord | None) -> TrialRecord:
    """The baseline figure to set `rec` against: its confirmation when `rec` comes from a
    confirmation window too (a short window against a long one would not compare)."""
    if rec.window_s is not None and confirmed is not None and confirmed.ok:
        return confirmed
    return baseline


def options_dict(opts: Any) -> dict[str, Any]:
    """The options as the result records them (no callables; the throttle by its limits)."""
    from autotune.search.shared import redact

    options = {k: v for k, v in opts.__dict__.items() if k not in ("popen", "throttle")}
    options["throttled"] = repr(opts.throttle.limits) if opts.throttle is not None else None
    options["out"] = str(options["out"])
    if options.get("storage"):
        options["storage"] = redact(options["storage"])  # never the password
    return options
