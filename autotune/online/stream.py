"""One epoch's index batches, drawn lazily from the user's sampler, shared by every pool.

Each inner torch DataLoader is given a `Lease` as its batch_sampler (or sampler without
auto-collation): a window [start, stop) of positions in the epoch's `IndexStream`. A pool
switch closes the old lease at a batch boundary and opens the new one there, so the epoch's
index batches are each taken exactly once and in the sampler's order, and the sampler is
drawn exactly as far as torch's own DataLoader would draw it (an infinite sampler works).
"""

from __future__ import annotations

from typing import Any, Iterator


class IndexStream:
    """The epoch's index batches by position; each position is handed out once.

    Positions are drawn from the sampler in order; one taken ahead of an earlier one (the
    new pool starts while the old one still takes the positions before it) leaves the
    earlier ones buffered until they are taken.
    """

    def __init__(self, sampler_iter: Iterator[Any], length: int | None = None) -> None:
        self._it = sampler_iter
        self._buf: dict[int, Any] = {}
        self._drawn = 0
        self.end: int | None = None  # the epoch's length once the sampler has ended
        # The sampler's len(), where it has one: a pool's prefetch stops there without
        # drawing the sampler's end, which only the loop's own ask past the last batch
        # draws (past_end). RandomSampler draws one more randperm from the generator
        # there: torch's loop without workers draws it only when the loop asks.
        self.length = length

    def get(self, pos: int) -> Any:
        """The index batch at `pos`; StopIteration at and after the epoch's end (or its
        len(), until the loop asks past it)."""
        while self._drawn <= pos:
            if self.end is not None or (self.length is not None and self._drawn >= self.length):
                raise StopIteration
            try:
                item = next(self._it)
            except StopIteration:
                self.end = self._drawn
                raise
            self._buf[self._drawn] = item
            self._drawn += 1
        if pos not in self._buf:
            # A position handed out twice would repeat a batch: a bug here, never the user's.
            raise RuntimeError(f"index batch {pos} of this epoch was already taken")
        return self._buf.pop(pos)

    def past_end(self) -> bool:
        """The loop asked past the last batch served: draw the sampler there, as torch's
        loop without workers does. True when it ended; False when it yields more than its
        len() said (what it yields is then served: the length no longer holds a pool)."""
        if self.end is not None or self.length is None or self._drawn < self.length:
            return True
        try:
            item = next(self._it)
        except StopIteration:
            self.end = self._drawn
            return True
        self._buf[self._drawn] = item
        self._drawn += 1
        self.length = None
        return False

    def put_back(self, items: dict[int, Any]) -> None:
        """Index batches handed out but never delivered (their pool failed): each position
        can be taken again, by the pool that carries on from the first of them."""
        for pos, item in items.items():
            if pos >= self._drawn or pos in self._buf:
                raise RuntimeError(f"index batch {pos} of this epoch was never taken")
            self._buf[pos] = item


class Lease:
    """The positions [start, stop) of a stream that one inner loader takes, in order.

    Without a stream it is idle (yields nothing): a pool is started idle so that its workers
    come up while the old pool serves. `stop` None means open-ended.
    """

    def __init__(self) -> None:
        self.stream: IndexStream | None = None
        self.start = 0
        self.next = 0
        self.stop: int | None = None
        self.gen = 0  # bumped by assign: an iterator of an earlier assignment yields nothing
        # Positions handed to the inner loader and not yet delivered to the loop: what goes
        # back to the stream when the pool fails.
        self.out: dict[int, Any] = {}

    def assign(self, stream: IndexStream | None, start: int = 0) -> None:
        self.stream, self.start, self.next, self.stop = stream, start, start, None
        self.out = {}
        self.gen += 1

    def delivered(self, pos: int) -> None:
        """The batch at `pos` reached the loop."""
        self.out.pop(pos, None)

    def give_back(self) -> int:
        """Put the undelivered positions back into the stream; how many there were."""
        out, self.out = self.out, {}
        if self.stream is not None and out:
            self.stream.put_back(out)
        self.gen += 1  # the failed loader's iterator takes nothing more
        return len(out)

    @property
    def exhausted(self) -> bool:
        """The stream ended at or before this lease's next position."""
        s = self.stream
        return s is not None and s.end is not None and self.next >= s.end

    def __iter__(self) -> Iterator[Any]:
        return _LeaseIter(self)


class _LeaseIter:
    def __init__(self, lease: Lease) -> None:
        self._lease, self._gen = lease, lease.gen

    def __iter__(self) -> _LeaseIter:
        return self

    def __next__(self) -> Any:
        le = self._lease
        if (le.gen != self._gen or le.stream is None
                or (le.stop is not None and le.next >= le.stop)):
            raise StopIteration
        item = le.stream.get(le.next)
        le.out[le.next] = item
        le.next += 1
        return item


def length_of(obj: Any) -> int | None:
    """len(obj) where it has one (an IterableDataset or an infinite sampler has none)."""
    try:
        n = len(obj)
    except (TypeError, NotImplementedError):
        return None
    return n if isinstance(n, int) and n >= 0 else None
