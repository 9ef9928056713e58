"""The other ways people run opencode: ``opencode run`` (one prompt, then exit) and
``opencode attach`` (a TUI client of an ``opencode serve``), with the real opencode 1.18.33,
Claude Code and ``crosstalk mcp``. Assertions are on what the models received."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import World, wait_for
from tests.live.support.opencode import OpencodeWorld
from tests.live.support.opencode_steps import (
    claude_does,
    last_user_of,
    oc_descriptor,
    oc_descriptors,
    oc_requests,
    wait_oc_descriptor,
    wait_oc_request,
    with_crosstalk,
)
from tests.live.support.steps import unique

pytestmark = pytest.mark.live


def test_an_opencode_run_session_is_an_agent_while_it_runs_and_takes_a_message(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """``opencode run PROMPT`` hosts one session while it runs: that session is an agent,
    listed ``crosstalk: true`` by Claude while its first model answer is still held back,
    before its model called any tool. Claude's message joins the run's loop (the next step
    carries it), and the agent leaves when the run exits."""
    ow = with_crosstalk(opencode_with_claude)
    alpha = world.session("alpha").start()
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    match, gate = unique("RUN"), unique("gate")
    ow.mock.add_rules({"id": "run-held", "match": match, "gate": gate, "gate_timeout_s": 90,
                       "text": "first answer"})
    env = [f"{k}={v}" for k, v in ow.env().items()]
    started = time.monotonic()
    proc = subprocess.Popen(ow.netns.argv("env", "-i", *env, str(ow.binary), "run", match),
                            cwd=ow.project("runner"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        desc = wait_for(lambda: next((d for d in oc_descriptors(world)
                                      if d.get("harness_pid") == proc.pid), None), 60,
                        what="the run's session as an agent")
        timings.add("opencode run start -> agent", time.monotonic() - started)
        sid = str(desc["session_ref"])
        listed, _ = claude_does(world, alpha, "list_agents")
        row = next(a for a in listed["agents"] if a["name"] == desc["name"])
        assert (row["harness"], row["crosstalk"]) == ("opencode", True), row
        # Registered before its first model answer: the run may register before its first
        # request reaches the model (CI saw 0 requests here), so wait for that request, held
        # by the gate; with the answer held, no second request (no tool call) can exist.
        wait_for(lambda: oc_requests(ow, sid), 60, what="the run's first model request")
        assert len(oc_requests(ow, sid)) == 1
        text = unique("TO-RUN")
        result, sent = claude_does(world, alpha, "send_message", to=desc["name"], text=text)
        assert result.get("state") == "accepted", result
        timings.add("claude send -> accepted by the run (mid-turn)", time.time() - sent)
        opened = time.time()
        ow.mock.open_gate(gate)
        got = wait_oc_request(ow, sid, text, after=opened)
        timings.add("first answer released -> the run's next step carries it",
                    got["t"] - opened)
        assert text in last_user_of(got)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-1500:]
    wait_for(lambda: oc_descriptor(world, sid) is None, 20, what="the run's agent gone")


def test_a_session_of_opencode_attach_is_its_servers_agent_and_shows_claudes_message(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """A TUI attached to ``opencode serve`` starts a session; the serve hosts it, so the
    serve's shim registers it. Claude's message to it wakes it (its model gets the envelope)
    and the attached TUI shows it."""
    ow = with_crosstalk(opencode_with_claude)
    alpha = world.session("alpha").start()
    project = ow.project("served")
    srv = ow.serve("srv", cwd=project).start()
    assert srv.port is not None
    tui = ow.tui("att", cwd=project,
                 args=("attach", f"http://127.0.0.1:{srv.port}", "--dir", str(project)))
    tui.start()
    hello = unique("HELLO")
    ow.mock.add_rules({"match": hello, "text": "hello back"})
    t0 = time.time()
    tui.type(hello)
    sid = wait_for(lambda: next((str(e["session"]) for e in ow.entries()
                                 if e.get("kind") == "main" and e.get("session")
                                 and float(e.get("t") or 0) >= t0 - 1
                                 and hello in str(e.get("body"))), None), 60,
                   what="the attached TUI's session")
    desc = wait_oc_descriptor(world, sid, timeout=60)
    timings.add("attach prompt -> agent", time.time() - t0)
    assert desc["harness_pid"] == srv.pid  # hosted by the serve, not the attach client
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    api = srv.api(project)
    wait_for(lambda: sid not in (api.get("/session/status") or {}), 60, what="idle")
    text = unique("TO-ATTACHED")
    result, sent = claude_does(world, alpha, "send_message", to=desc["name"], text=text)
    assert result.get("state") == "accepted", result
    got = wait_oc_request(ow, sid, text, after=sent)
    timings.add("claude send -> attached session's model request", got["t"] - sent)
    wait_for(lambda: text in tui.screen(), 20, what="the attached TUI showing it")
