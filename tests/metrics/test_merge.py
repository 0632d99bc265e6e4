"""Several frontend processes' expositions as one (``metrics.merge``)."""

from __future__ import annotations

from interlock.metrics import Registry
from interlock.metrics.merge import merge_processes


def process(requests: int, in_flight: int, workers: int, ttft: list[float]) -> str:
    r = Registry()
    r.counter("interlock_requests_total").inc(("m", "stop"), requests)
    r.gauge("interlock_requests_in_flight").set(in_flight)
    r.gauge("interlock_workers").set(workers, ("m", "both"))
    h = r.histogram("interlock_time_to_first_token_seconds")
    for x in ttft:
        h.observe(x, ("m",))
    return r.render()


def value(text: str, key: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith(key + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_counters_histograms_and_own_work_add_up_and_the_fleet_view_is_kept_once() -> None:
    a = process(3, 1, 2, [0.002, 0.02])
    b = process(4, 2, 2, [0.02])
    merged = merge_processes([a, b])
    assert value(merged, 'interlock_requests_total{model="m",finish_reason="stop"}') == 7
    assert value(merged, "interlock_requests_in_flight") == 3  # each process's own: summed
    assert value(merged, 'interlock_workers{model="m",role="both"}') == 2  # the same fleet: once
    assert value(merged, 'interlock_time_to_first_token_seconds_count{model="m"}') == 3
    assert value(merged, 'interlock_time_to_first_token_seconds_bucket{model="m",le="0.025"}') == 3
    assert value(merged, 'interlock_time_to_first_token_seconds_bucket{model="m",le="0.0025"}') == 1
    assert abs(value(merged, 'interlock_time_to_first_token_seconds_sum{model="m"}') - 0.042) < 1e-9
    assert merged.count("# TYPE interlock_requests_total counter") == 1


def test_a_workers_reported_figures_are_kept_once() -> None:
    texts = []
    for _ in range(2):  # both processes heard the same load reports
        r = Registry()
        r.counter("interlock_worker_busy_seconds_total").inc(("w0", "m"), 2.5)
        texts.append(r.render())
    assert value(merge_processes(texts), 'interlock_worker_busy_seconds_total{worker="w0",model="m"}') == 2.5


def test_a_series_only_one_process_has_is_kept_in_its_family() -> None:
    r = Registry()
    r.counter("interlock_requests_total").inc(("other", "length"), 5)
    merged = merge_processes([process(1, 0, 1, []), r.render()])
    lines = merged.splitlines()
    at = lines.index("# TYPE interlock_requests_total counter")
    family = lines[at + 1 : at + 3]
    assert 'interlock_requests_total{model="other",finish_reason="length"} 5' in family
    assert merge_processes([merged]) == merged
