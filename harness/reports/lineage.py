"""Population-based training's records: who copied whom, when, with which hyperparameters.

A PBT trial's record holds, in its curves, one event per exploit step: ``{"chunk": k, "source":
[C], "fitness": [C], "hparams": [C dicts]}`` (configuration ``i`` copied ``source[i]`` after chunk
``k`` and trained on with ``hparams[i]``). From those, a configuration's *lineage* is the chain of
configurations its network passed through, and its *schedule* the hyperparameters that network
trained with, chunk by chunk: what the final re-training replays on fresh seeds (and
``harness.train --schedule``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.store.records import TrialRecord, config_id


def events(record: TrialRecord) -> list[dict[str, Any]]:
    """The record's exploit steps, by chunk."""
    return sorted((c["pbt"] for c in record.curves if c.get("pbt")), key=lambda e: e["chunk"])


def schedule(record: TrialRecord, index: int) -> tuple[dict[str, float], list[dict[str, Any]], list[int]]:
    """Configuration ``index``'s network's history.

    Returns:
        ``(initial hyperparameters, changes [{"chunk": k, "hparams": {...}}] each in effect after
        chunk k, lineage [configuration index at chunk 0, ..., index])``.
    """
    lane, changes, chain = index, [], [index]
    for e in reversed(events(record)):  # only a copy changes a configuration's hyperparameters
        if e["source"][lane] != lane:
            changes.append({"chunk": e["chunk"], "hparams": dict(e["hparams"][lane])})
            lane = e["source"][lane]
            chain.append(lane)
    return dict(record.configs[lane].hparams or {}), changes[::-1], chain[::-1]


def merge(schedules: list[list[dict[str, Any]]], initials: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Per-configuration schedules as one plan schedule: ``[{"chunk": k, "hparams": [C dicts]}]``."""
    chunks = sorted({c["chunk"] for s in schedules for c in s})
    current = [dict(h) for h in initials]
    out = []
    for k in chunks:
        for i, s in enumerate(schedules):
            for change in s:
                if change["chunk"] == k:
                    current[i] = dict(change["hparams"])
        out.append({"chunk": k, "hparams": [dict(h) for h in current]})
    return out


def table(records: list[TrialRecord]) -> pd.DataFrame:
    """``pbt.csv``: one row per PBT configuration per exploit step (and its start, chunk 0):
    trial, chunk, config_id, the configuration it copied (itself when kept), fitness and the
    hyperparameters it trained with from then on."""
    rows = []
    for rec in records:
        evs = events(rec)
        if not rec.pbt or not evs:
            continue
        for i, c in enumerate(rec.configs):
            rows.append(dict(trial=rec.trial, chunk=0, config_id=config_id(rec.trial, i),
                             source=config_id(rec.trial, i), copied=False, fitness=None, **(c.hparams or {})))
        for e in evs:
            for i, src in enumerate(e["source"]):
                rows.append(dict(trial=rec.trial, chunk=e["chunk"], config_id=config_id(rec.trial, i),
                                 source=config_id(rec.trial, src), copied=src != i, fitness=e["fitness"][i],
                                 **e["hparams"][i]))
    return pd.DataFrame(rows)
