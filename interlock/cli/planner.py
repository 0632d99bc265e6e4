"""interlock planner status: what the planner decided and why (it asks the planner's
status endpoint, GET /planner)."""

from __future__ import annotations

import argparse
import json
import sys

import httpx

from interlock.cli import flags
from interlock.planner import DecisionRecord
from interlock.planner.status import PATH


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="interlock planner", description=__doc__)
    sub = p.add_subparsers(dest="op", required=True)
    s = sub.add_parser("status", help="list the planner's decisions with their reasons")
    s.add_argument(
        "--url",
        default="http://127.0.0.1:8010",
        help="the planner's status address (host:port it serves /planner on)",
    )
    s.add_argument("--json", action="store_true", help="print the raw status")
    return flags.apply_environment(p)


def render(status: dict[str, object]) -> str:
    lines = [
        f"policy    {status['policy']}",
        f"ticks     {status['ticks']} ({status['errors']} failed)",
        f"holding   {status['holding'] or '-'}",
    ]
    for w in status["wants"]:  # type: ignore[attr-defined]
        lines.append(f"wants     {w['role']} {'+1' if w['delta'] > 0 else '-1'}: {w['reason']}")
    decisions = status["decisions"]
    assert isinstance(decisions, list)
    lines.append(f"decisions {len(decisions)}")
    lines += [f"  {DecisionRecord.line_of(d)}" for d in decisions]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    url = args.url.rstrip("/") + PATH
    try:
        resp = httpx.get(url, timeout=5.0)
        resp.raise_for_status()
    except httpx.HTTPError as e:
        print(f"interlock planner status: cannot read {url}: {e}", file=sys.stderr)
        return 1
    status = resp.json()
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0
