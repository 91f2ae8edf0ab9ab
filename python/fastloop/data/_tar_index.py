"""The regular-file members of an uncompressed tar file, from its headers alone.

One pread of 512 bytes per header: POSIX ustar, pax ('x' and 'g' headers: path and size) and
GNU ('L' long names, 'K' long link names, 'S' sparse members) are understood. Python's tarfile
reads the same but ~10x slower (buffered reads that refill across every skipped member, much
per-header bookkeeping): 2 s instead of 0.2 s for ImageNet-size shards of 10,000 members,
which would be paid before a first batch.

The headers are outside bytes, checked at least as strictly as tarfile checks them (its
numeric fields, checksums and pax record framing), and more strictly where tarfile would go
on quietly: a negative or overflowing size, a bad header after the first one, an extended
header that describes no member, a member cut short are each a TarError naming the byte
offset. Every header moves the offset forward by at least 512 bytes and every pax record by
at least 5, so any file is read in time linear in its size (tests/fuzz/corpus/tar).
"""

from __future__ import annotations

import os
import re
from typing import Iterator

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
MAX_EXTENDED = 1 << 20  # a pax / long-name header's data: names and numbers, never a megabyte
REGULAR = (b"0", b"\0", b"7")  # files (and contiguous files) whose data follows the header
NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, FIFOs: no data blocks (tarfile)
EXTENDED = (b"x", b"X", b"g", b"L", b"K")  # describe the next member ('X': Solaris' pax header, as tarfile reads it)
NUMERIC_FIELDS = (("mode", 100, 108), ("uid", 108, 116), ("gid", 116, 124), ("mtime", 136, 148),
                  ("devmajor", 329, 337), ("devminor", 337, 345))  # those tarfile parses besides size
_RECORD = re.compile(rb"([0-9]{1,20}) ")  # a pax record's length, as tarfile frames it
_KEPT = (b"path", b"size")  # the pax keys the index reads; every other key is framed and dropped


class TarError(ValueError):
    """The file is not a readable tar (bad checksum or field, cut short, a size out of range)."""


def _number(field: bytes, what: str, offset: int) -> int:
    """A numeric field as tarfile reads it: octal text (NUL/space-padded), or base-256 after a
    0x80 (positive) or 0xff (negative) byte."""
    if field[0] in (0x80, 0xFF):
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1))) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0  # int() refuses bytes outside ASCII, as tarfile's decode
    except ValueError:
        raise TarError(f"bad {what} field {field!r} in the header at byte {offset}") from None


def _checked(header: bytes, offset: int) -> int:
    """The header's size field, after checking its checksum and numeric fields."""
    stored = _number(header[148:156], "checksum", offset)
    unsigned = 256 + sum(header) - sum(header[148:156])  # the checksum field counts as 8 spaces
    if stored != unsigned and stored != unsigned - 256 * sum(b > 127 for b in header[:148] + header[156:]):
        raise TarError(f"bad header checksum at byte {offset}")  # (old tars summed signed bytes)
    for what, start, end in NUMERIC_FIELDS:
        field = header[start:end]
        if field.split(b"\0", 1)[0].strip().translate(None, b"01234567"):  # not plain octal: as tarfile reads it
            _number(field, what, offset)
    return _number(header[124:136], "size", offset)


def _pax_records(data: bytes, offset: int) -> dict[str, str]:
    """The `path` and `size` of a pax header's "length key=value\\n" records (the last of each
    wins), every record framed as tarfile frames them: a length of 5 or more that ends inside
    the data on a newline, a key, an '='. Other keys are checked and dropped: a header of 100k
    keys must cost one pass, not a dict that every later member copies."""
    records, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        match = _RECORD.match(data, pos)
        length = int(match.group(1)) if match else 0
        end = pos + length - 1  # the record's newline
        if length < 5 or end >= len(data) or data[end] != 0x0A:
            raise TarError(f"bad pax record at byte {pos} of the pax header at byte {offset}")
        key, equals, value = data[match.end():end].partition(b"=")
        if not key or not equals:
            raise TarError(f"bad pax record at byte {pos} of the pax header at byte {offset}")
        if key in _KEPT:
            records[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _pax_size(value: str, offset: int) -> int:
    """A pax size: decimal digits only (tarfile's int() would take '-512', and 'x' as 0)."""
    if not (value.isascii() and value.isdigit()):
        raise TarError(f"bad pax size {value!r} for the member at byte {offset}")
    return int(value)


def _sparse_map(block: bytes, start: int, entries: int, offset: int) -> None:
    """Checks the (offset, size) pairs of a GNU sparse map, as tarfile reads them."""
    for at in range(start, start + 24 * entries, 12):
        _number(block[at:at + 12], "sparse map", offset)


def _sparse_blocks(fd: int, header: bytes, offset: int, file_size: int) -> int:
    """The GNU sparse extension blocks after an 'S' header (each says whether one more follows),
    their maps checked."""
    _sparse_map(header, 386, 4, offset)
    _number(header[483:495], "sparse size", offset)
    blocks, extended = 0, header[482]
    while extended:
        at = offset + BLOCK * (blocks + 1)
        if at + BLOCK > file_size:
            raise TarError(f"truncated: the sparse member at byte {offset} needs a header at byte {at}")
        block = os.pread(fd, BLOCK, at)
        _sparse_map(block, 0, 21, at)
        extended, blocks = block[504], blocks + 1
    return blocks


def members(fd: int, file_size: int) -> Iterator[tuple[str, int, int]]:
    """(name, data offset, size) of each regular file in the tar open as `fd`, in order.
    Raises TarError naming the byte offset of a bad header, or a member cut short."""
    offset, global_path = 0, None  # a global pax path names every later member (tarfile applies it so)
    pending: dict[str, str] | None = None  # path/size extended headers give the next member; None: none came
    while offset < file_size:
        header = os.pread(fd, BLOCK, offset)
        if offset > 0 and not any(header):  # the end-of-archive marker (or zeros up to the end)
            break
        if len(header) < BLOCK:
            raise TarError(f"truncated: a header at byte {offset} is cut short")
        if header == ZERO_BLOCK:  # at byte 0: an archive of no member
            break
        kind, size = header[156:157], _checked(header, offset)
        raw_name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if kind == b"\0" and raw_name.endswith("/"):  # a V7 directory (as tarfile reads it)
            kind = b"5"
        said_path, said_size = (pending.get("path"), pending.get("size")) if pending is not None else (global_path, None)
        if kind not in EXTENDED and said_size is not None:
            size = _pax_size(said_size, offset)
        if size < 0:
            raise TarError(f"a negative size ({size}) in the header at byte {offset}")
        data = offset + BLOCK * (1 + (_sparse_blocks(fd, header, offset, file_size) if kind == b"S" else 0))
        name = raw_name if said_path is None else said_path
        end = data if kind in NO_DATA else data + (size + BLOCK - 1) // BLOCK * BLOCK  # with its padding
        if end > file_size:
            raise TarError(f"truncated: member {name!r} at byte {offset} needs {end} bytes, the file has {file_size}")
        if kind in EXTENDED:
            if size > MAX_EXTENDED:
                raise TarError(f"the '{kind.decode()}' header at byte {offset} holds {size} bytes, more than "
                               f"{MAX_EXTENDED}")
            payload = os.pread(fd, size, data)
            # what this header says of the next member, the global path as it stands now included
            described = {} if global_path is None else {"path": global_path}
            if kind == b"g":
                records = _pax_records(payload, offset)
                if "size" in records:  # every later member's size: tarfile itself reads such a file two ways
                    raise TarError(f"the global pax header at byte {offset} sets a size")
                if "path" in records:
                    global_path = described["path"] = records["path"]
            elif kind in (b"x", b"X"):
                described.update(_pax_records(payload, offset))
            elif kind == b"L":
                described = {"path": payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")}
            else:  # 'K': the next member's link target
                described = {}
            pending = {**described, **(pending or {})}  # the first extended header wins, as tarfile nests them
        else:
            if kind in REGULAR:
                if said_path is None and header[257:263] == b"ustar\0" and header[345] != 0:  # POSIX prefix
                    prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                    name = f"{prefix}/{name}"
                yield name, data, size
            pending = None
        offset = end
    if pending is not None:
        raise TarError(f"the extended header before byte {offset} describes no member")
