"""Writes the corpus for fuzz_tar: small tar files, well-formed (ustar, GNU and pax as tarfile
writes them; a V7 directory; a GNU sparse member with an extension block) and malformed in
each way a shard can be (negative, overflowing and non-numeric sizes; pax records of length 0,
too short, too long, unframed, keyless; pax size=-512; extended headers that describe no
member; members and headers cut short; bad checksums and fields) and hostile (a global pax
header of 80,000 keys), each named by its SHA-1.

    python3 tests/fuzz/make_tar_seeds.py tests/fuzz/corpus/tar
"""

from __future__ import annotations

import hashlib
import io
import pathlib
import sys
import tarfile

END = bytes(1024)


def header(name: bytes = b"a.jpg", size: int = 0, kind: bytes = b"0", size_field: bytes | None = None,
           mtime: bytes = b"00000000000\0", magic: bytes = b"ustar\x0000", tail: dict[int, bytes] | None = None) -> bytes:
    """One 512-byte header with a correct checksum (unless the caller breaks it after)."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = mtime
    h[156:157] = kind
    h[257:265] = magic
    for at, value in (tail or {}).items():
        h[at:at + len(value)] = value
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def member(name: bytes, data: bytes, **kw: object) -> bytes:
    return header(name, len(data), **kw) + padded(data)  # type: ignore[arg-type]


def pax(records: bytes, kind: bytes = b"x") -> bytes:
    return header(b"PaxHeader/a", len(records), kind) + padded(records)


def record(key: str, value: str) -> bytes:
    """One pax record, "length key=value\\n", its length counting its own digits."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def many_keys(count: int) -> bytes:
    """`count` pax records of keys no reader knows ("1f=1"): 9 or 10 bytes each."""
    return b"".join(record(f"{i:x}", "1") for i in range(count))


def written(fmt: int, entries: list[tuple[str, bytes | None]]) -> bytes:
    """A tar as tarfile writes it: (name, data) files, (name, None) directories."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE if data is None else tarfile.REGTYPE
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data or b""))
    return out.getvalue()


def well_formed() -> list[bytes]:
    image = b"\xff\xd8\xff" + bytes(700)
    long_name = "d/" + "long-directory-name-" * 8 + "x.jpg"
    sparse = header(b"s.bin", 10, b"S", tail={482: b"\1"}) + bytes(512) + padded(b"0123456789")  # one extension
    return [
        written(tarfile.USTAR_FORMAT, [("dir", None), ("dir/a.jpg", image), ("dir/a.cls", b"3")]),
        written(tarfile.GNU_FORMAT, [(long_name, image), ("b.cls", b"1")]),
        written(tarfile.PAX_FORMAT, [("\u00e9t\u00e9/" + "x" * 150 + ".jpg", image), ("empty.jpg", b"")]),
        member(b"old/", b"", kind=b"\0", magic=b"\0" * 8) + member(b"v7.jpg", image, kind=b"\0", magic=b"\0" * 8) + END,
        pax(b"9 path=g\n", b"g") + member(b"a.jpg", image) + END,  # a global header names the next member
        pax(b"12 path=one\n") + pax(b"12 path=two\n") + member(b"a.jpg", image) + END,  # nested: the first wins
        pax(b"14 size=00010\n") + member(b"a.jpg", b"0123456789") + END,
        sparse + member(b"after.jpg", image) + END,
        member(b"a.jpg", image) + bytes(300),  # zeros shorter than a block after the last member
        pax(b"9 path=s\n", b"X") + member(b"a.jpg", image) + END,  # Solaris' pax header
        pax(b"9 path=a\n") * 6 + member(b"a.jpg", image) + END,  # a run of extended headers: the first wins
        END,  # an archive of no member
        # global records: path names every later member until the next global path; an 'x' path
        # wins for its member; other global keys (even tarfile's own) change nothing listed
        pax(record("path", "g1") + record("mtime", "7") + record("uname", "u") + record("linkpath", "l"), b"g")
        + member(b"a.jpg", image) + pax(record("path", "x")) + member(b"b.jpg", image)
        + pax(record("path", "g2"), b"g") + member(b"c.jpg", image) + END,
    ]


def hostile() -> list[bytes]:
    """Shards made to be slow: a global pax header of 80,000 keys (under the index's 1 MiB cap)
    before 60 members, the last two renamed by a second global header's path (tarfile, which
    the replay compares with, applies every global key to every member: more would be slow). Indexing it once per member
    cost seconds (every key was copied for every header); it must cost one pass."""
    keys = many_keys(80_000)
    members = b"".join(header(f"d{i}".encode(), kind=b"5") for i in range(57))
    return [pax(keys, b"g") + member(b"a.jpg", b"1") + members
            + pax(record("path", "p.jpg") + many_keys(5_000), b"g") + member(b"b.jpg", b"2") + member(b"c.jpg", b"3") + END]


def malformed() -> list[bytes]:
    image = b"\xff\xd8\xff" + bytes(100)
    good = member(b"a.jpg", image)
    bad_checksum = bytearray(good)
    bad_checksum[148:156] = b"0000000\0"
    return [
        header(b"neg.jpg", size_field=b"\xff" * 11 + b"\x00") + END,  # base-256 -256: offset backwards
        header(b"neg.jpg", size_field=b"\xff" * 12) + good + END,  # -1
        header(b"huge.jpg", size_field=b"\x80" + b"\xff" * 11) + END,  # 2**88 - 1
        header(b"odd.jpg", size_field=b"\x81" + bytes(11)) + END,  # not a base-256 marker
        header(b"sign.jpg", size_field=b"-0000001000\0") + good + END,  # octal text with a sign
        header(b"text.jpg", size_field=b"12abc\0\0\0\0\0\0\0") + END,
        header(b"mtime.jpg", mtime=b"zzzzzzzzzzz\0") + END,
        bytes(bad_checksum) + END,
        pax(b"0 x=y\n") + good + END,  # length 0: looped forever
        pax(b"3 x=\n") + good + END,  # shorter than the shortest record
        pax(b"5 x=y") + good + END,  # not ended by a newline
        pax(b"99 path=a\n") + good + END,  # longer than the header's data
        pax(b"8 pathx\n") + good + END,  # no '='
        pax(b"6 =ab\n") + good + END,  # no key
        pax(b"99999999999999999999 path=a\n") + good + END,
        pax(b"123456789012345678901 path=a\n") + good + END,  # 21 digits
        pax(b"x path=a\n") + good + END,
        pax(b"13 size=-512\n") + good + END,  # was "read to the end of the file" in the C reader
        pax(b"12 size=abc\n") + good + END,
        pax(b"30 size=1180591620717411303424\n") + good + END,  # 2**70
        pax(b"9 path=a\n") + END,  # describes no member
        header(b"././@LongLink", 5, b"L") + padded(b"long\0") + END,
        good[:512 + 60],  # the member's data cut short
        good + good[:200],  # a header cut short
        header(b"s.bin", 10, b"S", tail={482: b"\1"}),  # a sparse extension block missing
        member(b"dir", b"not a header" * 50, kind=b"5") + END,  # a directory's "data" read as a header
        pax(b"14 size=00010\n", b"g") + member(b"a.jpg", b"0123456789") + END,  # a global size: ambiguous
        b"\0",  # less than a header
    ]


def main(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for data in well_formed() + malformed() + hostile():
        (out / hashlib.sha1(data).hexdigest()).write_bytes(data)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
