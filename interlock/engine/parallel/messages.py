"""What the driver tells its ranks: a launch once, then one ``Step`` per engine step.

Frames on the rank's stdin (and its one answer, "ready" or why not, on its stdout): a 4-byte
length and a pickle. Both ends are the same Interlock of one worker, on one host, over a pipe
only they hold; nothing else writes to it. A closed stdin tells a rank its driver is gone.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import IO, Any

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class RankLaunch:
    rank: int
    tensor_size: int
    pipeline_size: int
    folder: str
    dtype: str
    """A concrete torch dtype name ("bfloat16", "float32"): the driver resolved ``auto``."""
    device: str
    max_model_len: int
    block_size: int
    num_blocks: int
    max_rows: int
    threads: int
    kernels: tuple[tuple[str, str], ...]
    store: str
    """The file the ranks' process groups meet through ("": none needed)."""
    reduce_fd: int
    """The stage's shared all-reduce memfd (-1: gloo all-reduces instead)."""
    reduce_elements: int
    timeout_s: float
    parent_pid: int


@dataclass(frozen=True, slots=True)
class Micro:
    """One micro-batch: its chunks as ``(token_ids, start_pos, block_table)`` and the rows of
    its hidden states the driver wants back (logits rows, micro-batch row numbers)."""

    chunks: tuple[tuple[list[int], int, list[int]], ...]
    rows: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Step:
    micro: tuple[Micro, ...]


def write_frame(out: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LENGTH.pack(len(data)) + data)
    out.flush()


def read_frame(src: IO[bytes]) -> Any:
    """The next message, or None at end of file (the other end is gone)."""
    head = src.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (n,) = _LENGTH.unpack(head)
    data = src.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)
