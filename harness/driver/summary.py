"""The lines a study ends with: trials done, the best configuration re-evaluated, how to
reproduce it, tuned vs default, the ablation path, where the reports are, and the most important
hyperparameters. Read from the reports on disk."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from harness.driver.progress import fmt_params
from harness.reports import importance
from harness.store.records import AblationRecord, TrialRecord


def lines(paths: dict[str, Path], *, done: int, minutes: float,
          ablation: AblationRecord | None = None, timing: str | None = None) -> list[str]:
    """The summary of a finished study from its report files (``report.build``'s paths) and
    its ablation.json (``ablation``: what it cost); ``timing``: where the time went (:func:`time_line`)."""
    out = [f"done: {done} trials in {minutes:.1f} min"] + ([timing] if timing else [])
    if "best" in paths:
        b = json.loads(paths["best"].read_text())
        ev = b.get("reevaluation")
        if ev and ev.get("mean") is not None:
            final = (f", final return {ev['final_return']:.1f}" if b.get("objective", "final") != "final"
                     and ev.get("final_return") is not None else "")
            searched = ("unknown (its trial record is unreadable)" if b.get("search_score") is None
                        else f"{b['search_score']:.1f}")
            out += [f"best: {b['config_id']} re-evaluated {ev['mean']:.1f} (95% CI {ev['ci95'][0]:.1f}"
                    f"..{ev['ci95'][1]:.1f}) on {ev['seeds']} fresh seeds{final}; search score {searched}",
                    f"  {fmt_params(b['params'])}",
                    f"  reproduce: {b['reproduce']['command']}"]
        elif b.get("search_score") is not None:  # nothing re-trained (--top-k 0): its search score
            out.append(f"best: {b['config_id']} search score {b['search_score']:.1f} (not re-evaluated)")
        if b.get("tuned_vs_default"):
            out.append(tuned_vs_default_line(b["tuned_vs_default"], b.get("objective", "final")))
    if "ablation" in paths:
        out.append(ablation_line(pd.read_csv(paths["ablation"]), ablation))
    out.append(f"reports: {paths['configs'].parent}/ ({', '.join(p.name for p in paths.values())})")
    out += importance_lines(paths)
    return out


def show(paths: dict[str, Path], *, done: int, minutes: float, ablation: AblationRecord | None = None,
         timing: str | None = None, say: Callable[[str], None] = print) -> None:
    for line in lines(paths, done=done, minutes=minutes, ablation=ablation, timing=timing):
        say(line)


def time_line(total_s: float, phases: dict[str, float], records: list[TrialRecord], slots: int) -> str:
    """Where a study's wall time went: compiling and training (the search's trials' own seconds
    over the ``slots`` that ran side by side), evaluating (the re-training and the ablation path:
    ``phases["final"]``, ``phases["ablation"]``) and waiting (the rest: Ray starting, trials
    scheduled, slots idle, reports). ``records``: the trials this run searched."""
    compile_s = sum(r.compile_seconds or 0.0 for r in records) / max(slots, 1)
    train_s = sum(r.kernel_seconds or 0.0 for r in records) / max(slots, 1)
    search = phases.get("search", 0.0)
    compile_s, train_s = min(compile_s, search), min(train_s, max(search - compile_s, 0.0))
    evaluate_s = phases.get("final", 0.0) + phases.get("ablation", 0.0)
    wait_s = max(total_s - compile_s - train_s - evaluate_s, 0.0)

    def part(name: str, s: float) -> str:
        return f"{name} {s / 60:.1f} min ({100 * s / max(total_s, 1e-9):.0f}%)"

    return ("time: " + ", ".join([part("compiling", compile_s), part("training", train_s),
                                   part("evaluating", evaluate_s), part("waiting", wait_s)])
            + f" (evaluating: re-training {phases.get('final', 0.0) / 60:.1f} min, ablation path "
              f"{phases.get('ablation', 0.0) / 60:.1f} min)")


def ablation_line(abl: pd.DataFrame, raw: AblationRecord | None) -> str:
    """The path in one line: each switch with its paired gain, and what the path cost (``raw``: ablation.json)."""
    steps = ", ".join(f"{r.param} {r.gain:+.1f}" for r in abl.iloc[1:].itertuples())
    cost = (f"; {raw.kernels} extra kernels, {(raw.seconds or 0.0) / 60:.1f} min (--no-ablation skips it)"
            if raw is not None and raw.kernels is not None else "")
    return f"ablation path (default {abl['mean'].iloc[0]:.1f} -> best {abl['mean'].iloc[-1]:.1f}): {steps}{cost}"


def importance_lines(paths: dict[str, Path]) -> list[str]:
    """The three most important hyperparameters by each evaluator, or why there are none."""
    if "importance" not in paths:
        try:
            configs = pd.read_csv(paths["configs"])
        except pd.errors.EmptyDataError:  # a study with no record yet
            return []
        return [importance.too_few(configs)] if len(configs) else []
    imp = pd.read_csv(paths["importance"])
    out = []
    for ev, name in (("fanova", "fANOVA"), ("ped_anova", "PED-ANOVA")):
        top = importance.top(imp, 3, ev)
        if top:
            n = int(imp["configs"].iloc[0])
            out.append(f"most important ({name}, {n} configurations): "
                       + ", ".join(f"{p} {v:.2f}" for p, v in top))
    return out


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
