"""Conversion on a Ray cluster: the writer's unit function as Ray tasks, one CPU each.

`run_on_ray` is an `execute` for FormatWriter.run: it submits `work(unit)` for each unit
(a bounded window ahead), yields the results in unit order, and the driver accepts and
publishes them as one process would, so the output is byte-identical. A task whose worker
process or node dies is retried by Ray (`MAX_RETRIES`): the unit function writes to a
temporary name and renames when whole, so a retry redoes the unit from scratch. A killed
driver is rerun like a killed conversion (finished units are kept).

WebDataset tasks write their shards straight into DST, so DST must be one path on every
node (a shared filesystem); LMDB tasks read and check, and the driver commits.

A head with token authentication on (Ray 2.60's `ray start --head` where a token exists):
a head on this machine that asks for a token gets this machine's, as Ray's own
`address="auto"` does; a head elsewhere only when RAY_AUTH_MODE=token says so. A refused
connection is one line naming the fix.

Ray is an optional extra (`pip install 'autotune-loader[ray]'`), imported only here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from autotune_base.errors import ConvertError

MAX_RETRIES = 3
INSTALL = "pip install 'autotune-loader[ray]'"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConvertError(f"engine ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def _run_unit(work: Callable[[int], Any], unit: int) -> Any:
    return work(unit)


def _connect(ray: Any, address: str | None) -> bool:
    """ray.init to `address` (else RAY_ADDRESS, else a local Ray); True when this call
    started the connection (and so shuts it down)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _reachable(address)
        _token_auth_for_local_head(ray, address)
    kw: dict[str, Any] = {"address": address, "log_to_driver": False,
                          "logging_level": logging.ERROR, "configure_logging": True}
    if address is None:
        kw["include_dashboard"] = False
    try:
        with _stderr_held() as held:
            ray.init(**kw)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
        where = address or "a local Ray instance"
        if _auth_refused(e, held.text):
            raise ConvertError(_auth_fix(where), setting="ray_address") from None
        msg = " ".join(str(e).split())[:300]
        raise ConvertError(f"cannot connect to Ray at {where} ({type(e).__name__}: {msg}); "
                           "start the head with `ray start --head --port PORT` and pass "
                           "HOST:PORT (ray_address / RAY_ADDRESS).",
                           setting="ray_address") from e
    return True


# -- token authentication (Ray 2.60: `ray start --head` turns it on where a token exists,
#    and every local `ray.init()`, ours included, writes one to ~/.ray/auth_token) -------
AUTH_MODE = "RAY_AUTH_MODE"
AUTH_DOC = "https://docs.ray.io/en/latest/ray-security/token-auth.html"


def token_source() -> str | None:
    """Where Ray would read this machine's token from (its own order), or None."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return path if os.path.isfile(path) else None


def is_this_machine(address: str) -> bool:
    """HOST:PORT names this machine: a loopback address or one of its own interfaces'
    (`ray start --head` prints the latter)."""
    import ipaddress
    import socket

    import psutil

    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    try:
        ips = {ipaddress.ip_address(i[4][0].split("%")[0])
               for i in socket.getaddrinfo(host, None)}
    except (OSError, ValueError):
        return False
    own = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
           if a.family in (socket.AF_INET, socket.AF_INET6)}
    return bool(ips) and all(ip.is_loopback or str(ip) in own for ip in ips)


def _token_auth_for_local_head(ray: Any, address: str) -> None:
    """Send this machine's token to a head on this machine that asks for one, when the
    user has not chosen a mode: Ray does so itself for the local cluster it finds
    (`address="auto"`), and `ray start --head` here turned token authentication on from
    the same token. A head elsewhere never gets it unasked (RAY_AUTH_MODE=token asks). A
    head without authentication must not: its workers, sending no token, could then not
    fetch this driver's objects."""
    if AUTH_MODE in os.environ or "://" in address or address == "auto":
        return
    if token_source() is None or not is_this_machine(address):
        return
    if not _head_wants_token(address):
        return
    os.environ[AUTH_MODE] = "token"
    try:  # Ray reads its config once, at import: have it read the mode again
        ray._raylet.Config.initialize("")
    except Exception:  # noqa: BLE001 - an older Ray without the knob: nothing to refresh
        pass


_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1])
except Exception as e:
    print("refused" if "InvalidAuthToken" in str(e) or "Authentication" in type(e).__name__
          else "unknown")
else:
    print("open")
"""


def _head_wants_token(address: str) -> bool:
    """One request to the head's GCS without a token: refused means it has token
    authentication on. In a child process (a second or two), whose stderr takes the
    warning Ray's C++ client logs (it reaches fd 2 late, past any redirect here); the
    child sees no RAY_AUTH_* so that it sends no token. Unknown (an older Ray, any other
    failure) counts as no."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")}
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, address], env=env, timeout=60,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.stdout.strip() == "refused"


def _auth_refused(e: BaseException, stderr: str) -> bool:
    text = stderr
    c: BaseException | None = e
    while c is not None:
        text += f" {type(c).__name__} {c}"
        c = c.__cause__ or c.__context__
    return any(k in text for k in ("AuthenticationError", "InvalidAuthToken", "Unauthenticated"))


def _auth_fix(where: str) -> str:
    if os.environ.get(AUTH_MODE, "").lower() == "token":
        src = token_source()
        return (f"cannot connect to Ray at {where}: the head refused this machine's token "
                f"({f'from {src}' if src else 'none found'}); put the head's own token "
                "(`ray get-auth-token` on the head prints it) in RAY_AUTH_TOKEN here. "
                f"See {AUTH_DOC}")
    return (f"cannot connect to Ray at {where}: the head has token authentication on "
            "(`ray start --head` turns it on where ~/.ray/auth_token exists) and this "
            f"process sent no token ({AUTH_MODE}={os.environ.get(AUTH_MODE, 'unset')}); set "
            f"{AUTH_MODE}=token and put the head's token (`ray get-auth-token` on the head "
            f"prints it) in RAY_AUTH_TOKEN or ~/.ray/auth_token here. See {AUTH_DOC}")


class _Held:
    text = ""


@contextmanager
def _stderr_held() -> Iterator[_Held]:
    """Hold what Ray's C++ core writes to fd 2 while it connects (a warning per retry,
    for up to a minute, when the head refuses the token): given back when the connection
    is made, summarised in the one-line error when it is not."""
    import sys
    import tempfile

    held = _Held()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 (a daemon): nothing to hold
        yield held
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        ok = False
        try:
            yield held
            ok = True
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            held.text = data.decode(errors="replace")
            if ok and data:
                os.write(2, data)


def _reachable(address: str) -> None:
    """A GCS address HOST:PORT nobody listens on fails here, in one line, instead of after
    Ray's own minute of retries."""
    import socket

    if "://" in address or address == "auto" or ":" not in address:
        return  # ray:// clients and "auto": Ray decides
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            return
    except ValueError:
        raise ConvertError(f"ray address {address!r}: expected HOST:PORT, the head's GCS "
                           "address as `ray start --head --port PORT` prints it.",
                           setting="ray_address") from None
    except OSError as e:
        raise ConvertError(f"cannot connect to Ray at {address} ({e.strerror or e}); start the "
                           "head with `ray start --head --port PORT` and pass HOST:PORT "
                           "(ray_address / RAY_ADDRESS).", setting="ray_address") from None


def cluster_cpus(ray: Any) -> int:
    try:
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    except Exception:  # noqa: BLE001
        return 1


def run_on_ray(units: list[int], work: Callable[[int], Any], *, address: str | None,
               window: Callable[[int], int]) -> Iterator[tuple[int, Any]]:
    """Yield (unit, work(unit)) in the order of `units`, computed by Ray tasks.
    window(cpus): how many results may be in flight or waiting (bounds the driver's
    memory for formats whose results carry the image bytes)."""
    ray = import_ray()
    started = _connect(ray, address)
    refs: dict[int, Any] = {}
    try:
        if not units:
            return
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_run_unit)
        work_ref = ray.put(work)
        ahead = max(1, window(cluster_cpus(ray)))
        todo = iter(units)
        for u in units:
            while len(refs) < ahead:
                nxt = next(todo, None)
                if nxt is None:
                    break
                refs[nxt] = task.remote(work_ref, nxt)
            yield u, _get(ray, refs.pop(u), u)
    finally:
        for ref in refs.values():  # an error or Ctrl-C: stop what is still running
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001
                pass
        if started:
            ray.shutdown()


def _get(ray: Any, ref: Any, unit: int) -> Any:
    from ray import exceptions as rex

    try:
        return ray.get(ref)
    except rex.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None  # the unit's own error (ConvertError names the file)
        raise ConvertError(f"unit {unit} failed in a Ray task: {' '.join(str(e).split())[:300]}"
                           ) from None
    except (rex.WorkerCrashedError, rex.NodeDiedError, rex.ObjectLostError,
            rex.TaskCancelledError) as e:
        raise ConvertError(
            f"unit {unit}: its Ray task was lost {MAX_RETRIES + 1} times ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:200]}); rerun the same command to resume (finished "
            "units are kept).") from None
