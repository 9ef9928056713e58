"""Which journal records survive retention (seed §5, review finding R3).

Records older than the retention window are dropped, **except the whole dependency set** of
anything unresolved: an open ask keeps its original message body, its dedupe record, its route
and its task, not just the record that says "open". Keeping only the newest state record per
key (the bug R3 found) lets an ask outlive the text it asks about.

The model is deliberately generic so it needs no knowledge of record types:

- a record that carries ``subject`` (a state-machine kind from :mod:`crosstalk.core.states`),
  ``id`` and ``state`` reports the state of ``(subject, id)``; the latest such record wins;
  the fields are read by :func:`crosstalk.core.records.links`, the same way for every kind;
- every id a record names (``id`` plus everything in ``refs``) links those ids together;
- an id whose latest state is unresolved is a root; the connected component of each root is
  its dependency set, and every record touching it is kept regardless of age.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from crosstalk.core.records import Links, links
from crosstalk.core.states import is_unresolved

Record = Mapping[str, Any]


def record_ids(record: Record) -> list[str]:
    """Every correlation id a record names."""
    return links(record).ids()


def unresolved_ids(records: Iterable[Record]) -> set[str]:
    """Ids whose latest journaled state (per subject kind) is unresolved."""
    return _unresolved(links(rec) for rec in records)


def _unresolved(all_links: Iterable[Links]) -> set[str]:
    latest: dict[tuple[str, str], str] = {}
    for link in all_links:
        if link.subject is not None and link.id is not None and link.state is not None:
            latest[(link.subject, link.id)] = link.state
    return {rid for (subject, rid), state in latest.items() if is_unresolved(subject, state)}


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        parent = self.parent.setdefault(x, x)
        while parent != x:
            grand = self.parent.setdefault(parent, parent)
            self.parent[x] = grand
            x, parent = parent, grand
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def plan(records: Sequence[Record], now: float, max_age: float) -> list[bool]:
    """For each record, whether it is kept. Records without a numeric ``ts`` are kept."""
    all_links = [links(rec) for rec in records]
    uf = _UnionFind()
    for link in all_links:
        ids = link.ids()
        for other in ids[1:]:
            uf.union(ids[0], other)
    roots = {uf.find(i) for i in _unresolved(all_links)}
    cutoff = now - max_age
    keep: list[bool] = []
    for link in all_links:
        young = link.ts is None or link.ts >= cutoff
        needed = any(uf.find(i) in roots for i in link.ids())
        keep.append(young or needed)
    return keep
