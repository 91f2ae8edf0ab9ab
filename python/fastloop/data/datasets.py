"""Image sources for the Loader: a folder per class (torchvision's ImageFolder), a list of
files, and WebDataset-style tar shards.

Each is a map-style dataset (``__len__``, ``__getitem__`` -> (HWC uint8 RGB image, label),
decoded by fastloop.images.decode, then transform / target_transform), so it works as a
torch Dataset and in the Loader's processes mode. In threads mode with a size-fixing
Pipeline the Loader reads it through ``_encoded_spec()`` (file, byte offset and length of
every sample): one pread and the fused decode -> crop -> resize per sample in C threads.

    >>> train = fastloop.ImageFolder("train/")
    >>> loader = fastloop.Loader(train, batch_size=128, shuffle=True, num_workers=8, transform=pipeline)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import zipfile
from typing import Any, Callable, Iterable, Sequence, Union

import numpy as np

from . import _tar_index
from .._cache import cache_root
from .._files import write_atomically
from ..errors import retold

__all__ = ["ImageFolder", "Images", "TarShards", "IMG_EXTENSIONS"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png")
"""The file extensions image sources read (matched case-insensitively)."""

PathLike = Union[str, "os.PathLike[str]"]


class _EncodedSource:
    """What the three sources share: per sample a file, an offset and a length (-1: the
    whole file), a label, and __getitem__ decoding it in Python."""

    files: list[str]
    """The files the samples are read from."""
    file_index: np.ndarray
    """int32, one per sample: which of `files` holds it."""
    offsets: np.ndarray
    """int64, one per sample: where it starts in its file."""
    lengths: np.ndarray
    """int64, one per sample: its size in bytes (-1: to the end of the file)."""
    targets: list[int]
    transform: Callable[[Any], Any] | None
    """Called on each decoded image (None: the image as decoded)."""
    target_transform: Callable[[Any], Any] | None
    """Called on each label (None: the label as is)."""

    def __len__(self) -> int:
        return len(self.targets)

    def _read(self, index: int) -> bytes:
        path = self.files[self.file_index[index]]
        with open(path, "rb") as f:
            f.seek(int(self.offsets[index]))
            length = int(self.lengths[index])
            return f.read() if length < 0 else f.read(length)

    def _where(self, index: int) -> str:
        """The sample's file (and tar member), for error messages."""
        return self.files[self.file_index[index]]

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        from . import images

        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"sample index {index} is out of range for {type(self).__name__} of {n} samples")
        index = index % n
        try:
            image: Any = images.decode(self._read(index))
        except ValueError as error:
            raise retold(error, f"sample {index}: {self._where(index)}: {error}") from None
        target: Any = self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _encoded_spec(self) -> tuple:
        return ([os.fsencode(os.path.abspath(p)) for p in self.files], self.file_index, self.offsets,
                self.lengths)


def _whole_files(source: _EncodedSource, paths: list[str]) -> None:
    n = len(paths)
    source.files = paths
    source.file_index = np.arange(n, dtype=np.int32)
    source.offsets = np.zeros(n, np.int64)
    source.lengths = np.full(n, -1, np.int64)


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


class ImageFolder(_EncodedSource):
    """A folder per class of JPEG/PNG files, read with torchvision's ImageFolder rules:
    classes are the sorted subfolder names (``classes``, ``class_to_idx``), files are found
    by walking each class folder (sorted, symlinks followed) and kept when their extension is
    .jpg, .jpeg or .png in any case; ``samples`` is [(path, class index)], ``targets`` the
    labels. The same file gets the same label and the same index as in torchvision.

    Raises FileNotFoundError naming root when it has no class folder or a class folder has
    no image (as torchvision does).

    >>> train = fastloop.ImageFolder("train/")          # train/cat/001.jpg, train/dog/...
    >>> train.classes, len(train), train[0][0].shape    # (['cat', 'dog'], 2000, (375, 500, 3))
    """

    def __init__(self, root: PathLike, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None) -> None:
        self.root = os.fspath(root)
        self.transform, self.target_transform = transform, target_transform
        self.classes, self.class_to_idx = self.find_classes(self.root)
        self.samples = self.make_dataset(self.root, self.class_to_idx)
        self.imgs = self.samples  # torchvision's older name
        self.targets = [label for _, label in self.samples]
        _whole_files(self, [path for path, _ in self.samples])

    @staticmethod
    def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
        """(sorted class folder names, {name: index}), as torchvision's find_classes."""
        try:
            classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        except FileNotFoundError:
            raise FileNotFoundError(f"ImageFolder: {root!r} does not exist") from None
        except NotADirectoryError:
            raise NotADirectoryError(f"ImageFolder: {root!r} is not a folder") from None
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
        return classes, {name: i for i, name in enumerate(classes)}

    @staticmethod
    def make_dataset(root: str, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
        """[(path, class index)] in torchvision's make_dataset order."""
        samples, empty = [], []
        for name in sorted(class_to_idx):
            folder = os.path.join(root, name)
            found = [(os.path.join(dirpath, f), class_to_idx[name])
                     for dirpath, _, files in sorted(os.walk(folder, followlinks=True))
                     for f in sorted(files) if _is_image(f)]
            if not found:
                empty.append(name)
            samples += found
        if empty:
            raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))} in {root}. "
                                    f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}")
        return samples

    def __repr__(self) -> str:
        return f"ImageFolder({self.root!r}, {len(self)} images, {len(self.classes)} classes)"


class Images(_EncodedSource):
    """A list of JPEG/PNG files with their labels (default: -1 for every file, "no label").

    >>> test = fastloop.Images(sorted(glob.glob("test/*.jpg")))
    >>> x, y = test[0]                                  # (h, w, 3) uint8, -1
    """

    def __init__(self, paths: Iterable[PathLike], labels: Sequence[int] | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None) -> None:
        if isinstance(paths, (str, bytes, os.PathLike)):
            raise TypeError(f"'paths' must be a list of image paths, not one path ({paths!r}): pass [path], "
                            f"or fastloop.ImageFolder(root) for a folder per class")
        files = [os.fspath(p) for p in paths]
        if not files:
            raise ValueError("'paths' is empty: Images needs at least one file")
        if labels is None:
            targets = [-1] * len(files)
        else:
            targets = [int(v) for v in np.asarray(labels).reshape(-1)] if not isinstance(labels, list) \
                else [int(v) for v in labels]
            if len(targets) != len(files):
                raise ValueError(f"'labels' has {len(targets)} entries for {len(files)} paths: give one per path")
        self.transform, self.target_transform = transform, target_transform
        self.targets = targets
        _whole_files(self, files)

    def __repr__(self) -> str:
        return f"Images({len(self)} files)"


# ---- tar shards ----

_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
               b"\x04\x22\x4d\x18": "lz4"}


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's (braceexpand's) patterns: "a-{000..003}.tar" (zero-padded to the
    width of the bounds), "{train,val}-{0..1}.tar"; a pattern without braces is itself."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[:match.start()], match.group(1), pattern[match.end():]
    numbers = re.fullmatch(r"(-?\d+)\.\.(-?\d+)", body)
    if numbers:
        a, b = numbers.groups()
        width = max(len(a), len(b)) if a.startswith("0") or b.startswith("0") else 0
        step = 1 if int(b) >= int(a) else -1
        parts = [str(i).zfill(width) for i in range(int(a), int(b) + step, step)]
    else:
        parts = body.split(",")
    return [expanded for part in parts for expanded in expand_braces(head + part + tail)]


def shard_paths(urls: Union[PathLike, Sequence[PathLike]]) -> list[str]:
    """The shard files of a brace/glob pattern or a list of paths and patterns, in order
    (a glob's matches sorted). Raises FileNotFoundError naming a pattern that matches nothing."""
    items = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
    paths: list[str] = []
    for item in items:
        for pattern in expand_braces(os.fspath(item)):
            if glob.has_magic(pattern):
                matches = sorted(glob.glob(pattern))
                if not matches:
                    raise FileNotFoundError(f"TarShards: no file matches {pattern!r}")
                paths += matches
            elif not os.path.exists(pattern):
                raise FileNotFoundError(f"TarShards: shard {pattern!r} does not exist")
            else:
                paths.append(pattern)
    if not paths:
        raise ValueError("TarShards: no shard given")
    return paths


def split_key(name: str) -> tuple[str, str]:
    """(key, extension) as WebDataset splits a member name: the key is the path up to the
    first dot of the file name ("a/b.c/x.seg.jpg" -> ("a/b.c/x", "seg.jpg"))."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
    return (match.group(1), match.group(2)) if match else (name, "")


def _refuse_compressed(path: str) -> None:
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise ValueError(f"TarShards: {path} is a {kind}-compressed tar: members are read in place, so shards "
                             f"must be uncompressed tars (decompress it, e.g. `{kind} -d`; JPEG/PNG do not "
                             f"compress further anyway)")


def _label_of(ext: str, data: bytes, where: str) -> int:
    """The label of a .cls (an integer as text) or .json ({"label": n} or {"cls": n}) member."""
    try:
        if ext == "cls":
            return int(data.decode().strip())
        value = json.loads(data)
        if isinstance(value, dict):
            for key in ("label", "cls"):
                if key in value:
                    return int(value[key])
        raise ValueError('no "label" or "cls" key')
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"TarShards: {where}: not a label ({error}): a .cls member holds an integer, a .json "
                         f'member an object with a "label" (or "cls") integer') from None


def _index_shard(path: str, labels: bool) -> list[tuple[str, int, int, int]]:
    """[(member name, data offset, size, label)] of the samples of one shard, in order, from
    its tar headers (a label member's few bytes are read too)."""
    _refuse_compressed(path)
    groups: list[tuple[str, dict[str, tuple[str, int, int]]]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for name, offset, size in _tar_index.members(fd, os.fstat(fd).st_size):
            base = name.rsplit("/", 1)[-1]
            if base.startswith(("__", ".")):
                continue  # WebDataset's metadata members (__key__...) and hidden files
            key, ext = split_key(name)
            if not groups or groups[-1][0] != key:  # a sample is a run of members with one key
                groups.append((key, {}))
            groups[-1][1][ext.lower()] = (name, offset, size)
        return [_sample(path, key, found, fd, labels) for key, found in groups]
    except _tar_index.TarError as error:
        what = error if str(error).startswith("truncated") else f"not a readable tar file ({error})"
        raise ValueError(f"TarShards: {path} is {what}") from None
    finally:
        os.close(fd)


def _sample(path: str, key: str, members: dict[str, tuple[str, int, int]], fd: int, labels: bool) -> tuple:
    images = [ext for ext in members if ext.rsplit(".", 1)[-1] in ("jpg", "jpeg", "png")]
    if len(images) != 1:
        found = ", ".join("." + e for e in members)
        what = "no .jpg/.jpeg/.png member" if not images else "several image members"
        raise ValueError(f"TarShards: {path}: sample {key!r} has {what} (it has {found})")
    image = members[images[0]]
    label = -1
    if labels:
        kinds = {e.rsplit(".", 1)[-1]: e for e in reversed(list(members))}  # "seg.cls" is a .cls member
        ext = kinds.get("cls") or kinds.get("json")
        if ext is None:
            raise ValueError(f"TarShards: {path}: sample {key!r} has no label: add a {key}.cls or {key}.json "
                             f"member, or open the shards with TarShards(..., labels=False)")
        name, offset, size = members[ext]
        label = _label_of(ext.rsplit(".", 1)[-1], os.pread(fd, size, offset), f"{path}: member {name!r}")
    return (*image, label)


_INDEX_VERSION = 2  # 2: indexes made before the strict header checks are made again


def _shard_index(path: str, labels: bool, use_cache: bool) -> list[tuple[str, int, int, int]]:
    """_index_shard's result, kept in the cache folder (keyed by the shard's path, size and
    mtime) so that a shard is read header by header once, not at every start."""
    if not use_cache:
        return _index_shard(path, labels)
    st = os.stat(path)
    key = f"{_INDEX_VERSION}|{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{labels}"
    file = os.path.join(cache_root(), "tar-index", hashlib.sha1(key.encode()).hexdigest() + ".npz")
    try:
        with np.load(file, allow_pickle=False) as saved:
            return list(zip(saved["names"].tolist(), saved["offsets"].tolist(), saved["sizes"].tolist(),
                            saved["labels"].tolist()))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # absent, or unreadable: index again
        pass
    samples = _index_shard(path, labels)
    try:  # the cache only saves time: a read-only or full cache folder is no error
        os.makedirs(os.path.dirname(file), exist_ok=True)
        write_atomically(file, lambda out: np.savez(
            out, names=np.array([n for n, _, _, _ in samples], dtype=str),
            offsets=np.array([o for _, o, _, _ in samples], np.int64),
            sizes=np.array([z for _, _, z, _ in samples], np.int64),
            labels=np.array([label for _, _, _, label in samples], np.int64)), durable=False)
    except OSError:
        pass
    return samples


class TarShards(_EncodedSource):
    """WebDataset-style shards: uncompressed POSIX tar files where a sample is the run of
    members sharing a key (the member's path up to the first dot of its file name):
    ``n01440764_10026.jpg`` (or .jpeg, .png) and its label, ``n01440764_10026.cls`` (an
    integer as text) or ``.json`` (``{"label": n}``, else ``{"cls": n}``). labels=False
    opens unlabelled shards (targets -1).

    The index (member offsets and sizes, labels) is built at open from the tar headers and
    kept in fastloop's cache folder ($FASTLOOP_CACHE, else ~/.cache/fastloop) for the next
    open of the same unchanged shard (index_cache=False: read the headers every time);
    images are never extracted: the Loader's threads pread each member in place. Long
    member names (pax and GNU) are handled; compressed tars are refused with a ValueError, as
    are malformed headers (a ValueError naming the shard and the byte offset).
    `urls`: a path, a brace/glob pattern (``"train-{0000..0146}.tar"``, ``"shards/*.tar"``)
    or a list of them.

    Across torchrun ranks, ``Loader(shards, split_by="shard")`` gives each rank whole
    shards (rank, rank + world_size, ...) and the same step count; the default splits
    samples, as for any source.

    >>> shards = fastloop.TarShards("train-{0000..0146}.tar")
    >>> loader = fastloop.Loader(shards, batch_size=128, shuffle=True, num_workers=8, transform=pipeline)
    """

    def __init__(self, urls: Union[PathLike, Sequence[PathLike]], transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, labels: bool = True,
                 index_cache: bool = True) -> None:
        self.transform, self.target_transform = transform, target_transform
        self.files = shard_paths(urls)
        per_shard = [_shard_index(path, labels, index_cache) for path in self.files]
        self.shard_sizes = [len(samples) for samples in per_shard]
        if not sum(self.shard_sizes):
            raise ValueError(f"TarShards: no sample in {', '.join(self.files)}")
        flat = [s for samples in per_shard for s in samples]
        self.members = [name for name, _, _, _ in flat]
        self.file_index = np.repeat(np.arange(len(self.files), dtype=np.int32), self.shard_sizes)
        self.offsets = np.array([offset for _, offset, _, _ in flat], np.int64)
        self.lengths = np.array([size for _, _, size, _ in flat], np.int64)
        self.targets = [label for _, _, _, label in flat]

    def _where(self, index: int) -> str:
        return f"{self.files[self.file_index[index]]}, member {self.members[index]!r}"

    def shard(self, rank: int, world_size: int, drop_last: bool = False) -> "TarShards":
        """This rank's part when splitting by shard: shards rank, rank + world_size, ...; as
        many samples on every rank (the largest rank's count, the others padded by wrapping
        around their own samples, as DistributedSampler pads; with drop_last the smallest,
        the others trimmed). Raises ValueError when there are fewer shards than ranks."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if len(self.files) < world_size:
            raise ValueError(f"split_by='shard' needs at least one shard per rank: {len(self.files)} shards for "
                             f"world_size={world_size} (use more shards, or split by sample)")
        starts = np.concatenate([[0], np.cumsum(self.shard_sizes)])
        per_rank = [sum(self.shard_sizes[r::world_size]) for r in range(world_size)]
        mine = np.concatenate([np.arange(starts[s], starts[s + 1]) for s in range(rank, len(self.files), world_size)])
        size = min(per_rank) if drop_last else max(per_rank)
        if not len(mine) or not size:
            raise ValueError(f"split_by='shard': rank {rank} would get no sample (samples per rank: {per_rank})")
        picked = np.resize(mine, size)  # trims, or repeats from the start to pad
        part = object.__new__(TarShards)
        part.transform, part.target_transform = self.transform, self.target_transform
        part.files = self.files
        part.shard_sizes = [self.shard_sizes[s] for s in range(rank, len(self.files), world_size)]
        part.members = [self.members[i] for i in picked]
        part.file_index, part.offsets, part.lengths = self.file_index[picked], self.offsets[picked], self.lengths[picked]
        part.targets = [self.targets[i] for i in picked]
        return part

    def __repr__(self) -> str:
        return f"TarShards({len(self.files)} shards, {len(self)} samples)"
