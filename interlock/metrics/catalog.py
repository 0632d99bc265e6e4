"""The metrics catalogue: every metric Interlock exports, with its type, labels, meaning, where
it is served and what vLLM and Dynamo call the same figure. A registry makes metrics only from
here (``interlock.metrics.registry``), and ``docs/metrics.md`` is this table
(``python -m interlock.metrics.catalog > docs/metrics.md``; a test holds the two equal and checks
that every name here is exported by a running fleet).

Conventions (Prometheus'): the ``interlock_`` prefix (``process_*`` as every client library
names them), base units (seconds, bytes), ``_total`` on counters, ratios in 0..1.
"""

from __future__ import annotations

from dataclasses import dataclass

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
TOKEN_BUCKETS = (1, 8, 32, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

FRONTEND = "frontend"
"""Served by the frontend's ``/metrics`` (its router's figures included)."""
WORKER = "worker"
"""Served by each worker's own ``/metrics`` (``metrics_address`` in its discovery metadata), and
by the frontend's ``/metrics?scope=fleet`` with a ``worker`` label added."""
PLANNER = "planner"
"""Served by the planner's status port (``/metrics``)."""
EVERY = "every process"


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    kind: str
    """counter, gauge or histogram."""
    help: str
    labels: tuple[str, ...] = ()
    where: str = FRONTEND
    group: str = ""
    """The deployment file's ``metrics.families`` switch this belongs to ("": always served)."""
    same_as: str = ""
    """vLLM's and Dynamo's names for the same figure, where they have one."""
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    per_process: bool = False
    """A gauge of this process's own work (requests in flight, its queue, its memory): the
    frontend processes sharing a port (``control-plane.frontend_workers``) add theirs up. Other
    gauges are the fleet as one process sees it (workers, their KV), the same in each."""

    @property
    def adds_up(self) -> bool:
        """Whether several frontend processes' samples of it are summed (``metrics.merge``): not
        a figure per worker (what the workers' load reports say, heard by every process alike),
        and a counter, a histogram or a gauge of a process's own work."""
        return "worker" not in self.labels and (self.kind != "gauge" or self.per_process)


GROUPS = ("requests", "ttft", "itl", "e2e", "tokens", "kv_cache_miss", "kv", "queue_depth", "gpu_utilization")
"""The families a deployment's ``metrics`` section switches on and off."""


def _specs() -> tuple[Spec, ...]:
    m = ("model",)
    w = ("worker", "model")
    return (
        # ---- frontend: requests as the client sees them ----
        Spec(
            "interlock_http_requests_total",
            "counter",
            "HTTP requests by endpoint and status code.",
            ("endpoint", "status"),
            group="requests",
            same_as="dynamo_frontend_requests_total (status)",
        ),
        Spec(
            "interlock_requests_total",
            "counter",
            "Generation requests ended, by model and finish reason (stop, length, tool_calls, abort, error).",
            ("model", "finish_reason"),
            group="requests",
            same_as="vllm:request_success_total (finished_reason)",
        ),
        Spec(
            "interlock_requests_in_flight",
            "gauge",
            "Generation requests being served now.",
            group="requests",
            same_as="dynamo_frontend_inflight_requests",
            per_process=True,
        ),
        Spec(
            "interlock_http_shed_total",
            "counter",
            "Connections closed or refused, and requests cut, to keep the frontend fair and its memory "
            "bounded, by reason.",
            ("reason",),
            group="requests",
        ),
        Spec(
            "interlock_time_to_first_token_seconds",
            "histogram",
            "Time from request arrival to its first token.",
            m,
            group="ttft",
            same_as="vllm:time_to_first_token_seconds, dynamo_frontend_time_to_first_token_seconds",
        ),
        Spec(
            "interlock_inter_token_latency_seconds",
            "histogram",
            "Time between consecutive output tokens.",
            m,
            group="itl",
            same_as="vllm:inter_token_latency_seconds, dynamo_frontend_inter_token_latency_seconds",
            buckets=ITL_BUCKETS,
        ),
        Spec(
            "interlock_request_duration_seconds",
            "histogram",
            "Time from request arrival to its last token.",
            m,
            group="e2e",
            same_as="vllm:e2e_request_latency_seconds, dynamo_frontend_request_duration_seconds",
        ),
        Spec(
            "interlock_request_prompt_tokens",
            "histogram",
            "Prompt length of each generation request, in tokens.",
            m,
            group="tokens",
            same_as="vllm:request_prompt_tokens, dynamo_frontend_input_sequence_tokens",
            buckets=TOKEN_BUCKETS,
        ),
        Spec(
            "interlock_request_completion_tokens",
            "histogram",
            "Completion length of each generation request, in tokens (all its choices).",
            m,
            group="tokens",
            same_as="vllm:request_generation_tokens, dynamo_frontend_output_sequence_tokens",
            buckets=TOKEN_BUCKETS,
        ),
        Spec(
            "interlock_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            m,
            group="tokens",
            same_as="vllm:prompt_tokens_total",
        ),
        Spec(
            "interlock_completion_tokens_total",
            "counter",
            "Completion tokens generated.",
            m,
            group="tokens",
            same_as="vllm:generation_tokens_total, dynamo_frontend_output_tokens_total",
        ),
        Spec(
            "interlock_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens served from a prefix cache (any tier).",
            m,
            group="kv_cache_miss",
            same_as="vllm:prefix_cache_hits_total (in tokens)",
        ),
        Spec(
            "interlock_prompt_chunks_total",
            "counter",
            "Long prompts' chunks by how the frontend got their token ids: chunk_hit (from its "
            "tokenizer's chunk cache), chunk_miss (encoded), prompt_hit (the whole prompt was "
            "sent before: one lookup).",
            ("result",),
        ),
        Spec(
            "interlock_prompt_cache_tokens",
            "gauge",
            "Token ids the frontend's tokenizers keep for long prompts (chunks and whole prompts).",
            per_process=True,
        ),
        Spec(
            "interlock_kv_cache_miss_tokens_total",
            "counter",
            "Prompt tokens computed because no prefix cache held them (prompt less cached).",
            m,
            group="kv_cache_miss",
        ),
        # ---- frontend: the fleet as its router sees it ----
        Spec(
            "interlock_workers",
            "gauge",
            "Workers in discovery, by model and role (aggregated, prefill, decode).",
            ("model", "role"),
            same_as="dynamo_component_* up series (one per instance)",
        ),
        Spec(
            "interlock_worker_kv_blocks_used",
            "gauge",
            "KV blocks in use (last load report).",
            w,
            group="kv",
        ),
        Spec("interlock_worker_kv_blocks_capacity", "gauge", "KV blocks in the device pool.", w, group="kv"),
        Spec(
            "interlock_worker_kv_usage_ratio",
            "gauge",
            "KV blocks in use over the pool, 0..1 (last load report).",
            w,
            group="kv",
            same_as="vllm:kv_cache_usage_perc, dynamo_component_kvstats_gpu_cache_usage_percent",
        ),
        Spec(
            "interlock_worker_running_requests",
            "gauge",
            "Requests running (last load report).",
            w,
            group="queue_depth",
            same_as="vllm:num_requests_running",
        ),
        Spec(
            "interlock_worker_waiting_requests",
            "gauge",
            "Requests waiting in the engine (last load report).",
            w,
            group="queue_depth",
            same_as="vllm:num_requests_waiting",
        ),
        Spec(
            "interlock_worker_busy_seconds_total",
            "counter",
            "Seconds the worker's engine spent in steps (rate(): its device utilisation).",
            w,
            group="gpu_utilization",
        ),
        Spec(
            "interlock_worker_weights_out_seconds",
            "gauge",
            "Seconds the worker's next request would wait for its model's weights, offloaded while "
            "idle (offload_after_s); 0 while they are in (last load report).",
            w,
        ),
        Spec(
            "interlock_worker_kv_handoffs_total",
            "counter",
            "A guest engine's KV hand-offs, by outcome (vLLM's NIXL connector: prefills handed over, "
            "pulls, pulls failed and computed locally).",
            (*w, "outcome"),
        ),
        *(
            Spec(f"interlock_worker_kv_tier_{name}", kind, help_, (*w, "tier"))
            for name, kind, help_ in (
                ("blocks", "gauge", "KV blocks held in a tier below the device pool."),
                ("capacity_blocks", "gauge", "KV blocks the tier can hold."),
                ("hits_total", "counter", "Blocks a prefix lookup found in the tier."),
                ("loads_total", "counter", "Blocks loaded from the tier into the device pool."),
                ("load_failures_total", "counter", "Blocks that could not be loaded (computed again)."),
                ("load_seconds_total", "counter", "Time spent loading from the tier."),
                ("evictions_total", "counter", "Blocks the tier evicted."),
                (
                    "load_timeouts_total",
                    "counter",
                    "Blocks of loads given up past their deadline (a slow disk).",
                ),
                ("write_failures_total", "counter", "Blocks the tier failed to write (a full disk)."),
            )
        ),
        Spec(
            "interlock_control_plane_up",
            "gauge",
            "1 while this process reaches the NATS server.",
        ),
        Spec(
            "interlock_control_plane_outages_total",
            "counter",
            "Times the NATS server became unreachable.",
        ),
        Spec(
            "interlock_workers_vouched",
            "gauge",
            "Workers silent on the control plane but answering on their request plane (kept routable).",
        ),
        # ---- frontend: routing ----
        Spec(
            "interlock_router_decisions_total",
            "counter",
            "Routing decisions by reason (kv overlap, load, session, route key...; a disaggregated "
            "request's legs, retries and migrations each count; `+queued` once it waited, "
            "`+queued+gave_up` once it stopped waiting for a busy worker holding more of its prefix).",
            ("model", "reason"),
            same_as="dynamo router's decision counters",
        ),
        Spec("interlock_router_requests_total", "counter", "Requests placed, each once.", m),
        Spec("interlock_router_prompt_tokens_total", "counter", "Prompt tokens routed.", m),
        Spec(
            "interlock_router_predicted_cached_tokens_total",
            "counter",
            "Prompt tokens expected from cache where routed.",
            m,
            group="kv_cache_miss",
        ),
        Spec("interlock_router_rejected_total", "counter", "Requests rejected with 503 (queue full).", m),
        Spec("interlock_router_resyncs_total", "counter", "KV index re-syncs requested.", m),
        Spec("interlock_router_decision_seconds_total", "counter", "Time spent deciding.", m),
        Spec(
            "interlock_router_queued_total",
            "counter",
            'Waits in the router\'s queue for a free worker, by the role waited for ("any": an '
            "aggregated request); a disaggregated request may wait twice.",
            ("model", "role"),
            group="queue_depth",
        ),
        Spec(
            "interlock_router_queue_depth",
            "gauge",
            "Requests waiting in the router's queue for a free worker now.",
            m,
            group="queue_depth",
            same_as="dynamo_frontend_queued_requests",
            per_process=True,
        ),
        Spec(
            "interlock_router_waiting_for_worker",
            "gauge",
            "Requests waiting for a model that has no eligible worker now (scaled to zero, every "
            "worker restarting); the planner counts them with the queue and starts a worker.",
            m,
            group="queue_depth",
            per_process=True,
        ),
        Spec(
            "interlock_router_retries_total",
            "counter",
            "Requests routed again after a failure before their first token.",
        ),
        Spec(
            "interlock_router_migrations_total",
            "counter",
            "Requests moved to another worker mid-stream.",
            same_as="dynamo's migration counters",
        ),
        Spec(
            "interlock_router_migrations_exhausted_total",
            "counter",
            "Requests failed after their migration limit.",
        ),
        Spec(
            "interlock_router_stalls_total",
            "counter",
            "Streams broken for sending nothing past the stall timeout.",
        ),
        Spec(
            "interlock_router_worker_aborts_total",
            "counter",
            "Streams a worker ended with abort (drain, shutdown).",
        ),
        Spec(
            "interlock_router_migration_recovery_seconds_total",
            "counter",
            "Seconds from a break to the next token, summed.",
        ),
        Spec("interlock_router_breaker_opened_total", "counter", "Times a worker's circuit breaker opened."),
        Spec(
            "interlock_router_breakers_open",
            "gauge",
            "Workers whose circuit breaker is open now (not routed to until it half-opens).",
        ),
        Spec(
            "interlock_router_kv_syncs_total",
            "counter",
            "Pulls of a worker's KV state: a gap replayed from its ring, its whole cache, or failed; its "
            "whole state copied from another router replica, or the replica could not.",
            ("kind",),
        ),
        Spec("interlock_router_kv_sync_bytes_total", "counter", "Bytes pulled from workers' KV state."),
        Spec(
            "interlock_router_kv_replica_bytes_total",
            "counter",
            "Bytes of workers' KV states copied from other router replicas.",
        ),
        Spec(
            "interlock_router_kv_replica_served_total",
            "counter",
            "Workers' KV states this router sent to other replicas.",
        ),
        Spec(
            "interlock_router_kv_lookups_total",
            "counter",
            "Per-request prefix lookups of a frontend without an index (--kv-index remote), by outcome: "
            "answered by a replica, failed or no replica known (placed by load).",
            ("outcome",),
        ),
        Spec(
            "interlock_router_kv_lookups_served_total",
            "counter",
            "Prefix lookups answered for other frontends.",
        ),
        Spec(
            "interlock_router_kv_syncing_workers",
            "gauge",
            "Workers whose KV state is being pulled (routed by what the index has meanwhile).",
        ),
        Spec(
            "interlock_router_weight_prefetches_total",
            "counter",
            "Workers asked to load their offloaded weights as a request arrived (no warm worker "
            "was free), by outcome (loaded, failed).",
            ("outcome",),
        ),
        Spec(
            "interlock_disagg_choices_total",
            "counter",
            "Prefill placement decisions (remote prefill or local), by reason.",
            ("reason",),
        ),
        Spec(
            "interlock_disagg_fallbacks_total",
            "counter",
            "Remote prefills that ended local, by cause.",
            ("cause",),
        ),
        Spec(
            "interlock_worker_restarts_total",
            "counter",
            "Processes the supervisor restarted (interlock serve, the Python API), by process name.",
            ("process",),
        ),
        # ---- worker: the engine's own figures ----
        Spec(
            "interlock_engine_requests_total",
            "counter",
            "Requests the engine ended, by finish reason (stop, length, abort, error).",
            ("finish_reason",),
            where=WORKER,
            same_as="vllm:request_success_total",
        ),
        Spec(
            "interlock_engine_queue_time_seconds",
            "histogram",
            "Time a request waited in the worker before its first step.",
            where=WORKER,
            same_as="vllm:request_queue_time_seconds",
        ),
        Spec(
            "interlock_engine_prefill_time_seconds",
            "histogram",
            "Time from a request's first step to its first token (its prompt's computation).",
            where=WORKER,
            same_as="vllm:request_prefill_time_seconds",
        ),
        Spec(
            "interlock_engine_decode_time_seconds",
            "histogram",
            "Time from a request's first token to its last.",
            where=WORKER,
            same_as="vllm:request_decode_time_seconds",
        ),
        Spec(
            "interlock_engine_time_to_first_token_seconds",
            "histogram",
            "Time from a request's arrival at the worker to its first token.",
            where=WORKER,
            same_as="vllm:time_to_first_token_seconds",
        ),
        Spec(
            "interlock_engine_weight_load_seconds",
            "histogram",
            "Loads of a model's weights that had been offloaded while idle (offload_after_s), "
            "each taking this long; the request that brought them back waited for it.",
            where=WORKER,
        ),
        Spec(
            "interlock_engine_weight_offloads_total",
            "counter",
            "Times the model's weights were offloaded after offload_after_s without a request.",
            where=WORKER,
        ),
        Spec(
            "interlock_engine_preemptions_total",
            "counter",
            "Requests preempted (their KV freed, recomputed later).",
            where=WORKER,
            same_as="vllm:num_preemptions_total",
        ),
        Spec(
            "interlock_engine_prompt_tokens_total",
            "counter",
            "Prompt tokens of requests the engine served.",
            where=WORKER,
            same_as="vllm:prompt_tokens_total",
        ),
        Spec(
            "interlock_engine_generation_tokens_total",
            "counter",
            "Tokens the engine generated.",
            where=WORKER,
            same_as="vllm:generation_tokens_total",
        ),
        Spec(
            "interlock_engine_running_requests",
            "gauge",
            "Requests running in the engine now.",
            where=WORKER,
            same_as="vllm:num_requests_running",
        ),
        Spec(
            "interlock_engine_waiting_requests",
            "gauge",
            "Requests waiting in the engine now.",
            where=WORKER,
            same_as="vllm:num_requests_waiting",
        ),
        Spec(
            "interlock_engine_kv_usage_ratio",
            "gauge",
            "KV blocks in use over the device pool, 0..1.",
            where=WORKER,
            same_as="vllm:kv_cache_usage_perc",
        ),
        Spec(
            "interlock_engine_prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            where=WORKER,
            same_as="vllm:prefix_cache_queries_total",
        ),
        Spec(
            "interlock_engine_prefix_cache_hits_total",
            "counter",
            "Prompt tokens found cached, by tier (any: every cached token of a request, whichever "
            "tier held it; host, disk...: those loaded from that tier below the device pool).",
            ("tier",),
            where=WORKER,
            same_as="vllm:prefix_cache_hits_total",
        ),
        Spec(
            "interlock_kv_transfers_total",
            "counter",
            "KV transfers this worker pulled for disaggregated requests, by transport.",
            ("transport",),
            where=WORKER,
            same_as="dynamo's NIXL transfer counters",
        ),
        Spec(
            "interlock_kv_transfer_bytes_total",
            "counter",
            "Bytes of KV pulled, by transport.",
            ("transport",),
            where=WORKER,
        ),
        Spec(
            "interlock_kv_transfer_seconds_total",
            "counter",
            "Seconds spent pulling KV, by transport.",
            ("transport",),
            where=WORKER,
        ),
        # ---- planner ----
        Spec(
            "interlock_planner_decisions_total",
            "counter",
            "Planner actions, by kind (add, remove, switch).",
            ("kind",),
            where=PLANNER,
        ),
        Spec("interlock_planner_tick_errors_total", "counter", "Planner ticks that failed.", where=PLANNER),
        Spec(
            "interlock_planner_replicas",
            "gauge",
            "Workers per role: those serving (current) and what the planner last wanted (desired).",
            ("role", "state"),
            where=PLANNER,
            same_as="dynamo planner's replica gauges",
        ),
        # ---- every process ----
        Spec(
            "interlock_build_info",
            "gauge",
            "Always 1; the labels say which Interlock and Python run here.",
            ("version", "python", "component"),
            where=EVERY,
        ),
        Spec(
            "process_cpu_seconds_total", "counter", "CPU time of this process, user and system.", where=EVERY
        ),
        Spec(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory of this process.",
            where=EVERY,
            per_process=True,
        ),
        Spec(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory of this process.",
            where=EVERY,
            per_process=True,
        ),
        Spec(
            "process_open_fds",
            "gauge",
            "File descriptors this process has open.",
            where=EVERY,
            per_process=True,
        ),
        Spec("process_max_fds", "gauge", "The most file descriptors this process may open.", where=EVERY),
        Spec(
            "process_start_time_seconds",
            "gauge",
            "When this process started, in seconds since the Unix epoch.",
            where=EVERY,
        ),
    )


CATALOG: dict[str, Spec] = {s.name: s for s in _specs()}


def markdown() -> str:
    """``docs/metrics.md``."""
    out = [
        "# Metrics",
        "",
        "Every metric Interlock exports (generated from `interlock/metrics/catalog.py`:",
        "`python -m interlock.metrics.catalog > docs/metrics.md`). Prometheus text format 0.0.4.",
        "",
        "- **frontend**: the frontend's `GET /metrics` (its router's figures included).",
        "- **worker**: each worker's own `GET /metrics`, at the `metrics_address` it advertises in",
        "  discovery; the frontend's `GET /metrics?scope=fleet` adds every worker's, labelled `worker`.",
        "- **planner**: the planner's status port, `GET /metrics`.",
        "- **every process**: each of the above.",
        "",
        "*Group* is the deployment file's `metrics.families` switch that turns a metric off (none:",
        "always served). *Same as* names vLLM's (`vllm:*`) and Dynamo's (`dynamo_*`) metric of the",
        "same meaning, for dashboards and alerts written against those.",
        "",
        "| Name | Type | Labels | Served by | Group | Meaning | Same as |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in CATALOG.values():
        labels = ", ".join(f"`{x}`" for x in s.labels)
        same = s.same_as.replace("|", "/")
        out.append(f"| `{s.name}` | {s.kind} | {labels} | {s.where} | {s.group} | {s.help} | {same} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
