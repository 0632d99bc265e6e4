"""Synthetic workloads: shared-prefix groups and multi-turn sessions (``SharedPrefixSpec``), and
long-context agent sessions written as a Mooncake trace (``AgentSpec``).

Each request belongs to one of ``num_groups`` groups sharing a system prompt of
``system_tokens`` tokens, followed by a unique user suffix. With ``turns > 1`` a request starts
a session whose later turns re-send the whole conversation so far (previous prompt, the
previous answer, a new user message), as chat clients do, so later turns hit the earlier
turns' cache. Arrivals are Poisson at ``rate`` requests/s; tokens are seeded, so a workload is
reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from interlock.kvchain import hash_blocks
from interlock.mooncake import TRACE_BLOCK_SIZE, MooncakeRecord
from interlock.sim.trace import VOCAB_SIZE, SimRequest


@dataclass(frozen=True)
class SharedPrefixSpec:
    num_requests: int = 1000
    """Requests in all (every turn of every session counts)."""
    num_groups: int = 1
    """Distinct system prompts; each request draws one."""
    system_tokens: int = 2000
    suffix_tokens: int = 200
    """A request's own user message after the system prompt (a new one each turn)."""
    output_tokens: int = 100
    turns: int = 1
    """Turns per session; a later turn re-sends the conversation so far."""
    think_time_s: float = 2.0
    """Delay between a turn's arrival and the session's next turn."""
    rate: float = 10.0
    """Session starts per second (Poisson)."""
    block_size: int = 64
    seed: int = 0
    keep_tokens: bool = False
    """Keep each prompt's token ids (for the engine backend of the replay)."""


def shared_prefix_requests(spec: SharedPrefixSpec) -> list[SimRequest]:
    rng = np.random.default_rng(spec.seed)
    systems = [
        rng.integers(0, VOCAB_SIZE, spec.system_tokens, dtype=np.uint32) for _ in range(spec.num_groups)
    ]
    out: list[SimRequest] = []
    t = 0.0
    session = 0
    while len(out) < spec.num_requests:
        t += rng.exponential(1.0 / spec.rate)
        group = int(rng.integers(spec.num_groups))
        tokens = systems[group]
        for turn in range(spec.turns):
            if len(out) >= spec.num_requests:
                break
            user = rng.integers(0, VOCAB_SIZE, spec.suffix_tokens, dtype=np.uint32)
            tokens = np.concatenate([tokens, user])
            out.append(
                SimRequest(
                    request_id=f"s{session}t{turn}",
                    arrival_s=t + turn * spec.think_time_s,
                    prompt_tokens=len(tokens),
                    output_tokens=spec.output_tokens,
                    block_hashes=tuple(hash_blocks(tokens.tolist(), spec.block_size)),
                    session_id=f"s{session}" if spec.turns > 1 else None,
                    token_ids=tuple(tokens.tolist()) if spec.keep_tokens else None,
                )
            )
            answer = rng.integers(0, VOCAB_SIZE, spec.output_tokens, dtype=np.uint32)
            tokens = np.concatenate([tokens, answer])
        session += 1
    out.sort(key=lambda r: r.arrival_s)
    return out


@dataclass(frozen=True)
class AgentSpec:
    """Long-context multi-turn agent sessions, as a Mooncake trace (``agent_records``).

    A session opens with one of ``num_system_prompts`` shared system prompts and a first user
    message; each later turn re-sends the whole history plus the previous answer and a new tool
    result or user message, until the prompt would pass ``max_input_tokens`` or the session's
    turns run out. Lengths are whole trace blocks (512 tokens), so a later turn's prompt extends
    the earlier one block for block, as in the Mooncake traces. Sessions start Poisson at
    ``rate`` per second; a turn follows the previous one after an exponential think time (open
    loop, as a trace is).
    """

    num_sessions: int = 300
    num_system_prompts: int = 6
    system_blocks: tuple[int, int] = (2, 8)
    """System prompt length in trace blocks, uniform in [lo, hi] (1k-4k tokens)."""
    first_blocks: tuple[int, int] = (1, 4)
    step_blocks: tuple[int, int] = (1, 6)
    """Blocks added per turn: the previous answer and a tool result."""
    turns: tuple[int, int] = (2, 16)
    max_input_tokens: int = 25_000
    output_tokens: tuple[int, int] = (50, 500)
    think_time_s: float = 5.0
    rate: float = 1.0
    seed: int = 0


def agent_records(spec: AgentSpec) -> list[MooncakeRecord]:
    """The sessions' turns as Mooncake records, sorted by arrival."""
    rng = np.random.default_rng(spec.seed)
    next_id = 0

    def new_ids(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    systems = [
        new_ids(int(rng.integers(spec.system_blocks[0], spec.system_blocks[1] + 1)))
        for _ in range(spec.num_system_prompts)
    ]
    max_blocks = spec.max_input_tokens // TRACE_BLOCK_SIZE
    out: list[MooncakeRecord] = []
    t = 0.0
    for _ in range(spec.num_sessions):
        t += rng.exponential(1.0 / spec.rate)
        ids = systems[int(rng.integers(len(systems)))] + new_ids(
            int(rng.integers(spec.first_blocks[0], spec.first_blocks[1] + 1))
        )
        at = t
        for _turn in range(int(rng.integers(spec.turns[0], spec.turns[1] + 1))):
            if len(ids) > max_blocks:
                break
            out_len = int(rng.integers(spec.output_tokens[0], spec.output_tokens[1] + 1))
            out.append(
                MooncakeRecord(round(at * 1000.0, 3), len(ids) * TRACE_BLOCK_SIZE, out_len, tuple(ids))
            )
            ids = ids + new_ids(int(rng.integers(spec.step_blocks[0], spec.step_blocks[1] + 1)))
            at += rng.exponential(spec.think_time_s)
    out.sort(key=lambda r: r.timestamp_ms)
    return out
