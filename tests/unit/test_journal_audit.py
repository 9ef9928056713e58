"""The journal audit's plumbing (``tests/support/journal_audit.py``): which journals a test
wrote, and how the auditor's findings are reported."""

from __future__ import annotations

from pathlib import Path

from crosstalk.store.journal import Journal
from tests.support.journal_audit import audit, opened_journals, state_dir_journals


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_state_dir_journals_are_found_at_any_depth_and_nothing_else(tmp_path: Path) -> None:
    own = _touch(tmp_path / "state" / "journal" / "a.jsonl")
    nested = _touch(tmp_path / "world" / "state" / "journal" / "b.jsonl")
    _touch(tmp_path / "inbox" / "session.jsonl")  # a fake session's inbox, not a journal
    _touch(tmp_path / "state" / "journal" / "a.jsonl.lock")
    assert state_dir_journals([tmp_path, tmp_path / "absent"]) == {own, nested}


def test_every_journal_opened_inside_is_remembered(tmp_path: Path) -> None:
    with opened_journals() as seen:
        with Journal(tmp_path / "first.jsonl"):
            pass
        with Journal(str(tmp_path / "second.jsonl")):
            pass
    with Journal(tmp_path / "after.jsonl"):
        pass
    assert seen == {tmp_path / "first.jsonl", tmp_path / "second.jsonl"}


def test_problems_name_their_journal_and_vanished_journals_are_skipped(tmp_path: Path) -> None:
    sound = _touch(tmp_path / "sound.jsonl")
    bad = _touch(tmp_path / "bad.jsonl")
    asked: list[Path] = []

    def auditor(path: Path) -> list[str]:
        asked.append(path)
        return ["delivered before submitted"] if path == bad else []

    problems = audit([sound, bad, tmp_path / "gone.jsonl", bad], auditor)
    assert problems == [f"{bad}: delivered before submitted"]
    assert sorted(asked) == sorted([sound, bad])
