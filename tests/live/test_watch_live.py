"""``crosstalk watch`` in a real terminal (tmux) beside the live suite's Claude Code sessions:
what its screen shows, read by ``tmux capture-pane`` (issue 15's live check).

The watch runs outside the namespace: it starts no harness and only reads the state dir, the
Claude config dir's session records and the journals, as a user's terminal pane would."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import World, tool_results, wait_for
from tests.live.support.extras import result_json
from tests.live.support.steps import start_all, unique

pytestmark = pytest.mark.live


def test_crosstalk_watch_shows_both_sessions_and_the_message_flow(
        world: World, timings: Timings, tmp_path: Path) -> None:
    alpha, beta = world.session("alpha"), world.session("beta")
    start_all(alpha, beta)
    beta.wait_idle()
    a_name, b_name = alpha.wait_descriptor()["name"], beta.wait_descriptor()["name"]
    sock = str(tmp_path / "tmux-watch.sock")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in world.env.items())
    command = f"exec env -i {env} TERM=xterm-256color {sys.executable} -m crosstalk watch"

    def screen() -> str:
        return subprocess.run(["tmux", "-S", sock, "capture-pane", "-p", "-t", "w"],
                              capture_output=True, text=True, timeout=10).stdout

    started = time.monotonic()
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", "w", "-x", "160", "-y",
                    "45", command], check=True, timeout=15)
    try:
        wait_for(lambda: a_name in screen() and b_name in screen(), 30,
                 what="both sessions on the watch's screen")
        timings.add("crosstalk watch start -> both sessions on screen",
                    time.monotonic() - started)
        text = unique("WATCHED")
        trigger = unique("GO-SEND")
        world.mock.add_rules({
            "id": "watched-send", "match": trigger, "session": alpha.session_id,
            "tool_use": {"name": "mcp__crosstalk__send_message",
                         "input": {"to": b_name, "text": text}},
            "then": {"text": "sent it"}})
        after = alpha.last_seq()
        alpha.send_keys(f"{trigger} please message beta")
        entry = alpha.wait_for_request(lambda e: bool(tool_results(e)), timeout=60,
                                       after=after)
        (block,) = tool_results(entry)
        assert result_json(block)["state"] == "accepted"
        shown = time.monotonic()
        row = f"{a_name} → {b_name}"
        wait_for(lambda: any(row in line and "accepted" in line and text[:12] in line
                             for line in screen().splitlines()), 20,
                 what="the message's row, accepted, on the watch's screen")
        timings.add("tool result -> the row accepted on screen", time.monotonic() - shown)
        print("[live] crosstalk watch screen:\n" + screen())
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True, timeout=15)
