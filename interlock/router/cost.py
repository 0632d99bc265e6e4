"""The ``kv`` routing cost: estimated seconds until the request's first token, per worker.

Pure functions over per-worker vectors (numpy), no state. For worker ``w``::

    uncached_w = max(prompt_tokens - overlap_w * block_size, 1)    # prefix hits are free
    work_w     = queued_prefill_w + uncached_w                      # tokens ahead of our 1st token
    backlog    = sum(queued_prefill) / workers / chunk_tokens      # the fleet's mean, one number
    ttft_w     = (work_w + miss_weight * ((1 + backlog) + waiting_w - idle_w) * uncached_w) * per_token_s_w
               + ceil(work_w / chunk_tokens) * step_overhead_s_w    # per-step cost, decodes included
               + stall_weight * decoding_w * ceil(uncached_w / chunk_tokens) * step_overhead_s_w
               + decode_weight * decode_tokens * decode_step_s_w    # optional: the decode phase too

``per_token_s`` and ``step_overhead_s`` are each worker's measured speed, a line fitted to its
load reports (``speed.StepTimeFit``). ``idle_w`` is 1 on a worker with nothing decoding, queued or
waiting when two or more workers hold the prompt's longest cached prefix, else 0 ("Idle replicas").

Why seconds instead of Dynamo's weighted block counts: a cache hit is worth exactly the prefill
time it saves on *that* worker, and a queue costs exactly the time to drain it, so hits and load
trade off in one unit without a tuning knob, and a slow or busy worker is priced as such.

``miss_weight`` (default 4) charges a miss again for each request its prefill will delay, which
a pure TTFT estimate ignores: the next request, and those that join the worker's queue before it
drains, about as many as wait there now (Little's law; ``waiting_w``, the worker's own queue as
it reported it). Charged for the next request only, a saturated fleet traded hits for queue
balance: with every queue seconds long, a hit's fraction of a second lost to a queue a few
seconds shorter elsewhere, and each miss added prefill that everyone waited for (the Mooncake
conversation trace at x12 fell to 55% of the pooled-cache bound; about 81% charged per waiting
request, TTFT p99 71 s to 40 s). The weight itself is measured, not derived (the prefill a miss
adds is also a replica that evicts someone else's prefix): on the conversation trace at x9 /
x10, 1 gave 87% / 83% of the pooled bound, 2 90% / 86%, 3 91% / 88%, 4 92% / 89%, TTFT p99 about
2.0 / 2.4 s throughout; on the agent workload 4 raised TTFT p99 at four of five loads (x3: 494 ms
against 459 at 3). 3 until 2026-12-08, when 4 also let the herd behind a shared prompt back (1.68x
at 20 req/s); with idle replicas (below) it does not (1.13-1.21x over five seeds), and 4 against 3
keeps the RAG workload at or above 90% of the pooled bound at every load from x3 to x20 (x3 / x20
89.1 / 89.8% -> 90.6 / 90.5%, TTFT p99 243 -> 239 ms at x3 but 1,493 -> 2,007 at x20, where
Dynamo's is 160 s), the agent workload at 98-99% (TTFT p99 lower at four of five loads, x2.5 231
-> 281 ms) and the conversation trace as it was (TTFT p99 x7.5-x12 1,892 / 2,209 / 2,733 /
14,613 -> 1,898 / 2,151 / 2,848 / 13,156 ms).

``backlog`` (``backlog_charge``, on by default) charges a miss once more per chunk of prompt
the fleet's workers have queued on average: a miss's prefill also delays requests that arrive
while the queues drain, and the router spreads those over the fleet (it sends them where the
queue is shorter), so what a miss adds is shared by every worker's backlog, not only the one it
lands on (``waiting_w`` counts only requests its engine has not admitted; a saturated engine
has admitted everything that fits and holds its backlog as running chunked prefills, so
``waiting_w`` was 0 where the Mooncake conversation trace at x10 gave up hits: 4% of its
blocks, the whole gap to the pooled bound, went to workers with a shorter queue than the one
holding the prefix, median 33k tokens). A chunk of queue is taken for one request (a step's
prefill budget, the most of one prompt a step computes). Charging a worker's own queue instead
changed nothing (x10: 88% of the pooled bound either way); the fleet's took x9 / x10 / x12 to
97% / 96% / 89% and agent x3.5 TTFT p99 to 292 ms (BENCHMARKS.md, Saturation). The mean is over
the fleet's workers (``backlog_workers``; the router passes every worker it has registered, the
unhealthy, held and draining ones and those of other roles too: each one's queue is in the sum,
and its own load reports keep it there), not over the vector's slots: the slots of workers that
left hold empty queues, and counted, after a planner shrank a fleet from 40 workers to 8, they
cut the charge by up to 5x. With every queue empty it is 0 and the cost is the same as without
it, to the last bit.

``decode_weight`` (default 0.15) adds that share of the request's own decode time at the
worker's expected decode step (``LoadTracker.decode_step``, which grows with the context the
worker holds): a TTFT cost alone keeps sending requests behind a shared system prompt to the few
workers that cache it, where the decodes pile up (8-worker herding test at 60 req/s: busiest
worker 1.7x the mean in flight, 4.8x without KV events). What holds the herd is the ratio to
``miss_weight`` (the price of joining the prompt's holders): 0.1 / 2 and 0.05 / 1 let it back
(1.6x), 0.075 of it holds it (at most 1.2x at 60 and 120 req/s, with or without events). At
0.2 / 1 it outbid the hits of long sessions on the agent workload (92% of the pooled bound at
x1.75; 96% now). With the fleet's decode line kept once fitted (``LoadTracker.decode_step``)
and the backlog charge (before the stall term below), 0.15 held the herd at 60 and 120 req/s
too (1.02x with KV events, at most 1.23x without; 0.1 let it back, 1.61x at 60) and gave the
agent workload 97-99% of the pooled bound and TTFT p99 194-292 ms over x1.25-x3.5 (0.225:
95-98%, p99 271-426 ms; 0.1: p99 157-338 ms). Pricing the slowdown a
request adds to the others on the worker by context (the requests decoding there x its
output x the decode line's slope x its context over the worker's KV) held the herd at 20 req/s
(1.05x, from 2.68x) but sent long agent sessions away from their caches (x1.25 at weights 0.5
and 1: 78-86% of the pooled bound, TTFT p99 527-674 ms); by the stall of their token streams
(``stall_weight``, below) it is kept. BENCHMARKS.md, Saturation, has the figures.

Stall: ``stall_weight`` (default 0.5) adds the time this request's own prefill steps stall the
requests decoding on that worker: each step that computes prompt tokens costs every decoding
request there a step overhead more between two tokens (``decoding_w``, this router's dispatches
past their first token). What a request makes others wait counts as much as its own wait. It
is what herding behind a shared prompt really costs at moderate load: at 20 req/s, with the
prompt's holders taking most requests, 2.68x the mean in flight on the busiest worker, TTFT
p99 55 ms and ITL p50 9.0 ms against 34 / 6.7 ms with round-robin; with the stall priced 1.03x
and 52 / 6.7 ms. Only the step overhead is priced: the whole prefill time (per-token part too)
at 0.5 held the herd as well but sent the conversation trace's long prompts to workers with few
decodes and long prefill queues (TTFT p99 x9 2.9 s against 2.0 s without it). The overhead
alone costs less (x9 2.0 -> 2.3 s, x10 2.4 -> 2.9 s; Dynamo's 2.4 / 5.4 s), took x12 from 89%
to 90% of the pooled bound and the agent workload's p99 over x1.25-x3.5 from 194-292 to 223-283
ms (BENCHMARKS.md, Saturation). Its weight, measured again once load reports were paced and the
router's queue took two passes (2026-12-07; every load of the conversation trace, agent and RAG
workloads, and herding at 10-200 req/s): at 0.5 rather than 1, TTFT p99 fell at 18 of those 19
loads (conversation x7.5-x12 1,973 / 2,328 / 3,081 / 14,498 -> 1,845 / 2,203 / 2,809 / 13,398 ms;
RAG x20 1,701 -> 1,368; agent x1.75 257 -> 292, the one rise), the hit ratio rose on the RAG and
agent workloads (RAG x3 / x20 88.4 / 88.8% -> 89.4 / 90.4% of the pooled bound) and held on the
conversation trace, and ITL p99 did not rise; the herd behind one brand-new shared prompt grew
at low rates (busiest worker at 20 req/s 1.26x -> 1.42x the mean in flight, 10 req/s 2.12x ->
2.77x, and up to 2.09x at 20 req/s on other seeds of that workload, where 1 gives up to 1.65x)
with the same TTFT and ITL (p99 52-54 and 26-29 ms at every seed and weight), and not from 40
req/s. 0.4 and 0.6 gave about the same; 0.75 less.

Stall at scale (``stall_over``, "decoding" by default): counted over the requests decoding
now, the stall misses those queued on the worker, which decode while this request's chunks
run. On a worker busy with long prefills few requests are past their first token, so another
long prompt is priced cheap there, and the same workers keep taking the long prompts; the
requests queued behind them miss their TTFT, and the short answers decoding there their ITL.
The larger the fleet, the likelier one such worker is the cheapest at a given moment: on the
Mooncake trace at the planner's load (``benchmarks/router_scale.py``: K salted copies of the
trace on K x 7 workers) the worker computing the most prefill had 1.04x the mean at 7 workers
and 1.26x at 28, and SLA attainment fell from 98.2% to 97.5%, where the four copies on four
fleets of 7 get 98.1% on average. Counted over every request in flight ("inflight"): 98.55%
at 7, 98.27% at 28 against 98.35% on four fleets of 7, and lower TTFT p99 on the conversation
trace at x7.5-x10 and the agent workload; but at x12 (8 workers far past saturation, queues
seconds long everywhere) the hit ratio falls from 90% to 88% of the pooled bound, so it is not
the default (BENCHMARKS.md, Router at scale).

Idle replicas (``idle_replicas``, on by default): on a worker with nothing decoding, queued or
waiting, a miss is not charged for the next request (``behind - 1``; the fleet's backlog still
counts) when two or more workers hold the prompt's longest cached prefix and some hold less.
There the miss delays no one, and the copy it makes of a prefix several workers serve takes a
share of its traffic from then on; pricing it as a miss that delays the next request treats a
one-off prefill as a cost paid again on every request. Behind one shared system prompt the
workers that took it in the first second kept every request until each had several decoding:
at 20 req/s on 8 workers, 4 to 6 workers served the whole run and the others stayed idle
(busiest worker 1.42-2.09x the mean in flight over five seeds of that workload; with it, at
``miss_weight`` 3, 1.09-1.19x, TTFT p99 52-54 -> 46-52 ms, ITL p99 27-29 -> 11-27 ms; at 10 req/s
2.8-4.0x -> 1.06-1.22x, TTFT p99 44-50 -> 33-38 ms, ITL p99 27-29 -> 7-12 ms). A prefix one
worker holds (a session's own context) keeps the charge: its copy would serve that session
alone (charged nowhere, the agent workload at x1.25 fell from 97% to 95% of the pooled bound,
TTFT p99 176 -> 263 ms; gated so, 97% and 228 ms). On the conversation trace and the RAG
workload, whose workers are rarely idle at the loads measured, TTFT p99 moved both ways, by at
most 9% (BENCHMARKS.md, Saturation and RAG).

KV tiers: ``lower_blocks_w`` more blocks right after the device-pool prefix that worker ``w``
holds in host memory or on disk are not computed but loaded (the engine always loads them);
they count as hits in ``uncached_w`` and cost ``lower_blocks_w * load_s_per_block_w``, the
worker's measured load time per block. A lower-tier hit is so priced between a device hit
(free) and a miss (its prefill).

Weights out: a worker whose model offloaded its weights while idle (``offload_after_s``) makes
its next request wait for them to load again (``LoadReport.weights_load_s``, the last load it
timed). The decider adds that wait to the worker's cost after ``ttft_costs``, in seconds like
the rest (``kv_decide.ReferenceDecider.costs``; the compiled decider leaves such decisions to
it): a warm worker keeps the traffic until its queue is longer than the load, and the idle one
keeps its memory free for the models beside it.

Room: a worker whose free KV blocks cannot hold the prompts queued on it plus this one's
uncached part admits it only as running requests finish (an engine allocates blocks as tokens
need them and queues what does not fit). ``room_wait_s`` prices that wait: the deficit, freed at
the rate its blocks in use are released (all of them over ``drain_s``, about one request's
decode time). So a full worker holding the prefix is worth waiting for exactly while the wait is
shorter than recomputing the prefix elsewhere (``Router.dispatch_queued`` applies the same rule
to a request waiting in the router's queue).

Pressure: above ``kv_watermark`` of KV usage (blocks in use as the worker last reported them;
the dispatched footprint, prompt plus output per request, counts a shared prefix once per
request and made workers behind shared system prompts look full) the cost is multiplied by
``1 + kv_penalty * (usage - watermark) / (1 - watermark)`` (a worker near full would evict the
very prefixes that made it attractive, or preempt). Off by default (``kv_penalty=0``) since the
wait for room prices a full worker in seconds: with the engine-faithful simulator, the
multiplier at 4 lowered the agent workload's hit ratio at ×3 from 0.715 to 0.622 (TTFT p99 625
to 1,895 ms) and the conversation trace's at ×12 from 0.201 to 0.185, and changed nothing at
lower loads (BENCHMARKS.md, Saturation).

Choice: argmin; costs within ``tie_tolerance`` of the best are ties, broken towards the worker
with the fewest in-flight requests (never the busiest), then by rotation. With a softmax
temperature > 0 the worker is sampled with probability ``exp(-normalised_cost / T)``.

These functions are the reference: the router computes the cost, the ranked candidates and the
choice at temperature 0 in one compiled pass where it can (``route_kernel``, ``csrc/route_kv.c``,
the same result to the last bit), and with these where it cannot. A change to the code here
switches that pass off (``route_kernel.MIRRORED``, a fingerprint of this code) until the C is
brought in line: the router never prices with a formula other than this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from interlock.errors import ConfigError
from interlock.names import STALL_OVER


@dataclass(frozen=True)
class CostParams:
    block_size: int = 16
    """Tokens per KV block (the router's)."""
    chunk_tokens: int = 8192
    """Prefill tokens per engine step (the workers' max_num_batched_tokens)."""
    kv_watermark: float = 0.7
    """KV usage above which the pressure multiplier applies (see "Pressure" above)."""
    kv_penalty: float = 0.0
    """The pressure multiplier's slope (0: off)."""
    miss_weight: float = 4.0
    """Extra weight on this request's own uncached prefill, per request it will delay (one,
    plus those waiting in the worker's queue): the work a miss adds to the whole system,
    beyond this request's TTFT."""
    decode_weight: float = 0.15
    """Weight of this request's own decode time (0: pure TTFT)."""
    stall_weight: float = 0.5
    """Weight of the step overheads this request's prefill adds between the tokens of each
    request decoding on the worker (0: not priced)."""
    backlog_charge: bool = True
    """Charge a miss once more per ``chunk_tokens`` of the fleet's mean queued prefill (the
    requests a miss delays while the fleet's queues drain); off: only the worker's own waiting
    requests count."""
    idle_replicas: bool = True
    """A miss on an idle worker of a prefix that two or more workers hold is not charged for
    the next request (see "Idle replicas" above); off: charged everywhere."""
    temperature: float = 0.0
    tie_tolerance_s: float = 1e-3
    price_room: bool = True
    """Add the wait for KV room (``room_wait_s``); off: a full worker is priced as an empty
    one with the same queue."""
    stall_over: str = "decoding"
    """Whom the stall term counts on each worker (``STALL_OVER``): "decoding", the requests
    past their first token; "inflight", every request in flight there (those still queued
    decode while this one's chunks run; see "Stall at scale" above). The router picks the
    vector it passes as ``decoding``; the formula is the same."""

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.chunk_tokens < 1:
            raise ConfigError("block_size and chunk_tokens must be positive")
        if not 0.0 < self.kv_watermark <= 1.0:
            raise ConfigError("kv_watermark must be in (0, 1]")
        if self.temperature < 0 or self.kv_penalty < 0 or self.decode_weight < 0 or self.stall_weight < 0:
            raise ConfigError("temperature, kv_penalty, decode_weight and stall_weight must be >= 0")
        if self.stall_over not in STALL_OVER:
            raise ConfigError(f"stall_over must be one of {STALL_OVER}, not {self.stall_over!r}")


def ttft_costs(
    params: CostParams,
    *,
    prompt_tokens: int,
    queued_prefill: np.ndarray,
    per_token_s: np.ndarray,
    step_overhead_s: np.ndarray,
    decode_step_s: np.ndarray,
    kv_usage: np.ndarray,
    overlap_blocks: np.ndarray | None = None,
    uncached_tokens: np.ndarray | None = None,
    decode_tokens: int = 0,
    lower_blocks: np.ndarray | None = None,
    load_s_per_block: np.ndarray | None = None,
    free_blocks: np.ndarray | None = None,
    used_blocks: np.ndarray | None = None,
    drain_s: np.ndarray | None = None,
    waiting: np.ndarray | None = None,
    decoding: np.ndarray | None = None,
    backlog_workers: int | None = None,
) -> np.ndarray:
    """Estimated seconds to first token on each worker, a miss charged for the requests it
    delays (``behind``: 1 + the fleet's backlog in chunks, plus ``waiting``; see the module
    docstring); with ``free_blocks``, ``used_blocks`` and ``drain_s`` the
    wait for room is added last. ``backlog_workers``: the workers the fleet's mean queue is
    over (None: every entry of ``queued_prefill``; the entries of slots without a worker must
    be 0).

    Give either ``overlap_blocks`` (and optionally ``lower_blocks``) or ``uncached_tokens``,
    the ``uncached_w`` of the formula already worked out (the router builds it straight from
    its prefix lookup). Terms that are the same everywhere are added without computing them
    per worker (a step count of 1 when no worker's work passes a chunk, no wait for room when
    every worker has it): the result is the same to the last bit, at a fraction of the cost
    over 1,024 workers."""
    uncached = _uncached(params, prompt_tokens, overlap_blocks, uncached_tokens, lower_blocks)
    work = queued_prefill + uncached
    idle = _idle_replicas(params, uncached, queued_prefill, waiting, decoding)
    cost = _prefill_s(
        params, work, uncached, queued_prefill, per_token_s, step_overhead_s, waiting, backlog_workers, idle
    )
    if params.stall_weight and decoding is not None:
        cost += _stall_s(params, uncached, step_overhead_s, decoding)
    if params.decode_weight and decode_tokens:
        decode = decode_step_s * (params.decode_weight * decode_tokens)
        cost += decode
    if lower_blocks is not None and load_s_per_block is not None:
        cost += lower_blocks * load_s_per_block
    if params.kv_penalty and kv_usage.max() > params.kv_watermark:
        over = np.maximum(kv_usage - params.kv_watermark, 0.0) / max(1.0 - params.kv_watermark, 1e-9)
        cost *= 1.0 + params.kv_penalty * over
    if free_blocks is not None and used_blocks is not None and drain_s is not None:
        short = work / params.block_size
        short -= free_blocks
        if short[short.argmax()] > 0:  # elsewhere the wait is 0
            cost += _room_wait(short, used_blocks, drain_s)
    return cost


def _uncached(
    params: CostParams,
    prompt_tokens: int,
    overlap_blocks: np.ndarray | None,
    uncached_tokens: np.ndarray | None,
    lower_blocks: np.ndarray | None,
) -> np.ndarray:
    """``uncached_w``: given, or from the overlaps (one of the two)."""
    if uncached_tokens is None:
        if overlap_blocks is None:
            raise TypeError("ttft_costs needs overlap_blocks or uncached_tokens")
        return uncached_tokens_of(params, prompt_tokens, overlap_blocks, lower_blocks)
    if overlap_blocks is not None or lower_blocks is not None:
        raise TypeError("ttft_costs takes uncached_tokens or overlap_blocks (and lower_blocks), not both")
    return uncached_tokens


def _prefill_s(
    params: CostParams,
    work: np.ndarray,
    uncached: np.ndarray,
    queued_prefill: np.ndarray,
    per_token_s: np.ndarray,
    step_overhead_s: np.ndarray,
    waiting: np.ndarray | None,
    backlog_workers: int | None,
    idle: np.ndarray | None = None,
) -> np.ndarray:
    """The work ahead of the first token and the miss charged per request it delays, at each
    worker's per-token speed, plus a step overhead per chunk of work (a new array). ``idle``
    (with ``waiting``): 1.0 where the next request is not charged (``_idle_replicas``)."""
    behind = 1.0  # the next request, and one per chunk of the fleet's mean queue
    if params.backlog_charge:
        fleet = len(queued_prefill) if backlog_workers is None else backlog_workers
        behind += float(queued_prefill.sum()) / fleet / params.chunk_tokens
    if waiting is None:
        cost = work + (params.miss_weight * behind) * uncached
    else:
        ahead = behind + waiting
        if idle is not None:
            ahead -= idle  # x - 0.0 is x: the other workers' cost is the same to the bit
        cost = params.miss_weight * ahead  # the miss, once per request it delays
        cost *= uncached
        cost += work
    cost *= per_token_s
    if work[work.argmax()] <= params.chunk_tokens and 0 < work[work.argmin()]:
        cost += step_overhead_s  # ceil(work / chunk_tokens) is 1 everywhere
    else:
        steps = work / params.chunk_tokens
        np.ceil(steps, out=steps)
        steps *= step_overhead_s
        cost += steps
    return cost


def _idle_replicas(
    params: CostParams,
    uncached: np.ndarray,
    queued_prefill: np.ndarray,
    waiting: np.ndarray | None,
    decoding: np.ndarray | None,
) -> np.ndarray | None:
    """1.0 on the workers with nothing decoding, queued or waiting, where two or more workers
    hold the prompt's longest cached prefix and some hold less (a shared prefix: see "Idle
    replicas"); None where no worker qualifies or the figures are not given."""
    if not params.idle_replicas or waiting is None or decoding is None or not len(uncached):
        return None
    best = uncached.min()
    if not best < uncached.max() or int(np.count_nonzero(uncached == best)) < 2:
        return None
    idle = (decoding == 0) & (queued_prefill == 0) & (waiting == 0)
    return idle.astype(np.float64) if idle.any() else None


def _stall_s(
    params: CostParams, uncached: np.ndarray, step_overhead_s: np.ndarray, decoding: np.ndarray
) -> np.ndarray:
    """The step overheads this request's prefill adds between the tokens of the requests
    decoding on each worker, weighted (one step everywhere when no prompt passes a chunk)."""
    if uncached[uncached.argmax()] <= params.chunk_tokens:
        stall = step_overhead_s * decoding  # one prefill step everywhere
    else:
        stall = uncached / params.chunk_tokens
        np.ceil(stall, out=stall)
        stall *= step_overhead_s
        stall *= decoding
    stall *= params.stall_weight
    return stall


def uncached_tokens_of(
    params: CostParams, prompt_tokens: int, overlap_blocks: np.ndarray, lower_blocks: np.ndarray | None
) -> np.ndarray:
    """``uncached_w`` of the formula: the prompt less its device (and lower-tier) hits, at
    least 1."""
    hit = overlap_blocks if lower_blocks is None else overlap_blocks + lower_blocks
    return np.maximum(prompt_tokens - hit * params.block_size, 1)


def room_wait_s(
    *, need_blocks: np.ndarray, free_blocks: np.ndarray, used_blocks: np.ndarray, drain_s: np.ndarray
) -> np.ndarray:
    """Seconds until each worker has ``need_blocks`` free: 0 while it has them; past that the
    deficit, at the rate a worker releases its ``used_blocks`` (all of them in ``drain_s``)."""
    return _room_wait(need_blocks - free_blocks, used_blocks, drain_s)


def _room_wait(short: np.ndarray, used_blocks: np.ndarray, drain_s: np.ndarray) -> np.ndarray:
    """``room_wait_s`` from the blocks each worker lacks (``short``, overwritten)."""
    deficit = np.maximum(short, 0.0, out=short)
    deficit *= drain_s
    deficit /= np.maximum(used_blocks, 1.0)
    return deficit


def cheapest(costs: np.ndarray, eligible: np.ndarray | None, k: int) -> list[int]:
    """Up to ``k`` indices among ``eligible`` (None: all) with the lowest costs, cheapest first,
    equal costs by index; +inf costs are left out."""
    left = costs.copy() if eligible is None else np.where(eligible, costs, np.inf)
    out = []
    for _ in range(k):
        i = int(left.argmin())
        if left.item(i) == np.inf:
            break
        out.append(i)
        left[i] = np.inf
    return out


def choose(
    costs: np.ndarray,
    eligible: np.ndarray,
    busy: np.ndarray,
    *,
    tolerance: float,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
    rotation: int = 0,
    ranked: list[int] | None = None,
) -> int:
    """Index of the chosen worker among ``eligible`` (a bool vector with at least one True).
    ``ranked``: ``cheapest(costs, eligible, k)`` for some k >= 2, if the caller has it: when the
    ties are all among those (the last one is past the tolerance), no pass over the costs."""
    if ranked and temperature <= 0:
        limit = costs[ranked[0]] + tolerance
        if len(ranked) == 1 or costs[ranked[1]] > limit:
            return ranked[0]
        if costs[ranked[-1]] > limit:  # the same rule as below, over the few tied ones
            near = sorted(i for i in ranked if costs[i] <= limit)
            least = min(busy[i] for i in near)
            near = [i for i in near if busy[i] == least]
            return near[rotation % len(near)]
    if temperature > 0:
        idx = np.flatnonzero(eligible)
        if len(idx) > 1:
            c = costs[idx]
            span = float(c.max() - c.min()) or 1.0
            logits = -(c - c.min()) / span / temperature
            p = np.exp(logits - logits.max())
            gen = rng or np.random.default_rng()
            return int(idx[gen.choice(len(idx), p=p / p.sum())])
    masked = np.where(eligible, costs, np.inf)
    best = int(masked.argmin())
    near = masked <= masked[best] + tolerance
    if np.count_nonzero(near) == 1:
        return best
    tied = np.flatnonzero(near)
    b = busy[tied]
    tied = tied[b == b.min()]
    return int(tied[rotation % len(tied)])
