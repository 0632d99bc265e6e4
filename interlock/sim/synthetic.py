"""Synthetic workloads: shared-prefix groups and multi-turn sessions (``SharedPrefixSpec``), and,
written as Mooncake traces, long-context agent sessions (``AgentSpec``) and retrieval-augmented
chat over a shared document collection (``RagSpec``).

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


class _TraceBlocks:
    """Fresh trace block ids, in order, and seeded draws for a synthetic trace."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self._next = 0

    def new(self, n: int) -> list[int]:
        self._next += n
        return list(range(self._next - n, self._next))

    def uniform(self, span: tuple[int, int]) -> int:
        """An integer uniform in ``[lo, hi]``."""
        return int(self.rng.integers(span[0], span[1] + 1))


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
    ids_of = _TraceBlocks(spec.seed)
    rng, new_ids, blocks = ids_of.rng, ids_of.new, ids_of.uniform
    systems = [new_ids(blocks(spec.system_blocks)) for _ in range(spec.num_system_prompts)]
    max_blocks = spec.max_input_tokens // TRACE_BLOCK_SIZE
    out: list[MooncakeRecord] = []
    t = 0.0
    for _ in range(spec.num_sessions):
        t += rng.exponential(1.0 / spec.rate)
        ids = systems[int(rng.integers(len(systems)))] + new_ids(blocks(spec.first_blocks))
        at = t
        for _turn in range(blocks(spec.turns)):
            if len(ids) > max_blocks:
                break
            out_len = blocks(spec.output_tokens)
            out.append(
                MooncakeRecord(round(at * 1000.0, 3), len(ids) * TRACE_BLOCK_SIZE, out_len, tuple(ids))
            )
            ids = ids + new_ids(blocks(spec.step_blocks))
            at += rng.exponential(spec.think_time_s)
    out.sort(key=lambda r: r.timestamp_ms)
    return out


@dataclass(frozen=True)
class RagSpec:
    """Retrieval-augmented chat over one shared document collection, as a Mooncake trace
    (``rag_records``).

    A question falls on a topic (Zipf popularity over ``num_topics``: a few topics draw most
    questions); each topic ranks ``candidates`` documents of the collection, and a retrieval
    keeps each candidate in rank order with probability ``keep`` until it has ``top_k``. The
    prompt is a system prompt (one of ``num_system_prompts``), the retrieved documents best
    first, then the question (a part of one trace block). Two prompts therefore share the system
    prompt and the documents up to the first rank where their retrievals differ: the reuse is
    partial, and a popular document is cached at many depths. A session asks ``followups`` more
    questions over the same context, each prompt re-sending the previous one with its answer.
    Sessions start Poisson at ``rate`` per second; a follow-up comes after an exponential think
    time (open loop, as a trace is).
    """

    num_sessions: int = 2000
    num_system_prompts: int = 2
    system_blocks: tuple[int, int] = (1, 2)
    num_documents: int = 600
    doc_blocks: tuple[int, int] = (1, 4)
    """A document's length in trace blocks (512-2,048 tokens), uniform in [lo, hi]."""
    num_topics: int = 150
    zipf_s: float = 1.1
    candidates: int = 12
    keep: float = 0.75
    top_k: tuple[int, int] = (3, 6)
    question_tokens: tuple[int, int] = (20, 300)
    followups: tuple[int, int] = (0, 3)
    output_tokens: tuple[int, int] = (100, 400)
    think_time_s: float = 15.0
    rate: float = 1.0
    seed: int = 0


def rag_records(spec: RagSpec) -> list[MooncakeRecord]:
    """The sessions' questions as Mooncake records, sorted by arrival."""
    ids_of = _TraceBlocks(spec.seed)
    rng, new_ids, blocks = ids_of.rng, ids_of.new, ids_of.uniform
    systems = [new_ids(blocks(spec.system_blocks)) for _ in range(spec.num_system_prompts)]
    documents = [new_ids(blocks(spec.doc_blocks)) for _ in range(spec.num_documents)]
    topics = [
        rng.choice(spec.num_documents, size=min(spec.candidates, spec.num_documents), replace=False)
        for _ in range(spec.num_topics)
    ]
    weights = 1.0 / np.arange(1, spec.num_topics + 1) ** spec.zipf_s
    weights /= weights.sum()
    out: list[MooncakeRecord] = []
    t = 0.0
    for _ in range(spec.num_sessions):
        t += rng.exponential(1.0 / spec.rate)
        topic = topics[int(rng.choice(spec.num_topics, p=weights))]
        want = blocks(spec.top_k)
        kept = [d for d in topic if rng.random() < spec.keep][:want]
        ids = list(systems[int(rng.integers(len(systems)))])
        for d in kept:
            ids += documents[int(d)]
        at = t
        for _turn in range(1 + blocks(spec.followups)):
            question = blocks(spec.question_tokens)
            # The question is the start of a block of its own; its answer fills it and more.
            prompt = ids + new_ids(1)
            out_len = blocks(spec.output_tokens)
            out.append(
                MooncakeRecord(
                    round(at * 1000.0, 3), len(ids) * TRACE_BLOCK_SIZE + question, out_len, tuple(prompt)
                )
            )
            ids = prompt + new_ids((question + out_len) // TRACE_BLOCK_SIZE)
            at += rng.exponential(spec.think_time_s)
    out.sort(key=lambda r: r.timestamp_ms)
    return out
