"""A study shared by several hosts (issue 15) on a real PostgreSQL 15 server that this module
starts (initdb, pg_ctl as the postgres user, on 127.0.0.1, in a temporary directory) and
stops. "Hosts" are searches in their own UTS namespaces (`unshare -u`, their own hostname)
on this machine: two at once, a third killed mid-trial (SIGKILL), a fourth that reclaims
its trial after the heartbeat grace period (and prints all it says, with the password in
its URL's query: none of it may show the password). Searches are tiny: 4 configurations, 1 s
windows, no probe, no confirmation."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from search_waits import wait_for

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
USER, PASSWORD, DB = "tuner", "s3cr3t-pw-42", "optuna"
# Hosts that run together judge each other with a roomy grace (a beat delayed on 2 busy
# cores must not look like a dead host); the resuming host with a short one.
GRACE, SHORT_GRACE = "20", "3"

pytestmark = [pytest.mark.slow, pytest.mark.root]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True,
                          text=True, timeout=120, **kw)


@pytest.fixture(scope="module")
def pg():
    """A PostgreSQL 15 server on 127.0.0.1:PORT (password auth over TCP), a role and a
    database for the studies; stopped and removed at the end."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL 15 is not installed (apt-get install postgresql; "
                    "scripts/setup does it as root)")
    if not shutil.which("runuser"):
        pytest.skip("runuser (util-linux) is missing")
    base = Path(tempfile.mkdtemp(prefix="autotune-pg-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    shutil.chown(base, "postgres", "postgres")
    shutil.chown(sock, "postgres", "postgres")
    port = _free_port()
    r = _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres",
                     "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8")
    assert r.returncode == 0, r.stderr
    r = _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"),
                     "-w", "-o", f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 "
                                 "-c fsync=off -c max_connections=100", "start")
    assert r.returncode == 0, r.stderr + (base / "server.log").read_text()
    try:
        psql = [str(PG_BIN.parent / "bin" / "psql"), "-h", str(sock), "-p", str(port), "-U",
                "postgres", "-v", "ON_ERROR_STOP=1", "-c"]
        for sql in (f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'",
                    f"CREATE DATABASE {DB} OWNER {USER}"):
            r = _as_postgres(*psql, sql)
            assert r.returncode == 0, r.stderr
        yield {"port": port, "url": f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/{DB}",
               "url_nopw": f"postgresql://{USER}@127.0.0.1:{port}/{DB}", "dir": base}
    finally:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def space(tmp_path_factory) -> str:
    """Four configurations."""
    p = tmp_path_factory.mktemp("space") / "four.yaml"
    p.write_text("num_workers: {choices: [0, 1, 2, 3]}\nprefetch_factor: {choices: [2]}\n"
                 "persistent_workers: {choices: [false]}\npin_memory: {choices: [false]}\n")
    return str(p)


def _search(host: str, ds: Path, out: Path, storage: str, space: str, study: str, trials: int,
            env: dict[str, str] | None = None, grace: str = GRACE,
            quiet: bool = True) -> subprocess.Popen:
    """`autotune search` as host `host`: its own UTS namespace and hostname."""
    cmd = [sys.executable, "-m", "autotune", *(["-q"] if quiet else []), "search", str(ds), "--preset", "decode-only",
           "--batch-size", "8", "--compute-ms", "5", "--seconds", "1", "--space", space,
           "--no-probe", "--warm", "--confirm", "0", "--no-prune", "--out", str(out),
           "--study", study,
           "--storage", storage, "--trials", str(trials), "--heartbeat-grace", grace,
           "--json", "-"]
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', host,
                             *cmd], cwd=ROOT, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _study(url: str, name: str):
    import optuna

    from autotune.search.shared import with_driver

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=with_driver(url))


def _search_pid(unshare: subprocess.Popen) -> int:
    """The search process inside `unshare ... exec` (unshare execs sh, which execs it)."""
    return unshare.pid


def test_two_hosts_a_killed_host_and_a_resuming_host_share_one_study(
        pg, small_dataset, space, tmp_path, live_measurements):
    study = "shared-4"
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{pg['port']}:{DB}:{USER}:{PASSWORD}\n")
    pgpass.chmod(0o600)
    # host-a: the password in the URL; host-b: PGPASSWORD; host-c: a .pgpass file;
    # host-d: sslmode=disable and the password in the URL's query, as libpq reads them.
    # (a grace longer than host-a is stopped for below, so host-b never reclaims its trial)
    a = _search("host-a", small_dataset, tmp_path / "a", pg["url"], space, study, 2, grace="90")
    b = _search("host-b", small_dataset, tmp_path / "b", pg["url_nopw"], space, study, 2,
                {"PGPASSWORD": PASSWORD}, grace="90")

    # one search per host per study: a second one named host-a is refused with a's pid.
    # host-a is stopped (SIGSTOP: alive, its claim held) while the second one starts: on a
    # busy machine host-a and host-b had measured both trials and host-a had left before the
    # second one's interpreter was up, and it found nothing to refuse.
    wait_for(lambda: bool(live_measurements(a.pid)), 120, "host-a's first measurement")
    os.kill(_search_pid(a), signal.SIGSTOP)
    try:
        a2 = _search("host-a", small_dataset, tmp_path / "a2", pg["url"], space, study, 2)
        out2, err2 = a2.communicate(timeout=120)
    finally:
        os.kill(_search_pid(a), signal.SIGCONT)
    assert a2.returncode == 1, err2
    assert f"pid {_search_pid(a)}" in err2 and "host-a" in err2 and len(err2.strip().splitlines()) == 1

    outs = {}
    for name, p in (("a", a), ("b", b)):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs[name] = (json.loads(out), err)
    s = _study(pg["url"], study)
    # (--no-prune: on a busy machine a trial's 1 s windows swing 3x, and a pruned trial is
    # no complete one; this test is about sharing, not pruning)
    done = [t for t in s.trials if t.user_attrs.get("record", {}).get("state") == "complete"]
    assert len(done) == 2, [t.user_attrs.get("record", {}).get("state") for t in s.trials]
    # (--trials 2 is the study's total, not each host's)
    hosts = {t.user_attrs["record"]["host"]["hostname"] for t in done}
    assert hosts <= {"host-a", "host-b"}

    # host-c: killed (SIGKILL) while it measures a trial
    c = _search("host-c", small_dataset, tmp_path / "c", pg["url_nopw"], space, study, 4,
                {"PGPASSFILE": str(pgpass)})

    def c_measuring() -> bool:
        from optuna.trial import TrialState

        running = [t for t in _study(pg["url"], study).get_trials(states=(TrialState.RUNNING,))
                   if t.user_attrs.get("owner", {}).get("host") == "host-c"
                   and t.user_attrs.get("claim")]
        return bool(running) and bool(live_measurements(c.pid))

    wait_for(c_measuring, 180, "host-c's measurement")
    c.kill()
    c.communicate(timeout=30)

    # host-d, after its grace period: reclaims host-c's trial and measures it again; the
    # password in the URL's query this time, and everything a search says (not -q)
    time.sleep(int(SHORT_GRACE) + 1)
    d_url = f"{pg['url_nopw']}?sslmode=disable&connect_timeout=5&password={PASSWORD}"
    d = _search("host-d", small_dataset, tmp_path / "d", d_url, space, study, 4,
                grace=SHORT_GRACE, quiet=False)
    out, err = d.communicate(timeout=300)
    assert d.returncode == 0, err[-3000:]
    res_d = json.loads(out)
    assert res_d["storage"] == (f"{pg['url_nopw']}?sslmode=disable&connect_timeout=5"
                                f"&password=***")
    assert _leaks(PASSWORD, out, err, tmp_path / "d") == [], err[-3000:]

    from optuna.trial import TrialState

    s = _study(pg["url"], study)
    assert not s.get_trials(states=(TrialState.RUNNING,)), "a trial was left RUNNING"
    records = [t.user_attrs["record"] for t in s.trials if t.user_attrs.get("record")]
    complete = Counter(json.dumps(r["params"], sort_keys=True) for r in records
                       if r["state"] == "complete")
    assert len(complete) == 4 and set(complete.values()) == {1}, complete  # none twice
    lost = [r for r in records if r["state"] == "interrupted"]
    assert len(lost) == 1 and "host-c" in lost[0]["reason"] and "heartbeat" in lost[0]["reason"]
    assert lost[0]["host"]["hostname"] == "host-c"
    again = [r for r in records if r["state"] == "complete" and r["params"] == lost[0]["params"]]
    assert again and again[0]["host"]["hostname"] == "host-d"
    # the report groups by host; every host is of one class here (one machine)
    assert res_d["host"]["hostname"] == "host-d"
    # (which of host-a and host-b measured the first two trials is the scheduler's call:
    # on a busy machine one took both)
    assert len(res_d["hosts"]) == 1 and set(res_d["hosts"][0]["hostnames"]) >= hosts | {"host-d"}
    html = (tmp_path / "d" / "report.html").read_text()
    assert "Hosts sharing the study" in html and "host-c" in html

    # the password appears nowhere: results, reports, logs
    for name in "abd":
        for f in ("search.json", "report.html"):
            assert PASSWORD not in (tmp_path / name / f).read_text(), (name, f)
    for _, err in outs.values():
        assert PASSWORD not in err
    assert PASSWORD not in err2 + out2
    assert outs["a"][0]["storage"] == f"postgresql://{USER}:***@127.0.0.1:{pg['port']}/{DB}"
    assert PASSWORD not in json.dumps(outs["a"][0])


def test_an_unreachable_server_is_one_line_and_nothing_is_written(small_dataset, tmp_path,
                                                                  space):
    port = _free_port()  # nobody listens there
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autotune", "-q", "search", str(small_dataset),
                        "--storage", f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/{DB}",
                        "--study", "x", "--out", str(out), "--no-probe", "--space", space],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "host 127.0.0.1" in lines[0] and f"port {port}" in lines[0], lines[0]
    assert "psycopg2" in lines[0] and "Connection refused" in lines[0], lines[0]
    assert PASSWORD not in r.stderr
    assert not out.exists()


def test_sslmode_is_passed_to_libpq(pg, small_dataset, tmp_path, space):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autotune", "-q", "search", str(small_dataset),
                        "--storage", pg["url"] + "?sslmode=require", "--study", "ssl",
                        "--out", str(out), "--no-probe", "--space", space],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "SSL" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert PASSWORD not in r.stderr and not out.exists()


def test_journal_storage_on_a_shared_path(small_dataset, tmp_path, space):
    journal = tmp_path / "shared" / "study.log"
    p = _search("host-j", small_dataset, tmp_path / "j", f"journal:{journal}", space, "j", 1)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    d = json.loads(out)
    assert d["storage"] == f"journal:{journal}" and journal.is_file()
    assert [t["host"]["hostname"] for t in d["trials"] if t["state"] == "complete"] == ["host-j"]


QUERY_PW = "s3cret-in-query-77"
AT_PW = "p@ss-tail-with-at-88"


def _leaks(secret: str, r_out: str, r_err: str, out: Path) -> list[str]:
    """Where `secret` (or its tail after an '@') occurs: the streams and every output file."""
    needles = {secret, *(p for p in secret.split("@")[1:] if len(p) >= 3)}
    where = [name for name, text in (("stdout", r_out), ("stderr", r_err))
             if any(n in text for n in needles)]
    for f in (out.rglob("*") if out.exists() else []):
        if f.is_file() and any(n.encode() in f.read_bytes() for n in needles):
            where.append(str(f))
    return where


def test_redaction_hides_every_form_of_a_password():
    from autotune.search.shared import redact, scrub

    cases = {
        f"postgresql://u@h:5/db?connect_timeout=1&password={QUERY_PW}": QUERY_PW,
        f"postgresql://u@h/db?sslpassword={QUERY_PW}&application_name=a@b": QUERY_PW,
        f"postgresql://u@h/db?pass%77ord={QUERY_PW}": QUERY_PW,
        f"postgresql://u:{AT_PW}@h:5/db": AT_PW,
        "postgresql://u:s%33cret-pct@h/db": "s3cret-pct",
        "mysql://u@h/db?passwd=my-pw-99": "my-pw-99",
    }
    for url, pw in cases.items():
        shown = redact(url)
        assert "***" in shown and pw not in shown and url.split("?")[0].split("@")[-1] not in \
            pw, (url, shown)
        assert not any(t in shown for t in pw.split("@")[1:]), (url, shown)
        assert scrub(f"driver said: bad password {pw} for {url}", url).count(pw) == 0
    assert redact(f"postgresql://u:{AT_PW}@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact("postgresql://u@h/db?application_name=a@b") == \
        "postgresql://u@h/db?application_name=a@b"
    assert redact("journal:/shared/x.log") == "journal:/shared/x.log"


def test_a_failing_shared_search_writes_and_prints_no_password(small_dataset, tmp_path, space):
    port = _free_port()  # nobody listens there
    out = tmp_path / "out"
    for url, pw in ((f"postgresql://{USER}@127.0.0.1:{port}/{DB}?connect_timeout=1"
                     f"&password={QUERY_PW}", QUERY_PW),
                    (f"postgresql://{USER}:{AT_PW}@127.0.0.1:{port}/{DB}", AT_PW)):
        r = subprocess.run([sys.executable, "-m", "autotune", "search", str(small_dataset),
                            "--storage", url, "--study", "x", "--out", str(out), "--no-probe",
                            "--space", space], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 1, r.stderr
        assert "***" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert _leaks(pw, r.stdout, r.stderr, out) == [], r.stderr
