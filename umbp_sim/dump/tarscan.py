"""A bounded, single-pass tar reader for dumps (plain, gzip, bzip2 or xz; never extracted).

``scan(data, label, wanted, budget)`` walks the archive once and returns a ``Scan``: the members
``wanted(name)`` asks for (their bytes, read in memory), the directories, the links and the
names it refused. Python's ``tarfile`` is not used because it reads a pax or GNU long-name
header whole before any check, keeps every member's ``TarInfo`` and decompresses without a
bound on output; here every step is charged to a ``limits.Budget`` first:

- decompression is done in steps of at most 1 MiB of output, each counted (``max_unpacked``),
  with a new decompressor per concatenated stream counted too (``max_streams``);
- each header is counted (``max_members``); pax and GNU long-name/long-link headers are
  refused before they are read when larger than ``max_header``; names are at most ``max_name``;
- only wanted members' data is kept (``max_file`` each, ``max_kept`` in all); others are skipped,
  their name and size recorded (for a manifest check) under the bound directory names have;
- data that ends early (a truncated compressed stream, a member or header cut off, no
  end-of-archive blocks) is a ``TarFormatError`` with ``cut_short`` set.

Formats: POSIX ustar and pax (``path``, ``linkpath``, ``size`` records), GNU (``L``/``K``
long names, base-256 sizes, old sparse headers skipped), v7. A bad checksum, a short header,
data cut short or a malformed pax record is ``TarFormatError``; the caller words it.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.dump.limits import Budget

BLOCK = 512
_IN_CHUNK = 64 << 10  # compressed bytes fed per step
_OUT_STEP = 1 << 20  # most decompressed bytes produced per step

GZIP_MAGIC = b"\x1f\x8b"
BZ2_MAGIC = b"BZh"
XZ_MAGIC = b"\xfd7zXZ\x00"

REGULAR = (b"0", b"\0", b"7")
HARDLINK, SYMLINK, DIRECTORY = b"1", b"2", b"5"
NO_DATA = (HARDLINK, SYMLINK, b"3", b"4", DIRECTORY, b"6")  # the size field is not data
GNU_LONGNAME, GNU_LONGLINK, GNU_SPARSE = b"L", b"K", b"S"
PAX_HEADER, PAX_GLOBAL, SOLARIS_PAX = b"x", b"g", b"X"


class TarFormatError(Exception):
    """The bytes are not a readable tar archive (the message says where it broke).

    ``cut_short``: the data ends early (a truncated stream or tar) rather than being wrong;
    ``partial`` is what the scan had read up to there (set by ``scan``).
    """

    def __init__(self, message: str, cut_short: bool = False) -> None:
        super().__init__(message)
        self.cut_short = cut_short
        self.partial: Scan | None = None


@dataclass
class Link:
    name: str
    target: str
    symbolic: bool


@dataclass
class Scan:
    files: dict[str, bytes] = field(default_factory=dict)  # wanted regular members
    oversized: dict[str, int] = field(default_factory=dict)  # wanted, but over max_file
    links: list[Link] = field(default_factory=list)  # wanted hard/symbolic links
    dirs: set[str] = field(default_factory=set)  # directory members (as named)
    sizes: dict[str, int] = field(default_factory=dict)  # regular members (kept as dirs are)
    names: set[str] = field(default_factory=set)  # names of wanted files and links
    refused: list[str] = field(default_factory=list)  # unsafe names (first 50)
    refused_count: int = 0


def _compressor(data: bytes) -> tuple[Callable[[], Any], bytes, str] | None:
    """(a new decompressor, the magic every stream starts with, its name), or None for a
    plain tar."""
    if data.startswith(GZIP_MAGIC):
        return (lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)), GZIP_MAGIC, "gzip"
    if data.startswith(BZ2_MAGIC):
        return bz2.BZ2Decompressor, BZ2_MAGIC, "bzip2"
    if data.startswith(XZ_MAGIC):
        return (lambda: lzma.LZMADecompressor(format=lzma.FORMAT_XZ)), XZ_MAGIC, "xz"
    return None


class Input:
    """The archive as given, read in steps: ``head`` (bytes already read, for sniffing) then
    ``more(n)`` until it returns b"". Every byte is charged to ``budget`` (``max_archive``)."""

    def __init__(self, head: bytes, more: Callable[[int], bytes], budget: Budget) -> None:
        self.head = head
        self.more = more
        self.budget = budget
        budget.add_input(len(head))

    @classmethod
    def of(cls, data: bytes, budget: Budget) -> Input:
        return cls(data, lambda n: b"", budget)

    def read(self, n: int) -> bytes:
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        out = self.more(n)
        self.budget.add_input(len(out))
        return out

    def peek_magic(self) -> bytes:
        return self.head[:6]


def _decompressed(src: Input, budget: Budget) -> Iterator[bytes]:
    """The archive's bytes after decompression, in bounded steps, each charged to ``budget``."""
    kind = _compressor(src.peek_magic())
    if kind is None:
        while chunk := src.read(_OUT_STEP):
            budget.add_unpacked(len(chunk))
            yield chunk
        return
    make, magic, zname = kind
    pending = b""
    while True:
        budget.add_stream()
        d = make()
        is_zlib = hasattr(d, "unconsumed_tail")
        pending = pending or src.read(_IN_CHUNK)
        while True:
            try:
                out = d.decompress(pending, _OUT_STEP)
            except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError) as e:
                raise TarFormatError(f"corrupt compressed data ({e})") from None
            pending = d.unconsumed_tail if is_zlib else b""
            budget.add_unpacked(len(out))
            if out:
                yield out
            if d.eof:
                break
            if (not pending) if is_zlib else d.needs_input:
                pending = src.read(_IN_CHUNK)
                if not pending:
                    raise TarFormatError(
                        f"the {zname} data ends before its stream does (after "
                        f"{budget.unpacked} bytes unpacked)",
                        cut_short=True,
                    )
        pending = d.unused_data
        while len(pending) < len(magic) and (more := src.read(_IN_CHUNK)):
            pending += more
        if not pending.startswith(magic):
            return  # trailing zeros or garbage after the last stream: ignored, as gzip/bz2 do


class _Stream:
    """Exact reads and skips over the decompressed bytes (the tar layer's only view of them)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.buf = b""
        self.pos = 0  # next unread byte of buf
        self.offset = 0  # bytes consumed so far

    def _fill(self) -> bool:
        chunk = next(self.chunks, None)
        if chunk is None:
            return False
        self.buf, self.pos = chunk, 0
        return True

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the data)."""
        parts = []
        need = n
        while need:
            if self.pos >= len(self.buf) and not self._fill():
                break
            part = self.buf[self.pos : self.pos + need]
            self.pos += len(part)
            need -= len(part)
            parts.append(part)
        self.offset += n - need
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def exact(self, n: int, what: str) -> bytes:
        data = self.read(n)
        if len(data) != n:
            raise TarFormatError(f"data ends inside {what} (offset {self.offset})", True)
        return data

    def skip(self, n: int, what: str) -> None:
        while n:
            if self.pos >= len(self.buf) and not self._fill():
                raise TarFormatError(f"data ends inside {what} (offset {self.offset})", True)
            step = min(n, len(self.buf) - self.pos)
            self.pos += step
            self.offset += step
            n -= step


def _nts(field_: bytes) -> str:
    return field_.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field_: bytes, what: str, offset: int) -> int:
    if field_[:1] in (b"\x80", b"\xff"):  # GNU base-256
        n = int.from_bytes(field_[1:], "big")
        if field_[:1] == b"\xff":
            n -= 1 << (8 * (len(field_) - 1))
        return n
    text = field_.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise TarFormatError(f"header at offset {offset}: bad {what} field") from None


_HIGH = bytes(range(128, 256))


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = int(block[148:156].split(b"\0", 1)[0].strip(b" ") or b"-1", 8)
    except ValueError:
        return False
    rest = block[:148] + block[156:]
    unsigned = sum(rest) + 256  # the checksum field counts as 8 spaces
    if stored == unsigned:
        return True
    high = len(rest) - len(rest.translate(None, _HIGH))  # bytes summed as negative by some tars
    return stored == unsigned - 256 * high


def _pax(data: bytes, offset: int) -> dict[str, str]:
    """``"%d %s=%s\\n"`` records; the keys a dump needs are path, linkpath and size."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:  # some writers pad with NULs
            break
        space = data.find(b" ", pos, pos + 24)
        try:
            length = int(data[pos:space]) if space > pos else -1
        except ValueError:
            length = -1
        record = data[pos : pos + length] if length > 0 else b""
        if length <= 0 or len(record) != length or not record.endswith(b"\n"):
            raise TarFormatError(f"pax header at offset {offset}: malformed record")
        key, sep, value = record[space - pos + 1 : -1].partition(b"=")
        if not sep:
            raise TarFormatError(f"pax header at offset {offset}: record without '='")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def scan(
    data: bytes | Input,
    wanted: Callable[[str], bool],
    safe_name: Callable[[str], str | None],
    budget: Budget,
    keep_dir: Callable[[str], bool] = lambda name: True,
) -> Scan:
    """Walk the archive once; see the module docstring. ``safe_name`` normalises a member name
    (None for an absolute name or one with ``..``); ``wanted`` is asked about safe names only,
    ``keep_dir`` which directory members to list."""
    out = Scan()
    src = data if isinstance(data, Input) else Input.of(data, budget)
    try:
        stream = _Stream(_decompressed(src, budget))
        _walk(stream, out, wanted, safe_name, budget, keep_dir)
        # Past the end-of-archive blocks to the end of the compressed stream: a copy cut in its
        # last bytes (the record's zero padding, gzip's CRC and length) is cut short too.
        while stream.read(_OUT_STEP):
            pass
    except TarFormatError as e:
        e.partial = out
        raise
    return out


def _walk(
    stream: _Stream,
    out: Scan,
    wanted: Callable[[str], bool],
    safe_name: Callable[[str], str | None],
    budget: Budget,
    keep_dir: Callable[[str], bool],
) -> None:
    limits = budget.limits
    long_name: str | None = None
    long_link: str | None = None
    pax: dict[str, str] = {}
    first = True
    arrived: str | None = None  # the regular member whose size is recorded once it is read
    while True:
        offset = stream.offset
        block = stream.read(BLOCK)
        if not block and first:
            raise TarFormatError("empty archive")
        if len(block) < BLOCK:
            if not block and not (long_name or long_link or pax):
                raise TarFormatError(
                    f"the tar data ends without its end-of-archive blocks (offset {offset})",
                    cut_short=True,
                )
            raise TarFormatError(f"data ends inside the header at offset {offset}", True)
        if block.count(0) == BLOCK:
            if first:
                raise TarFormatError("empty archive")
            return  # end of archive
        if not _checksum_ok(block):
            raise TarFormatError(f"header at offset {offset}: bad checksum (not a tar archive?)")
        first = False
        budget.add_member()
        kind = block[156:157]
        size = _number(block[124:136], "size", offset)
        if kind in (GNU_LONGNAME, GNU_LONGLINK, PAX_HEADER, PAX_GLOBAL, SOLARIS_PAX):
            label = "GNU long-name" if kind in (GNU_LONGNAME, GNU_LONGLINK) else "pax"
            if size < 0:
                raise TarFormatError(f"header at offset {offset}: negative size")
            budget.check_header(label, size)
            body = stream.exact(size, f"the {label} header at offset {offset}")
            stream.skip(_padded(size) - size, "padding")
            if kind == GNU_LONGNAME:
                long_name = _nts(body)
            elif kind == GNU_LONGLINK:
                long_link = _nts(body)
            elif kind in (PAX_HEADER, SOLARIS_PAX):
                pax = _pax(body, offset)
            continue
        name = _nts(block[0:100])
        if block[257:263] == b"ustar\x00" and block[345:500].strip(b"\0"):
            name = _nts(block[345:500]) + "/" + name
        link = _nts(block[157:257])
        name = pax.get("path", long_name if long_name is not None else name)
        link = pax.get("linkpath", long_link if long_link is not None else link)
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                raise TarFormatError(f"pax header before offset {offset}: bad size") from None
        long_name = long_link = None
        pax = {}
        if size < 0:
            raise TarFormatError(f"header at offset {offset}: negative size")
        if kind == GNU_SPARSE:  # old GNU sparse: extension headers follow, not in `size`
            extended = block[482]
            while extended:
                budget.add_member()
                extended = stream.exact(BLOCK, "a sparse extension header")[504]
        is_dir = kind == DIRECTORY or (kind == b"\0" and name.endswith("/"))
        skip = 0 if is_dir or kind in NO_DATA else _padded(size)
        safe = safe_name(name) if len(name) <= limits.max_name else None
        if safe is None:
            out.refused_count += 1
            if len(out.refused) < 50:
                out.refused.append(name[:200])
        elif is_dir:
            if keep_dir(safe):  # not every one: 100,000 names of 4 KiB would be 400 MB
                out.dirs.add(safe)
        elif kind in (HARDLINK, SYMLINK):
            if wanted(safe) and len(link) <= limits.max_name:
                out.links.append(Link(safe, link, kind == SYMLINK))
                out.names.add(safe)
        elif kind in REGULAR and not wanted(safe):
            if keep_dir(safe):  # its size, checked against a manifest; bounded as dirs are
                arrived = safe
        elif kind in REGULAR:
            arrived = safe
            out.names.add(safe)
            if size > limits.max_file:
                out.oversized[safe] = size
            else:
                budget.add_kept(size)
                out.files[safe] = stream.exact(size, f"member {safe[:200]}")
                skip -= size  # the padding is what is left
        stream.skip(skip, f"member {name[:200]}")
        if arrived is not None:  # whole: a member cut inside is not counted as there
            out.sizes[arrived] = size
            arrived = None
