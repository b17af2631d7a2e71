"""HuggingFace `transformers.Trainer` console output (ProgressCallback / PrinterCallback).

    ***** Running training *****
      Total train batch size (w. parallel, distributed & accumulation) = 32
      Total optimization steps = 939
    {'loss': 0.6931, 'grad_norm': 1.234, 'learning_rate': 4.5e-05, 'epoch': 0.27}
    {'train_runtime': 123.4567, 'train_samples_per_second': 243.1, 'train_steps_per_second': 7.606, 'train_loss': 0.55, 'epoch': 3.0}

The Trainer logs no data-loading time at all, so there is no data-time share (null, and the
analysis says so). The closing dict gives the wall time per optimizer step (train_runtime /
steps: data loading and any evaluation during training included) and the samples per
second. Newer versions print the floats as strings ('0.6931'), some as np.float64(...).
Evaluation dicts ('eval_loss', 'eval_runtime', ...) are left out.
"""

from __future__ import annotations

import re

from autotune.analyze.parsers._base import NUM, OTHER, LogParser, ProfileSummary, Skip

_DICT = re.compile(r"\{'[\w/]+':")
_PAIR = re.compile(rf"'(?P<key>[\w/]+)':\s*(?:np\.float\d*\()?'?(?P<num>{NUM})'?")
_BATCH = re.compile(r"Total train batch size \(.*\) = (?P<n>[\d,]+)")
_STEPS = re.compile(r"Total optimization steps = (?P<n>[\d,]+)")


class HFTrainerParser(LogParser):
    name = "hf_trainer"
    description = "HuggingFace Trainer ({'loss': ..} lines and the closing {'train_runtime': ..})"
    figures = "none: the Trainer logs no data-loading time"
    no_timing_hint = ("the Trainer prints its timing only in the closing {'train_runtime': ...} "
                      "dict at the end of training: give the log's end as well")

    def __init__(self) -> None:
        super().__init__()
        self._summary: ProfileSummary | None = None

    def sniff(self, line: str) -> bool:
        return ("'train_runtime'" in line or "***** Running training *****" in line
                or ("{'loss'" in line and "'learning_rate'" in line))

    def feed(self, line: str, lineno: int) -> list:
        d = _DICT.search(line)
        if d is not None:
            pairs = {m["key"]: float(m["num"]) for m in _PAIR.finditer(line, d.start())}
            if "train_runtime" in pairs:
                self._close(pairs, lineno)
                return []
            if any(k.startswith(("eval_", "test_")) for k in pairs):
                raise Skip("evaluation line")
            if "loss" in pairs or "learning_rate" in pairs:
                return []     # a training log line: understood, but it holds no time
            raise Skip(OTHER)
        for pattern, key in ((_BATCH, "batch_size"), (_STEPS, "steps")):
            if (m := pattern.search(line)) is not None:
                self.meta[key] = int(m["n"].replace(",", ""))
                return []
        if "***** Running training *****" in line:
            return []
        raise Skip(OTHER)

    def _close(self, pairs: dict[str, float], lineno: int) -> None:
        runtime = pairs["train_runtime"]
        per_s = pairs.get("train_steps_per_second")
        steps = round(runtime * per_s) if per_s else self.meta.get("steps")
        if not steps or runtime <= 0:
            return
        samples = pairs.get("train_samples_per_second")
        if "batch_size" not in self.meta and samples and per_s:
            self.meta["batch_size"] = round(samples / per_s)
        self._summary = ProfileSummary(
            data_total_s=None, data_calls=int(steps), step_total_s=runtime,
            step_calls=int(steps), lineno=lineno, source="train_runtime",
            samples_per_s=samples,
            note=("HuggingFace Trainer logs no data-loading time: data_time_share is null; the "
                  "step time is train_runtime / steps (the wall time per optimizer step, data "
                  "loading and any evaluation included) and images/s its samples per second"))

    def finish(self) -> list[ProfileSummary]:
        return [self._summary] if self._summary is not None else []
