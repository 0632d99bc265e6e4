"""The exact (slow) backend of the replay: a real ``EngineCore`` with the ``MockRunner`` on a
``VirtualClock``, behind the same interface as ``SimWorker``.

Each engine step is executed when it starts (the core computes at once; the runner only records
its modelled time) and its outputs, KV events and load report are delivered when it ends, so a
request arriving during a step joins the next one, as on a real worker. One Python step per
token of every running request: use it to check the fast model on small workloads
(``ReplayConfig(backend="engine")``), not for hour-long traces.
"""

from __future__ import annotations

from dataclasses import dataclass

from interlock.engine.clock import VirtualClock
from interlock.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from interlock.engine.core import EngineCore, StepResult
from interlock.engine.runners.mock import MockRunner
from interlock.protocol.events import KVEventBatch, LoadReport
from interlock.protocol.generate import GenerateRequest
from interlock.protocol.sampling import SamplingParams
from interlock.sim.trace import SimRequest
from interlock.sim.worker import KVBatches, PacedLoads, SimSeq, WorkerShape, WorkerSink


@dataclass(slots=True)
class _Step:
    start: float
    end: float
    result: StepResult


class EngineWorker:
    def __init__(
        self,
        instance_id: str,
        shape: WorkerShape,
        *,
        sink: WorkerSink | None = None,
        max_model_len: int = 1 << 20,
    ) -> None:
        self.instance_id = instance_id
        self.publish_events = shape.publish_events
        self.sink = sink or WorkerSink()
        self.clock = VirtualClock()
        num_blocks, block_size = shape.num_blocks, shape.block_size
        config = EngineConfig(
            model=ModelConfig(runner="mock"),
            cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=shape.max_num_batched_tokens,
                max_num_seqs=shape.max_num_seqs,
                max_model_len=max_model_len,
            ),
        )
        runner = MockRunner(
            num_blocks=num_blocks, block_size=block_size, timing=shape.timing, clock=self.clock
        )
        self.core = EngineCore(config, runner, clock=self.clock, instance_id=instance_id)
        self.step: _Step | None = None
        self.version = 0
        self._seqs: dict[str, SimSeq] = {}
        self._batches = KVBatches(instance_id)
        self._loads = PacedLoads(self, self.sink, shape.report_interval_s)

    @property
    def num_inflight(self) -> int:
        return len(self._seqs)

    def enqueue(self, req: SimRequest, now: float) -> SimSeq:
        if req.token_ids is None:
            raise ValueError("the engine backend needs requests with token_ids")
        s = SimSeq(req, now)
        self._seqs[req.request_id] = s
        self.core.add_request(
            GenerateRequest(
                request_id=req.request_id,
                token_ids=req.token_ids,
                sampling=SamplingParams(max_tokens=req.output_tokens, ignore_eos=True, temperature=0.0),
            )
        )
        return s

    def start_step(self, now: float) -> float | None:
        if not self.core.has_work():
            self.step = None
            return None
        self.clock.advance_to(now)
        result = self.core.step()
        self.step = _Step(now, now + result.step_time_s, result)
        self.version += 1
        return self.step.end

    def cut(self, now: float) -> float | None:
        return None  # engine steps are single steps: nothing to cut

    def finish_step(self, now: float) -> None:
        st = self.step
        assert st is not None
        self.step = None
        self.clock.advance_to(now)
        decode_tokens = 0
        for out in st.result.outputs:
            s = self._seqs.get(out.request_id)
            if s is None:
                continue
            if out.token_ids and s.first_token_s < 0:
                s.first_token_s = now
                s.hit_tokens = out.num_cached_tokens
                self.sink.first_token(self, s, now)
            elif out.token_ids:
                decode_tokens += len(out.token_ids)
            if out.finished:
                s.finish_s = now
                del self._seqs[out.request_id]
                self.sink.finished(self, s, now)
        if decode_tokens:
            self.sink.itl(st.end - st.start, decode_tokens)
        if st.result.kv_events and self.publish_events:
            self.sink.kv_events(self._batches.live(now, st.result.kv_events))
        self._loads.offer(st.result.load, now)

    def send_held_load(self, now: float) -> float | None:
        self._loads.due(now)
        return None  # single steps: nothing to schedule

    def load_report(self, now: float) -> LoadReport:
        return self.core.load

    def snapshot(self, now: float) -> KVEventBatch:
        return self._batches.snapshot(now, self.core.kv_snapshot())
