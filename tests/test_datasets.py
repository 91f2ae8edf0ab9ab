"""Image sources: ImageFolder (torchvision's rules), Images, TarShards (WebDataset-style tar
shards), read by the Loader in threads and processes mode, sharded across ranks, and their
bad inputs."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastloop
from fastloop import ops
from test_images import natural

Image = pytest.importorskip("PIL.Image")

SIZE = (40, 48)  # (h, w) every test image is resized to


@pytest.fixture(autouse=True)
def index_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own (TarShards keeps its shard indexes there)."""
    folder = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("FASTLOOP_CACHE", str(folder))
    return folder


def jpeg_bytes(seed: int, fmt: str = "JPEG") -> bytes:
    h, w = 50 + 7 * (seed % 5), 60 + 11 * (seed % 4)
    out = io.BytesIO()
    Image.fromarray(natural(h, w, seed=seed)).save(out, fmt, quality=90)
    return out.getvalue()


def pillow_resized(data: bytes) -> np.ndarray:
    """The reference: Pillow decodes, converts to RGB and resizes (bilinear, antialiased)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(image.resize(SIZE[::-1], Image.BILINEAR))


def resized(image: np.ndarray) -> np.ndarray:
    """A Python transform for processes mode: the same resize on the decoded array."""
    return np.asarray(Image.fromarray(image).resize(SIZE[::-1], Image.BILINEAR))


def torchvision_rule(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision.datasets.ImageFolder's documented rule, restated: classes are the sorted
    folder names in root; each class folder is walked (os.walk, followlinks=True, sorted),
    its files sorted, kept when the lower-cased name ends with an allowed extension."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for index, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            samples += [(os.path.join(dirpath, f), index) for f in sorted(files)
                        if f.lower().endswith((".jpg", ".jpeg", ".png"))]
    return classes, samples


def make_folder(root: Path) -> dict[str, bytes]:
    """A class tree with nested folders, upper-case extensions, PNGs, non-image files, a
    symlinked file, a symlinked folder inside a class and a symlinked class folder."""
    files = {"cat/b.jpg": 0, "cat/A.JPG": 1, "cat/sub/deeper/c.jpeg": 2, "cat/sub/d.PNG": 3,
             "dog/x.png": 4, "dog/Y.Jpeg": 5, "dog/z.jpg": 6, "Zebra/q.jpg": 7, "ant/10.jpg": 8, "ant/9.jpg": 9}
    written = {}
    for rel, seed in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        written[rel] = jpeg_bytes(seed, "PNG" if rel.lower().endswith(".png") else "JPEG")
        path.write_bytes(written[rel])
    for junk in ("cat/notes.txt", "cat/jpg", "dog/x.png.bak", "dog/array.npy", "ant/.DS_Store"):
        (root / junk).write_bytes(b"not an image")
    elsewhere = root.parent / "elsewhere"
    (elsewhere / "more").mkdir(parents=True)
    (elsewhere / "more" / "m.jpg").write_bytes(jpeg_bytes(10))
    os.symlink(elsewhere / "more", root / "dog" / "linked")  # a folder symlink: followed
    os.symlink(root / "cat" / "b.jpg", root / "ant" / "alias.jpg")  # a file symlink
    os.symlink(elsewhere, root / "linked_class")  # a symlinked class folder
    return written


def test_image_folder_follows_torchvisions_rule(tmp_path: Path) -> None:
    root = tmp_path / "train"
    make_folder(root)
    folder = fastloop.ImageFolder(root)
    classes, samples = torchvision_rule(str(root))
    assert folder.classes == classes == ["Zebra", "ant", "cat", "dog", "linked_class"]
    assert folder.class_to_idx == {name: i for i, name in enumerate(classes)}
    assert folder.samples == samples and folder.targets == [label for _, label in samples]
    names = [os.path.relpath(p, root) for p, _ in folder.samples]
    assert names == ["Zebra/q.jpg", "ant/10.jpg", "ant/9.jpg", "ant/alias.jpg", "cat/A.JPG", "cat/b.jpg",
                     "cat/sub/d.PNG", "cat/sub/deeper/c.jpeg", "dog/Y.Jpeg", "dog/x.png", "dog/z.jpg",
                     "dog/linked/m.jpg", "linked_class/more/m.jpg"]  # a folder's files before its subfolders
    assert len(folder) == 13


def test_image_folder_getitem_decodes_and_applies_the_transforms(tmp_path: Path) -> None:
    root = tmp_path / "train"
    written = make_folder(root)
    folder = fastloop.ImageFolder(root, transform=resized, target_transform=lambda y: y * 10)
    image, label = folder[folder.samples.index((str(root / "cat" / "A.JPG"), 2))]
    np.testing.assert_array_equal(image, resized(np.asarray(Image.open(io.BytesIO(written["cat/A.JPG"])).convert("RGB"))))
    assert label == 20
    raw = fastloop.ImageFolder(root)
    assert raw[-1][0].shape == (50, 82, 3) and raw[-1][0].dtype == np.uint8  # m.jpg, seed 10
    with pytest.raises(IndexError, match="13"):
        raw[13]


def test_image_folder_without_classes_or_images_names_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fastloop.ImageFolder(tmp_path / "missing")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(jpeg_bytes(0))
    with pytest.raises(FileNotFoundError, match=f"class folder in {tmp_path / 'flat'}"):
        fastloop.ImageFolder(tmp_path / "flat")
    (tmp_path / "root" / "cat").mkdir(parents=True)
    (tmp_path / "root" / "cat" / "a.jpg").write_bytes(jpeg_bytes(0))
    (tmp_path / "root" / "dog").mkdir()
    (tmp_path / "root" / "dog" / "readme.txt").write_text("no images here")
    with pytest.raises(FileNotFoundError, match=f"classes dog in {tmp_path / 'root'}.*\\.jpg"):
        fastloop.ImageFolder(tmp_path / "root")


def loader_batches(source: object, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    with fastloop.Loader(source, batch_size=4, **kw) as loader:
        xs, ys = zip(*[(np.array(x), np.array(y)) for x, y in loader])
    return np.concatenate(xs), np.concatenate(ys)


FUSED = ops.Pipeline([ops.Resize(SIZE, reduced_decode=False)])


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_loader_over_image_folder_matches_pillow(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "train"
    written = make_folder(root)
    if mode == "threads":  # fused decode + resize in C threads
        x, y = loader_batches(fastloop.ImageFolder(root), num_workers=2, transform=FUSED)
    else:  # __getitem__ in worker processes, a Python transform
        x, y = loader_batches(fastloop.ImageFolder(root, transform=resized), num_workers=2, mode="processes")
    folder = fastloop.ImageFolder(root)
    assert y.tolist() == folder.targets and x.shape == (13,) + SIZE + (3,)
    for i, (path, _) in enumerate(folder.samples):
        reference = pillow_resized(Path(path).read_bytes())
        assert np.abs(x[i].astype(int) - reference).max() <= 1, path
    assert len(written) == 10


def test_images_take_paths_and_labels(tmp_path: Path) -> None:
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(jpeg_bytes(i))
    x, y = loader_batches(fastloop.Images(paths, labels=[4, 3, 2, 1, 0]), num_workers=2, transform=FUSED)
    assert y.tolist() == [4, 3, 2, 1, 0]
    for i, path in enumerate(paths):
        assert np.abs(x[i].astype(int) - pillow_resized(path.read_bytes())).max() <= 1
    assert fastloop.Images([str(p) for p in paths]).targets == [-1] * 5  # unlabelled
    with pytest.raises(ValueError, match="2 entries for 5 paths"):
        fastloop.Images(paths, labels=[0, 1])
    with pytest.raises(TypeError, match="list of image paths"):
        fastloop.Images(str(paths[0]))
    with pytest.raises(ValueError, match="empty"):
        fastloop.Images([])


# ---- tar shards ----

def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, samples: list[tuple[str, bytes, int]], fmt: int = tarfile.GNU_FORMAT,
                label: str = "cls", mode: str = "w") -> None:
    with tarfile.open(path, mode, format=fmt) as tar:
        for key, image, target in samples:
            add(tar, key + ".jpg", image)
            if label == "cls":
                add(tar, key + ".cls", f"{target}\n".encode())
            elif label == "json":
                add(tar, key + ".json", json.dumps({"label": target, "caption": "x"}).encode())


FORMATS = (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT)  # long names: 'L', 'x', prefix


def make_shards(folder: Path, sizes: list[int]) -> list[tuple[bytes, int]]:
    """Shards shard-000.tar... of the given sample counts: GNU, pax and ustar formats, .cls and
    .json labels, and a long member name (> 100 characters) in each. Returns [(jpeg, label)]."""
    out, seed = [], 0
    for s, count in enumerate(sizes):
        samples = []
        for i in range(count):
            key = f"s{s}/sample{i:04d}" if i else f"s{s}/{'long-directory-name-' * 6}/first"
            samples.append((key, jpeg_bytes(seed), seed % 7))
            out.append((samples[-1][1], seed % 7))
            seed += 1
        write_shard(folder / f"shard-{s:03d}.tar", samples, fmt=FORMATS[s % 3],
                    label="json" if s % 3 == 2 else "cls")
    return out


def test_tar_shards_index_members_in_order_with_labels(tmp_path: Path) -> None:
    expected = make_shards(tmp_path, [3, 2, 4])
    shards = fastloop.TarShards(str(tmp_path / "shard-{000..002}.tar"))
    assert len(shards) == 9 and shards.shard_sizes == [3, 2, 4]
    assert shards.targets == [label for _, label in expected]
    assert shards.members[0].startswith("s0/long-directory-name-") and len(shards.members[0]) > 100
    assert shards.members[3] == f"s1/{'long-directory-name-' * 6}/first.jpg"
    for i, (jpeg, label) in enumerate(expected):  # no extraction: the offsets point at the bytes
        with open(shards.files[shards.file_index[i]], "rb") as f:
            f.seek(int(shards.offsets[i]))
            assert f.read(int(shards.lengths[i])) == jpeg
    image, label = shards[4]
    np.testing.assert_array_equal(image, np.asarray(Image.open(io.BytesIO(expected[4][0])).convert("RGB")))
    assert label == expected[4][1]
    assert len(fastloop.TarShards(str(tmp_path / "shard-*.tar"))) == 9
    assert len(fastloop.TarShards([tmp_path / "shard-002.tar", tmp_path / "shard-000.tar"])) == 7


def test_the_header_index_agrees_with_pythons_tarfile(tmp_path: Path) -> None:
    from fastloop.data import _tar_index

    make_shards(tmp_path, [3, 3, 3])
    with tarfile.open(tmp_path / "shard-001.tar", "a", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "\u00e9t\u00e9/" + "x" * 150 + ".jpg", jpeg_bytes(0))  # non-ASCII pax path
        folder = tarfile.TarInfo("a-folder")
        folder.type = tarfile.DIRTYPE  # not a regular file: not listed
        tar.addfile(folder)
    for s in range(3):
        path = tmp_path / f"shard-{s:03d}.tar"
        with tarfile.open(path) as tar:
            expected = [(m.name, m.offset_data, m.size) for m in tar.getmembers() if m.isreg()]
        fd = os.open(path, os.O_RDONLY)
        try:
            assert list(_tar_index.members(fd, os.fstat(fd).st_size)) == expected
        finally:
            os.close(fd)


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_loader_over_tar_shards_matches_pillow(tmp_path: Path, mode: str) -> None:
    expected = make_shards(tmp_path, [5, 3, 6])
    if mode == "threads":
        x, y = loader_batches(fastloop.TarShards(str(tmp_path / "*.tar")), num_workers=2, transform=FUSED)
    else:
        x, y = loader_batches(fastloop.TarShards(str(tmp_path / "*.tar"), transform=resized), num_workers=2,
                              mode="processes")
    assert y.tolist() == [label for _, label in expected]
    for i, (jpeg, _) in enumerate(expected):
        assert np.abs(x[i].astype(int) - pillow_resized(jpeg)).max() <= 1


def test_a_bad_image_in_a_shard_names_shard_member_and_index(tmp_path: Path) -> None:
    samples = [(f"k{i}", jpeg_bytes(i), i) for i in range(6)]
    samples[4] = ("k4", jpeg_bytes(4)[:300], 4)  # truncated JPEG
    write_shard(tmp_path / "bad.tar", samples)
    shards = fastloop.TarShards(tmp_path / "bad.tar")
    with fastloop.Loader(shards, batch_size=2, num_workers=2, transform=FUSED) as loader:
        it = iter(loader)
        next(it), next(it)  # earlier batches delivered
        with pytest.raises(fastloop.DecodeError, match=r"sample 4: .*bad\.tar.*libjpeg.*member 'k4\.jpg'"):
            next(it)
    with pytest.raises(fastloop.DecodeError, match=r"sample 4: .*bad\.tar, member 'k4\.jpg'"):
        shards[4]


def test_unusable_tars_are_refused_naming_the_shard(tmp_path: Path) -> None:
    good = [(f"k{i}", jpeg_bytes(i), i) for i in range(3)]
    write_shard(tmp_path / "gz.tar.gz", good, mode="w:gz")
    with pytest.raises(ValueError, match=r"gz\.tar\.gz is a gzip-compressed tar.*uncompressed"):
        fastloop.TarShards(tmp_path / "gz.tar.gz")
    (tmp_path / "junk.tar").write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match=r"junk\.tar is not a readable tar file"):
        fastloop.TarShards(tmp_path / "junk.tar")
    write_shard(tmp_path / "cut.tar", good)
    data = (tmp_path / "cut.tar").read_bytes()
    end = data.rfind(b"k2.jpg")  # cut inside the last image's data
    (tmp_path / "cut.tar").write_bytes(data[:end + 900])
    with pytest.raises(ValueError, match=r"cut\.tar is truncated: member 'k2\.jpg'"):
        fastloop.TarShards(tmp_path / "cut.tar")
    with pytest.raises(FileNotFoundError, match="no file matches"):
        fastloop.TarShards(str(tmp_path / "none-*.tar"))
    with pytest.raises(FileNotFoundError, match=r"missing-000\.tar' does not exist"):
        fastloop.TarShards(str(tmp_path / "missing-{000..001}.tar"))


FUZZ = Path(__file__).resolve().parent / "fuzz"


def tar_seeds() -> tuple[list[bytes], list[bytes]]:
    """(well-formed, malformed) tar files of tests/fuzz/make_tar_seeds.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tar_seeds", FUZZ / "make_tar_seeds.py")
    seeds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seeds)  # type: ignore[union-attr]
    return seeds.well_formed(), seeds.malformed()


def tar_index_of(data: bytes, tmp_path: Path) -> list[tuple[str, int, int]]:
    from fastloop.data import _tar_index

    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(_tar_index.members(fd, len(data)))
    finally:
        os.close(fd)


def test_global_pax_records_give_path_to_every_later_member_and_nothing_else(tmp_path: Path) -> None:
    """A global ('g') pax path names every later member until the next global path, an 'x'
    path wins for its own member, a global size is refused (tarfile reads it two ways), and
    every other global key (mtime, uname, linkpath, 80,000 unknown ones) changes nothing: as
    tarfile lists the same files. The index keeps path and size only, never every key."""
    from fastloop.data import _tar_index

    sys.path.insert(0, str(FUZZ))
    from fuzz_tar import tarfile_members
    from make_tar_seeds import END, hostile, many_keys, member, pax, record

    image = b"\xff\xd8\xff" + bytes(700)
    data = (pax(record("path", "g1") + record("mtime", "7") + record("uname", "u") + record("linkpath", "l"), b"g")
            + member(b"a.jpg", image) + pax(record("path", "x")) + member(b"b.jpg", image)
            + pax(record("path", "g2"), b"g") + member(b"c.jpg", image) + END)
    found = tar_index_of(data, tmp_path)
    assert [name for name, _, _ in found] == ["g1", "x", "g2"]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert [(m.name, m.offset_data, m.size) for m in tar.getmembers() if m.isreg()] == found

    (big,) = hostile()
    found = tar_index_of(big, tmp_path)
    assert [name for name, _, _ in found] == ["a.jpg", "p.jpg", "p.jpg"]
    assert [(offset, size) for _, offset, size in found] == tarfile_members(big)

    keys = many_keys(80_000) + record("path", "n.jpg") + record("size", "3")
    assert len(keys) < _tar_index.MAX_EXTENDED
    assert _tar_index._pax_records(keys, 0) == {"path": "n.jpg", "size": "3"}  # one pass, two keys kept
    assert [name for name, _, _ in tar_index_of(pax(many_keys(80_000), b"g") + member(b"a.jpg", image) + END,
                                                 tmp_path)] == ["a.jpg"]
    with pytest.raises(_tar_index.TarError, match=r"global pax header at byte 0 sets a size"):
        tar_index_of(pax(many_keys(1_000) + record("size", "10"), b"g") + member(b"a.jpg", bytes(10)) + END, tmp_path)


def test_each_malformed_shard_is_refused_naming_the_shard_and_the_byte(tmp_path: Path) -> None:
    """Negative and overflowing sizes, pax records of any length ("0 x=y" looped forever), pax
    size=-512, headers describing no member, members cut short: a ValueError naming the shard
    and the byte offset, never a hang."""
    for i, data in enumerate(tar_seeds()[1]):
        path = tmp_path / f"bad-{i:02d}.tar"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=rf"TarShards: {re.escape(str(path))} is .*\bbyte \d+"):
            fastloop.TarShards(path)


def test_random_mutations_of_shards_are_indexed_as_tarfile_reads_them_or_refused() -> None:
    """tests/fuzz/fuzz_tar.check (never more lenient than tarfile, an error names its byte, a
    bounded number of reads) over mutated shards: bytes changed, inserted, deleted, header
    fields overwritten, checksums fixed so the mutation reaches past them."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    sys.path.insert(0, str(FUZZ))
    from fuzz_tar import check

    good, bad = tar_seeds()
    values = [b"\xff" * 12, b"\x80" + bytes(10) + b"\x01", b"-1", b"77777777777", b"x", b"g", b"L", b"S", b"\0"]

    def mutated(draw: Any) -> bytes:
        data = bytearray(draw(st.sampled_from(good + bad)))
        for _ in range(draw(st.integers(1, 6))):
            at = draw(st.integers(0, max(0, len(data) - 1)))
            kind = draw(st.integers(0, 3))
            if kind == 0 and data:
                data[at] = draw(st.integers(0, 255))
            elif kind == 1:
                data[at:at] = draw(st.binary(min_size=1, max_size=16))
            elif kind == 2:
                del data[at:at + draw(st.integers(1, 600))]
            else:
                block, field = at // 512 * 512, draw(st.sampled_from([0, 124, 148, 156, 345, 482]))
                value = draw(st.sampled_from(values))
                data[block + field:block + field + len(value)] = value
        for block in range(0, len(data) - 511, 512):  # valid checksums take the mutation deeper
            header = data[block:block + 512]
            if any(header):
                header[148:156] = b" " * 8
                data[block + 148:block + 156] = b"%06o\0 " % sum(header)
        return bytes(data)

    @hypothesis.settings(max_examples=300, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.composite(mutated)())
    def holds(data: bytes) -> None:
        check(data)

    holds()


def test_the_encoded_image_reader_refuses_lengths_it_cannot_read(tmp_path: Path) -> None:
    """What the C reader is handed is checked: a length below -1 (-1 alone means "to the end
    of the file"; a pax size=-512 used to become that) at construction, and a length past the
    end of the file before a buffer that large is asked for."""
    image = tmp_path / "a.jpg"
    image.write_bytes(jpeg_bytes(0))

    class Spans:
        targets = [0]

        def __init__(self, length: int) -> None:
            self.length = length

        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> tuple:
            raise AssertionError("read by the C threads")

        def _encoded_spec(self) -> tuple:
            return [str(image)], [0], [0], [self.length]

    with pytest.raises(ValueError, match=r"sample 0 .* at offset 0, -512 bytes"):
        fastloop.Loader(Spans(-512), transform=FUSED)
    with fastloop.Loader(Spans(2**40), transform=FUSED) as loader:
        with pytest.raises(ValueError, match=r"a\.jpg ends at byte \d+, before the image's 1099511627776 bytes"):
            next(iter(loader))
    assert next(iter(fastloop.Loader(Spans(-1), transform=FUSED)))[0].shape == (1, *SIZE, 3)


def test_labels_missing_or_malformed_are_named(tmp_path: Path) -> None:
    samples = [(f"k{i}", jpeg_bytes(i), i) for i in range(2)]
    write_shard(tmp_path / "nolabel.tar", samples, label="none")
    with pytest.raises(ValueError, match=r"nolabel\.tar: sample 'k0' has no label.*k0\.cls.*labels=False"):
        fastloop.TarShards(tmp_path / "nolabel.tar")
    assert fastloop.TarShards(tmp_path / "nolabel.tar", labels=False).targets == [-1, -1]
    with tarfile.open(tmp_path / "badjson.tar", "w") as tar:
        add(tar, "a.jpg", jpeg_bytes(0))
        add(tar, "a.json", b'{"caption": "no label"}')
    with pytest.raises(ValueError, match=r"member 'a\.json': not a label.*\"label\""):
        fastloop.TarShards(tmp_path / "badjson.tar")
    with tarfile.open(tmp_path / "cls.tar", "w") as tar:
        add(tar, "a.jpg", jpeg_bytes(0))
        add(tar, "a.cls", b"seven")
    with pytest.raises(ValueError, match=r"member 'a\.cls': not a label"):
        fastloop.TarShards(tmp_path / "cls.tar")
    with tarfile.open(tmp_path / "noimage.tar", "w") as tar:
        add(tar, "a.txt", b"text")
        add(tar, "a.cls", b"1")
    with pytest.raises(ValueError, match=r"sample 'a' has no \.jpg/\.jpeg/\.png member \(it has \.txt, \.cls\)"):
        fastloop.TarShards(tmp_path / "noimage.tar")


def test_the_index_is_cached_until_the_shard_changes(tmp_path: Path, index_cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from fastloop.data import _tar_index

    expected = make_shards(tmp_path, [3, 2])
    first = fastloop.TarShards(str(tmp_path / "*.tar"))
    assert len(list((index_cache / "tar-index").glob("*.npz"))) == 2

    def unread(*args: object) -> None:
        raise AssertionError("the headers were read again")

    with monkeypatch.context() as patch:
        patch.setattr(_tar_index, "members", unread)
        again = fastloop.TarShards(str(tmp_path / "*.tar"))
    assert (again.members, again.targets, again.offsets.tolist(), again.lengths.tolist()) == \
        (first.members, first.targets, first.offsets.tolist(), first.lengths.tolist())
    write_shard(tmp_path / "shard-001.tar", [("new", expected[0][0], 6)])  # changed: indexed anew
    assert fastloop.TarShards(str(tmp_path / "*.tar")).targets == first.targets[:3] + [6]
    for cached in (index_cache / "tar-index").glob("*.npz"):
        cached.write_bytes(b"garbage")  # an unreadable cache entry is rebuilt, not an error
    assert fastloop.TarShards(str(tmp_path / "*.tar")).targets == first.targets[:3] + [6]
    with monkeypatch.context() as patch:
        patch.setattr(_tar_index, "members", unread)
        with pytest.raises(AssertionError, match="read again"):
            fastloop.TarShards(str(tmp_path / "*.tar"), index_cache=False)


def test_webdataset_grouping_keys_and_metadata(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        add(tar, "__key__", b"ignored")
        add(tar, "dir.v1/img.seg.PNG", jpeg_bytes(0, "PNG"))  # key: up to the file name's first dot
        add(tar, "dir.v1/img.seg.cls", b"3")
        add(tar, "dir.v1/other.jpeg", jpeg_bytes(1))
        add(tar, "dir.v1/other.json", b'{"cls": 5}')
    shards = fastloop.TarShards(tmp_path / "s.tar")
    assert shards.members == ["dir.v1/img.seg.PNG", "dir.v1/other.jpeg"] and shards.targets == [3, 5]
    assert fastloop.datasets.split_key("a/b.c/x.seg.jpg") == ("a/b.c/x", "seg.jpg")
    assert fastloop.datasets.expand_braces("t-{08..10}-{a,b}.tar") == \
        ["t-08-a.tar", "t-08-b.tar", "t-09-a.tar", "t-09-b.tar", "t-10-a.tar", "t-10-b.tar"]


def labels_per_rank(source: fastloop.TarShards, world_size: int, **kw: object) -> list[list[int]]:
    ranks = []
    for rank in range(world_size):
        with fastloop.Loader(source, batch_size=2, rank=rank, world_size=world_size, transform=FUSED, **kw) as loader:
            ranks.append([int(v) for _, y in loader for v in np.array(y)])
            assert len(loader) == len(ranks[0]) // 2 + len(ranks[0]) % 2
    return ranks


def test_split_by_shard_gives_each_rank_whole_shards_and_equal_steps(tmp_path: Path) -> None:
    sizes = [3, 5, 2, 4, 3]  # rank 0: shards 0, 3 (7 samples); 1: 1, 4 (8); 2: shard 2 (2: samples 8, 9)
    make_shards(tmp_path, sizes)
    shards = fastloop.TarShards(str(tmp_path / "*.tar"), labels=False)
    shards.targets = list(range(len(shards)))  # labels = global sample index, to see who read what
    starts = np.cumsum([0] + sizes)
    own = [set(range(starts[s], starts[s + 1])) for s in range(5)]
    ranks = labels_per_rank(shards, 3, split_by="shard")
    assert [len(r) for r in ranks] == [8, 8, 8]  # padded by wrapping to the largest rank
    assert set(ranks[0]) == own[0] | own[3] and set(ranks[1]) == own[1] | own[4] and set(ranks[2]) == own[2]
    assert ranks[2] == [8, 9] * 4 and ranks[0] == [0, 1, 2, 10, 11, 12, 13, 0]
    trimmed = labels_per_rank(shards, 3, split_by="shard", drop_last=True)
    assert [len(r) for r in trimmed] == [2, 2, 2]
    shuffled = labels_per_rank(shards, 3, split_by="shard", shuffle=True, seed=3)
    assert [sorted(r) for r in shuffled] == [sorted(r) for r in ranks]
    by_sample = labels_per_rank(shards, 3)  # the default: samples strided across ranks
    assert sorted(v for r in by_sample for v in r) == sorted(list(range(17)) + [0])  # padded by one
    with pytest.raises(ValueError, match="5 shards for world_size=6"):
        fastloop.Loader(shards, rank=0, world_size=6, split_by="shard", transform=FUSED)
    with pytest.raises(TypeError, match="split_by='shard' splits fastloop.TarShards"):
        fastloop.Loader(fastloop.Images([tmp_path / "x.jpg"]), split_by="shard", transform=FUSED)
    with pytest.raises(ValueError, match="'split_by'"):
        fastloop.Loader(shards, split_by="file", transform=FUSED)


def test_split_by_shard_reads_rank_and_world_size_from_torchrun_variables(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    make_shards(tmp_path, [2, 3])
    shards = fastloop.TarShards(str(tmp_path / "*.tar"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with fastloop.Loader(shards, batch_size=3, split_by="shard", transform=FUSED) as loader:
        (x, y), = list(loader)
    assert y.tolist() == shards.targets[2:]


def test_split_by_shard_in_processes_mode_reads_the_ranks_shards(tmp_path: Path) -> None:
    expected = make_shards(tmp_path, [2, 3, 2])
    shards = fastloop.TarShards(str(tmp_path / "*.tar"), transform=resized)
    with fastloop.Loader(shards, batch_size=2, num_workers=1, mode="processes", rank=1, world_size=2,
                         split_by="shard") as loader:
        labels = [int(v) for _, y in loader for v in np.array(y)]
    assert labels == [label for _, label in expected[2:5]] + [expected[2][1]]  # shard 1, padded to 4


def test_image_folder_is_a_torch_dataset(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    root = tmp_path / "train"
    make_folder(root)
    folder = fastloop.ImageFolder(root, transform=lambda image: torch.tensor(resized(image)))
    x, y = next(iter(torch.utils.data.DataLoader(folder, batch_size=5)))
    assert x.shape == (5,) + SIZE + (3,) and y.tolist() == folder.targets[:5]
    np.testing.assert_array_equal(x[1].numpy(), folder[1][0].numpy())
