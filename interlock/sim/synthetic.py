"""Synthetic shared-prefix workloads: system-prompt groups, unique suffixes, multi-turn sessions.

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

from interlock.kvhash import hash_blocks
from interlock.sim.trace import VOCAB_SIZE, SimRequest


@dataclass(frozen=True)
class SharedPrefixSpec:
    num_requests: int = 1000
    num_groups: int = 1
    system_tokens: int = 2000
    suffix_tokens: int = 200
    output_tokens: int = 100
    turns: int = 1
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
    systems = [rng.integers(0, VOCAB_SIZE, spec.system_tokens, dtype=np.uint32)
               for _ in range(spec.num_groups)]
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
            out.append(SimRequest(
                request_id=f"s{session}t{turn}",
                arrival_s=t + turn * spec.think_time_s,
                prompt_tokens=len(tokens),
                output_tokens=spec.output_tokens,
                block_hashes=tuple(hash_blocks(tokens.tolist(), spec.block_size)),
                session_id=f"s{session}" if spec.turns > 1 else None,
                token_ids=tuple(tokens.tolist()) if spec.keep_tokens else None,
            ))
            answer = rng.integers(0, VOCAB_SIZE, spec.output_tokens, dtype=np.uint32)
            tokens = np.concatenate([tokens, answer])
        session += 1
    out.sort(key=lambda r: r.arrival_s)
    return out
