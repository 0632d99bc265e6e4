"""``interlock bench``: a load generator and report tool for any OpenAI-compatible endpoint.

It talks HTTP only (aiohttp), so it measures Interlock, vLLM or Dynamo the same way. Pieces:
prompts (``vocab``, ``lengths``, ``prompts``, ``trace``; traces load with ``interlock.mooncake``), pacing (``schedule``, ``plans``,
``loadgen``), one timed request (``client``), numbers (``stats``), outputs (``results``,
``table``, ``plots``, ``progress``) and a fake server with injected delays (``fake_server``).
"""

from interlock.bench.client import Endpoint, RequestRecord, request_body, send_request
from interlock.bench.fake_server import FakeOpenAIServer, FakeTiming
from interlock.bench.lengths import LengthDist
from interlock.bench.loadgen import Bounds, LoadPlan, RunResult, run_load
from interlock.bench.plans import concurrency_plan, rate_plan, trace_plan
from interlock.bench.plots import PlotRun, report_png
from interlock.bench.prompts import Prompt, SyntheticSpec, synthetic_prompt
from interlock.bench.results import BenchFile
from interlock.bench.results import load as load_results
from interlock.bench.results import save as save_results
from interlock.bench.schedule import arrival_offsets
from interlock.bench.stats import Dist, Summary, Targets, summarize, throughput_series
from interlock.bench.trace import TracePrompts
from interlock.bench.vocab import TokenizerVocab, Vocab, WordVocab, load_vocab

__all__ = [
    "BenchFile",
    "Bounds",
    "Dist",
    "Endpoint",
    "FakeOpenAIServer",
    "FakeTiming",
    "LengthDist",
    "LoadPlan",
    "PlotRun",
    "Prompt",
    "RequestRecord",
    "RunResult",
    "Summary",
    "SyntheticSpec",
    "Targets",
    "TokenizerVocab",
    "TracePrompts",
    "Vocab",
    "WordVocab",
    "arrival_offsets",
    "concurrency_plan",
    "load_results",
    "load_vocab",
    "rate_plan",
    "report_png",
    "request_body",
    "run_load",
    "save_results",
    "send_request",
    "summarize",
    "synthetic_prompt",
    "throughput_series",
    "trace_plan",
]
