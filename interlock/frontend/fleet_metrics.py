"""``GET /metrics?scope=fleet``: the frontend's figures, then every worker's own ``/metrics``
(fetched at once, each within a deadline), each sample labelled with its worker and each family
written once, so that one scrape of the frontend sees the whole fleet."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from interlock.metrics.merge import head_of
from interlock.metrics.registry import escape_label

FETCH_TIMEOUT_S = 2.0


async def fleet_text(own: str, targets: Sequence[tuple[str, str]], timeout_s: float = FETCH_TIMEOUT_S) -> str:
    """``own`` followed by each ``(worker id, host:port)`` target's metrics, merged by family.
    A worker that does not answer in time is left out, and counted in a comment line."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        texts = await asyncio.gather(*(_fetch(session, addr) for _, addr in targets))
    families: dict[str, list[str]] = {}
    order: list[str] = []
    _merge(own, None, families, order)
    missing = []
    for (worker, _), text in zip(targets, texts, strict=True):
        if text is None:
            missing.append(worker)
        else:
            _merge(text, worker, families, order)
    lines = [line for name in order for line in families[name]]
    if missing:
        lines.append(f"# workers not answering: {' '.join(sorted(missing))}")
    return "\n".join(lines) + "\n"


async def _fetch(session: aiohttp.ClientSession, address: str) -> str | None:
    try:
        async with session.get(f"http://{address}/metrics") as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None


def _merge(text: str, worker: str | None, families: dict[str, list[str]], order: list[str]) -> None:
    """Add ``text``'s families to ``families`` (HELP and TYPE only the first time a family is
    seen), with ``worker="..."`` put first in each sample's labels when ``worker`` is given."""
    label = f'worker="{escape_label(worker)}"' if worker is not None else ""
    current = ""
    histograms: set[str] = set()
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            head = head_of(line)
            if head is None:
                continue
            kind, current, kind_of = head
            if kind == "TYPE" and kind_of == "histogram":
                histograms.add(current)
            if current not in families:
                families[current] = []
                order.append(current)
                families[current].append(line)
            elif not any(x.startswith(f"# {kind} ") for x in families[current]):
                families[current].append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        family = current if name == current or _suffixed(name, current, histograms) else name
        if family not in families:
            families[family] = []
            order.append(family)
        if label:
            rest = line[len(name) :].removeprefix("{}")
            line = f"{name}{{{label},{rest[1:]}" if rest.startswith("{") else f"{name}{{{label}}}{rest}"
        families[family].append(line)


def _suffixed(name: str, family: str, histograms: set[str]) -> bool:
    return family in histograms and name in (f"{family}_bucket", f"{family}_sum", f"{family}_count")
