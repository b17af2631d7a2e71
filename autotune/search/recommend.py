"""The recommendation: the knee of the measured configurations, and the baseline.

knee (DESIGN.md): the cheapest configuration whose images/s is within 3 % of the best:
fewest workers, then lowest prefetch, then least memory. Cheaper means fewer processes
and less pinned/shared memory on a node that also runs the training job.
"""

from __future__ import annotations

from typing import Any

from autotune.search.records import TrialRecord
from autotune.params import PARAMS, LoaderSettings, config_key, cost_key, loader_kwargs

KNEE_TOLERANCE = 0.03


def best_trial(trials: list[TrialRecord]) -> TrialRecord | None:
    ok = [t for t in trials if t.ok]
    return max(ok, key=lambda t: t.images_per_s) if ok else None  # type: ignore[arg-type, return-value]


def knee(trials: list[TrialRecord], tolerance: float = KNEE_TOLERANCE) -> TrialRecord | None:
    """The cheapest trial within `tolerance` of the best images/s."""
    best = best_trial(trials)
    if best is None:
        return None
    floor = best.images_per_s * (1.0 - tolerance)  # type: ignore[operator]
    near = [t for t in trials if t.ok and t.images_per_s >= floor]  # type: ignore[operator]

    def cost(t: TrialRecord) -> tuple:
        return (*cost_key(t.params), round(t.memory_mib), -(t.images_per_s or 0))

    return min(near, key=cost)


def confirm_candidates(trials: list[TrialRecord], k: int,
                       also: TrialRecord | None = None) -> list[TrialRecord]:
    """The configurations to measure again before one is named: the `k` fastest, the
    knee (the would-be recommendation) and `also` (the baseline: the gain against it is
    then like against like), each once, fastest first."""
    ok = sorted((t for t in trials if t.ok), key=lambda t: -(t.images_per_s or 0))
    picked: list[TrialRecord] = []
    seen: set[tuple] = set()

    def take(t: TrialRecord) -> None:
        if config_key(t.params) not in seen:
            seen.add(config_key(t.params))
            picked.append(t)

    for t in ok:
        if len(picked) == k:
            break
        take(t)
    if (kn := knee(trials)) is not None:
        take(kn)
    if also is not None and also.ok:
        take(also)
    return picked


def confirm_window(params: dict[str, Any], seconds: float, step_s: float | None) -> float:
    """Seconds for a confirmation window: twice the search's window, longer when the
    configuration's prefetch queue (workers x prefetch batches, each one step long) would
    still be draining (a queue filled during warm-up flatters a short window), at most
    four times the search's window."""
    queue_s = 0.0
    if step_s:
        queue_s = LoaderSettings.from_params(params).queue * step_s
    return round(min(4 * seconds, max(2 * seconds, 2 * queue_s)), 1)


def baseline_params(cores: int, cuda: bool = True) -> dict[str, Any]:
    """The rule of thumb most people start from: num_workers = min(8, cores), prefetch 2,
    persistent_workers, and pin_memory where there is a GPU to copy to (without one the
    DataLoader ignores it with a warning, and a winning baseline would recommend it)."""
    w = min(8, max(1, cores))
    return LoaderSettings(num_workers=w, prefetch_factor=2, persistent_workers=True,
                          pin_memory=cuda).params()


# DataLoader keywords that change what the model sees (which samples, in which order, in
# which batches): the user's to choose, never part of a recommendation.
NOT_LOADER_SETTINGS = ("shuffle", "sampler", "batch_sampler", "drop_last", "generator",
                       "collate_fn", "worker_init_fn")


def kwargs_of(params: dict[str, Any], batch_size: int, *, iterable: bool = False) -> dict[str, Any]:
    """The DataLoader keywords of a configuration, in the order a person writes them:
    batch_size, then each loader setting that applies (no prefetch_factor without
    workers). Never `shuffle` or anything else that changes what the model sees
    (NOT_LOADER_SETTINGS): the order is the user's. The YAML block and
    autotune.loader_kwargs() are this dict; the snippet adds the user's `shuffle=True`
    where the dataset is map-style (`iterable` False), in plain sight.

    `params` may leave settings out (those the space does not search): the dict form of
    LoaderSettings.dataloader_kwargs (autotune.params.loader_kwargs) keeps them out."""
    full = {"batch_size": batch_size, **params}
    kw: dict[str, Any] = {"batch_size": full["batch_size"]}
    kw.update((k, v) for k, v in loader_kwargs(full).items()
              if k != "batch_size" and k not in NOT_LOADER_SETTINGS)
    return kw


def _arg(k: str, v: Any) -> str:
    return f"{k}={PARAMS[k].python(v) if k in PARAMS else repr(v)}"


_SAMPLER = ("sampler = torch.utils.data.distributed.DistributedSampler(dataset)"
            "  # this rank's share, shuffled: sampler.set_epoch(epoch) before each epoch")


def _order_arg(iterable: bool, ranks: int) -> list[str]:
    """How a training loader is ordered, written out (the user's to keep): a map-style
    dataset's `shuffle=True` on one rank, its DistributedSampler's `sampler=` on several
    (shuffle=True there would train every rank on the whole dataset); none for an
    iterable dataset, which orders and splits itself."""
    if iterable:
        return []
    return ["sampler=sampler"] if ranks > 1 else ["shuffle=True"]


def dataloader_snippet(params: dict[str, Any], batch_size: int, *,
                       iterable: bool = False, ranks: int = 1) -> str:
    """Ready-to-paste DataLoader call for the recommended configuration, its order written
    out (`_order_arg`: `shuffle=True`, or a DistributedSampler for `ranks` > 1)."""
    kw = kwargs_of(params, batch_size, iterable=iterable)
    args = [_arg(k, v) for k, v in kw.items()]
    args[1:1] = _order_arg(iterable, ranks)
    head = _SAMPLER + "\n" if ranks > 1 and not iterable else ""
    return (head + "loader = torch.utils.data.DataLoader(\n    dataset,\n    "
            + ",\n    ".join(args) + ",\n)")


def train_code(dataset: str, params: dict[str, Any], batch_size: int, *, iterable: bool,
               batch_size_from: str = "option", factory: str | None = None,
               ranks: int = 1, endpoint: str | None = None) -> str:
    """The lines that build `autotune.open_dataset(dataset)` (or, when the search measured
    the user's own Dataset, `factory` "file.py:function", that function's) and its
    DataLoader with the recommended settings, and the epoch loop around them (runnable once
    `transform` and the step are the user's). A batch size the user never chose (the
    preset's) is marked to be replaced. With `ranks` > 1 (a --procs-per-node search) a
    map-style dataset gets a DistributedSampler and its set_epoch, as each DDP rank needs.
    `endpoint`: an s3:// dataset's S3-compatible endpoint, which the code then names (the
    search's --endpoint-url is no argument of open_dataset: it reads AWS_ENDPOINT_URL)."""
    kw = kwargs_of(params, batch_size, iterable=iterable)
    args = [_arg(k, v) for k, v in kw.items()]
    note = {"preset": "  # the preset's, measured: put yours (a model setting)",
            "searched": "  # searched: a model setting, keep it only if training agrees"
            }.get(batch_size_from, "")
    workers = kw.get("num_workers", 0)
    ds_args = [repr(str(dataset)), "transform=transform"]
    if iterable and workers:
        ds_args.append(f"num_workers={workers}")
    if factory:
        fn = factory.rsplit(":", 1)[-1]
        lines = ["import torch", "",
                 f"# {fn}: your Dataset factory ({factory}), the Dataset the search measured",
                 f"dataset = {fn}({str(dataset)!r})"]
    else:
        lines = ["import autotune", "import torch", "",
                 "# transform: yours (a PIL image in RGB in, a tensor out)",
                 f"dataset = autotune.open_dataset({', '.join(ds_args)})"]
    if endpoint:   # after the imports, whichever they are (a factory's too)
        blank = lines.index("")
        lines = ["import os", "", *lines[:blank], "",
                 "# the bucket's endpoint, where the search read it (credentials as boto3 "
                 "finds them)",
                 f"os.environ.setdefault('AWS_ENDPOINT_URL', {endpoint!r})", *lines[blank:]]
    sampler = ranks > 1 and not iterable
    if sampler:
        lines.append(_SAMPLER)
    lines += ["loader = torch.utils.data.DataLoader(", "    dataset,",
             f"    {args[0]},{note}"]
    lines += [f"    {a}," for a in _order_arg(iterable, ranks) + args[1:]]
    lines += [")", "for epoch in range(epochs):"]
    if sampler:
        lines.append("    sampler.set_epoch(epoch)  # this epoch's order")
    elif iterable and not factory:
        lines.append("    dataset.set_epoch(epoch)  # this epoch's shard order and buffer")
    elif iterable and ranks > 1:
        lines.insert(lines.index("loader = torch.utils.data.DataLoader("),
                     "# your IterableDataset splits itself between the ranks (the search "
                     "gave each rank RANK and WORLD_SIZE)")
    lines += ["    for images, labels in loader:", "        ...  # your step"]
    return "\n".join(lines)


def yaml_block(params: dict[str, Any], batch_size: int, *, iterable: bool = False) -> str:
    kw = kwargs_of(params, batch_size, iterable=iterable)
    return "\n".join(["dataloader:"] + [f"  {k}: {PARAMS[k].yaml(v) if k in PARAMS else str(v).lower()}"
                                        for k, v in kw.items()])
