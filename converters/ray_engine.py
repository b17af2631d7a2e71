"""Conversion on a Ray cluster: the writer's unit function as Ray tasks, one CPU each.

`run_on_ray` is an `execute` for FormatWriter.run: it submits `work(unit)` for each unit
(a bounded window ahead), yields the results in unit order, and the driver accepts and
publishes them as one process would, so the output is byte-identical. A task whose worker
process or node dies is retried by Ray (`MAX_RETRIES`): the unit function writes to a
temporary name and renames when whole, so a retry redoes the unit from scratch. A killed
driver is rerun like a killed conversion (finished units are kept).

WebDataset tasks write their shards straight into DST, so DST must be one path on every
node (a shared filesystem); LMDB tasks read and check, and the driver commits.

Ray is an optional extra (`pip install 'autotune-loader[ray]'`), imported only here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from converters.errors import ConvertError

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
    kw: dict[str, Any] = {"address": address, "log_to_driver": False,
                          "logging_level": logging.ERROR, "configure_logging": True}
    if address is None:
        kw["include_dashboard"] = False
    try:
        ray.init(**kw)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
        where = address or "a local Ray instance"
        msg = " ".join(str(e).split())[:300]
        raise ConvertError(f"cannot connect to Ray at {where} ({type(e).__name__}: {msg}); "
                           "start the head with `ray start --head --port PORT` and pass "
                           "HOST:PORT (ray_address / RAY_ADDRESS).",
                           setting="ray_address") from e
    return True


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
