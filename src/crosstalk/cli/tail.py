"""``crosstalk tail``: print an agent's journal records, without locking or repairing the file.

An agent is named as ``crosstalk send`` names it (a live name), or by agent_id even after the
agent is gone, since journals outlive registrations.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from crosstalk.cli.send import EXIT_OK, SendFailure, resolve_target
from crosstalk.config import journal_path
from crosstalk.core.ids import is_agent_id
from crosstalk.core.records import kind_of
from crosstalk.store.journal_read import read_journal


def journal_files(home: Path, agent: str | None) -> list[Path]:
    """The journals to show: every one, or one agent's (by live name, or by agent_id even
    after the agent is gone, since journals outlive registrations)."""
    if agent is None:
        return sorted((home / "journal").glob("*.jsonl"))
    if is_agent_id(agent) and journal_path(home, agent).exists():
        return [journal_path(home, agent)]
    return [journal_path(home, resolve_target(home, agent).agent_id)]


def _text_of(value: object, width: int = 80) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def format_record(rec: Mapping[str, Any], senders: dict[str, str]) -> str:
    """One readable line: time, seq, subject, id, state, reason, sender, start of the text."""
    ts = rec.get("ts")
    when = (datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")
            if isinstance(ts, int | float) else "-")
    rid = str(rec.get("id") or "-")
    sender = rec.get("sender")
    if isinstance(sender, dict):
        label = sender.get("name") or sender.get("agent_id") or "unverified"
        senders[rid] = str(label)
    elif isinstance(sender, str):
        senders.setdefault(rid, sender)
    fields = [when, f"#{rec.get('seq', '-')}", kind_of(rec) or "-",
              rid, str(rec.get("state") or "-"), str(rec.get("reason") or "-"),
              senders.get(rid, "-")]
    line = " ".join(fields)
    if rec.get("text") is not None:
        line += f"  {_text_of(rec['text'])!s}"
    return line


class _Tail:
    """Tracks what has been printed per journal, by seq (which survives retention rewrites)."""

    def __init__(self, out: IO[str], err: IO[str], *, as_json: bool, prefix: bool) -> None:
        self.out, self.err = out, err
        self.as_json, self.prefix = as_json, prefix
        self.seen: dict[Path, tuple[int, tuple[int, int, int]]] = {}
        self.senders: dict[Path, dict[str, str]] = {}
        self.damage_reported: dict[Path, int] = {}

    def poll(self, paths: Iterable[Path]) -> None:
        for path in paths:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            last_seq, last_stamp = self.seen.get(path, (0, (-1, -1, -1)))
            if stamp == last_stamp:
                continue
            replay = read_journal(path)
            damaged = [d for d in replay.damage if d.reason != "torn_tail"]
            if len(damaged) > self.damage_reported.get(path, 0):
                self.damage_reported[path] = len(damaged)
                print(f"crosstalk tail: {path}: {len(damaged)} damaged line(s) skipped",
                      file=self.err)
            senders = self.senders.setdefault(path, {})
            for rec in replay.records:
                seq = rec.get("seq")
                if not isinstance(seq, int) or seq <= last_seq:
                    continue
                last_seq = seq
                self._print(path, rec, senders)
            self.seen[path] = (last_seq, stamp)
        self.out.flush()

    def _print(self, path: Path, rec: Mapping[str, Any], senders: dict[str, str]) -> None:
        if self.as_json:
            line = json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
        else:
            line = format_record(rec, senders)
            if self.prefix:
                line = f"{path.stem} {line}"
        print(line, file=self.out)


def run_tail(home: Path, agent: str | None, *, follow: bool = False, as_json: bool = False,
             interval: float = 0.5, out: IO[str] | None = None,
             err: IO[str] | None = None) -> int:
    """The ``crosstalk tail`` command."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        paths = journal_files(home, agent)
    except SendFailure as exc:
        print(f"crosstalk tail: {exc}", file=err)
        return exc.exit_code
    if agent is not None and not follow and not paths[0].exists():
        print(f"crosstalk tail: {paths[0]} does not exist yet", file=err)
        return EXIT_OK
    tail = _Tail(out, err, as_json=as_json, prefix=agent is None)
    tail.poll(paths)
    if not follow:
        return EXIT_OK
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(interval)
            tail.poll(journal_files(home, None) if agent is None else paths)
    return EXIT_OK
