"""Every format: sniffed, parsed line by line, forced with --format, and its share on a log
made for it (tests/analyze/data/formats, written by make_formats.py) against the share
computed by hand from the figures written into that log.

The arithmetic, per log (w = the batches a line stands for: the gap to the previous line;
an epoch's first line stands for the batches since the epoch began, at most one interval;
the run's first line is left out as warm-up when its batch index is below 5):
  imagenet      2 epochs, lines at batches 1 11 21 31 41; batch 1: Data 1.500 Time 1.600,
                others 0.050 0.250. Warm-up: epoch 0's [1]; epoch 1's [1] w=1, others w=10.
                (8*10*0.05 + 1.5) / (8*10*0.25 + 1.6) = 5.5 / 21.6 = 0.254630; steady 0.05/0.25
  timm          2 epochs, lines at 0 25 50 75 99; idx 0: Data 2.100 Time 2.500, others 0.050
                0.500. Warm-up: epoch 0's [0]; w = 25 25 25 24 per epoch, epoch 1's [0] w=1.
                (198*0.05 + 2.1) / (198*0.5 + 2.5) = 12.0 / 101.5 = 0.118227; steady 0.1
  metriclogger  3 epochs, lines at 0 100 200 300 400; [0]: time 2.5 data 2.2, others 0.5
                0.1. Warm-up: epoch 0's [0]; epochs 1-2's [0] w=1, others w=100.
                (12*100*0.1 + 2*2.2) / (12*100*0.5 + 2*2.5) = 124.4 / 605 = 0.205620; steady 0.2
  semseg        2 epochs, lines at 10..100; every printed line Data 0.020 Batch 0.400 (batch 0's
                3.000/3.380 is never printed): 0.05, steady 0.05. The running averages at [100]:
                0.050 / 0.430 = 0.116279, 2.3x the share: said.
  mmcv          3 epochs, lines at 50..300 (w=50); first: time 0.900 data_time 0.600, others
                0.400 0.050. (3*0.6 + 15*0.05) / (3*0.9 + 15*0.4) = 2.55 / 8.7 = 0.293103; steady 0.125
  mmengine      2 epochs, lines at 50..200 (w=50); first 1.2000/0.8000, others 0.3000/0.0300.
                (2*0.8 + 6*0.03) / (2*1.2 + 6*0.3) = 1.78 / 4.2 = 0.423810; steady 0.1
  detectron2    iter 19..199 (w=20); first time 0.3500 data_time 0.2000, others 0.3000 0.0300.
                (0.2 + 9*0.03) / (0.35 + 9*0.3) = 0.47 / 3.05 = 0.154098; steady 0.1
  yolox         2 epochs, iter 10..100 (w=10); first 1.500s/1.100s, others 0.500s/0.050s.
                (2*1.1 + 18*0.05) / (2*1.5 + 18*0.5) = 3.1 / 12 = 0.258333; steady 0.1
  lerobot       steps 200..2000 (w=200); updt_s 0.150 throughout, data_s 0.450 then 0.050; a
                step is updt_s + data_s. (0.45 + 9*0.05) / (0.6 + 9*0.2) = 0.9 / 2.4 = 0.375; steady 0.25
  lightning     Markdown, no run_training_batch: data 30 s, optimizer_step 90 s.
                30 / (30 + 90) = 0.25 (totals: no steady share)
  hf_trainer    no data time: null. Step 300 s / 1000 steps = 0.3 s; 106.7 samples/s
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.analyze import analyze, detect_format
from autotune.analyze.parsers import (BUILTIN, FORMATS, Detectron2Parser, HFTrainerParser,
                                      LerobotParser, LightningParser, MetricLoggerParser,
                                      MMCVParser, MMEngineParser, SemsegParser, Skip,
                                      YoloxParser)
from autotune.errors import UsageError

FORMATS_DIR = Path(__file__).resolve().parent / "data" / "formats"

# One line per format, as each program prints it (the README lists the same ones).
EXAMPLES = {
    "imagenet": "Epoch: [3][ 10/5005]\tTime  0.345 ( 0.567)\tData  0.123 ( 0.234)\tLoss 6.9077e+00 (6.9100e+00)",
    "timm": ("Train: 0 [  50/5004 (  1%)]  Loss: 6.90 (6.92)  Time: 0.370s,  691.04/s  "
             "(0.419s,  611.41/s)  LR: 1.000e-05  Data: 0.012 (0.045)"),
    "metriclogger": ("Epoch: [0]  [  10/5005]  eta: 0:55:12  lr: 0.1  img/s: 412.3  loss: 6.9077 "
                     "(6.9100)  acc1: 0.0000 (0.0000)  time: 0.5123  data: 0.1012  max mem: 10234"),
    "semseg": ("[2024-05-01 12:00:00,123 INFO train.py line 240 4567] Epoch: [1/200][10/1488] "
               "Data 0.001 (0.143) Batch 4.110 (4.190) Remain 01:23:45 MainLoss 0.5316 "
               "AuxLoss 0.5401 Loss 0.7476 Accuracy 0.7712."),
    "mmengine": ("05/01 12:00:00 - mmengine - INFO - Epoch(train)  [1][ 50/1000]  lr: 1.0000e-01  "
                 "eta: 1:23:45  time: 0.4123  data_time: 0.0123  memory: 4521  loss: 2.3012"),
    "mmcv": ("2024-05-01 12:00:00,123 - mmdet - INFO - Epoch [1][100/5005]\tlr: 1.000e-01, "
             "eta: 1 day, 2:03:04, time: 0.432, data_time: 0.071, memory: 4521, loss: 2.1234"),
    "detectron2": ("[11/20 09:23:44 d2.utils.events]:  eta: 0:10:00  iter: 19  total_loss: 1.234  "
                   "time: 0.3411  data_time: 0.0123  lr: 0.00019981  max_mem: 2631M"),
    "yolox": ("2024-05-01 12:00:00 | INFO     | yolox.core.trainer:259 - epoch: 1/300, iter: "
              "10/1000, gpu mem: 4521Mb, mem: 3.2Gb, iter_time: 0.512s, data_time: 0.095s, "
              "total_loss: 12.3, lr: 1.000e-04, size: 640, ETA: 1 day, 2:03:04"),
    "lerobot": ("INFO 2025-01-20 12:34:56 ts/train.py:232 step:200 smpl:6K ep:10 epch:0.05 "
                "loss:0.512 grdn:12.345 lr:1.0e-05 updt_s:0.123 data_s:0.646"),
    "hf_trainer": ("{'train_runtime': 123.4567, 'train_samples_per_second': 243.1, "
                   "'train_steps_per_second': 7.606, 'train_loss': 0.55, 'epoch': 3.0}"),
    "lightning": ("|  [_TrainingEpochLoop].train_dataloader_next \t|  0.0521         \t|  1000      "
                  "\t|  52.1           \t|  69.2          \t|"),
}

# name: (share by hand, steady share by hand, lines parsed, skipped by reason)
HAND = {
    "imagenet": (5.5 / 21.6, 0.05 / 0.25, 10, {"other output": 4, "evaluation line": 2}),
    "timm": (12.0 / 101.5, 0.1, 10, {"other output": 2, "evaluation line": 2}),
    "metriclogger": (124.4 / 605, 0.2, 15, {"other output": 12, "evaluation line": 6}),
    "semseg": (0.05, 0.05, 20, {"other output": 6, "evaluation line": 2}),
    "mmcv": (2.55 / 8.7, 0.125, 18, {"other output": 6, "evaluation line": 3}),
    "mmengine": (1.78 / 4.2, 0.1, 8, {"other output": 4, "evaluation line": 4}),
    "detectron2": (0.47 / 3.05, 0.1, 10, {"other output": 2, "evaluation line": 2}),
    "yolox": (3.1 / 12, 0.1, 20, {"other output": 8, "evaluation line": 2}),
    "lerobot": (0.9 / 2.4, 0.25, 10, {"other output": 2, "evaluation line": 1}),
    "lightning": (0.25, None, 8, {"blank line": 1}),
    "hf_trainer": (None, None, 6, {"other output": 4, "evaluation line": 1}),
}


def _skip(parser, line: str) -> str | None:
    try:
        parser.feed(line, 1)
    except Skip as e:
        return e.reason
    return None


def test_every_builtin_format_has_an_example_a_log_and_a_hand_share():
    assert set(EXAMPLES) == set(HAND) == set(BUILTIN) - {"own"}
    assert set(BUILTIN) <= set(FORMATS)                       # --format NAME accepts each
    assert {p.stem for p in FORMATS_DIR.glob("*.log")} == set(HAND)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_sniff_claims_its_own_line_and_no_other_format_does(name):
    claimed = [other for other, cls in BUILTIN.items() if cls().sniff(EXAMPLES[name])]
    assert claimed == [name]


@pytest.mark.parametrize("name", sorted(HAND))
def test_share_on_a_log_made_for_the_format_matches_the_hand_computation(name):
    log = FORMATS_DIR / f"{name}.log"
    assert detect_format(log) == name
    share, steady, parsed, skipped = HAND[name]
    for a in (analyze(log), analyze(log, format=name)):     # sniffed, then forced
        assert a.format == name
        assert a.lines["parsed"] == parsed and a.lines["skipped_by_reason"] == skipped
        if share is None:
            assert a.data_time_share is None
        else:
            assert a.data_time_share == pytest.approx(share, rel=1e-6)
        if steady is None:
            assert a.steady_data_time_share is None
        else:
            assert a.steady_data_time_share == pytest.approx(steady, rel=1e-6)


@pytest.mark.parametrize("name", sorted(HAND))
def test_forcing_the_wrong_format_says_so_on_one_line(name):
    wrong = "mmcv" if name == "yolox" else "yolox"     # (mmcv forced on mmengine reads it)
    with pytest.raises(UsageError) as e:
        analyze(FORMATS_DIR / f"{name}.log", format=wrong)
    msg = str(e.value)
    assert "\n" not in msg and f"{name}.log" in msg and f"format '{wrong}'" in msg
    assert e.value.settings == ("format",)   # the CLI names the option that sets it


@pytest.mark.parametrize("name", sorted(set(HAND) - {"hf_trainer"}))
def test_verdict_without_metrics(name):
    # compute when the step hardly waits (semseg's printed lines: 5 %), else unknown with
    # "input-bound" and the command that tells storage, decode and loader apart.
    a = analyze(FORMATS_DIR / f"{name}.log")
    v = a.verdict
    if a.au >= 0.9:
        assert v.bottleneck == "compute" and name == "semseg"
    else:
        assert v.bottleneck == "unknown"
        assert any(e.startswith("input-bound: the step waits") for e in v.evidence)
        assert v.next_command.startswith("autotune monitor --data")


# -- formats one by one -------------------------------------------------------------------

def test_metriclogger_deit_dino_mae_variants_without_img_s():
    dino = ("Epoch: [3/100]  [ 40/1251]  eta: 0:12:01  loss: 11.07 (11.08)  lr: 0.0005 (0.0005)"
            "  wd: 0.04 (0.04)  time: 0.6012  data: 0.3005  max mem: 8000")
    deit_cpu = "Epoch: [0]  [   0/1251]  eta: 2:01:00  lr: 0.000001  loss: 6.9 (6.9)  time: 5.8000  data: 4.1000"
    [r] = MetricLoggerParser().feed(dino, 1)
    assert (r.epoch, r.index, r.total, r.iter_s, r.data_s) == (3, 40, 1251, 0.6012, 0.3005)
    [r] = MetricLoggerParser().feed(deit_cpu, 1)
    assert (r.iter_s, r.data_s) == (5.8, 4.1)
    assert _skip(MetricLoggerParser(), "Epoch: [0] Total time: 0:12:34") == "other output"


def test_mmengine_time_before_or_after_data_time_and_never_inside_it():
    p = MMEngineParser()
    after = "Iter(train) [  50/90000]  lr: 1.0000e-02  eta: 1:00:00  data_time: 0.0123  time: 0.4123  memory: 4521"
    [r] = p.feed(after, 1)
    assert (r.index, r.total, r.epoch, r.data_s, r.iter_s) == (50, 90000, None, 0.0123, 0.4123)
    # Only data_time on the line: `time` must not be read out of it.
    only_data = "Epoch(train) [1][ 50/1000]  lr: 1.0000e-01  data_time: 0.0123  memory: 4521"
    assert _skip(p, only_data) == "truncated or garbled record"
    assert _skip(p, "Epoch(test) [ 50/500]    eta: 0:00:10  time: 0.1  data_time: 0.01") == "evaluation line"


def test_mmcv_by_iteration_and_later_epoch_train_header():
    [r] = MMCVParser().feed("Iter [100/160000]\tlr: 1.000e-02, eta: 1 day, 0:00:00, time: 0.540, data_time: 0.020, memory: 9000", 1)
    assert (r.index, r.total, r.epoch, r.iter_s, r.data_s) == (100, 160000, None, 0.54, 0.02)
    [r] = MMCVParser().feed("Epoch(train) [2][100/5005]\tlr: 1.000e-01, eta: 0:01:00, time: 0.432, data_time: 0.071, loss: 1.0", 1)
    assert (r.epoch, r.index) == (2, 100)


def test_detectron2_says_its_time_is_a_global_average():
    a = analyze(FORMATS_DIR / "detectron2.log")
    assert any("global" in e or "since the start of training" in e for e in a.verdict.evidence)
    assert any("last 20 iterations" in e for e in a.verdict.evidence)
    assert a.share_from["other_share"] == pytest.approx(a.data_time_share)   # last_* agree here
    [r] = Detectron2Parser().feed(EXAMPLES["detectron2"], 1)
    assert (r.index, r.iter_s, r.data_s, r.alt_iter_s) == (20, 0.3411, 0.0123, None)


def test_yolox_line():
    [r] = YoloxParser().feed(EXAMPLES["yolox"], 1)
    assert (r.epoch, r.index, r.total, r.iter_s, r.data_s) == (1, 10, 1000, 0.512, 0.095)
    assert r.end_time is not None                       # the loguru timestamp


def test_semseg_line_and_both_readings():
    [r] = SemsegParser().feed(EXAMPLES["semseg"], 1)
    assert (r.epoch, r.index, r.iter_s, r.data_s, r.alt_iter_s, r.alt_data_s) == (
        1, 10, 4.11, 0.001, 4.19, 0.143)


def test_lerobot_step_is_update_plus_data_and_rounded_steps_keep_the_interval():
    p = LerobotParser()
    [r] = p.feed(EXAMPLES["lerobot"], 1)
    assert r.iter_s == pytest.approx(0.123 + 0.646) and r.step_s == 0.123 and r.data_s == 0.646
    # 200, 400, 600, 800 exact, then 1K ... : the interval of 200 carries on.
    idx = [p.feed(f"step:{s} smpl:1K ep:1 epch:0.01 loss:0.5 grdn:1.0 lr:1.0e-05 updt_s:0.1 data_s:0.1", 1)[0].index
           for s in ("400", "600", "800", "1K", "1K", "2K")]
    assert idx == [400, 600, 800, 1000, 1200, 1400]
    # An excerpt from late in a run: rounded only, lines one apart (equal weights), and far
    # from the run's start (no warm-up taken out of it).
    late = LerobotParser()
    idx = [late.feed(f"step:{s} smpl:1M ep:1 epch:9.0 loss:0.5 grdn:1.0 lr:1.0e-05 updt_s:0.1 data_s:0.1", 1)[0].index
           for s in ("12K", "12K", "13K")]
    assert idx == [12000, 12001, 12002]


def test_hf_trainer_floats_as_numbers_strings_or_numpy():
    for closing in (EXAMPLES["hf_trainer"],
                    "{'train_runtime': '123.5', 'train_samples_per_second': '243.1', "
                    "'train_steps_per_second': '7.606', 'train_loss': '0.55', 'epoch': '3'}",
                    "{'train_runtime': np.float64(123.4567), 'train_samples_per_second': "
                    "np.float64(243.1), 'train_steps_per_second': 7.606, 'epoch': 3.0}"):
        p = HFTrainerParser()
        assert p.feed(closing, 9) == []
        [s] = p.finish()
        assert s.data_total_s is None and s.step_calls == 939       # 123.5 s x 7.606/s
        assert s.samples_per_s == 243.1 and p.meta["batch_size"] == 32   # 243.1 / 7.606


def test_hf_trainer_null_share_is_said_and_step_time_and_throughput_kept():
    a = analyze(FORMATS_DIR / "hf_trainer.log")
    d = a.to_dict()
    assert d["data_time_share"] is None and d["au"] is None
    assert d["step_time_s"]["p50"] == pytest.approx(300 / 1000)
    assert d["images_per_s"] == pytest.approx(106.7) and d["batch_size"] == 32
    assert any("no data-loading time: data_time_share is null" in w for w in d["warnings"])
    assert d["verdict"]["bottleneck"] == "unknown" and "no data time" in d["verdict"]["summary"]


def test_hf_trainer_without_the_closing_dict_says_where_the_timing_is(tmp_path):
    log = tmp_path / "hf.log"
    log.write_text("{'loss': 0.69, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}\n" * 6)
    with pytest.raises(UsageError, match="closing \\{'train_runtime'"):
        analyze(log)


# -- Lightning tables in the shapes people paste --------------------------------------------

ROWS = [("run_training_epoch", "35.1", "2", "70.2", "93.2"),
        ("[_TrainingEpochLoop].train_dataloader_next", "0.045", "1000", "45.0", "59.8"),
        ("run_training_batch", "0.025", "1000", "25.0", "33.2")]
HEAD = ("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")


def _table(shape: str, rows=ROWS) -> str:
    w = max(len(r[0]) for r in rows)
    if shape == "lightning":        # SimpleProfiler.summary(): pipes and tabs
        body = [f"|  {r[0]:<{w}}\t|  {r[1]:<15}\t|  {r[2]:<15}\t|  {r[3]:<15}\t|  {r[4]:<15}\t|"
                for r in [HEAD, *rows]]
        return "FIT Profiler Report\n" + "-" * 80 + "\n" + "\n".join(body[:1] + ["-" * 80] + body[1:])
    if shape == "indented":         # inside a quoted, indented block
        return "\n".join(">     " + line for line in _table("lightning", rows).splitlines())
    if shape == "padded":           # tabs expanded by the terminal or the editor
        return _table("lightning", rows).expandtabs()
    if shape == "tabs":             # pasted from a spreadsheet: no pipes
        return "\n".join("\t".join(r) for r in [HEAD, *rows])
    if shape == "spaces":           # no pipes, columns padded with spaces
        return "\n".join("  ".join(c.ljust(w if i == 0 else 18) for i, c in enumerate(r))
                         for r in [HEAD, *rows])
    if shape == "markdown":
        return "\n".join(["| " + " | ".join(HEAD) + " |", "|" + "---|" * 5]
                         + ["| " + " | ".join(f"`{r[0]}`" if i == 0 else c for i, c in enumerate(r))
                            + " |" for r in rows])
    if shape == "headless":         # the rows alone
        return "\n".join("|  " + "  |  ".join(r) + "  |" for r in rows)
    if shape == "old":              # Lightning < 1.5: no leading pipe, no "Num calls"
        return "\n".join(f"{r[0]:<{w}}\t|  {r[1]:<15}\t|  {r[3]:<15}" for r in
                         [(HEAD[0], HEAD[1], "", HEAD[3], ""), *rows])
    raise AssertionError(shape)


@pytest.mark.parametrize("shape", ["lightning", "indented", "padded", "tabs", "spaces",
                                   "markdown", "headless", "old"])
def test_lightning_table_in_every_pasted_shape(tmp_path, shape):
    log = tmp_path / "fit.log"
    log.write_text("Epoch 1: 100%|##########| 500/500 [00:35<00:00, 14.2it/s]\n"
                   + _table(shape) + "\n")
    assert detect_format(log) == "lightning"
    a = analyze(log, batch_size=32)
    # train_dataloader_next 45 s is apart from run_training_batch 25 s: 45 / (45 + 25).
    assert a.data_time_share == pytest.approx(45.0 / 70.0)
    assert a.steps == 1000
    assert a.step_time_s["p50"] == pytest.approx(0.025)


def test_lightning_without_run_training_batch_falls_back_and_says_which(tmp_path):
    log = tmp_path / "fit.log"
    log.write_text(_table("markdown", ROWS[:2]) + "\n")
    a = analyze(log)
    # run_training_epoch 70.2 s minus the data wait 45 s is the step: 45 / 70.2.
    assert a.data_time_share == pytest.approx(45.0 / 70.2)
    assert any("run_training_epoch minus the data wait" in w for w in a.warnings)
    log.write_text(_table("markdown", ROWS[1:2]) + "\n")
    assert analyze(log).data_time_share is None       # no step row at all: no share
    assert re.search(r"no row for the step", " ".join(analyze(log).warnings))


def test_lightning_row_of_interest_cut_short_is_counted():
    p = LightningParser()
    assert _skip(p, "|  [_TrainingEpochLoop].train_dataloader_next  \t|  0.04") == "truncated or garbled record"
    assert _skip(p, "train_dataloader_next took long") == "other output"
