"""The lines a study ends with: trials done, the best configuration re-evaluated, how to
reproduce it, tuned vs default, and where the reports are. Read from the reports on disk."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.progress import fmt_params


def lines(paths: dict[str, Path], *, done: int, minutes: float) -> list[str]:
    """The summary of a finished study from its report files (``report.build``'s paths)."""
    out = [f"done: {done} trials in {minutes:.1f} min"]
    if "best" in paths:
        b = json.loads(paths["best"].read_text())
        ev = b.get("reevaluation")
        if ev and ev.get("mean") is not None:
            final = (f", final return {ev['final_return']:.1f}" if b.get("objective", "final") != "final"
                     and ev.get("final_return") is not None else "")
            out += [f"best: {b['config_id']} re-evaluated {ev['mean']:.1f} (95% CI {ev['ci95'][0]:.1f}"
                    f"..{ev['ci95'][1]:.1f}) on {ev['seeds']} fresh seeds{final}; search score "
                    f"{b['search_score']:.1f}",
                    f"  {fmt_params(b['params'])}",
                    f"  reproduce: {b['reproduce']['command']}"]
        elif b.get("search_score") is not None:  # nothing re-trained (--top-k 0): its search score
            out.append(f"best: {b['config_id']} search score {b['search_score']:.1f} (not re-evaluated)")
        if b.get("tuned_vs_default"):
            out.append(tuned_vs_default_line(b["tuned_vs_default"], b.get("objective", "final")))
    out.append(f"reports: {paths['configs'].parent}/ ({', '.join(p.name for p in paths.values())})")
    return out


def show(paths: dict[str, Path], *, done: int, minutes: float, say: Callable[[str], None] = print) -> None:
    for line in lines(paths, done=done, minutes=minutes):
        say(line)


def tuned_vs_default_line(t: dict[str, Any], objective: str) -> str:
    """One line: tuned vs default on the same fresh seeds, CIs and the paired difference."""
    def side(x: dict[str, Any]) -> str:
        if x.get("mean") is None:
            return "no score" + (" (diverged)" if x.get("diverged") else "")
        return f"{x['mean']:.1f} (95% CI {x['ci95'][0]:.1f}..{x['ci95'][1]:.1f})"

    d = t["difference"]
    diff = ("no paired seeds" if d["mean"] is None else
            f"paired difference {d['mean']:+.1f} (95% CI {d['ci95'][0]:+.1f}..{d['ci95'][1]:+.1f}) over "
            f"{d['paired_seeds']} seeds")
    verdict = ("tuning helps" if t["better"] else "the default is better" if t.get("worse")
               else "no clear difference")
    line = f"tuned vs default ({objective}): {side(t['tuned'])} vs {side(t['default'])}; {diff}: {verdict}"
    if r := t.get("above_reference"):
        times = "" if r["ratio"] is None else f", {r['ratio']:.1f}x"
        line += (f"; above {r['label']} ({r['return']:g}): {r['tuned']:.2f} vs {r['default']:.2f}{times}")
    return line
