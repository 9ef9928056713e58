"""``crosstalk watch``'s full-screen start: the start state is read before textual is imported,
and the app's first poll is handed exactly that read (nothing lost, nothing read twice)."""

from __future__ import annotations

from pathlib import Path

from crosstalk.cli.watch import Polled
from crosstalk.watch.feed import Feed
from crosstalk.watch.model import Change


def test_the_first_poll_is_the_one_already_read_and_later_ones_go_to_the_feed(
        tmp_path: Path) -> None:
    calls: list[int] = []
    feed = Feed(tmp_path, {}, sessions=lambda: calls.append(1) or [])
    read = [Change("notice", 1.0, "here", "a line", {})]
    polled = Polled(feed, read)
    assert polled.board is feed.board
    assert polled.poll() is read  # handed over as read, not polled again
    assert calls == []
    assert polled.poll() == []  # the feed's own poll now: nothing new in an empty state dir
    assert calls == [1]
