"""A second model of the same shape with other weights, made from a converted one.

Tests and benchmarks of several models on one worker (``ExecutionGroup.colocate``) need two
different models and only one ships with Interlock (SmolLM2). ``make_variant`` copies the
model's folder and scales its final norm's weights (by 0.8 by default): the same shape and
tokenizer, other logits, so the two answer differently. Nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MANIFEST = "interlock-manifest.json"


def make_variant(source: Path, dest: Path, *, norm_scale: float = 0.8) -> Path:
    """``dest``, a copy of the converted model folder ``source`` whose ``model.norm.weight`` is
    multiplied by ``norm_scale`` (its conversion manifest left out: it names other weights)."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True)
    for f in source.iterdir():
        if f.name not in ("model.safetensors", MANIFEST):
            shutil.copy(f, dest / f.name)
    tensors = load_file(str(source / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * norm_scale
    save_file(tensors, str(dest / "model.safetensors"))
    return dest
