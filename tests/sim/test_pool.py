"""The simulator's compiled pieces (``sim.native``: the pool's block map, a stretch's step times) against the Python they replace."""

from __future__ import annotations

import random

import pytest

from interlock.sim import native
from interlock.sim.pool import DictMap, SimPool


def drive(pool: SimPool, seed: int, steps: int = 3000) -> list[object]:
    """Requests over a few shared prefixes come and go (hits, shared references, evictions),
    keys from both ends of the 64-bit range and negative ones; everything observable is kept."""
    rng = random.Random(seed)
    prefixes = [[rng.choice((rng.randrange(1 << 64), rng.randrange(64))) for _ in range(6)] for _ in range(5)]
    held: list[tuple[list[int], int]] = []
    seen: list[object] = []
    uid = 0
    for _ in range(steps):
        if held and (rng.random() < 0.45 or pool.free < 12):
            keyed, unkeyed = held.pop(rng.randrange(len(held)))
            pool.release(keyed, unkeyed)
        else:
            uid += 1
            keys = prefixes[rng.randrange(5)][: rng.randrange(1, 7)] + [
                -(uid << 8) - i - 1 for i in range(rng.randrange(3))
            ]
            hits = pool.prefix(keys)
            seen.append(("prefix", hits, pool.revived(keys[:hits])))
            need = len(keys) - hits + rng.randrange(3)
            if need > pool.free - pool.revived(keys[:hits]):
                continue
            pool.touch(keys[:hits])
            pool.allocate(need)
            stored = pool.store_run(keys[hits:])
            single = [k for k in keys[hits:] if pool.store(k)]  # all held now: none stored
            assert single == []
            held.append((keys[:hits] + stored, need - len(stored)))
        pool.check()
        seen.append((pool.plain, pool.used, pool.free, pool.extra_refs(), pool.has_events()))
        if rng.random() < 0.1:
            seen.append(tuple(pool.take_events()))
    seen.append(sorted(pool.keys()))
    return seen


@pytest.mark.parametrize("seed", range(5))
def test_the_compiled_map_gives_what_the_dicts_give(seed) -> None:
    assert native.load() is not None  # this machine has a compiler: the C path is tested
    compiled = SimPool(40, 16, compiled=True)
    assert not isinstance(compiled.map, DictMap)
    reference = SimPool(40, 16, compiled=False)
    assert drive(compiled, seed) == drive(reference, seed)


def test_the_compiled_map_refuses_what_the_dicts_refuse() -> None:
    module = native.load()
    assert module is not None
    m = module.Pool(4)
    with pytest.raises(KeyError):
        m.touch([7])
    with pytest.raises(KeyError):
        m.release([7])
    with pytest.raises(ValueError):
        m.evict(1)
    with pytest.raises(TypeError):
        m.prefix([1.5])
    with pytest.raises(OverflowError):
        m.prefix([1 << 64])
    assert m.store_run([1, 2, 3, 4]) == ([1, 2, 3, 4], [1, 2, 3, 4])
    with pytest.raises(RuntimeError, match="more keys than blocks"):
        m.store_run([5])


def test_the_compiled_decode_times_equal_the_python_doubles() -> None:
    """A stretch's step ends (``_decode_span``) and step times with the EMA (``_step_s``,
    ``_ema``) from C are Python's doubles exactly, or refused (None) where they could not be."""
    from interlock.engine.timing import TimingModel
    from interlock.sim.worker import _A, _B, _C, _EMA, SimWorker, WorkerShape, _ema

    module = native.load()
    assert module is not None
    rng = random.Random(3)
    for _ in range(3000):
        kt = rng.choice([64 * 61000, 16 * 200, 64 * 5678])
        speed = rng.choice([1.0, 3.0, 1000.0])
        w = SimWorker("w", WorkerShape(num_blocks=kt // 64, block_size=64, timing=TimingModel(speed)))
        kt = w._kv_tokens_total
        ctx, n = rng.randrange(0, 3_000_000), rng.randrange(1, 257)
        k0 = rng.randrange(1, 400)
        start = rng.random() * 3600
        ends = module.decode_ends(start, ctx, n, k0, k0 + 20, kt, speed, _A, _B, _C)
        assert ends == [start + w._decode_span(ctx, n, k) for k in range(k0, k0 + 20)]
        ema0 = rng.choice([0.0, rng.random() / 100])
        steps, ema = module.decode_steps(ctx, n, 20, kt, speed, _A, _B, _C, ema0, _EMA)
        want, e = [], ema0
        for i in range(20):
            want.append(w._step_s(ctx + i * n))
            e = _ema(e, want[-1])
        assert steps == want and ema == e
    # past 2**53 the integers are not exact as doubles: refused, Python computes them
    assert module.decode_ends(0.0, 10**8, 256, 5000, 5001, 64 * 61000, 1.0, _A, _B, _C) is None
