"""The journal against a model: a list of acknowledged records, in order.

Appends, batches, crashes that leave an unacknowledged fragment (a would-be line cut short, no
newline), reopens and retention are interleaved at random. After every step the lock-free
reader must see exactly the model (plus at most a torn tail), and ``seq`` must be strictly
increasing and never reused.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from crosstalk.store.journal import Journal
from crosstalk.store.journal_format import decode_line, encode_line
from crosstalk.store.journal_read import read_journal

DAY = 24 * 3600.0

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
# The journal owns "seq" and "ts"; records carry neither ids nor states here, so retention's
# only rule that applies is age.
keys = st.text(max_size=8).filter(lambda k: k not in {"seq", "ts", "id", "refs", "subject"})
records = st.dictionaries(keys, json_values, max_size=5)


def strip(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("seq", "ts")}


class JournalModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="journal-model-"))
        self.path = self.dir / "agent.jsonl"
        self.now = 1_700_000_000.0
        self.journal = Journal(self.path, clock=self.clock)
        self.model: list[dict[str, Any]] = []
        self.stamps: list[float] = []  # the ts the journal gave each model record
        self.high_seq = 0  # the highest seq ever acknowledged
        self.fragment = False  # an unacknowledged fragment sits at the end of the file

    def clock(self) -> float:
        self.now += 1.0
        return self.now

    @initialize()
    def start_empty(self) -> None:
        assert read_journal(self.path).records == []

    def _acknowledged(self, stored: list[dict[str, Any]], sent: list[dict[str, Any]]) -> None:
        assert [strip(r) for r in stored] == sent
        assert [r["seq"] for r in stored] == list(
            range(self.high_seq + 1, self.high_seq + 1 + len(stored))
        ), "seq continues from the highest one ever acknowledged"
        self.high_seq += len(stored)
        self.model.extend(sent)
        self.stamps.extend(r["ts"] for r in stored)
        self.fragment = False

    @rule(record=records)
    def append(self, record: dict[str, Any]) -> None:
        self._acknowledged([self.journal.append(record)], [record])

    @rule(batch=st.lists(records, min_size=1, max_size=4))
    def append_batch(self, batch: list[dict[str, Any]]) -> None:
        sent: list[Mapping[str, Any]] = list(batch)  # append_batch takes list[Mapping]
        self._acknowledged(self.journal.append_batch(sent), batch)

    # a writer repairs the tail under the lock before it writes, so crashes never stack up
    @precondition(lambda self: not self.fragment)
    @rule(record=records, data=st.data())
    def crash_mid_line(self, record: dict[str, Any], data: st.DataObject) -> None:
        """A writer died while writing this line: a non-empty prefix, no newline, never acked."""
        line = encode_line({**record, "seq": self.high_seq + 1, "ts": self.now})
        cut = data.draw(st.integers(min_value=1, max_value=len(line) - 1), label="cut")
        assert b"\n" not in line[:cut]
        with self.path.open("ab") as f:
            f.write(line[:cut])
        self.fragment = True

    @precondition(lambda self: not self.fragment)
    @rule(batch=st.lists(records, min_size=2, max_size=4), data=st.data())
    def crash_mid_batch(self, batch: list[dict[str, Any]], data: st.DataObject) -> None:
        """A writer died inside one append_batch write: some whole lines, maybe a fragment.

        ``append_batch`` is all or nothing, so none of it may ever be replayed.
        """
        lines = [
            encode_line({**r, "seq": self.high_seq + 1 + i, "ts": self.now},
                        more=i < len(batch) - 1)
            for i, r in enumerate(batch)
        ]
        written = b"".join(lines)
        cut = data.draw(st.integers(min_value=1, max_value=len(written) - 1), label="cut")
        with self.path.open("ab") as f:
            f.write(written[:cut])
        self.fragment = True

    @rule()
    def reopen(self) -> None:
        self.journal.close()
        self.journal = Journal(self.path, clock=self.clock)

    @rule()
    def replay(self) -> None:
        rep = self.journal.replay()
        assert [strip(r) for r in rep.records] == self.model
        assert [d.reason for d in rep.damage] == (["torn_tail"] if self.fragment else [])
        assert self.journal.last_seq == self.high_seq or not self.model
        self.fragment = False  # replay repairs under the lock

    @rule(advance=st.sampled_from([0.0, DAY / 2, DAY + 1, 3 * DAY]))
    def retention(self, advance: float) -> None:
        self.now += advance
        res = self.journal.apply_retention(now=self.now)
        # older than the window goes, except the newest record: it is the seq high-water mark
        keep = [ts >= self.now - DAY for ts in self.stamps]
        if keep:
            keep[-1] = True
        assert (res.kept, res.dropped, res.quarantined) == (sum(keep), keep.count(False), 0)
        self.model = [r for r, k in zip(self.model, keep, strict=True) if k]
        self.stamps = [t for t, k in zip(self.stamps, keep, strict=True) if k]
        self.fragment = False  # retention catches up first, which drops the fragment

    @invariant()
    def reader_sees_the_model(self) -> None:
        rep = read_journal(self.path)
        assert [strip(r) for r in rep.records] == self.model
        assert [d.reason for d in rep.damage] == (["torn_tail"] if self.fragment else [])
        seqs = [r["seq"] for r in rep.records]
        assert all(a < b for a, b in itertools.pairwise(seqs)), seqs
        assert all(s <= self.high_seq for s in seqs)
        if not self.fragment:
            data = self.path.read_bytes()
            assert data == b"" or data.endswith(b"\n")
            assert all(isinstance(decode_line(raw), dict) for raw in data.split(b"\n")[:-1])

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.dir, ignore_errors=True)


JournalModel.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_journal_model = JournalModel.TestCase
