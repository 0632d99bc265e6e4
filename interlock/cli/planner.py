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
        sign = f"{w['delta']:+d}" if w["delta"] else " 0"
        lines.append(f"wants     {w['role']} {sign}: {w['reason']}")
    lines += model_lines(status.get("model"))
    decisions = status["decisions"]
    assert isinstance(decisions, list)
    lines.append(f"decisions {len(decisions)}")
    lines += [f"  {DecisionRecord.line_of(d)}" for d in decisions]
    return "\n".join(lines)


def model_lines(model: object) -> list[str]:
    """The policy's own view (``Policy.status``): the SLA policy's forecast and its errors,
    its needs and their corrections; the reactive policy's window means."""
    if not isinstance(model, dict):
        return []
    out = []
    f = model.get("forecast")
    if isinstance(f, dict):
        err = model.get("forecast_error")
        e = (
            f" (last {err['compared']:.0f} forecasts: mean error {100 * err['mean_abs_error']:.0f}%, "
            f"bias {100 * err['bias']:+.0f}%)"
            if isinstance(err, dict)
            else ""
        )
        out.append(f"forecast  {f['rate']} req/s over {model.get('horizon_s')} s{e}")
    for role, need in (model.get("needs") or {}).items():
        cap = (model.get("capacity_error") or {}).get(role, {})
        last = cap.get("last_window")
        seen = (
            f"; last window {last['size']} workers, model need {last['need']}, "
            f"{100 * last['met']:.1f}% met: model {last['verdict']}"
            if last
            else ""
        )
        out.append(
            f"needs     {role} {need} (capacity error x{cap.get('factor', 1.0)}, "
            f"SLO correction x{model.get('slo_correction', 1.0)}{seen})"
        )
    for role, m in (model.get("means") or {}).items():
        out.append(f"means     {role} " + ", ".join(f"{k} {v}" for k, v in m.items()))
    return out


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
