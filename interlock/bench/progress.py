"""Live progress bar: requests done, running p50 TTFT and output-token throughput (tqdm, stderr)."""

from __future__ import annotations

import statistics
import time

from tqdm import tqdm

from interlock.bench.client import RequestRecord

REFRESH_S = 0.5
"""Recomputing the median on every completion would cost the load generator CPU it shares."""


class Progress:
    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        self._bar = tqdm(
            total=total, desc=label, unit="req", disable=not enabled, leave=True, dynamic_ncols=True
        )
        self._ttfts: list[float] = []
        self._tokens = 0
        self._errors = 0
        self._t0 = time.perf_counter()
        self._last = 0.0

    def update(self, record: RequestRecord) -> None:
        if record.ok and record.ttft_s is not None:
            self._ttfts.append(record.ttft_s)
            self._tokens += record.output_tokens
        elif not record.ok:
            self._errors += 1
        self._bar.update(1)
        now = time.perf_counter()
        if now - self._last >= REFRESH_S:
            self._last = now
            self._bar.set_postfix_str(self.postfix(now), refresh=False)

    def postfix(self, now: float) -> str:
        p50 = f"{statistics.median(self._ttfts) * 1000:.0f}ms" if self._ttfts else "-"
        rate = self._tokens / max(now - self._t0, 1e-9)
        return f"p50 TTFT {p50}, {rate:.1f} out tok/s, {self._errors} err"

    def close(self) -> None:
        self._bar.set_postfix_str(self.postfix(time.perf_counter()), refresh=True)
        self._bar.close()
