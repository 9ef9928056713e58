"""``crosstalk capture`` on a live agent, with the real Claude Code 2.1.328 (docs/capture.md).

B's session runs; the test attaches ``crosstalk capture beta`` (outside the namespace, as a
user would, with no restart of anything), then A's model sends B a message with
``send_message`` and a script sends B one with ``crosstalk send``. The capture shows the
A2A request and its answer, the uds frames and the very ack the script got, the frames B's
gate helper wrote into Claude's inbox and Claude's ``held`` receipt for the script's message
(a script is held for B's user), then its ``denied`` receipt once B's user denies it; B's
model gets A's message as it would without the capture; and no token
or key of the machine (CrossTalk's bearer credentials and uds keys, Claude's peer tokens) is
anywhere in what the capture printed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import LiveClaude, World, is_main, wait_for
from tests.live.support.gate import BYPASS, choose, model_saw, send_once
from tests.live.support.steps import start_all, unique

pytestmark = pytest.mark.live


def machine_secrets(world: World) -> list[str]:
    """Every token and key the machine holds: bearer credentials, uds keys, peer tokens."""
    found = [p.read_text().strip() for p in (world.state / "credentials").glob("*.token")]
    for desc in world.descriptors():
        found.append(Path(desc["uds_path"]).with_suffix(".key").read_text().strip())
    for key in (world.config_dir / "sessions").glob("*.key"):
        token = json.loads(key.read_text()).get("peerToken")
        if isinstance(token, str):
            found.append(token)
    return [s for s in found if s]


class LiveCapture:
    """``crosstalk capture`` as a user runs it; stdout and stderr read as they come."""

    def __init__(self, world: World, agent: str) -> None:
        script = Path(sys.executable).parent / "crosstalk"
        self.proc = subprocess.Popen([str(script), "capture", agent], env=world.env,
                                     cwd=world.root, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.started = threading.Event()
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True
                         ).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True
                         ).start()
        if not self.started.wait(30):
            self.proc.kill()
            raise AssertionError(f"the capture did not start: {self.err}")

    def _pump(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            if "capturing" in line:
                self.started.set()

    def frames(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.out)]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(30)


def _bodies(frames: list[dict[str, Any]], source: str, direction: str) -> str:
    return json.dumps([f["frame"] for f in frames
                       if f["source"] == source and f["direction"] == direction])


def test_capture_b_while_as_claude_sends_to_b(world: World, timings: Timings) -> None:
    alpha, beta = world.session("alpha", **BYPASS), world.session("beta", **BYPASS)
    start_all(alpha, beta)
    for claude in (alpha, beta):
        claude.wait_idle()
    name = beta.wait_named()["name"]
    capture = LiveCapture(world, name)
    try:
        text = unique("LIVE-CAPTURE-A2A")
        result, took = send_once(world, alpha, name, text)
        timings.add("send_message under capture: tool_use -> tool_result", took)
        assert result["state"] == "accepted", result
        _wait_seen(beta, text)
        scripted = unique("LIVE-CAPTURE-UDS")
        done = world.crosstalk("send", "--json", name, scripted)
        # A script is no Claude session: Claude holds its frame for B's user (ADR 0020).
        ack = json.loads(done.stdout)
        assert (ack["state"], ack["reason"]) == ("unknown", "held_for_approval"), done.stderr
        choose(beta, deliver=False)  # B's user denies it (and the dialog is gone for /exit)
        wait_for(lambda: "denied" in _bodies(capture.frames(), "claude_receipt", "in"), 20,
                 what="Claude's denied receipt in the capture")
    finally:
        code = capture.stop()
    assert code == 0, capture.err
    frames = capture.frames()
    print(f"[live] capture: {len(frames)} frames: "
          f"{sorted({(f['source'], f.get('direction')) for f in frames})}")
    assert text in _bodies(frames, "a2a", "in")
    assert '"status": 200' in _bodies(frames, "a2a", "out")
    assert scripted in _bodies(frames, "uds", "in")
    assert ack in [f["frame"] for f in frames if f["source"] == "uds"
                   and f["direction"] == "out"]
    assert "held" in _bodies(frames, "claude_receipt", "in")
    inbox = _bodies(frames, "claude_inbox", "out")
    assert text in inbox
    assert scripted in inbox
    assert "cross-session-message" in inbox
    everything = "".join(capture.out) + "".join(capture.err)
    secrets = machine_secrets(world)
    assert len(secrets) >= 4, len(secrets)  # never print a token
    leaked = [s[:4] for s in secrets if s in everything]
    assert leaked == [], f"tokens starting {leaked} are in the capture"


def _wait_seen(claude: LiveClaude, text: str) -> None:
    claude.wait_for_request(lambda e: is_main(e) and model_saw(claude, text) > 0, timeout=60)
