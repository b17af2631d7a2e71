"""One study shared by searches on several hosts (PostgreSQL, MySQL, or Optuna's journal
file on a shared filesystem).

    storage      open_storage(url, grace): RDBStorage with Optuna's heartbeat (the
                 database's clock: hosts' clocks may differ) or a JournalStorage
    redact       the URL as search.json, the report and every message show it (no password)
    claims       a configuration is claimed by one trial before it is measured (a row in
                 `autotune_claims`, or an O_EXCL file beside the journal): one running
                 or complete elsewhere is skipped, never measured twice
    hosts        one search per host per study (its hostname and pid are claimed); each
                 trial records the host that measured it (hostname, CPU model, cores, the
                 dataset's storage class) and hosts are compared only within one class
    heartbeat    sent while a trial is measured; a trial whose host is silent longer than
                 the grace period is marked interrupted (by whichever host looks next), its
                 claim released, and the configuration measured again
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, unquote_plus

from autotune.errors import AutotuneError, UsageError
from autotune.search.guard import owner_gone

JOURNAL = "journal:"
CLAIMS_TABLE = "autotune_claims"


# -- URLs ----------------------------------------------------------------------------------

# Query keys whose values are secrets (libpq's password and sslpassword, MySQL's passwd,
# tokens and keys of other drivers); matched on the decoded key, case-insensitively.
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|credential|auth|apikey|api_key|access_key",
                         re.IGNORECASE)
_HIDDEN = "***"


def _userinfo_end(rest: str) -> int:
    """Where the user:password part of `rest` (the URL after '://') ends: the last '@' before
    the query, so that an unescaped '@' (or '/') inside the password stays inside it; -1
    when there is none. The query starts at the first '?' after the first '@' (a '?' in a
    query value or a password before it is kept where it is)."""
    first = rest.find("@")
    if first < 0:
        return -1
    q = rest.find("?", first + 1)
    return rest.rfind("@", 0, q if q >= 0 else len(rest))


def _redact_query(query: str) -> str:
    """`query` with the value of every secret key hidden (the key decoded first:
    `pass%77ord=` is `password=`)."""
    parts = []
    for part in re.split(r"([&;])", query):
        key, eq, _value = part.partition("=")
        if eq and _SECRET_KEY.search(unquote_plus(key)):
            part = f"{key}={_HIDDEN}"
        parts.append(part)
    return "".join(parts)


def redact(url: str) -> str:
    """The storage URL as every output shows it (search.json, the report, every message):
    the password hidden in each form it can take — in the userinfo (an unescaped '@' in it
    included: `postgresql://user:***@host/db`), as a query value (`?password=`,
    `sslpassword=`, percent-encoded keys) — and any secret's value that occurs elsewhere in
    the text. A journal path and SQLite URLs have none and are returned as they are."""
    if "://" not in url or url.startswith("sqlite") or url.startswith(JOURNAL):
        return url
    scheme, rest = url.split("://", 1)
    at = _userinfo_end(rest)
    head, tail = "", rest
    if at >= 0:
        user, colon, _pw = rest[:at].partition(":")
        head, tail = user + (f":{_HIDDEN}" if colon else "") + "@", rest[at + 1:]
    path, qmark, query = tail.partition("?")
    text = f"{scheme}://{head}{path}{qmark}{_redact_query(query)}"
    return scrub(text, url)


def _raw_at(url: str) -> bool:
    """Whether the password in `url`'s userinfo holds an unescaped '@'."""
    rest = url.split("://", 1)[-1]
    at = _userinfo_end(rest)
    return at >= 0 and "@" in rest[:at].partition(":")[2]


def secrets(url: str) -> list[str]:
    """The secret values `url` carries (its userinfo password, secret query values), in the
    forms they may be printed in (as written, and percent-decoded)."""
    if "://" not in url:
        return []
    rest = url.split("://", 1)[1]
    found = []
    at = _userinfo_end(rest)
    if at >= 0 and ":" in rest[:at]:
        pw = rest[:at].split(":", 1)[1]
        # SQLAlchemy ends the password at its first '@' and takes the rest for the host
        # name, which the driver's message repeats: each piece is a secret too.
        found.extend([pw, *pw.split("@")])
    query = rest[at + 1:].partition("?")[2]
    for part in re.split(r"[&;]", query):
        key, eq, value = part.partition("=")
        if eq and _SECRET_KEY.search(unquote_plus(key)):
            found.append(value)
    try:  # the password as SQLAlchemy reads it (what the driver is given)
        from sqlalchemy.engine import make_url

        pw = make_url(url).password
        if pw:
            found.append(str(pw))
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads
        pass
    forms = {f for v in found for f in (v, unquote(v), unquote_plus(v))}
    # Very short values are not searched for in text: they would hide ordinary letters.
    return sorted((f for f in forms if len(f) >= 3), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` (a driver's message, a line naming `url`) with every secret of `url` hidden."""
    for s in secrets(url):
        text = text.replace(s, _HIDDEN)
    return text


POSTGRES_INSTALL = "pip install 'autotune-loader[postgres]'"


def with_driver(url: str) -> str:
    """postgresql://... names the driver of the `postgres` extra (psycopg2): SQLAlchemy 2.1
    would pick psycopg 3 otherwise. A URL naming its driver is kept. With neither driver
    installed, one line naming the extra (SQLAlchemy's own error names only the module)."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            try:
                import psycopg  # noqa: F401 - psycopg 3 installed: SQLAlchemy's default
            except ImportError:
                try:
                    import psycopg2  # noqa: F401
                except ImportError:
                    raise UsageError(f"{redact(url)}: a study on PostgreSQL needs a driver, "
                                     "and neither psycopg2 nor psycopg is installed: "
                                     f"{POSTGRES_INSTALL}.", setting="storage") from None
                return "postgresql+psycopg2://" + url[len(scheme):]
            return "postgresql://" + url[len(scheme):]
    return url


def is_shared(url: str) -> bool:
    """Storages several hosts can share (a server database, or a journal file)."""
    return url.startswith(JOURNAL) or ("://" in url and not url.startswith("sqlite"))


def _host_port(url: str) -> tuple[str, str]:
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        host = u.host or u.query.get("host") or os.environ.get("PGHOST") or "localhost (socket)"
        port = u.port or os.environ.get("PGPORT") or (5432 if u.get_backend_name().startswith(
            "postgres") else 3306)
        return str(host), str(port)
    except Exception:  # noqa: BLE001
        return "?", "?"


def unreachable(url: str, e: BaseException) -> AutotuneError:
    """One line: which server, and what the driver said."""
    host, port = _host_port(url)
    host = scrub(host, url)
    orig = getattr(e, "orig", None) or e
    msg = scrub(" ".join(str(orig).split()), url) or type(orig).__name__
    driver = type(orig).__module__.split(".", 1)[0]
    if "://" in url and not url.startswith("sqlite"):
        return AutotuneError(
            f"cannot open the study on {redact(url)} at host {host} port {port} ({driver}: "
            f"{msg}); check that the server runs and accepts this user (PGPASSWORD, "
            "~/.pgpass, sslmode as in libpq"
            f"{'; write an @ in the password as %40' if _raw_at(url) else ''}). Nothing was "
            "measured or written.",
            setting="storage")
    return AutotuneError(f"cannot open Optuna storage {redact(url)} ({type(orig).__name__}: "
                         f"{msg}); check the URL.", setting="storage")


# -- storage -------------------------------------------------------------------------------

def heartbeat_interval(grace: int) -> int:
    """Seconds between heartbeats: a few within one grace period."""
    return max(1, grace // 4)


def open_storage(url: str, grace: int) -> Any:
    """The Optuna storage for `url`; raises AutotuneError (one line) when unreachable."""
    import warnings

    import optuna

    if url.startswith(JOURNAL):
        path = url[len(JOURNAL):]
        if not path:
            raise UsageError("journal storage needs a path: --storage journal:/shared/study.log",
                             setting="storage")
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        Path(path).absolute().parent.mkdir(parents=True, exist_ok=True)
        try:
            # An O_EXCL lock file works on NFS, where symlink and flock locks may not.
            return optuna.storages.JournalStorage(
                JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
        except OSError as e:
            raise AutotuneError(f"{path}: cannot open the journal ({e.strerror or e}).",
                                setting="storage") from e
    kw: dict[str, Any] = {}
    if url.startswith("sqlite:///"):
        # SQLite serialises writers; a generous busy timeout lets a second search process
        # on the same file wait its turn instead of failing with "database is locked".
        kw["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    else:
        kw["engine_kwargs"] = {"pool_pre_ping": True}
        kw["heartbeat_interval"] = heartbeat_interval(grace)
        kw["grace_period"] = grace
    from sqlalchemy import exc as sa_exc

    driver_url = with_driver(url)   # before the retries: a missing driver is no server error
    from sqlalchemy.engine import make_url

    try:
        make_url(driver_url).get_dialect()  # a scheme SQLAlchemy has no dialect for
    except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError):
        raise UsageError(f"{redact(url)}: not a storage URL a study can use; give "
                         "sqlite:///FILE, postgresql://USER@HOST/DB, mysql://USER@HOST/DB "
                         "or journal:FILE.", setting="storage") from None
    for attempt in range(4):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # heartbeat_interval is "experimental"
                return optuna.storages.RDBStorage(driver_url, **kw)
        except (sa_exc.IntegrityError, sa_exc.ProgrammingError) as e:
            # Two hosts creating Optuna's tables at the same moment: one of them loses the
            # race; its second look finds the tables made.
            if attempt == 3:
                raise unreachable(url, e) from e
            time.sleep(0.5)
        except Exception as e:  # noqa: BLE001 - SQLAlchemy / driver errors: say which server
            raise unreachable(url, e) from e
    raise AssertionError("unreachable")


# -- hosts ---------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown"


def host_info(dataset: Path) -> dict[str, Any]:
    """Who measures: hostname, CPU model, usable cores, the dataset's storage class; `key`
    names the class of hosts whose figures compare (hostname not included)."""
    from autotune.cpus import usable_cores
    from autotune.probe.classify import classify

    try:
        storage = classify(dataset).klass
    except Exception:  # noqa: BLE001 - a path classify cannot read: unknown, not a failure
        storage = "unknown"
    info = {"hostname": socket.gethostname(), "cpu_model": _cpu_model(),
            "cores": usable_cores(), "storage_class": storage}
    info["key"] = hashlib.sha1(json.dumps([info["cpu_model"], info["cores"], storage]).encode()
                               ).hexdigest()[:8]
    return info


def host_label(h: dict[str, Any] | None) -> str:
    if not h:
        return "?"
    return (f"{h.get('hostname', '?')} ({h.get('cpu_model', '?')}, {h.get('cores', '?')} cores, "
            f"{h.get('storage_class', '?')})")


# -- claims --------------------------------------------------------------------------------

class Claims:
    """Names claimed by one holder at a time. This base grants everything: one search
    process owns the study (SQLite, held by StudyFileLock)."""

    def claim(self, name: str, holder: dict[str, Any]) -> dict[str, Any] | None:
        """None when `name` is now ours; else the current holder."""
        return None

    def release(self, name: str, trial: int | None = None) -> None:
        """Give `name` up (only if `trial` holds it, when given)."""

    def holder(self, name: str) -> dict[str, Any] | None:
        return None


class SqlClaims(Claims):
    """Rows of `autotune_claims` (study_id, name) -> holder, in the study's database: the
    primary key makes the first INSERT win on every host."""

    def __init__(self, engine: Any, study_id: int) -> None:
        import sqlalchemy as sa

        self.sa, self.engine, self.study_id = sa, engine, study_id
        meta = sa.MetaData()
        self.table = sa.Table(CLAIMS_TABLE, meta,
                              sa.Column("study_id", sa.Integer, primary_key=True),
                              sa.Column("name", sa.String(255), primary_key=True),
                              sa.Column("trial", sa.Integer, nullable=True),
                              sa.Column("holder", sa.Text, nullable=False))
        for attempt in range(3):
            try:
                meta.create_all(engine, checkfirst=True)
                break
            except sa.exc.SQLAlchemyError:  # two hosts creating it at once: one wins
                if attempt == 2:
                    raise
                time.sleep(0.2)

    def claim(self, name: str, holder: dict[str, Any]) -> dict[str, Any] | None:
        sa = self.sa
        try:
            with self.engine.begin() as c:
                c.execute(self.table.insert().values(study_id=self.study_id, name=name,
                                                     trial=holder.get("trial"),
                                                     holder=json.dumps(holder)))
            return None
        except sa.exc.IntegrityError:
            return self.holder(name) or {"hostname": "?"}

    def release(self, name: str, trial: int | None = None) -> None:
        t = self.table
        cond = (t.c.study_id == self.study_id) & (t.c.name == name)
        if trial is not None:
            cond = cond & (t.c.trial == trial)
        with self.engine.begin() as c:
            c.execute(t.delete().where(cond))

    def holder(self, name: str) -> dict[str, Any] | None:
        t = self.table
        with self.engine.connect() as c:
            row = c.execute(self.sa.select(t.c.holder).where(
                (t.c.study_id == self.study_id) & (t.c.name == name))).first()
        return json.loads(row[0]) if row else None


class FileClaims(Claims):
    """Files created with O_EXCL in DIR (beside a journal on a shared filesystem)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        return self.dir / hashlib.sha1(name.encode()).hexdigest()

    def claim(self, name: str, holder: dict[str, Any]) -> dict[str, Any] | None:
        p = self._path(name)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return self.holder(name) or {"hostname": "?"}
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(holder))
            f.flush()
            os.fsync(f.fileno())
        return None

    def release(self, name: str, trial: int | None = None) -> None:
        h = self.holder(name)
        if h is not None and (trial is None or h.get("trial") == trial):
            try:
                self._path(name).unlink()
            except FileNotFoundError:
                pass

    def holder(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(name).read_text())
        except (OSError, ValueError):
            return None


def claims_for(storage: Any, url: str, study: Any) -> Claims:
    if url.startswith(JOURNAL):
        return FileClaims(Path(url[len(JOURNAL):] + ".claims") / str(study._study_id))
    if is_shared(url):
        return SqlClaims(storage.engine, study._study_id)
    return Claims()


def config_claim(host_key: str, key: Any) -> str:
    """The claim name of one configuration on one class of hosts."""
    return "cfg:" + hashlib.sha1(json.dumps([host_key, key], default=str).encode()).hexdigest()


def _alive_here(holder: dict[str, Any]) -> bool:
    """A holder on this host whose process still runs (pid and start time match); another
    host's is assumed to run (its heartbeats decide)."""
    return not owner_gone({**holder, "host": holder.get("hostname")})


def claim_host(claims: Claims, study_name: str, url: str) -> str:
    """One search per host per study: claim this hostname, or refuse naming the pid that
    holds it. A holder that died is replaced. Returns the claim name (to release)."""
    import psutil

    me = psutil.Process()
    name = f"host:{socket.gethostname()}"
    mine = {"hostname": socket.gethostname(), "pid": me.pid, "started": me.create_time()}
    for _ in range(3):
        held = claims.claim(name, mine)
        if held is None:
            return name
        if _alive_here(held):
            raise AutotuneError(
                f"study {study_name!r} on {redact(url)} is already searched from this host "
                f"({held.get('hostname')}) by pid {held.get('pid')}: two searches on one host "
                "measure each other's load. Wait for it, or run this search on another host.")
        claims.release(name)  # its process is gone: take over
    raise AutotuneError(f"study {study_name!r}: could not register host "
                        f"{socket.gethostname()} (another search keeps taking it over).")


# -- heartbeats and stale trials -----------------------------------------------------------

class Heartbeats:
    """Heartbeats of this host's trials, and finding other hosts' silent ones.

    RDB storages use Optuna's heartbeat table (the database's clock); the journal, which
    has none, a `heartbeat` user attribute in this host's clock (hosts sharing a
    filesystem are assumed NTP-synchronised)."""

    def __init__(self, storage: Any, url: str, grace: int) -> None:
        from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

        self.storage, self.grace = storage, grace
        self.interval = heartbeat_interval(grace)
        self.optuna = isinstance(storage, BaseHeartbeat) and is_heartbeat_enabled(storage)
        self.enabled = is_shared(url)

    def beat(self, trial: Any) -> None:
        if not self.enabled:
            return
        if self.optuna:
            self.storage.record_heartbeat(trial._trial_id)
        else:
            trial.set_user_attr("heartbeat", time.time())

    @contextmanager
    def during(self, trial: Any) -> Iterator[None]:
        """Beat every `interval` seconds while the body runs (a measurement)."""
        if not self.enabled:
            yield
            return
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.interval):
                try:
                    self.beat(trial)
                except Exception:  # noqa: BLE001 - a lost connection: try again next beat
                    pass

        t = threading.Thread(target=loop, name="autotune-heartbeat", daemon=True)
        self.beat(trial)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(5)

    def stale(self, study: Any) -> list[Any]:
        """RUNNING trials whose host has been silent longer than the grace period."""
        from optuna.trial import TrialState

        if not self.enabled:
            return []
        if self.optuna:
            ids = set(self.storage._get_stale_trial_ids(study._study_id))
            return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if t._trial_id in ids]
        now = time.time()
        return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if now - float(t.user_attrs.get("heartbeat", now)) > self.grace]


# -- what a search holds of a shared study -------------------------------------------------

class SharedStudy:
    """The storage, its claims and heartbeats, and this host; `enabled` when other hosts
    may share the study (else every method is the one-process behaviour)."""

    def __init__(self, storage: Any, url: str, claims: Claims, dataset: Path, grace: int) -> None:
        self.storage, self.url, self.claims, self.grace = storage, url, claims, grace
        self.enabled = is_shared(url)
        self.heartbeats = Heartbeats(storage, url, grace)
        self.host = host_info(dataset)

    @property
    def host_key(self) -> str:
        return str(self.host["key"])

    def same_class(self, host: dict[str, Any] | None) -> bool:
        """Figures measured on `host` compare with this host's (no host: an older
        one-process study, measured here)."""
        return host is None or host.get("key") == self.host_key

    def holder(self, trial: Any) -> dict[str, Any]:
        import psutil

        me = psutil.Process()
        return {"hostname": self.host["hostname"], "pid": me.pid, "started": me.create_time(),
                "trial": trial.number}
