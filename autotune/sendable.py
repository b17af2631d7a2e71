"""Whether a batch a DataLoader worker makes can reach the training process.

A worker puts each batch on a multiprocessing queue whose feeder thread pickles it. Where
that fails (a sample holding a generator, a lock, a lambda, an open database handle) the
thread prints the error and drops the batch, and the training loop waits for it for ever
(torch's default timeout=0): the same dataset trains in the training process alone
(num_workers=0, torch's default). autotune starts workers only where the user gave no
num_workers, so it must not start them for such a batch.

The check pickles the first batch, made in the training process before any worker
starts, with the pickler the queue uses, into nothing. Tensors are not pickled (torch sends
a tensor's storage through shared memory, without side effects here only if not done):
only torch's own refusal is repeated, a non-leaf tensor that requires grad. Arrays of
numbers always pickle (an array of objects is looked into). What multiprocessing itself
reduces (a connection, a socket: a duplicated descriptor and a thread to hand it over) is
taken as sent, as the queue would send it.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler
from typing import Any


class _Nowhere:
    """A file that keeps nothing: the check needs the pickling, not its bytes."""

    def write(self, b: bytes) -> int:
        return len(b)


def why_unsendable(batch: Any) -> str | None:
    """Why `batch` could not be sent from a worker (the pickling error, in a line), or
    None when it can."""
    import numpy as np
    import torch

    skip = (torch.UntypedStorage, torch.storage.TypedStorage)
    # What multiprocessing and torch send their own way (not a method or a partial: those
    # are pickled through, and what they hold may fail).
    theirs = tuple(t for t in ForkingPickler._extra_reducers
                   if t.__module__.split(".")[0] in ("torch", "multiprocessing", "socket"))

    class _Check(ForkingPickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                if obj.requires_grad and not obj.is_leaf:
                    raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which "
                                       "requires_grad (torch's refusal in a worker)")
                return int, (0,)
            if (isinstance(obj, skip) or isinstance(obj, theirs)
                    or (isinstance(obj, np.ndarray) and not obj.dtype.hasobject)):
                return int, (0,)
            return NotImplemented

    try:
        # The queue's own protocol (ForkingPickler.dumps: the default).
        _Check(_Nowhere()).dump(batch)
    except Exception as e:  # noqa: BLE001  (whatever the queue's thread would have met)
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return None
