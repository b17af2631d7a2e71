"""Regenerate the fixture logs of tests/analyze/test_parsers.py (deterministic).

Each is written with the very format strings of the program it imitates:
  imagenet.log        pytorch/examples imagenet/main.py: ProgressMeter.display joins
                      '{name} {val:6.3f} ({avg:6.3f})' meters with tabs; Test: lines too
  timm.log            timm train.py train_one_epoch's f-string (Time: Xs, R/s ... Data: D (A))
  lightning*.log      Lightning SimpleProfiler.summary() (extended and plain tables)

    python tests/analyze/data/make_logs.py
"""

from __future__ import annotations

import os
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


class _Meter:
    def __init__(self, name: str, fmt: str) -> None:
        self.name, self.fmt, self.val, self.sum, self.n = name, fmt, 0.0, 0.0, 0

    def update(self, v: float) -> None:
        self.val, self.sum, self.n = v, self.sum + v, self.n + 1

    def __str__(self) -> str:
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(name=self.name, val=self.val, avg=self.sum / max(1, self.n))


def imagenet() -> str:
    lines = ["=> creating model 'resnet50'", "Use GPU: 0 for training"]
    n = 200
    for epoch in range(2):
        m = [_Meter("Time", ":6.3f"), _Meter("Data", ":6.3f"), _Meter("Loss", ":.4e"),
             _Meter("Acc@1", ":6.2f"), _Meter("Acc@5", ":6.2f")]
        for i in range(n):
            d = 1.5 if i == 0 else random.uniform(0.05, 0.07)
            step = random.uniform(0.09, 0.11)
            for meter, v in zip(m, (d + step, d, 6.9 - i * 0.001, 0.1, 0.5)):
                meter.update(v)
            if i % 10 == 0:
                fmt = "{:" + str(len(str(n))) + "d}"
                batch = "[" + fmt + "/" + fmt.format(n) + "]"
                lines.append("\t".join([f"Epoch: [{epoch}]" + batch.format(i + 1)]
                                       + [str(x) for x in m]))
        for i in range(0, 50, 10):
            lines.append("\t".join(["Test: [" + "{:2d}".format(i) + "/50]", "Time  0.100 ( 0.100)",
                                    "Loss 6.9e+00 (6.9e+00)", "Acc@1   0.10 (  0.10)",
                                    "Acc@5   0.50 (  0.50)"]))
        lines.append(" *   Acc@1 0.100 Acc@5 0.500")
    return "\n".join(lines) + "\n"


def timm() -> str:
    lines = ["Training with a single process on 1 device (cuda:0).",
             "Model resnet50 created, param count:25557032"]
    n = 100
    for epoch in range(2):
        tsum = dsum = 0.0
        for idx in range(n):
            d = 2.0 if idx == 0 else random.uniform(0.010, 0.014)
            t = d + random.uniform(0.35, 0.37)
            tsum += t
            dsum += d
            if idx % 25 == 0 or idx == n - 1:
                k = idx + 1
                lines.append(
                    f"Train: {epoch} [{idx:>4d}/{n} ({100. * idx / (n - 1):>3.0f}%)]  "
                    f"Loss: {6.9:#.3g} ({6.91:#.3g})  "
                    f"Time: {t:.3f}s, {256 / t:>7.2f}/s  "
                    f"({tsum / k:.3f}s, {256 / (tsum / k):>7.2f}/s)  "
                    f"LR: {1e-5:.3e}  "
                    f"Data: {d:.3f} ({dsum / k:.3f})")
        lines.append("Test: [   0/195]  Time: 0.500 (0.500)  Loss:  6.9000 (6.9000)  "
                     "Acc@1:  0.1000 ( 0.1000)  Acc@5:  0.5000 ( 0.5000)")
    return "\n".join(lines) + "\n"


def profiler_table(rows: list[tuple[str, float, int, float]], extended: bool = True,
                   stage: str = "FIT") -> str:
    sep = os.linesep
    max_key = max(len(r[0]) for r in rows)
    out = f"{stage} Profiler Report{sep}"
    if extended:
        def row(a: str, m: str, n: str, t: str, p: str) -> str:
            return f"{sep}|  {a:<{max_key}s}\t|  {m:<15}\t|  {n:<15}\t|  {t:<15}\t|  {p:<15}\t|"
        h = row("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
        sl = f"{sep}{'-' * len(h.expandtabs())}"
        out += sl + h + sl + row("Total", "-", "2210", "75.3", "100 %") + sl
        for a, m, n, t in rows:
            out += row(a, f"{m:.5}", f"{n}", f"{t:.5}", f"{100 * t / 75.3:.5}")
    else:
        def row3(a: str, m: str, t: str) -> str:
            return f"{sep}|  {a:<{max_key}s}\t|  {m:<15}\t|  {t:<15}\t|"
        h = row3("Action", "Mean duration (s)", "Total time (s)")
        sl = f"{sep}{'-' * len(h.expandtabs())}"
        out += sl + h + sl
        for a, m, _n, t in rows:
            out += row3(a, f"{m:.5}", f"{t:.5}")
    return out + sl + sep


def main() -> None:
    random.seed(1)
    (HERE / "imagenet.log").write_text(imagenet())
    (HERE / "timm.log").write_text(timm())
    fit = [("run_training_epoch", 35.1, 2, 70.2),
           ("[_TrainingEpochLoop].train_dataloader_next", 0.045, 1000, 45.0),
           ("run_training_batch", 0.025, 1000, 25.0),
           ("[Strategy]SingleDeviceStrategy.training_step", 0.02, 1000, 20.0),
           ("[_EvaluationLoop].val_next", 0.01, 100, 1.0)]
    test = [("[_EvaluationLoop].test_next", 0.01, 100, 1.0), ("test_step", 0.002, 100, 0.2)]
    (HERE / "lightning.log").write_text(
        "GPU available: True (cuda), used: True\n"
        "Epoch 1: 100%|##########| 500/500 [00:35<00:00, 14.2it/s, v_num=0]\n"
        + profiler_table(fit) + profiler_table(test, stage="TEST"))
    old = [("run_training_epoch", 35.1, 2, 70.2), ("get_train_batch", 0.03, 1000, 30.0),
           ("run_training_batch", 0.03, 1000, 30.0)]
    (HERE / "lightning_old.log").write_text(profiler_table(old, extended=False))


if __name__ == "__main__":
    main()
