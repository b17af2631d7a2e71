"""The traps of real logs, each on the logs of tests/analyze/data/formats (their hand-
computed shares are in test_log_formats.py): evaluation lines with times, progress bars glued
to the next line, blank lines, every line logged twice, units, tabs expanded, warnings in
between, torchrun prefixes, standard input and gzip, `current (running average)` pairs,
epoch-start stalls against the steady share, and short excerpts."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.analyze import analyze
from autotune.analyze.parsers import (Detectron2Parser, HFTrainerParser, ImagenetParser,
                                      LerobotParser, MetricLoggerParser, MMCVParser,
                                      MMEngineParser, SemsegParser, Skip, TimmParser,
                                      YoloxParser)
from autotune.analyze.reader import MAX_LINE

DATA = Path(__file__).resolve().parent / "data" / "formats"
REPO = Path(__file__).resolve().parents[2]

# Shares by hand (see test_log_formats.py for the arithmetic).
MMCV_SHARE, YOLOX_SHARE, IMAGENET_SHARE = 2.55 / 8.7, 3.1 / 12, 5.5 / 21.6
BAR = "\r{p:3d}%|{bar:<10}| {i}/300 [00:{s:02d}<00:30, 9.87it/s]"


def _lines(name: str) -> list[str]:
    return (DATA / f"{name}.log").read_text().splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _steps(name: str) -> list[str]:
    """The log's training lines (what its parser turns into records)."""
    parser = {"mmcv": MMCVParser, "yolox": YoloxParser, "imagenet": ImagenetParser}[name]()
    out = []
    for line in _lines(name):
        try:
            if parser.feed(line, 1):
                out.append(line)
        except Skip:
            pass
    return out


# -- evaluation lines carry times too ------------------------------------------------------

@pytest.mark.parametrize("parser, line", [
    (MetricLoggerParser, "Test:   [ 0/50]  eta: 0:00:12  loss: 6.9 (6.9)  acc1: 0.0 (0.0)  "
                         "time: 0.3000  data: 0.2500  max mem: 10234"),
    (ImagenetParser, "Test: [ 1/10]\tTime  0.300 ( 0.300)\tLoss 6.9000e+00 (6.9000e+00)"),
    (TimmParser, "Test: [   0/10]  Time: 0.300 (0.300)  Loss:  6.9000 (6.9000)"),
    (SemsegParser, "Test: [10/63] Data 0.001 (0.012) Batch 0.500 (0.520) Loss 0.3000 (0.3500)"),
    (MMEngineParser, "Epoch(val)  [1][ 5/10]    eta: 0:00:01  time: 0.1000  data_time: 0.0500"),
    (MMEngineParser, "Epoch(val) [1][10/10]    accuracy/top1: 76.5000  data_time: 0.0500  time: 0.1000"),
    (MMCVParser, "Epoch(val) [1][500]\tlr: 1.000e-02, time: 0.215, data_time: 0.050, bbox_mAP: 0.3580"),
    (Detectron2Parser, "Inference done 11/125. Dataloading: 0.0012 s/iter. Inference: 0.0412 "
                       "s/iter. Eval: 0.0001 s/iter. Total: 0.0430 s/iter. ETA=0:00:05"),
    (YoloxParser, "Average forward time: 5.12 ms, Average NMS time: 1.23 ms, Average inference "
                  "time: 6.35 ms"),
    (LerobotParser, "step:2K smpl:64K ep:160 epch:0.50 ∑rwrd:12.345 success:45.0 eval_s:30.123"),
    (HFTrainerParser, "{'eval_loss': 0.5, 'eval_runtime': 12.3, 'eval_samples_per_second': 81.2, "
                      "'eval_steps_per_second': 10.2, 'epoch': 1.0}"),
])
def test_evaluation_lines_with_times_are_not_training_steps(parser, line):
    with pytest.raises(Skip) as e:
        parser().feed(line, 1)
    assert e.value.reason == "evaluation line"


def test_a_log_with_more_evaluation_than_training_lines(tmp_path):
    # mmengine: each epoch's 4 training lines, then 40 validation iterations that wait 10x
    # longer for their data; the share is the training lines' alone (1.78 / 4.2).
    out = []
    for line in _lines("mmengine"):
        out.append(line)
        if "Saving checkpoint" in line:
            out += [f"Epoch(val)  [1][{i:>2}/40]    eta: 0:00:01  time: 0.5000  data_time: "
                    "0.4000  memory: 1200" for i in range(1, 41)]
    a = analyze(_write(tmp_path / "val.log", out))
    assert a.format == "mmengine" and a.steps == 8
    assert a.data_time_share == pytest.approx(1.78 / 4.2)
    assert a.lines["skipped_by_reason"]["evaluation line"] == 4 + 80


# -- progress bars -------------------------------------------------------------------------

def test_progress_bar_without_newline_glued_to_the_next_line(tmp_path):
    # tqdm redraws with '\r' and no newline; the next log line ends up after the bar.
    glued = []
    for k, line in enumerate(_lines("mmcv")):
        bar = "".join(BAR.format(p=i // 3, bar="#" * (i // 30), i=i, s=i % 60)
                      for i in range(k * 10, k * 10 + 10))
        glued.append(bar + line)
    a = analyze(_write(tmp_path / "bar.log", glued))
    assert a.format == "mmcv" and a.steps == 18
    assert a.data_time_share == pytest.approx(MMCV_SHARE)


def test_hf_dicts_written_by_tqdm_write_between_bar_redraws(tmp_path):
    # tqdm.write clears the bar ('\r' + spaces + '\r'), prints, and the bar comes back.
    lines = _lines("hf_trainer")
    out = [("\r" + " " * 60 + "\r" + ln) if ln.startswith("{") else ln for ln in lines]
    a = analyze(_write(tmp_path / "hf.log", out))
    assert a.format == "hf_trainer" and a.steps == 1000


def test_a_progress_bar_longer_than_a_line_then_a_record(tmp_path):
    # Hours of bar redraws without a newline (over MAX_LINE bytes), then a record: the
    # record is read, the bar is not held in memory.
    steps = _steps("imagenet")
    log = tmp_path / "long.log"
    with log.open("w") as f:
        f.write(steps[0] + "\n")
        n = MAX_LINE // 40 + 1000
        f.write("".join(BAR.format(p=i % 100, bar="#", i=i, s=i % 60) for i in range(n)))
        f.write(steps[1] + "\n")
        f.write("x" * (MAX_LINE + 10) + "\n")                 # junk without \r: still cut
        f.writelines(s + "\n" for s in steps[2:])
    a = analyze(log)
    assert a.steps + a.warmup_steps == len(steps)
    assert a.lines["skipped_by_reason"] == {"line too long (over 1 MiB)": 1}


# -- blank lines, every line twice ---------------------------------------------------------

def test_blank_lines_between_entries(tmp_path):
    lines = _lines("mmcv")
    a = analyze(_write(tmp_path / "blank.log", [x for ln in lines for x in (ln, "", "   ")]))
    assert a.data_time_share == pytest.approx(MMCV_SHARE) and a.steps == 18
    assert a.lines["skipped_by_reason"]["blank line"] == 2 * len(lines)


def test_every_line_logged_twice_counts_once(tmp_path):
    # One logger with two handlers on one file: each line twice in a row.
    lines = _lines("yolox")
    a = analyze(_write(tmp_path / "twice.log", [x for ln in lines for x in (ln, ln)]))
    assert a.steps == 20 and a.batches == 200 and a.ranks == 1
    assert a.data_time_share == pytest.approx(YOLOX_SHARE)
    assert a.lines["skipped_by_reason"]["line printed twice (the same as the one before)"] == len(lines)


def test_the_same_step_printed_by_two_handlers_in_two_formats(tmp_path):
    # The file handler adds a timestamp, the console handler (redirected to the same file)
    # does not: not the same text, the same step and figures.
    out = []
    for line in _steps("mmcv"):
        bare = line.split(" - INFO - ", 1)[1]
        out += [line, bare]
    a = analyze(_write(tmp_path / "two.log", out))
    assert a.steps == 18 and a.ranks == 1
    assert a.data_time_share == pytest.approx(MMCV_SHARE)
    assert a.lines["skipped_by_reason"] == {"step printed twice (same epoch, index and figures)": 18}


# -- units, tabs, warnings -----------------------------------------------------------------

def test_units_such_as_2_564s_and_ms():
    [r] = MMCVParser().feed("Epoch [1][50/300]\tlr: 1.000e-02, eta: 0:01:00, time: 2.564s, "
                            "data_time: 1282ms, memory: 3511", 1)
    assert (r.iter_s, r.data_s) == (2.564, 1.282)
    [r] = ImagenetParser().feed("Epoch: [0][ 11/50]\tTime 2.564s (2.600s)\tData 1.282s (1.300s)", 1)
    assert (r.iter_s, r.data_s, r.alt_iter_s, r.alt_data_s) == (2.564, 1.282, 2.6, 1.3)
    [r] = Detectron2Parser().feed(" iter: 39  total_loss: 1.2  time: 2.564s  data_time: 0.5s  lr: 0.01", 1)
    assert (r.iter_s, r.data_s) == (2.564, 0.5)


@pytest.mark.parametrize("name, share", [("imagenet", IMAGENET_SHARE), ("mmcv", MMCV_SHARE)])
def test_tabs_expanded_to_spaces(tmp_path, name, share):
    lines = _lines(name)
    assert any("\t" in ln for ln in lines)
    a = analyze(_write(tmp_path / "spaces.log", [ln.expandtabs() for ln in lines]))
    assert a.format == name and a.data_time_share == pytest.approx(share)


def test_warnings_interleaved_and_glued(tmp_path):
    warn = ["/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:560: UserWarning: "
            "This DataLoader will create 16 worker processes in total. Our suggested max "
            "number of worker in current system is 8, which is smaller than what this "
            "DataLoader is going to create.", "  warnings.warn(_create_warning_msg("]
    out = []
    for k, line in enumerate(_lines("mmcv")):
        out.append(line + (warn[0] if k % 5 == 4 else ""))   # stderr glued to a line
        if k % 3 == 0:
            out += warn
    a = analyze(_write(tmp_path / "warn.log", out))
    assert a.data_time_share == pytest.approx(MMCV_SHARE) and a.steps == 18
    # The warnings are other output, one count per line added.
    assert a.lines["skipped_by_reason"]["other output"] == 6 + 2 * len(range(0, 27, 3))


def test_a_warning_inside_a_lightning_table(tmp_path):
    table = _lines("lightning")
    out = table[:6] + ["lightning/pytorch/trainer/connectors/data_connector.py:441: "
                       "PossibleUserWarning: The 'train_dataloader' does not have many "
                       "workers which may be a bottleneck."] + table[6:]
    a = analyze(_write(tmp_path / "fit.log", out))
    assert a.data_time_share == pytest.approx(0.25)       # 30 / (30 + 90), as without it


# -- torchrun ranks ------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["[rank{r}]:", "[default{r}]:", None])
def test_torchrun_rank_prefixes(tmp_path, prefix):
    # pytorch/examples prints on every rank. Rank 0 waits 0.100 s of 0.400 s, rank 1 0.300 s
    # of 0.400 s, at batches 10..100 (10 batches a line): (10*0.1 + 10*0.3) / (20*0.4) = 0.5.
    out = []
    for i in range(10, 101, 10):
        for r, d in ((0, 0.1), (1, 0.3)):
            line = f"Epoch: [0][{i:3d}/100]\tTime  0.400 ( 0.400)\tData  {d:.3f} ( {d:.3f})"
            out.append((prefix.format(r=r) if prefix else "") + line)
    a = analyze(_write(tmp_path / "ddp.log", out))
    assert a.format == "imagenet" and a.ranks == 2
    assert a.data_time_share == pytest.approx(0.5)
    assert a.batches == 200                               # 2 ranks x 10 lines x 10 batches


# -- standard input, gzip ------------------------------------------------------------------

def _cli(stdin: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "autotune", "analyze", "-", *args],
                          input=stdin, capture_output=True, cwd=REPO)


def test_log_from_standard_input_plain_and_gzipped():
    raw = (DATA / "yolox.log").read_bytes()
    for data in (raw, gzip.compress(raw)):
        r = _cli(data, "--json", "-")
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        d = json.loads(r.stdout)
        assert d["log"] == "-" and d["format"] == "yolox"
        assert d["data_time_share"] == pytest.approx(YOLOX_SHARE, abs=1e-4)   # JSON: 4 digits
    r = _cli(b"nothing to see\n" * 3)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1
    assert "- (standard input)" in err and "autotune-stdin-" not in err


@pytest.mark.parametrize("name", ["metriclogger", "detectron2", "lightning"])
def test_gzipped_log_file(tmp_path, name):
    gz = tmp_path / f"{name}.log.gz"
    gz.write_bytes(gzip.compress((DATA / f"{name}.log").read_bytes()))
    plain = analyze(DATA / f"{name}.log")
    a = analyze(gz)
    assert a.format == name and a.data_time_share == pytest.approx(plain.data_time_share)


# -- current (running average) -------------------------------------------------------------

def test_current_and_running_average_apart_are_both_said():
    # semseg's stall at batch 0 is never printed: the current values say 5 %, the running
    # averages 0.050 / 0.430 = 11.6 %; over 2x apart, both are given.
    a = analyze(DATA / "semseg.log")
    assert a.share_from["figures"].startswith("Data and Batch: each printed line's current")
    assert a.share_from["other_share"] == pytest.approx(0.05 / 0.43)
    [w] = [w for w in a.warnings if "apart" in w]
    assert "(5%)" in w and "give 12%" in w and "2.3x apart" in w and "running averages" in w


def test_current_and_running_average_close_stay_quiet():
    # imagenet: the printed batches hold the stall; the averages at [41]: 0.085 / 0.283 =
    # 0.300 against 0.255: within 2x, no warning, the other share still in the JSON.
    a = analyze(DATA / "imagenet.log")
    assert a.share_from["other_share"] == pytest.approx(0.085 / 0.283)
    assert not any("apart" in w for w in a.warnings)


def test_detectron2_last_iteration_apart_from_the_averages(tmp_path):
    # last_data_time 0.2400 against data_time 0.0300 at the same time 0.3000: 0.8 vs 0.1.
    out = [f" eta: 0:01:00  iter: {it}  total_loss: 1.2  time: 0.3000  last_time: 0.3000  "
           f"data_time: 0.0300  last_data_time: 0.2400   lr: 0.01" for it in range(19, 400, 20)]
    a = analyze(_write(tmp_path / "d2.log", out))
    assert a.data_time_share == pytest.approx(0.1)
    assert a.share_from["other_share"] == pytest.approx(0.8)
    [w] = [w for w in a.warnings if "apart" in w]
    assert "8.0x apart" in w and "last_time and last_data_time" in w
    assert "one iteration per line is a small sample" in w and "running averages" not in w


# -- epoch starts, steady share, excerpts ---------------------------------------------------

def test_epoch_start_stalls_in_the_share_apart_in_the_steady_share():
    a = analyze(DATA / "yolox.log")
    # Both epochs' first lines (1.100 s of 1.500 s, 10 batches each) are in the share (3.1 /
    # 12) and out of the steady one (0.05 / 0.5), and listed on their own.
    assert a.data_time_share == pytest.approx(YOLOX_SHARE)
    assert a.steady_data_time_share == pytest.approx(0.1)
    st = a.epoch_starts
    assert (st["lines"], st["batches"]) == (2, 20)
    assert st["mean_wait_s"] == pytest.approx(1.1) and st["steady_mean_wait_s"] == pytest.approx(0.05)
    assert [(s["epoch"], s["batches"]) for s in st["listed"]] == [(1, 10), (2, 10)]
    assert "steady_data_time_share" in a.to_dict() and a.to_dict()["epoch_starts"] == st


def test_an_excerpt_from_mid_epoch_weighs_its_first_line_as_one_interval(tmp_path):
    # mmcv lines at 2550..2950 of 5005: the first stands for 50 batches, not 2550.
    out = [f"Epoch [7][{i}/5005]\tlr: 1.000e-02, eta: 1:00:00, time: 0.400, data_time: "
           f"{0.2 if i == 2550 else 0.1:.3f}, memory: 3511" for i in range(2550, 2951, 50)]
    a = analyze(_write(tmp_path / "mid.log", out))
    assert a.batches == 9 * 50
    # (0.2 + 8 * 0.1) / (9 * 0.4) = 1.0 / 3.6
    assert a.data_time_share == pytest.approx(1.0 / 3.6)


@pytest.mark.parametrize("name, hand", [
    # mmcv, epoch 1's first 5 lines: (0.6 + 4 * 0.05) / (0.9 + 4 * 0.4) = 0.8 / 2.5
    ("mmcv", 0.8 / 2.5),
    # yolox, epoch 1's first 5 lines: (1.1 + 4 * 0.05) / (1.5 + 4 * 0.5) = 1.3 / 3.5
    ("yolox", 1.3 / 3.5),
    # imagenet's first 5 lines: [1] is the warm-up, then 4 x 0.05 / 0.25
    ("imagenet", 0.2),
])
def test_a_short_excerpt_still_gives_the_share_with_a_confidence_note(tmp_path, name, hand):
    a = analyze(_write(tmp_path / "paste.log", _steps(name)[:5]))
    assert a.data_time_share == pytest.approx(hand)
    assert a.confidence["level"] == "low"
    assert "short excerpt" in a.confidence["note"] and a.confidence["note"] in a.verdict.evidence
    assert a.verdict.bottleneck == "unknown" and a.verdict.next_command.startswith("autotune monitor")


def test_a_full_log_has_no_confidence_note(tmp_path):
    lines = [f"Epoch [1][{i}/5000]\tlr: 1.000e-02, eta: 1:00:00, time: 0.400, data_time: 0.010, "
             "memory: 3511" for i in range(50, 5001, 50)]
    a = analyze(_write(tmp_path / "full.log", lines))
    assert a.confidence == {"level": "normal", "note": None}
    assert a.verdict.bottleneck == "compute"              # 0.01 / 0.4: the step hardly waits



def test_a_short_instrumented_log_is_not_told_to_use_instrument(tmp_path):
    # 15 steps of autotune.instrument()'s own log: a short excerpt, but the advice to wrap
    # the loader with autotune.instrument(loader) would be needless: it already is.
    a = analyze(_own_log(tmp_path / "steps.jsonl", n=15))
    assert a.format == "own" and a.confidence["level"] == "low"
    assert "instrument" not in a.confidence["note"], a.confidence["note"]
    assert "a longer run gives firmer figures" in a.confidence["note"]
    # A text log of the same length still gets it.
    b = analyze(_write(tmp_path / "paste.log", _steps("mmcv")[:5]))
    assert "autotune.instrument(loader)" in b.confidence["note"]

# -- hostile side files: over-long lines, deep JSON, a truncated gzip -----------------------

def _own_log(path: Path, n: int = 60, t0: float = 1_700_000_000.0) -> Path:
    """An autotune.instrument() step log: n steps, 0.1 s apart, 20 % of each waiting."""
    return _write(path, [json.dumps({"t": t0 + 0.1 * i, "step": i, "wait_s": 0.02,
                                     "step_s": 0.08}) for i in range(n)])


def _metrics(path: Path, n: int = 10, t0: float = 1_700_000_000.0) -> Path:
    return _write(path, [json.dumps({"time": t0 + i, "interval_s": 1.0}) for i in range(n)])


_PEAK = """
import resource, sys
from autotune.analyze import analyze
a = analyze(sys.argv[1], metrics=sys.argv[2] if len(sys.argv) > 2 else None)
print(a.steps, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _peak_mib(*args: Path) -> tuple[int, int]:
    """(steps, peak RSS in MiB) of analyze() on `args` in a fresh process."""
    r = subprocess.run([sys.executable, "-c", _PEAK, *map(str, args)], capture_output=True,
                       text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    steps, peak = r.stdout.split()
    return int(steps), int(peak)


def _huge_line(path: Path, prefix: bytes = b"1 ", mib: int = 200) -> None:
    with path.open("ab") as f:
        f.write(prefix)
        chunk = b"7" * (1 << 20)
        for _ in range(mib):
            f.write(chunk)
        f.write(b"\n")


@pytest.mark.slow
@pytest.mark.parametrize("side", ["times", "metrics", "steps"])
def test_a_200_mb_line_in_a_side_file_keeps_memory_bounded(tmp_path, side):
    run = tmp_path / "run"
    run.mkdir()
    log = _own_log(run / "steps.jsonl")
    metrics = _metrics(tmp_path / "metrics.jsonl")
    steps, base = _peak_mib(log, metrics)
    if side == "times":
        _write(Path(f"{log}.times"), ["10 1700000000.0"])
        _huge_line(Path(f"{log}.times"))
        args = (log, metrics)
    elif side == "metrics":
        _huge_line(metrics, b'{"time": ')
        args = (log, metrics)
    else:   # a monitor dir whose steps.jsonl starts with the line (read to pick the log)
        (run / "train.log").write_text("")
        body = log.read_bytes()
        log.write_bytes(b"")
        _huge_line(log, b'{"x": ')
        with log.open("ab") as f:
            f.write(body)
        args = (run,)
    steps2, peak = _peak_mib(*args)
    assert steps2 == steps
    print(f"{side}: peak {peak} MiB, {base} MiB without the 200 MB line")
    assert peak - base < 60, f"peak {peak} MiB, {base} MiB without the 200 MB line"


def test_deeply_nested_json_is_a_counted_bad_line(tmp_path):
    deep = '{"t": 1, "wait_s": ' + "[" * 100_000 + "]" * 100_000 + ', "step_s": 1}'
    log = _own_log(tmp_path / "steps.jsonl")
    with log.open("a") as f:
        f.write(deep + "\n")
    metrics = _metrics(tmp_path / "metrics.jsonl")
    with metrics.open("a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    a = analyze(log, metrics=metrics)
    assert a.steps == 60 - a.warmup_steps
    assert a.lines["total"] == 61 and a.lines["skipped"] >= 1
    assert a.system is not None and a.system.bad_lines == 1
    run = tmp_path / "run"   # the same line in a monitor dir's steps.jsonl; its run.json
    run.mkdir()
    (run / "steps.jsonl").write_text(log.read_text())
    (run / "run.json").write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert analyze(run).steps == a.steps


def test_a_truncated_gzip_log_is_analyzed_up_to_where_it_ends(tmp_path):
    log = _own_log(tmp_path / "steps.jsonl", n=400)
    gz = tmp_path / "steps.jsonl.gz"
    whole = gzip.compress(log.read_bytes())
    gz.write_bytes(whole[:len(whole) * 2 // 3])
    a = analyze(gz)
    n = a.lines["total"]
    assert 0 < n < 400 and a.steps > 0
    assert any(f"{gz}: truncated gzip after {n} lines" in w for w in a.warnings), a.warnings
    r = subprocess.run([sys.executable, "-m", "autotune", "analyze", str(gz)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"truncated gzip after {n} lines" in " ".join((r.stdout + r.stderr).split())


def test_a_log_name_with_control_characters_is_printed_escaped(tmp_path):
    log = _own_log(tmp_path / "steps\x1b[31mRED.jsonl")
    r = subprocess.run([sys.executable, "-m", "autotune", "analyze", str(log)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\x1b" not in r.stdout + r.stderr
    assert "steps\\x1b[31mRED.jsonl" in "".join(r.stdout.split())
    r = subprocess.run([sys.executable, "-m", "autotune", "analyze", str(tmp_path / "no\x1b[2J")],
                       capture_output=True, text=True, cwd=REPO)   # the error line too
    assert r.returncode == 2 and "\x1b" not in r.stderr, r.stderr
    assert "no\\x1b[2J" in "".join(r.stderr.split()), r.stderr


def test_the_runs_warm_up_is_not_an_epoch_start_stall(tmp_path):
    # Kept workers: the run's first batches wait 2 s (workers starting), later epochs start
    # with no stall. The warm-up is left out of every figure, the epoch starts' too.
    log = tmp_path / "steps.jsonl"
    lines = []
    for epoch in range(3):
        for i in range(40):
            wait = 2.0 if epoch == 0 and i < 3 else 0.01
            lines.append(json.dumps({"t": 1000.0 + 100 * epoch + i, "epoch": epoch, "step": i,
                                     "wait_s": wait, "step_s": 0.1, "batch": 8}))
    log.write_text("\n".join(lines) + "\n")
    a = analyze(log)
    st = a.epoch_starts
    assert st["mean_wait_s"] == pytest.approx(0.01), st
    assert [s["warmup"] for s in st["listed"]].count(True) == 5   # listed, flagged
