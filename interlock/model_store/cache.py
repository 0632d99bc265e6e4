"""The content-addressed cache's parts: source digests, the GGUF sniff, keys and manifests.

An entry ``<models>/<key>/<name>/`` is a converted HF folder plus ``interlock-manifest.json``,
which names the source's SHA-256, the converter's version and every file with its size and a
sampled SHA-256. ``entry_problem`` checks all of it on every load and says what is wrong.

Why sampled: a full SHA-256 of the bf16 weights costs ~0.2 s per start for a 270 MB model and
grows with the model (~10 s at 14 GB), on every worker start. What the check must catch is the
wrong file or a short one (a foreign folder, a half-copied cache, a truncated or replaced
weights file); the size, the safetensors header (the first chunk) and 16 evenly spaced MiB
catch those for a constant ~16 MiB read. Files up to ``WHOLE_MAX`` (configs, tokenizer) are
hashed whole. Silent bit rot inside the weights is the file system's to catch.

The source's SHA-256 is computed in full (it is the key), but once per file version: a record in
``.sources/`` maps a path and its (device, inode, size, mtime, ctime) to the digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgspec

from interlock.errors import ConfigError

MANIFEST = "interlock-manifest.json"
MANIFEST_FORMAT = 1
WHOLE_MAX = 16 << 20
"""Files up to this size are hashed whole; larger ones are sampled."""
CHUNK = 1 << 20
CHUNKS = 16
_MAX_MANIFEST = 1 << 20

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
_GGUF_HEADER = struct.Struct("<4sIQQ")
"""magic, version, tensor count, metadata key/value count."""


class FileSum(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    size: int
    sample_sha256: str


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    source_sha256: str
    converter: str
    files: dict[str, FileSum]


class _Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: str
    identity: tuple[int, int, int, int, int]
    sha256: str


def check_gguf(path: Path) -> None:
    """ConfigError, naming ``path``, unless it opens with a GGUF header we can read."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_GGUF_HEADER.size)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if len(head) < _GGUF_HEADER.size or not head.startswith(GGUF_MAGIC):
        raise ConfigError(
            f"{path} is not a GGUF file: it starts with {head[:4]!r}, not {GGUF_MAGIC!r} "
            f"({path.stat().st_size} bytes)"
        )
    _, version, _, _ = _GGUF_HEADER.unpack(head)
    if version not in GGUF_VERSIONS:
        raise ConfigError(f"{path}: GGUF version {version} is not supported (only {GGUF_VERSIONS})")


def entry_key(source_sha256: str, converter_version: str) -> str:
    """The entry's folder name: 128 bits of the source's digest and 32 of the converter's."""
    return f"{source_sha256[:32]}-{hashlib.sha256(converter_version.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Source:
    """A GGUF file as hashed: its path, the stat fields that identify this version, its digest."""

    path: Path
    identity: tuple[int, int, int, int, int]
    sha256: str
    recorded: bool
    """The digest came from (or is already in) the record, which need not be written again."""

    def unchanged(self) -> bool:
        return _identity(self.path) == self.identity


@dataclass(frozen=True)
class SourceDigests:
    """Records of source digests, one file per path, so a warm start hashes nothing."""

    folder: Path

    def digest(self, path: Path) -> Source:
        identity = _identity(path)
        record = self._read(path)
        if record is not None and record.identity == identity:
            return Source(path, identity, record.sha256, recorded=True)
        with open(path, "rb") as fh:
            sha256 = hashlib.file_digest(fh, "sha256").hexdigest()
        source = Source(path, identity, sha256, recorded=False)
        if not source.unchanged():
            raise ConfigError(f"{path} changed while it was hashed; try again")
        return source

    def remember(self, source: Source) -> None:
        if source.recorded:
            return
        record = _Record(str(source.path), source.identity, source.sha256)
        # Only a shortcut: on a read-only cache every start hashes the source again instead.
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)
            _write_atomically(self._file(source.path), msgspec.json.encode(record))

    def _file(self, path: Path) -> Path:
        return self.folder / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"

    def _read(self, path: Path) -> _Record | None:
        try:
            record = msgspec.json.decode(self._file(path).read_bytes(), type=_Record)
        except (OSError, msgspec.DecodeError):
            return None
        return record if record.path == str(path) else None


def write_manifest(folder: Path, source_sha256: str, converter_version: str) -> None:
    """Describe every file in a freshly converted ``folder``; ConfigError if one is not a plain file."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not path.is_file():
            raise ConfigError(f"the converter left {path}, which is not a plain file")
        size = path.stat().st_size
        files[path.name] = FileSum(size, sample_sha256(path, size))
    manifest = Manifest(MANIFEST_FORMAT, source_sha256, converter_version, files)
    (folder / MANIFEST).write_bytes(msgspec.json.encode(manifest))
    (folder / MANIFEST).chmod(0o644)


def entry_problem(folder: Path, source_sha256: str, converter_version: str) -> str | None:
    """None when ``folder`` is a complete conversion of that source by that converter; else why not."""
    if folder.is_symlink():
        return "a symlink, not a folder"
    if not folder.exists():
        return "not converted yet"
    if not folder.is_dir():
        return "not a folder"
    manifest_file = folder / MANIFEST
    try:
        if manifest_file.is_symlink() or manifest_file.stat().st_size > _MAX_MANIFEST:
            return f"{MANIFEST} is not a manifest"
        manifest = msgspec.json.decode(manifest_file.read_bytes(), type=Manifest)
    except (OSError, msgspec.DecodeError) as exc:
        return f"no readable {MANIFEST} ({exc})"
    if manifest.format != MANIFEST_FORMAT:
        return f"manifest format {manifest.format}, expected {MANIFEST_FORMAT}"
    if manifest.source_sha256 != source_sha256:
        return f"made from another file (sha256 {manifest.source_sha256[:16]}...)"
    if manifest.converter != converter_version:
        return f"made by converter {manifest.converter!r}"
    present = {p.name for p in folder.iterdir()} - {MANIFEST}
    if present != set(manifest.files):
        missing, extra = sorted(set(manifest.files) - present), sorted(present - set(manifest.files))
        return f"files differ from the manifest (missing {missing}, unexpected {extra})"
    for name, expected in manifest.files.items():
        problem = _file_problem(folder / name, expected)
        if problem is not None:
            return f"{name}: {problem}"
    return None


def sample_sha256(path: Path, size: int) -> str:
    """SHA-256 of the whole file up to ``WHOLE_MAX``, else of ``CHUNKS`` evenly spaced chunks
    (the first at the start, the last at the end)."""
    with open(path, "rb") as fh:
        if size <= WHOLE_MAX:
            return hashlib.file_digest(fh, "sha256").hexdigest()
        digest = hashlib.sha256()
        for i in range(CHUNKS):
            fh.seek((size - CHUNK) * i // (CHUNKS - 1))
            digest.update(fh.read(CHUNK))
        return digest.hexdigest()


def fsync_tree(folder: Path, *, files: bool = True) -> None:
    """Make ``folder``'s files (when ``files``) and its own entries durable before a rename
    publishes them: a crash after the rename must not leave a complete-looking empty file."""
    if files:
        for path in folder.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_problem(path: Path, expected: FileSum) -> str | None:
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode):
            return "not a plain file"
        if st.st_size != expected.size:
            return f"{st.st_size} bytes, expected {expected.size}"
        if sample_sha256(path, st.st_size) != expected.sample_sha256:
            return "content differs from the manifest"
    except OSError as exc:
        return f"unreadable ({exc})"
    return None


def _identity(path: Path) -> tuple[int, int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
