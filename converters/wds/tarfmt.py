"""Tar shards: a reproducible writer and a reader that trusts nothing in the archive.

Writer: POSIX ustar members with fixed metadata (mtime 0, uid/gid 0, no user or group
names, mode 0444), in the order given, padded to tar's 10 KiB record as GNU tar and
Python's tarfile do, hashed (sha256) while written. Same input, same bytes.

Reader: streams members without ever extracting anything to disk. A member that is not a
regular file (symlink, hard link, directory, device), whose name has a directory part,
'..' or is absolute, or a tar that ends early is an error naming the shard: the shards
autotune writes never contain such members, so a shard that does is not ours or damaged.
Memory is bounded by the shard, never by what its headers claim: every member's size is
checked against the bytes left in the file and against a per-member limit
(`max_member_bytes`, default MAX_MEMBER_BYTES = 256 MiB, far above any image) before
anything is allocated for it, and sparse members (GNU type 'S', PAX GNU.sparse.*), whose
holes would be read as zeros many times the shard's size, are refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 512
RECORD = 20 * BLOCK
_ZEROS = bytes(RECORD)
MEMBER_RE = re.compile(r"^([A-Za-z0-9_-]+)\.([a-z0-9]+)$")
MAX_MEMBER_BYTES = 256 << 20  # the default per-member limit (see the module doc)


class ShardFormatError(Exception):
    """A shard is damaged or holds something autotune never writes; str() names it."""


class ShardNotRegular(ShardFormatError):
    """A shard's name is a symbolic link (or reached through one) or not a regular file:
    not read; str() names it and says the fix."""


# The fixed part of every member header, as tarfile's USTAR format writes it for
# mode 0444, uid/gid 0, mtime 0, empty user/group names (fields after 'size').
_MODE_IDS = b"0000444\0" + b"0000000\0" * 2
_MTIME = b"00000000000\0"
_AFTER_SUM = b"0" + b"\0" * 100 + b"ustar\x0000" + b"\0" * (64 + 16 + 167)


def member_header(name: str, size: int) -> bytes:
    """A 512-byte ustar header; byte for byte what tarfile writes (tested), ~20x faster."""
    raw = name.encode("ascii")  # keys are digits and suffixes are [a-z0-9]
    if len(raw) > 100 or size >= 8 ** 11:
        raise ValueError(f"member {name!r} of {size} bytes does not fit a ustar header")
    head = raw.ljust(100, b"\0") + _MODE_IDS + b"%011o\0" % size + _MTIME
    chksum = sum(head) + 8 * 32 + sum(_AFTER_SUM)  # the checksum field counts as spaces
    return head + b"%06o\0 " % chksum + _AFTER_SUM


class TarShardWriter:
    """Append members to a new tar file; `finish()` fsyncs and returns (bytes, sha256).

    Members are assembled in a staging buffer and written (and hashed, once) in writes
    of `buffer_size` bytes; a source file can be read straight into its place in the
    buffer (`reserve` / `slot` / `commit_slot`), so an image is copied once, from the
    page cache into the buffer, and never held as a `bytes` of its own.
    """

    BUFFER = 8 << 20

    def __init__(self, path: Path, buffer_size: int | None = None) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self._sha = hashlib.sha256()
        self._size = 0  # bytes flushed to the file
        size = buffer_size or self.BUFFER
        # Two buffers: one is filled while a thread hashes and writes the other (both
        # release the GIL), so hashing and writing overlap the next files' reads and checks.
        self._bufs = [bytearray(size), bytearray(size)]
        self._buf = self._bufs[0]
        self._mv = memoryview(self._buf)
        self._pos = 0
        self._pending: Any = None  # the other buffer's write, in flight
        self._pool: Any = None

    # -- the staging buffer ------------------------------------------------------------

    def _flush(self) -> None:
        if self._pos:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(1, thread_name_prefix="autotune-tar-write")
            self._wait()
            self._pending = self._pool.submit(self._write_out, self._mv[:self._pos])
            self._buf = self._bufs[1] if self._buf is self._bufs[0] else self._bufs[0]
            self._mv = memoryview(self._buf)
            self._pos = 0

    def _wait(self) -> None:
        """The write in flight done (its error raised here)."""
        if self._pending is not None:
            f, self._pending = self._pending, None
            f.result()

    def _write_out(self, b: bytes | memoryview) -> None:
        self._sha.update(b)
        mv = memoryview(b)
        while mv:
            k = os.write(self._fd, mv)
            mv = mv[k:]
        self._size += len(b)

    def reserve(self, n: int) -> bool:
        """Make `n` contiguous bytes free in the buffer (flushing it if needed); False
        when `n` is more than the whole buffer holds (then use `add`)."""
        if self._pos + n > len(self._buf):
            self._flush()
        return n <= len(self._buf)

    def mark(self) -> int:
        """A position to `rollback` to (valid until the next `reserve` or `add`)."""
        return self._pos

    def rollback(self, mark: int) -> None:
        self._pos = mark

    def slot(self) -> memoryview:
        """Where the next member's data goes (after its header's place); `commit_slot`
        then makes the first `n` bytes of it a member."""
        return self._mv[self._pos + BLOCK:]

    def commit_slot(self, name: str, n: int) -> None:
        pos = self._pos
        self._mv[pos:pos + BLOCK] = member_header(name, n)
        end = pos + BLOCK + n
        pad = -n % BLOCK
        self._mv[end:end + pad] = _ZEROS[:pad]
        self._pos = end + pad

    def add(self, name: str, data: bytes | memoryview) -> None:
        n = len(data)
        need = BLOCK + n + (-n % BLOCK)
        if self.reserve(need):
            self._mv[self._pos + BLOCK:self._pos + BLOCK + n] = data
            self.commit_slot(name, n)
            return
        self._flush()  # larger than the buffer: straight to the file
        self._wait()
        self._write_out(member_header(name, n))
        self._write_out(data)
        if n % BLOCK:
            self._write_out(_ZEROS[:-n % BLOCK])

    # -- the end -----------------------------------------------------------------------

    def finish(self) -> tuple[int, str]:
        self._flush()
        self._wait()  # _size is final only now
        end = 2 * BLOCK
        end += -(self._size + end) % RECORD
        self._shutdown()
        self._write_out(bytes(end))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        return self._size, self._sha.hexdigest()

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def abort(self) -> None:
        try:
            try:
                self._wait()
            except Exception:  # noqa: BLE001 (aborting: the file is removed anyway)
                pass
            self._shutdown()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def _kind(ti: tarfile.TarInfo) -> str:
    if ti.issym():
        return f"a symlink to {ti.linkname!r}"
    if ti.islnk():
        return f"a hard link to {ti.linkname!r}"
    if ti.isdir():
        return "a directory"
    if ti.isdev() or ti.isfifo():
        return "a device or FIFO"
    return f"of tar type {ti.type!r}"


_CHUNK = 1 << 20
_REGULAR = (b"0", b"\0")
_USTAR = b"ustar\x0000"


class _ChunkReader:
    """The unread bytes of a file in one reused buffer, refilled by 1 MiB reads."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.buf = bytearray(_CHUNK)
        self.mv = memoryview(self.buf)
        self.start = self.end = 0  # unread bytes are buf[start:end]
        self.consumed = 0          # file offset of buf[start]
        self.eof = False

    def fill(self, need: int) -> bool:
        """At least `need` unread bytes in the buffer, unless the file ends first."""
        if self.end - self.start >= need:
            return True
        if need > len(self.buf):  # a member larger than the buffer: a larger one
            nb = bytearray(need)
            nb[:self.end - self.start] = self.mv[self.start:self.end]
            self.buf, self.mv = nb, memoryview(nb)
            self.end -= self.start
            self.start = 0
        elif self.start:
            self.mv[:self.end - self.start] = self.mv[self.start:self.end]
            self.end -= self.start
            self.start = 0
        while self.end < need and not self.eof:
            k = self.f.readinto(self.mv[self.end:])
            if not k:
                self.eof = True
            else:
                self.end += k
        return self.end - self.start >= need

    def take(self, n: int) -> bytes:
        return bytes(self.mv[self.start:self.start + n])

    def skip(self, n: int) -> None:
        """Past `n` bytes, or to the end of what the file holds (the next read ends it).
        Bytes not buffered yet are read and dropped: the padding after a member that
        filled a buffer of exactly its size (a member over 1 MiB) is not in it."""
        got = min(n, self.end - self.start)
        self.start += got
        self.consumed += got
        rest = n - got
        while rest > 0 and not self.eof:
            self.start = self.end = 0  # the buffer is empty here
            k = self.f.readinto(self.mv[:min(rest, len(self.buf))])
            if not k:
                self.eof = True
            rest -= k
            self.consumed += k


def _fast_header(h: bytes, name: str, count: int) -> tuple[str, int] | None:
    """(member name, size) of a header as autotune writes it (ustar, a regular file, a
    short name, an octal size), its checksum verified; None for any other kind."""
    if h[156:157] not in _REGULAR or h[257:265] != _USTAR or h[345] != 0 or h[124] & 0x80:
        return None
    stored = h[148:156].split(b"\0", 1)[0].strip()
    try:
        chk = int(stored or b"x", 8)
        size = int(h[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ShardFormatError(f"{name}: truncated or corrupt after {count} members "
                               "(a header with a non-octal field)") from None
    if chk != sum(h[:148]) + 256 + sum(h[156:]):
        raise ShardFormatError(f"{name}: truncated or corrupt after {count} members "
                               "(bad header checksum)")
    return h[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape"), size


def _check_size(name: str, member: str, size: int, at: int, length: int, limit: int,
                count: int) -> None:
    """Refuse a member whose data would start at file offset `at` before allocating it:
    over the per-member limit, or longer than what the shard still holds."""
    if size > limit:
        raise ShardFormatError(
            f"{name}: member {member!r} is {size:,} bytes, over the per-member limit of "
            f"{limit:,} (max_member_bytes); no image is that large: the shard is damaged or "
            "not an autotune shard (pass a larger max_member_bytes if it is genuine)")
    if at + size > length:
        raise ShardFormatError(
            f"{name}: truncated or corrupt after {count} members (member {member!r} claims "
            f"{size:,} bytes, but the shard holds {max(0, length - at):,} more)")


def open_shard(path: str | os.PathLike[str], beneath: str | None = None) -> Any:
    """The shard at `path` opened for reading (unbuffered), a regular file that is not a
    symbolic link: OSError otherwise (a link: ELOOP "a symbolic link, not followed").

    `beneath`: the dataset's folder, `path` being beneath/NAME with NAME from its manifest:
    a NAME with a directory part is walked beneath that folder one component at a time,
    no link followed (autotune_base.beneath); a plain NAME, as autotune writes them, is one
    open with O_NOFOLLOW, whose fstat also gives the length: no syscall more than a plain
    open. The folder itself is the user's own path: a link to it is followed."""
    name = os.fspath(path)
    rel = os.path.relpath(name, beneath) if beneath else os.path.basename(name)
    if beneath and "/" in rel:
        from autotune_base.beneath import open_dir, open_regular, parent_of

        root = open_dir(beneath)
        try:
            with parent_of(root, rel) as (d, leaf):
                fd, _ = open_regular(d, leaf)
        finally:
            os.close(root)
    else:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OSError(e.errno, "a symbolic link, not followed", name) from None
            raise
        # O_NONBLOCK was for the open alone (a FIFO is refused by iter_members' fstat before
        # any read; some cluster file systems give a non-blocking descriptor's reads EAGAIN).
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0)


def iter_members(path: str | os.PathLike[str], max_member_bytes: int = MAX_MEMBER_BYTES,
                 *, beneath: str | None = None) -> Iterator[tuple[str, str, bytes]]:
    """(key, suffix, data) of each member of a shard, in order, checked.

    Raises ShardFormatError naming the shard for a hostile or unexpected member, a
    sparse member, a member larger than `max_member_bytes` or than the rest of the file,
    or a truncated archive. Nothing is written anywhere; memory stays within about one
    member (at most the smaller of the limit and the file) plus a 1 MiB buffer.

    The headers autotune writes (ustar, regular files, short names, octal sizes) are
    parsed here from 1 MiB reads into one reused buffer, with the checksum verified; at
    the first header of any other kind (a link, a directory, pax or GNU extensions, ...)
    the rest of the shard goes through `tarfile`, which names what it is.

    The shard is opened by `open_shard` (no link followed; `beneath`: the dataset's
    folder): a link, or anything but a regular file, is a ShardFormatError saying so.
    """
    name = os.path.basename(os.fspath(path))
    try:
        f = open_shard(path, beneath)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EINVAL):
            on = os.path.basename(os.fspath(e.filename or name))
            link = "symbolic link" in (e.strerror or "")
            raise ShardNotRegular(f"{name}: {e.strerror}"
                                  + (f" (its folder {on!r})" if on != name else "")
                                  + "; a dataset is read only from inside its own folder: "
                                  f"replace {'the link' if link else 'it'} with the file "
                                  "itself") from None
        raise ShardFormatError(f"{name}: truncated or corrupt after 0 members "
                               f"({type(e).__name__}: {e})") from None
    with f:
        try:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (OSError, AttributeError):
            pass
        try:
            st = os.fstat(f.fileno())
        except OSError as e:
            raise ShardFormatError(f"{name}: truncated or corrupt after 0 members "
                                   f"({type(e).__name__}: {e})") from None
        if not stat.S_ISREG(st.st_mode):
            raise ShardNotRegular(f"{name}: not a regular file; a dataset's shards are "
                                  "regular files: replace it with the file itself")
        length = st.st_size
        yield from iter_stream(_ReadAhead(f, length), name, length, max_member_bytes,
                               seekable=True)


READ_AHEAD = 4 << 20  # the bytes a shard reader asks the kernel for ahead of its reads


class _ReadAhead:
    """A local file whose next READ_AHEAD bytes are asked for (posix_fadvise WILLNEED)
    before its reads reach them. The kernel's own read-ahead follows the reads: behind a
    capped or slow disk each 1 MiB read then waited for its own I/O after the previous
    megabyte was decoded (measured: the cap's I/O time added to the decode time, not
    overlapped with it); asked ahead, the I/O runs while the worker decodes. One syscall
    per MiB read; pages already cached cost a lookup."""

    def __init__(self, f: Any, length: int, ahead: int = READ_AHEAD) -> None:
        self.f, self.length, self.ahead = f, length, ahead
        self.pos = self.advised = 0

    def readinto(self, mv: memoryview) -> int:
        self._advise()
        k = self.f.readinto(mv)
        self.pos += k or 0
        return k

    def _advise(self) -> None:
        # 1 MiB at a time: the kernel reads at most max(the disk's largest request, its
        # read-ahead) of one WILLNEED (1.25 MiB on a loop disk at 128 KB read-ahead).
        while self.ahead and self.advised < min(self.pos + self.ahead, self.length):
            try:
                os.posix_fadvise(self.f.fileno(), self.advised, _CHUNK, os.POSIX_FADV_WILLNEED)
            except (OSError, AttributeError):  # not Linux, or a file system without it
                self.ahead = 0
                return
            self.advised += _CHUNK

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = self.f.seek(offset, whence)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        self._advise()
        data = self.f.read(n)
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos


def iter_stream(f: Any, name: str, length: int, max_member_bytes: int = MAX_MEMBER_BYTES, *,
                seekable: bool = False) -> Iterator[tuple[str, str, bytes]]:
    """iter_members of an open stream of `length` bytes (a shard read by one GET: its
    body's `readinto` or `read`), with the same checks; `name` names it in errors."""
    count = 0
    r = _ChunkReader(f if hasattr(f, "readinto") else _ReadInto(f))
    try:
        while True:
            if not r.fill(BLOCK):
                if count == 0:
                    raise ShardFormatError(f"{name}: truncated or corrupt after 0 members "
                                           "(empty or shorter than one tar header)")
                return  # as tarfile: the member count check names what is missing
            h = r.take(BLOCK)
            if h[0] == 0 and h == _ZEROS[:BLOCK]:
                return  # end-of-archive blocks
            parsed = _fast_header(h, name, count)
            if parsed is None:
                break  # not what autotune writes: tarfile takes it from here
            mname, size = parsed
            m = MEMBER_RE.match(mname)
            if not m:
                raise ShardFormatError(
                    f"{name}: member name {mname!r} is not KEY.EXT (a path, '..', an "
                    "absolute name or a dot in the key); refusing to read it")
            r.skip(BLOCK)
            _check_size(name, mname, size, r.consumed, length, max_member_bytes, count)
            if not r.fill(size):
                raise ShardFormatError(
                    f"{name}: truncated or corrupt after {count} members (ReadError: member "
                    f"{mname!r} has {r.end - r.start} of {size} bytes)")
            data = r.take(size)
            r.skip(size + (-size % BLOCK))
            count += 1
            yield m.group(1), m.group(2), data
    except OSError as e:
        raise ShardFormatError(f"{name}: truncated or corrupt after {count} members "
                               f"({type(e).__name__}: {e})") from None
    # The slow path, from the first header the fast one does not take.
    if seekable:
        f.seek(r.consumed)
        yield from _iter_tarfile(f, name, count, max_member_bytes, length=length)
    else:  # a stream cannot go back: what the buffer holds, then the rest of it
        yield from _iter_tarfile(_Rest(r), name, count, max_member_bytes, length=length)


class _ReadInto:
    """`readinto` over a stream that has only `read(n)` (an HTTP response body)."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def readinto(self, mv: memoryview) -> int:
        data = self.f.read(len(mv))
        mv[:len(data)] = data
        return len(data)


class _Rest:
    """The unread part of a _ChunkReader's stream, for tarfile: the buffered bytes first,
    then the rest; `tell()` is the offset in the whole stream."""

    def __init__(self, r: _ChunkReader) -> None:
        self.r = r
        self.pos = r.consumed

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        r = self.r
        have = r.end - r.start
        if have:
            k = have if n < 0 else min(n, have)
            out = bytes(r.mv[r.start:r.start + k])
            r.start += k
        else:
            parts = []
            want = n if n >= 0 else 1 << 62
            while want > 0:
                buf = bytearray(min(want, 1 << 20))
                k = r.f.readinto(memoryview(buf))
                if not k:
                    break
                parts.append(bytes(buf[:k]))
                want -= k
                if n >= 0:
                    break  # one read, as a file's read(n) may return fewer
            out = b"".join(parts)
        self.pos += len(out)
        return out


class _Sparse(Exception):
    """A sparse member met while tarfile parses its headers; args[0] is its name."""


class _CheckedInfo(tarfile.TarInfo):
    """tarfile's TarInfo refusing sparse members as soon as their headers are parsed,
    before tarfile builds their map (a PAX 1.0 map is read from the member's data)."""

    def _proc_sparse(self, tarfile):  # noqa: ANN001 (tarfile's hook signature)
        raise _Sparse(self.name)

    def _proc_gnusparse_00(self, next, pax_headers, buf):  # noqa: ANN001, A002
        raise _Sparse(pax_headers.get("path", next.name))

    def _proc_gnusparse_01(self, next, pax_headers):  # noqa: ANN001, A002
        raise _Sparse(pax_headers.get("path", next.name))

    def _proc_gnusparse_10(self, next, pax_headers, tarfile):  # noqa: ANN001, A002
        raise _Sparse(pax_headers.get("GNU.sparse.name", next.name))


def _sparse(ti: tarfile.TarInfo) -> bool:
    return ti.issparse() or ti.type == tarfile.GNUTYPE_SPARSE or any(
        k.startswith("GNU.sparse.") for k in ti.pax_headers)


def _iter_tarfile(f, name: str, count: int, max_member_bytes: int = MAX_MEMBER_BYTES,
                  *, length: int | None = None) -> Iterator[tuple[str, str, bytes]]:
    base = f.tell()  # tarfile's offsets are from where its stream starts
    if length is None:
        length = os.fstat(f.fileno()).st_size
    try:
        with tarfile.open(fileobj=f, mode="r|", tarinfo=_CheckedInfo) as tf:
            for ti in tf:
                if _sparse(ti):
                    raise _Sparse(ti.name)
                if not ti.isreg():
                    raise ShardFormatError(f"{name}: member {ti.name!r} is {_kind(ti)}; "
                                           "autotune shards hold only regular files")
                m = MEMBER_RE.match(ti.name)
                if not m:
                    raise ShardFormatError(
                        f"{name}: member name {ti.name!r} is not KEY.EXT (a path, '..', an "
                        "absolute name or a dot in the key); refusing to read it")
                _check_size(name, ti.name, ti.size, base + ti.offset_data, length,
                            max_member_bytes, count)
                fobj = tf.extractfile(ti)  # a view of the stream: nothing is written out
                data = fobj.read() if fobj is not None else b""
                if len(data) != ti.size:
                    raise tarfile.ReadError(f"member {ti.name!r} has {len(data)} of "
                                            f"{ti.size} bytes")
                count += 1
                tf.members = []  # streaming: do not keep every TarInfo of the shard
                yield m.group(1), m.group(2), data
    except ShardFormatError:
        raise
    except _Sparse as e:
        raise ShardFormatError(f"{name}: member {e.args[0]!r} is a sparse file (GNU tar type "
                               "'S' or PAX GNU.sparse.*); autotune shards hold only plain "
                               "regular files") from None
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ShardFormatError(f"{name}: truncated or corrupt after {count} members "
                               f"({type(e).__name__}: {e})") from None
