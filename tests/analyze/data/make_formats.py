"""Regenerate tests/analyze/data/formats/*.log: one short log per format, deterministic.

Each is written with the format strings of the program it imitates (read in its own
logging code), with round figures so that the share can be computed by hand (the
arithmetic is in tests/analyze/test_formats.py and the README). Every log holds, besides
its training lines, what the real one holds around them: start-up output, evaluation lines
that carry times too (left out), epoch summaries. Each epoch starts with a stall (the
workers starting) that the steady share leaves out.

    python tests/analyze/data/make_formats.py
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parent / "formats"


def _eta(s: float) -> str:
    return str(datetime.timedelta(seconds=int(s)))


def imagenet() -> list[str]:
    """pytorch/examples imagenet/main.py: ProgressMeter.display(i + 1) every print_freq
    batches; meters '{name} {val:6.3f} ({avg:6.3f})' joined by tabs. Batch 0 of each epoch
    waits 1.500 s (iteration 1.600 s), the others 0.050 s (0.250 s)."""
    out = ["=> creating model 'resnet50'", "Use GPU: 0 for training"]
    n, freq = 50, 10
    for epoch in range(2):
        tsum = dsum = 0.0
        for i in range(n):
            d, t = (1.5, 1.6) if i == 0 else (0.05, 0.25)
            tsum, dsum = tsum + t, dsum + d
            if i % freq == 0:
                out.append("\t".join([f"Epoch: [{epoch}][{i + 1:2d}/{n}]",
                                      f"Time {t:6.3f} ({tsum / (i + 1):6.3f})",
                                      f"Data {d:6.3f} ({dsum / (i + 1):6.3f})",
                                      f"Loss {6.9:.4e} ({6.9:.4e})", f"Acc@1 {0.1:6.2f} ({0.1:6.2f})"]))
        out += ["Test: [ 1/10]\tTime  0.300 ( 0.300)\tLoss 6.9000e+00 (6.9000e+00)\tAcc@1   0.10 (  0.10)",
                " *   Acc@1 0.100 Acc@5 0.500"]
    return out


def timm() -> list[str]:
    """timm train.py train_one_epoch: a line at batch_idx % log_interval == 0 and at the
    last batch; `Time: {s:.3f}s, {rate:>7.2f}/s  ({avg:.3f}s, {avg_rate:>7.2f}/s)` and
    `Data: {val:.3f} ({avg:.3f})`. Batch 0 waits 2.100 s (update 2.500 s), the others 0.050 s
    (0.500 s); 256 samples per update."""
    out = ["Training with a single process on 1 device (cuda:0).",
           "Model resnet50 created, param count:25557032"]
    n, every = 100, 25
    for epoch in range(2):
        tsum = dsum = 0.0
        for idx in range(n):
            d, t = (2.1, 2.5) if idx == 0 else (0.05, 0.5)
            tsum, dsum = tsum + t, dsum + d
            if idx % every == 0 or idx == n - 1:
                k = idx + 1
                out.append(f"Train: {epoch} [{idx:>4d}/{n} ({100. * idx / (n - 1):>3.0f}%)]  "
                           f"Loss: {6.9:#.3g} ({6.9:#.3g})  "
                           f"Time: {t:.3f}s, {256 / t:>7.2f}/s  "
                           f"({tsum / k:.3f}s, {256 / (tsum / k):>7.2f}/s)  "
                           f"LR: {1e-3:.3e}  Data: {d:.3f} ({dsum / k:.3f})")
        out.append("Test: [   0/10]  Time: 0.300 (0.300)  Loss:  6.9000 (6.9000)  "
                   "Acc@1:  0.1000 ( 0.1000)  Acc@5:  0.5000 ( 0.5000)")
    return out


def metriclogger() -> list[str]:
    """torchvision references/classification train.py: MetricLogger(delimiter="  "),
    header f"Epoch: [{epoch}]", a line when i % print_freq == 0 (0-based), time and data
    '{avg:.4f}'. The figures are written as chosen: the line at batch 0 of each epoch
    shows time 2.5000 and data 2.2000, the others 0.5000 and 0.1000."""
    out = ["Not using distributed mode", "Creating model", "Start training"]
    n, freq = 500, 100
    for epoch in range(3):
        for i in range(0, n, freq):
            t, d = (2.5, 2.2) if i == 0 else (0.5, 0.1)
            out.append("  ".join([f"Epoch: [{epoch}]", f"[{i:3d}/{n}]", f"eta: {_eta(t * (n - i))}",
                                  "lr: 0.1", f"img/s: {256 / t}", "loss: 6.9078 (6.9080)",
                                  "acc1: 0.0000 (0.0000)", "acc5: 0.3906 (0.4000)",
                                  f"time: {t:.4f}", f"data: {d:.4f}", "max mem: 10234"]))
        out.append(f"Epoch: [{epoch}] Total time: 0:05:00")
        for i in (0, 25):
            out.append("  ".join(["Test: ", f"[{i:2d}/50]", "eta: 0:00:12", "loss: 6.9 (6.9)",
                                  "acc1: 0.0 (0.0)", "acc5: 0.4 (0.4)", "time: 0.3000",
                                  "data: 0.2500", "max mem: 10234"]))
        out += ["Test:  Total time: 0:00:15", "Test:  Acc@1 0.100 Acc@5 0.500"]
    return out


def semseg() -> list[str]:
    """hszhao/semseg train.py: a line when (i + 1) % print_freq == 0, 'Data {val:.3f}
    ({avg:.3f}) Batch {val:.3f} ({avg:.3f})'. Batch 0 of each epoch waits 3.000 s (iteration
    3.380 s): it is never printed, so it shows only in the running averages; the others
    wait 0.020 s of 0.400 s."""
    pre = "[2024-05-01 12:00:00,123 INFO train.py line 241 4567] "
    out = [pre + "=> creating model ...", pre + "Classes: 21"]
    n, freq, epochs = 100, 10, 2
    for epoch in range(epochs):
        dsum = bsum = 0.0
        for i in range(n):
            d, b = (3.0, 3.38) if i == 0 else (0.02, 0.4)
            dsum, bsum = dsum + d, bsum + b
            if (i + 1) % freq == 0:
                out.append(pre + f"Epoch: [{epoch + 1}/{epochs}][{i + 1}/{n}] "
                           f"Data {d:.3f} ({dsum / (i + 1):.3f}) "
                           f"Batch {b:.3f} ({bsum / (i + 1):.3f}) "
                           f"Remain {_eta(b * (n - i))} MainLoss 0.5316 AuxLoss 0.5401 "
                           f"Loss 0.7476 Accuracy 0.7712.")
        out.append(pre + f"Train result at epoch [{epoch + 1}/{epochs}]: mIoU/mAcc/allAcc 0.1/0.2/0.3.")
        out.append(pre + ">>>>>>>>>>>>>>>> Start Evaluation >>>>>>>>>>>>>>>>")
        out.append(pre + "Test: [10/63] Data 0.001 (0.012) Batch 0.500 (0.520) Loss 0.3000 (0.3500) Accuracy 0.9000.")
    return out


def mmcv() -> list[str]:
    """mmcv TextLoggerHook._log_info: 'Epoch [{epoch}][{iter}/{len}]\\t' then 'lr: {:.3e}, ',
    'eta: .., time: {:.3f}, data_time: {:.3f}, memory: N, ' and the losses, ', '-joined.
    Interval 50, 300 iterations per epoch. The first line of each epoch: time 0.900,
    data_time 0.600 (the workers starting); the others 0.400 and 0.050."""
    pre = "2024-05-01 12:00:00,123 - mmdet - INFO - "
    out = [pre + "Environment info:", pre + "Start running, host: user@node, work_dir: /w",
           pre + "workflow: [('train', 1)], max: 3 epochs"]
    for epoch in range(1, 4):
        for it in range(50, 301, 50):
            t, d = (0.9, 0.6) if it == 50 else (0.4, 0.05)
            out.append(pre + f"Epoch [{epoch}][{it}/300]\tlr: {2e-2:.3e}, eta: {_eta(t * 900)}, "
                       f"time: {t:.3f}, data_time: {d:.3f}, memory: 3511, loss_rpn_cls: 0.0560, "
                       "loss_bbox: 0.2011, loss: 0.6140")
        out.append(pre + f"Saving checkpoint at {epoch} epochs")
        out.append(pre + f"Epoch(val) [{epoch}][500]\tbbox_mAP: 0.3580, bbox_mAP_50: 0.5600")
    return out


def mmengine() -> list[str]:
    """mmengine LogProcessor.get_log_after_iter: 'Epoch(train)  [{e}][{i:>3}/{len}]  ' then
    'lr: {:.4e}  eta: ..  time: {:.4f}  data_time: {:.4f}  memory: N  ' and the losses,
    two-space-joined; validation iterations and the end-of-validation line (time and
    data_time last, data_time first) too. 200 iterations per epoch, interval 50. The first
    line of each epoch: time 1.2000, data_time 0.8000; the others 0.3000 and 0.0300."""
    pre = "05/01 12:00:00 - mmengine - INFO - "
    out = [pre + "Config:", pre + "Checkpoints will be saved to /work_dirs/r50."]
    for epoch in range(1, 3):
        for it in range(50, 201, 50):
            t, d = (1.2, 0.8) if it == 50 else (0.3, 0.03)
            out.append(pre + f"Epoch(train) [{epoch}][{it:>3}/200]  lr: {1e-1:.4e}  "
                       f"eta: {_eta(t * 200)}  time: {t:.4f}  data_time: {d:.4f}  "
                       "memory: 4521  loss: 2.3012")
        out.append(pre + f"Saving checkpoint at {epoch} epochs")
        out.append(pre + f"Epoch(val)  [{epoch}][ 5/10]    eta: 0:00:01  time: 0.1000  "
                   "data_time: 0.0500  memory: 1200")
        out.append(pre + f"Epoch(val) [{epoch}][10/10]    accuracy/top1: 76.5000  "
                   "data_time: 0.0500  time: 0.1000")
    return out


def detectron2() -> list[str]:
    """detectron2 CommonMetricPrinter.write: ' {eta}iter: {iter}  {losses}  {avg_time}
    {last_time}{avg_data_time}{last_data_time} lr: {lr}  {memory}' every 20 iterations
    (0-based iter 19, 39, ..). The first line: time 0.3500, data_time 0.2000 (the start); the
    others 0.3000 and 0.0300; last_* equal to them."""
    pre = "[05/01 12:00:00 d2.utils.events]: "
    out = ["[05/01 11:59:00 d2.engine.train_loop]: Starting training from iteration 0"]
    for it in range(19, 200, 20):
        t, d = (0.35, 0.2) if it == 19 else (0.3, 0.03)
        out.append(pre + f" eta: {_eta(t * (200 - it))}  iter: {it}  total_loss: 1.234  "
                   f"loss_cls: 0.5  time: {t:.4f}  last_time: {t:.4f}  data_time: {d:.4f}  "
                   f"last_data_time: {d:.4f}   lr: 0.00019981  max_mem: 2631M")
    out += ["[05/01 12:01:00 d2.evaluation.evaluator]: Start inference on 125 batches",
            "[05/01 12:01:05 d2.evaluation.evaluator]: Inference done 11/125. Dataloading: "
            "0.0012 s/iter. Inference: 0.0412 s/iter. Eval: 0.0001 s/iter. Total: 0.0430 "
            "s/iter. ETA=0:00:05",
            "[05/01 12:01:10 d2.evaluation.evaluator]: Total inference time: 0:00:05.2 "
            "(0.043 s / iter per device, on 1 devices)"]
    return out


def yolox() -> list[str]:
    """YOLOX Trainer.after_iter (loguru): 'epoch: {}/{}, iter: {}/{}, gpu mem: {:.0f}Mb,
    mem: {:.1f}Gb, iter_time: {:.3f}s, data_time: {:.3f}s, <losses>, lr: {:.3e}, size: N,
    ETA: ..' every 10 iterations of 100. The first line of each epoch: iter_time 1.500s,
    data_time 1.100s; the others 0.500s and 0.050s."""
    pre = "2024-05-01 12:00:00 | INFO     | yolox.core.trainer:259 - "
    out = ["2024-05-01 11:59:00 | INFO     | yolox.core.trainer:196 - Training start...",
           "2024-05-01 11:59:00 | INFO     | yolox.core.trainer:202 - init prefetcher, this "
           "might take one minute or less..."]
    for epoch in range(1, 3):
        out.append(f"2024-05-01 12:00:00 | INFO     | yolox.core.trainer:207 - ---> start train epoch{epoch}")
        for it in range(10, 101, 10):
            t, d = (1.5, 1.1) if it == 10 else (0.5, 0.05)
            out.append(pre + f"epoch: {epoch}/2, iter: {it}/100, gpu mem: 4521Mb, mem: 3.2Gb, "
                       f"iter_time: {t:.3f}s, data_time: {d:.3f}s, total_loss: 12.3, "
                       f"iou_loss: 3.1, l1_loss: 0.0, conf_loss: 6.2, cls_loss: 3.0, "
                       f"lr: {1e-4:.3e}, size: 640, ETA: {_eta(t * 100)}")
        out += ["100%|##########| 157/157 [00:20<00:00,  7.71it/s]",
                "2024-05-01 12:02:00 | INFO     | yolox.evaluators.coco_evaluator:254 - "
                "Evaluate in main process...",
                "2024-05-01 12:02:01 | INFO     | yolox.core.trainer:339 - Average forward "
                "time: 5.12 ms, Average NMS time: 1.23 ms, Average inference time: 6.35 ms"]
    return out


def lerobot() -> list[str]:
    """LeRobot train.py: MetricsTracker.__str__ 'step:{} smpl:{} ep:{} epch:{:.2f}' and the
    meters '{name}:{avg:fmt}' (loss :.3f, grdn :.3f, lr :0.1e, updt_s :.3f, data_s :.3f),
    every 200 steps, batch 32; format_big_number rounds 1000 and above ("1K"). The first
    line (steps 1-200, the workers starting) waits data_s 0.450, the others 0.050; the
    update takes 0.150 s throughout, after the batch is fetched."""
    pre = "INFO 2025-01-20 12:34:56 ts/train.py:232 "

    def big(n: float) -> str:
        for suffix in ("", "K", "M"):
            if abs(n) < 1000:
                return f"{n:.0f}{suffix}"
            n /= 1000.0
        return f"{n:.0f}B"

    out = ["INFO 2025-01-20 12:30:00 ts/train.py:120 Creating dataset",
           "INFO 2025-01-20 12:30:05 ts/train.py:140 Start offline training on a fixed dataset"]
    for step in range(200, 2001, 200):
        d = 0.45 if step == 200 else 0.05
        out.append(pre + f"step:{big(step)} smpl:{big(step * 32)} ep:{big(step * 32 / 400)} "
                   f"epch:{step * 32 / 128000:.2f} loss:0.512 grdn:12.345 lr:{1e-5:0.1e} "
                   f"updt_s:{0.15:.3f} data_s:{d:.3f}")
    out.append(pre + "step:2K smpl:64K ep:160 epch:0.50 ∑rwrd:12.345 success:45.0 eval_s:30.123")
    return out


def hf_trainer() -> list[str]:
    """transformers Trainer: the '***** Running training *****' block, ProgressCallback's
    str(logs) dicts (floats as '{:.4g}' strings, as recent versions print them), an
    evaluation dict, and the closing train_runtime dict: 1000 steps of 32 samples in
    300 s."""
    return [
        "***** Running training *****",
        "  Num examples = 10,667",
        "  Num Epochs = 3",
        "  Instantaneous batch size per device = 32",
        "  Total train batch size (w. parallel, distributed & accumulation) = 32",
        "  Gradient Accumulation steps = 1",
        "  Total optimization steps = 1,000",
        "{'loss': '0.6931', 'grad_norm': '1.234', 'learning_rate': '4.5e-05', 'epoch': '0.5'}",
        "{'eval_loss': '0.5', 'eval_runtime': '12.3', 'eval_samples_per_second': '81.2', "
        "'eval_steps_per_second': '10.2', 'epoch': '1'}",
        "{'loss': '0.5012', 'grad_norm': '0.987', 'learning_rate': '2.5e-05', 'epoch': '1.5'}",
        "{'train_runtime': '300', 'train_samples_per_second': '106.7', "
        "'train_steps_per_second': '3.333', 'train_loss': '0.55', 'epoch': '3'}",
    ]


def lightning() -> list[str]:
    """Lightning SimpleProfiler as pasted in an issue: trimmed into a Markdown table, with
    no run_training_batch row. train_dataloader_next: 1000 calls, 30 s; optimizer_step
    (the step without run_training_batch): 1000 calls, 90 s."""
    return [
        "FIT Profiler Report",
        "",
        "| Action | Mean duration (s) | Num calls | Total time (s) | Percentage % |",
        "|---|---|---|---|---|",
        "| Total | - | 4210 | 125.0 | 100 % |",
        "| run_training_epoch | 62.0 | 2 | 124.0 | 99.2 |",
        "| [LightningModule]LitModel.optimizer_step | 0.09 | 1000 | 90.0 | 72.0 |",
        "| [_TrainingEpochLoop].train_dataloader_next | 0.03 | 1000 | 30.0 | 24.0 |",
        "| [Strategy]SingleDeviceStrategy.backward | 0.05 | 1000 | 50.0 | 40.0 |",
    ]


LOGS: dict[str, Callable[[], list[str]]] = {
    "imagenet": imagenet, "timm": timm, "metriclogger": metriclogger, "semseg": semseg,
    "mmcv": mmcv, "mmengine": mmengine, "detectron2": detectron2, "yolox": yolox,
    "lerobot": lerobot, "hf_trainer": hf_trainer, "lightning": lightning,
}


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, make in LOGS.items():
        (OUT / f"{name}.log").write_text("\n".join(make()) + "\n")


if __name__ == "__main__":
    main()
