"""Each log format, parsed from lines written with the original programs' own format
strings (tests/analyze/data), and the damaged lines a real log holds: cut mid-way,
spliced by two ranks, garbage, over-long, gzip-compressed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from autotune.analyze import analyze, detect_format
from autotune.analyze.parsers import (ImagenetParser, LightningParser, OwnParser, RegexParser,
                                      Skip, TimmParser, line_timestamp)
from autotune.analyze.reader import MAX_LINE, iter_lines
from autotune.errors import UsageError

DATA = Path(__file__).resolve().parent / "data"
IMAGENET = ("Epoch: [3][ 10/5005]\tTime  0.345 ( 0.567)\tData  0.123 ( 0.234)\t"
            "Loss 6.9077e+00 (6.9100e+00)\tAcc@1   0.00 (  0.10)\tAcc@5   0.39 (  0.50)")
TIMM = ("Train: 0 [  50/5004 (  1%)]  Loss: 6.90 (6.92)  Time: 0.370s,  691.04/s  "
        "(0.419s,  611.41/s)  LR: 1.000e-05  Data: 0.012 (0.045)")


def _feed(parser, line: str):
    try:
        return parser.feed(line, 1)
    except Skip as e:
        return e.reason


# -- pytorch/examples imagenet -----------------------------------------------------------

def test_imagenet_line():
    [r] = ImagenetParser().feed(IMAGENET, 7)
    assert (r.epoch, r.index, r.total, r.iter_s, r.data_s) == (3, 10, 5005, 0.345, 0.123)
    assert r.step_s == pytest.approx(0.222) and r.lineno == 7 and r.batch is None


def test_imagenet_test_lines_and_other_output_are_counted_not_parsed():
    p = ImagenetParser()
    assert _feed(p, "Test: [ 10/196]\tTime  0.100 ( 0.100)\tLoss 1.0 (1.0)") == "evaluation line"
    assert _feed(p, "=> creating model 'resnet50'") == "other output"
    assert _feed(p, "") == "other output"


def test_imagenet_truncated_line():
    cut = IMAGENET[:IMAGENET.index("Data") + 9]    # "... Data  0.12"
    assert _feed(ImagenetParser(), cut) == "truncated or garbled record"


def test_imagenet_spliced_line_keeps_the_whole_record():
    # Rank A's line cut after "Time  0.3", rank B's whole line written into it.
    p = ImagenetParser()
    recs = p.feed(IMAGENET[:30] + IMAGENET.replace("[3]", "[4]"), 1)
    assert [r.epoch for r in recs] == [4]
    assert p.dropped == {"truncated or garbled record": 1}
    both = p.feed(IMAGENET + "  " + IMAGENET.replace("[ 10/", "[ 20/"), 2)
    assert [r.index for r in both] == [10, 20]


def test_imagenet_fixture_log():
    a = analyze(DATA / "imagenet.log", batch_size=256)
    assert a.format == "imagenet"
    assert a.lines["skipped_by_reason"] == {"evaluation line": 10, "other output": 4}
    assert a.steps == 39 and a.warmup_steps == 1     # 2 epochs x 20 lines, the first left out
    assert a.batches == 381                          # lines stand for 10 batches each
    assert a.batch_size == 256 and a.batch_size_source == "--batch-size"
    assert 0.35 < a.data_time_share < 0.42
    assert a.step_time_s["p50"] == pytest.approx(0.1, abs=0.012)


# -- timm ----------------------------------------------------------------------------------

def test_timm_line_and_batch_from_rate():
    [r] = TimmParser().feed(TIMM, 1)
    assert (r.epoch, r.index, r.total) == (0, 50, 5004)
    assert (r.iter_s, r.data_s, r.rate) == (0.370, 0.012, 691.04)
    assert r.batch == 256                            # 691.04/s x 0.370 s


def test_timm_with_logging_prefix_and_timestamp():
    line = "2024-05-01 12:00:03,250 - INFO - train - " + TIMM
    [r] = TimmParser().feed(line, 1)
    assert r.end_time == pytest.approx(line_timestamp("2024-05-01 12:00:03.250"))
    assert r.end_time % 1 == pytest.approx(0.25)


def test_timm_truncated_and_eval():
    assert _feed(TimmParser(), TIMM[:TIMM.index("Data: ") + 8]) == "truncated or garbled record"
    assert _feed(TimmParser(), "Test: [   0/195]  Time: 0.5 (0.5)  Loss:  6.9 (6.9)") == "evaluation line"


def test_timm_fixture_log():
    a = analyze(DATA / "timm.log", batch_size=128)
    assert a.format == "timm" and a.batch_size == 256
    assert a.batch_size_source.startswith("the log")
    assert any("--batch-size 128 differs" in w for w in a.warnings)
    assert 640 < a.images_per_s < 700                  # ~256 / 0.37 s
    assert 0.02 < a.data_time_share < 0.1


# -- Lightning -----------------------------------------------------------------------------

def test_lightning_extended_report_last_fit_table():
    a = analyze(DATA / "lightning.log", batch_size=32)
    assert a.format == "lightning"
    assert a.steps == 1000
    assert a.data_time_share == pytest.approx(45.0 / 70.0)
    assert a.step_time_s["p50"] == pytest.approx(0.025) and a.step_time_s["p95"] is None
    assert a.images_per_s == pytest.approx(32 * 1000 / 70.0)
    assert a.profile is not None and "train_dataloader_next" in a.profile.source
    assert a.trend["findings"][0].startswith("no trend")


def test_lightning_old_short_table():
    a = analyze(DATA / "lightning_old.log", format="lightning")
    assert a.steps == 1000 and a.data_time_share == pytest.approx(0.5)
    assert a.profile.source == "get_train_batch"


def test_lightning_truncated_row_is_counted():
    p = LightningParser()
    assert _feed(p, "|  [_TrainingEpochLoop].train_dataloader_next  \t|  0.04") == "truncated or garbled record"
    assert p.finish() == []


# -- own JSONL -----------------------------------------------------------------------------

OWN = '{"t":1714557600.000000,"epoch":0,"step":7,"wait_s":0.010000,"step_s":0.100000,"batch":64}'


def test_own_record_and_header():
    p = OwnParser()
    assert p.feed('{"autotune": "steps", "version": 1, "loader": {"num_workers": 4}}', 1) == []
    assert p.meta["loader"]["num_workers"] == 4
    [r] = p.feed(OWN, 2)
    assert (r.index, r.batch, r.data_s, r.iter_s) == (7, 64, 0.01, pytest.approx(0.11))
    assert r.end_time == pytest.approx(1714557600.11)


def test_own_cut_and_spliced_lines():
    p = OwnParser()
    assert _feed(p, OWN[:40]) == "truncated or garbled record"
    assert len(p.feed(OWN[:40] + OWN, 1)) == 1          # a cut record, then a whole one
    assert len(p.feed(OWN + OWN.replace('"step":7', '"step":8'), 2)) == 2
    assert _feed(p, '{"t": 1, "wait_s": "x", "step_s": 0.1}') == "truncated or garbled record"
    assert _feed(p, '{"t": 1, "wait_s": -1, "step_s": 0.1}').startswith("impossible figure")


# -- regex ---------------------------------------------------------------------------------

def test_regex_yaml(tmp_path):
    y = tmp_path / "fmt.yaml"
    y.write_text("pattern: 'ep (?P<epoch>\\d+) it (?P<index>\\d+) data (?P<data>[\\d.]+)ms "
                 "iter (?P<iter>[\\d.]+)ms bs (?P<batch>\\d+)'\nunits: ms\nanchor: 'ep \\d+ it '\n")
    log = tmp_path / "my.log"
    log.write_text("".join(f"ep 0 it {i} data 30.0ms iter 100.0ms bs 32\n" for i in range(40))
                   + "ep 0 it 40 data 3\nhello\n")
    a = analyze(log, regex=y)
    assert a.format == "regex" and a.batch_size == 32
    assert a.data_time_share == pytest.approx(0.3)
    assert a.lines["skipped_by_reason"] == {"truncated or garbled record": 1, "other output": 1}


@pytest.mark.parametrize("text, fix", [
    ("pattern: 'it (?P<iter>[\\d.]+)'", "(?P<data>...)"),
    ("pattern: 'data (?P<data>[\\d.]+) (?P<iter'", "not a valid regular expression"),
    ("pattern: 'd (?P<data>\\d) i (?P<iter>\\d) (?P<loss>\\d)'", "unknown group name(s) loss"),
    ("patern: 'x'", "expected a mapping with a 'pattern'"),
])
def test_regex_errors_name_the_file_and_fix(tmp_path, text, fix):
    y = tmp_path / "bad.yaml"
    y.write_text(text + "\n")
    with pytest.raises(UsageError) as e:
        RegexParser.from_yaml(y)
    assert str(y) in str(e.value) and fix in str(e.value)


# -- detection and reading ---------------------------------------------------------------

@pytest.mark.parametrize("name, fmt", [("imagenet.log", "imagenet"), ("timm.log", "timm"),
                                       ("lightning.log", "lightning")])
def test_detect_format(name, fmt):
    assert detect_format(DATA / name) == fmt


def test_unknown_log_says_what_to_do(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("epoch 1 loss 0.3\n" * 10)
    with pytest.raises(UsageError) as e:
        analyze(log)
    msg = str(e.value)
    assert str(log) in msg and "--regex" in msg and "autotune.instrument" in msg


def test_gzip_log_and_crlf(tmp_path):
    raw = (DATA / "imagenet.log").read_text().replace("\n", "\r\n").encode()
    gz = tmp_path / "imagenet.log.gz"
    gz.write_bytes(gzip.compress(raw))
    a = analyze(gz, batch_size=256)
    assert a.format == "imagenet" and a.steps == 39


def test_over_long_line_is_skipped_in_pieces(tmp_path):
    log = tmp_path / "long.log"
    with log.open("w") as f:
        f.write(IMAGENET + "\n")
        f.write("x" * (3 * MAX_LINE + 5) + "\n")          # a progress bar without newline
        f.write(IMAGENET.replace("[ 10/", "[ 20/") + "\n")
    lines = list(iter_lines(log))
    assert [ln.too_long for ln in lines] == [False, True, False]
    assert lines[-1].end_offset == log.stat().st_size
    a = analyze(log, batch_size=8, warmup=0)
    assert a.lines["skipped_by_reason"] == {"line too long (over 1 MiB)": 1}
    assert a.steps == 2


def test_own_log_spliced_by_two_writers(tmp_path):
    # Two ranks writing one file without care: pieces of lines, whole lines, junk.
    recs = [json.dumps({"t": 1000.0 + i, "epoch": 0, "step": i, "wait_s": 0.05,
                        "step_s": 0.05, "batch": 8, "rank": i % 2}) for i in range(100)]
    text = "\n".join(recs[:50]) + "\n" + recs[50][:25] + recs[51] + "\n" + "\n".join(recs[52:]) + "\n"
    log = tmp_path / "steps.jsonl"
    log.write_text(text)
    a = analyze(log, warmup=0)
    assert a.steps == 99 and a.ranks == 2
    assert a.lines["skipped_by_reason"] == {
        "truncated or garbled record (piece of a spliced line)": 1}
    assert a.data_time_share == pytest.approx(0.5)
