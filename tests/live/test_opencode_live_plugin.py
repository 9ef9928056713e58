"""CrossTalk's opencode plugin (``crosstalk.js``) loaded in the real opencode 1.18.33 binary.

A TUI in tmux (no ``--port``: no TCP listener at all) and ``opencode serve`` with two project
directories, all inside the loopback-only namespace, against our mock Chat Completions API.
The MCP server named ``crosstalk`` here is a logging stand-in (``support/logging_mcp.py``),
next to another one named ``other``: what reaches them shows which tools get the stamp.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from crosstalk.proc import process_matches, process_start_time
from tests.live.conftest import Timings
from tests.live.support.claude import World, alive, wait_for
from tests.live.support.opencode import VERSION, OpencodeWorld, UnixHttp

FORMAT = "crosstalk-opencode-instance"


def key(pid: int, directory: Path) -> str:
    return f"{pid}-{hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]}"


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def check_record(w: OpencodeWorld, record: dict[str, Any], pid: int, directory: Path) -> None:
    """Every field as ``harness/opencode/records.py`` reads it; the files private to us."""
    name = key(pid, directory)
    assert Path(record["_path"]) == w.records_dir / f"{name}.json"
    assert {k: record[k] for k in ("format", "version", "pid", "process_start", "directory",
                                   "socket", "opencode_version")} == {
        "format": FORMAT, "version": 1, "pid": pid, "process_start": process_start_time(pid),
        "directory": str(directory.resolve()), "socket": str(w.records_dir / f"{name}.sock"),
        "opencode_version": VERSION}
    assert isinstance(record["written_at"], int | float)  # JSON: 1.5e9 may print as an int
    assert abs(record["written_at"] - time.time()) < 600
    assert set(record) == {"format", "version", "pid", "process_start", "directory", "socket",
                           "opencode_version", "written_at", "_path"}
    assert stat.S_ISSOCK(os.lstat(record["socket"]).st_mode)
    assert mode(record["socket"]) == 0o600
    assert mode(record["_path"]) == 0o600
    assert mode(w.records_dir) == 0o700


def two_tool_calls(w: OpencodeWorld, match: str) -> None:
    """The model answers ``match`` with ``crosstalk_echo``, then ``other_echo``, then text."""
    w.mock.add_rules({"match": match, "tool_call": {"name": "crosstalk_echo",
                                                   "arguments": {"text": f"{match}-ours"}},
                      "then": {"tool_call": {"name": "other_echo",
                                             "arguments": {"text": f"{match}-theirs"}},
                               "then": {"text": f"{match}-DONE"}}})


def calls_for(w: OpencodeWorld, match: str) -> dict[str, dict[str, Any]]:
    """The arguments each logging server got for ``match``'s calls, by server."""
    return {c["server"]: c["arguments"] for c in w.mcp_calls()
            if str((c.get("arguments") or {}).get("text", "")).startswith(match)}


def both_calls(w: OpencodeWorld, match: str) -> dict[str, dict[str, Any]] | None:
    """:func:`calls_for` once both servers got theirs."""
    calls = calls_for(w, match)
    return calls if len(calls) == 2 else None


def tool_call_id(w: OpencodeWorld, name: str, text: str) -> str:
    """The id the mock gave the tool call ``name`` it answered with (the model's call id)."""
    for entry in w.entries():
        for call in (entry.get("response") or {}).get("tool_calls") or []:
            args = json.loads(call["function"]["arguments"])
            if call["function"]["name"] == name and args.get("text") == text:
                return str(call["id"])
    raise AssertionError(f"the mock answered no {name} call with {text!r}")


def test_a_tui_publishes_its_instance_serves_its_api_and_cleans_up_on_exit(
        opencode_world: OpencodeWorld, timings: Timings) -> None:
    w = opencode_world
    started = time.monotonic()
    tui = w.tui("alpha").start()
    timings.add("TUI start to its input box", time.monotonic() - started)
    assert tui.pid is not None
    record = tui.wait_record()
    check_record(w, record, tui.pid, tui.cwd)
    api = UnixHttp(record["socket"])
    assert api.get("/global/health") == {"healthy": True, "version": VERSION}
    assert api.get("/session") == []

    events = api.events()
    assert events.status == 200
    assert str(events.content_type).startswith("text/event-stream")
    events.wait(lambda e: e.get("type") == "server.connected", 10)
    two_tool_calls(w, "STAMP-TUI")
    sent = time.monotonic()
    tui.type("STAMP-TUI")
    calls = wait_for(lambda: both_calls(w, "STAMP-TUI"), 60, what="both echo calls")
    timings.add("typed prompt to both MCP calls", time.monotonic() - sent)
    sessions = api.get("/session")
    assert len(sessions) == 1
    sid = sessions[0]["id"]
    # the stamp: the calling session and the model's call id, on CrossTalk's tool only
    assert calls["crosstalk"] == {"text": "STAMP-TUI-ours", "_opencode": {
        "sessionID": sid, "callID": tool_call_id(w, "crosstalk_echo", "STAMP-TUI-ours")}}
    assert calls["other"] == {"text": "STAMP-TUI-theirs"}
    # SSE streamed through the socket while the TUI worked
    events.wait(lambda e: e.get("type") == "session.idle"
                and e["properties"].get("sessionID") == sid, 60)
    seen = {e.get("type") for e in events.events}
    assert {"session.status", "message.updated", "message.part.updated"} <= seen
    wait_for(lambda: "STAMP-TUI-DONE" in tui.screen(), 30, what="the reply on screen")
    events.close()

    exited = time.monotonic()
    tui.exit()
    timings.add("/exit to process gone", time.monotonic() - exited)
    assert not Path(record["_path"]).exists()
    assert not os.path.lexists(record["socket"])
    assert w.records() == []


def test_serve_publishes_each_directory_as_its_own_instance(
        opencode_world: OpencodeWorld, timings: Timings) -> None:
    w = opencode_world
    started = time.monotonic()
    serve = w.serve("a").start()
    timings.add("serve start to its first instance published", time.monotonic() - started)
    a = serve.wait_record()
    check_record(w, a, serve.pid or 0, serve.cwd)
    other = w.project("b")
    # A request for another directory, through A's socket, makes opencode open that instance.
    status, _ = UnixHttp(a["socket"]).request(
        "GET", "/session", headers={"x-opencode-directory": quote(str(other), safe="")})
    assert status == 200
    b = w.wait_record(serve.pid or 0, other, 30)
    check_record(w, b, serve.pid or 0, other)
    assert a["socket"] != b["socket"]

    apis = {"a": UnixHttp(a["socket"]), "b": UnixHttp(b["socket"])}
    ids = {}
    for name, api in apis.items():
        status, session = api.request("POST", "/session", {})
        assert status == 200
        ids[name] = session["id"]
    for name, api in apis.items():  # each socket is its own directory's instance
        listed = api.get("/session")
        assert [s["id"] for s in listed] == [ids[name]]
        assert listed[0]["directory"] == (a if name == "a" else b)["directory"]
    assert apis["a"].get("/session/status") == {}
    # two sessions of one process, each stamped with its own id
    for name, api in apis.items():
        two_tool_calls(w, f"STAMP-{name.upper()}")
        status, _ = api.request("POST", f"/session/{ids[name]}/prompt_async",
                                {"parts": [{"type": "text", "text": f"STAMP-{name.upper()}"}]})
        assert status == 204
    for name in apis:
        calls = wait_for(lambda n=name: both_calls(w, f"STAMP-{n.upper()}"), 60,
                         what=f"{name}'s echo calls")
        assert calls["crosstalk"]["_opencode"]["sessionID"] == ids[name]
        assert "_opencode" not in calls["other"]

    # A model that writes "_opencode" itself cannot name another session: the hook's wins.
    w.mock.add_rules({"match": "STAMP-FORGED", "tool_call": {"name": "crosstalk_echo",
                      "arguments": {"text": "STAMP-FORGED", "_opencode": {
                          "sessionID": "ses_forged", "callID": "call_forged"}}},
                      "then": {"text": "FORGED-DONE"}})
    apis["a"].request("POST", f"/session/{ids['a']}/prompt_async",
                      {"parts": [{"type": "text", "text": "STAMP-FORGED"}]})
    forged = tool_call_id(w, "crosstalk_echo", "STAMP-FORGED") if wait_for(
        lambda: any("STAMP-FORGED" in json.dumps(e.get("response")) for e in w.entries()),
        60, what="the forging answer") else ""
    wait_for(lambda: any(m.get("role") == "tool" and m.get("tool_call_id") == forged
                         for e in w.entries() for m in (e.get("body") or {}).get("messages", [])),
             60, what="the forged call's result back at the model")
    calls = calls_for(w, "STAMP-FORGED")
    assert calls["crosstalk"]["_opencode"] == {"sessionID": ids["a"], "callID": forged}

    stopped = time.monotonic()
    assert serve.terminate() == -15  # it still dies of SIGTERM, after the plugin cleaned up
    timings.add("SIGTERM to serve gone", time.monotonic() - stopped)
    for record in (a, b):
        assert not Path(record["_path"]).exists()
        assert not os.path.lexists(record["socket"])


def test_the_socket_refuses_what_crosstalk_must_never_do(opencode_world: OpencodeWorld
                                                         ) -> None:
    w = opencode_world
    serve = w.serve("guard").start()
    api = serve.api()
    status, session = api.request("POST", "/session", {})
    assert status == 200
    refused = [("POST", "/tui/append-prompt", {"text": "typed for the user"}),
               ("POST", "/tui/submit-prompt", None),
               ("POST", "/permission/per_1/reply", {"reply": "always"}),
               ("PATCH", "/config", {"share": "auto"}),
               ("POST", f"/session/{session['id']}/shell", {"command": "true", "agent": "build"}),
               ("POST", "/pty", {}),
               # the same routes spelt otherwise
               ("POST", "//tui/append-prompt", {"text": "x"}),
               ("POST", "/%74ui/append-prompt", {"text": "x"}),
               ("POST", "/TUI/submit-prompt", None),
               ("POST", "/permission%2Fper_1%2Freply", {"reply": "once"}),
               ("GET", "/%E0%A4%A/x", None)]
    for method, route, body in refused:
        status, answer = api.request(method, route, body)
        assert status == 403, (method, route, answer)
        assert "CrossTalk's socket does not serve" in answer["error"]
    assert api.get("/permission") == []  # reading whether a session waits for its user is fine
    assert api.get("/config")["share"] == "disabled"  # the settings stayed as they were


def test_kill_9_leaves_a_stale_record_that_is_detectably_dead(
        opencode_world: OpencodeWorld) -> None:
    w = opencode_world
    serve = w.serve("doomed").start()
    record = serve.wait_record()
    serve.kill9()
    # nothing could clean up: both files stay, and the record shows itself stale
    assert Path(record["_path"]).exists()
    assert os.path.lexists(record["socket"])
    assert not alive(record["pid"])
    assert not process_matches(record["pid"], record["process_start"])

    def refused() -> bool:  # once the last of its threads is gone (the leader is a zombie
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:  # before that)
            probe.settimeout(2)
            try:
                probe.connect(record["socket"])
            except ConnectionRefusedError:
                return True
        return False
    wait_for(refused, 10, what="the dead socket refusing connections")


def test_one_shot_commands_publish_nothing_and_run_publishes_while_it_runs(
        opencode_world: OpencodeWorld, timings: Timings) -> None:
    w = opencode_world
    project = w.project("cli")
    # A second plugin beside ours notes every process that loads plugins.
    marks = w.root / "loaded.jsonl"
    (w.config_dir / "plugin" / "marker.js").write_text(
        'import fs from "fs"\nexport const Marker = async () => {\n'
        f'  fs.appendFileSync({json.dumps(str(marks))}, JSON.stringify(process.argv.slice(2))'
        ' + "\\n")\n  return {}\n}\n')
    for args in (("session", "list"), ("--version",), ("debug", "paths"), ("mcp", "list")):
        started = time.monotonic()
        done = w.run(*args, cwd=project)
        timings.add(f"opencode {' '.join(args)}", time.monotonic() - started)
        assert done.returncode == 0, (args, done.stdout[-500:], done.stderr[-1500:])
        assert not w.records_dir.exists(), args  # the plugin returned before making anything
    assert w.run("--version").stdout.strip() == VERSION
    loaded = [json.loads(line) for line in marks.read_text().splitlines()]
    assert ["session", "list"] in loaded  # plugins did load there: ours published nothing

    # `opencode run` hosts a session while it runs: published, then removed at its exit
    w.mock.add_rules({"match": "RUN-SLOWLY", "text": "RUN-DONE", "delay_s": 4})
    env = [f"{k}={v}" for k, v in w.env().items()]
    proc = subprocess.Popen(w.netns.argv("env", "-i", *env, str(w.binary), "run", "RUN-SLOWLY"),
                            cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        record = w.wait_record(proc.pid, project, 60)
        assert UnixHttp(record["socket"]).get("/global/health")["healthy"] is True
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-1500:]
    assert b"RUN-DONE" in out
    assert w.records() == []


def test_the_installed_entry_and_plugin_work_in_opencode_and_uninstall_restores_the_file(
        opencode_world: OpencodeWorld, timings: Timings) -> None:
    """What ``crosstalk install`` writes (its ConfigEdit and PlacedFile, applied here by hand:
    the entry point is the harness package's) into a user's JSONC config that asks before
    every tool: opencode takes the file, loads the plugin from where install put it, starts
    the entry with its environment, runs CrossTalk's tools without asking and still asks for
    the others; doctor, run in the namespace, sees it all; removing the entry gives back the
    user's bytes."""
    from crosstalk.harness.opencode import setup
    from crosstalk.harness.plugin import ConfigEdit, PlacedFile

    w = opencode_world
    (w.config_dir / "plugin" / "crosstalk.js").unlink()
    (w.config_dir / "opencode.json").unlink()
    base = json.dumps(w.base_config(), indent=2)[1:-2]  # the members, without the braces
    user = ("// my opencode settings\n{" + base + ",\n  /* careful */\n  \"permission\": "
            '{"*": "ask", "bash": {"git *": "allow"}},\n  "mcp": {\n    "other": '
            + json.dumps(w.logging_servers("other")["other"]) + ",\n  },\n}\n")
    env = {"HOME": str(w.home), "XDG_CONFIG_HOME": str(w.config_home)}
    edit, placed = setup.install_entries(env)
    assert isinstance(edit, ConfigEdit)
    assert isinstance(placed, PlacedFile)
    assert edit.path == w.config_dir / "opencode.jsonc"  # none yet: the file opencode writes
    edit.path.write_text(user)
    command = w.logging_servers("crosstalk")["crosstalk"]["command"]  # our stand-in server
    edit.path.write_text(edit.add(user, command))
    placed.path.parent.mkdir(exist_ok=True)
    placed.path.write_text(placed.content())

    tui = w.tui("installed").start()
    record = tui.wait_record()
    two_tool_calls(w, "STAMP-INSTALLED")
    tui.type("STAMP-INSTALLED")
    ours = wait_for(lambda: calls_for(w, "STAMP-INSTALLED").get("crosstalk"), 60,
                    what="crosstalk_echo, not asked for")
    assert set(ours["_opencode"]) == {"sessionID", "callID"}
    wait_for(lambda: "Permission required" in tui.screen(), 30, what="other_echo asked for")
    assert "other" not in calls_for(w, "STAMP-INSTALLED")
    starts = [json.loads(line) for line in w.mcp_log.read_text().splitlines()
              if '"startup"' in line]
    crosstalk_env = next(s["msg"]["env"] for s in starts if s["server"] == "crosstalk")
    assert crosstalk_env["CROSSTALK_HARNESS"] == "opencode"
    assert crosstalk_env["OPENCODE_PID"] == str(tui.pid)

    doctor = ("import json, os; from crosstalk.harness.opencode import setup; print(json.dumps("
              "[[f.ok, f.what, f.fix] for f in setup.doctor(dict(os.environ))]))")
    started = time.monotonic()
    done = w.netns.run("env", "-i", *(f"{k}={v}" for k, v in {
        **w.env(), "PATH": f"{w.binary.parent}:{w.env()['PATH']}"}.items()),
        w.python, "-c", doctor, timeout=60)
    timings.add("doctor in the namespace", time.monotonic() - started)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    lines = [what for ok, what, _ in found]
    assert [what for ok, what, _ in found if not ok] == []
    assert f"opencode: registered in {edit.path} ({' '.join(command)})" in lines
    assert f"opencode: plugin {placed.path}" in lines
    assert f"opencode: version {VERSION}" in lines
    assert f"opencode {tui.pid} in {record['directory']}: reachable, 1 sessions live, " \
        f"1 busy (opencode {VERSION})" in lines  # busy: other_echo waits for its user

    stopping = time.monotonic()
    assert tui.stop() == []
    timings.add("stop with a permission prompt open", time.monotonic() - stopping)
    assert edit.remove(edit.path.read_text()) == user


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_tui_told_to_stop_by_a_signal_cleans_up(opencode_world: OpencodeWorld,
                                                 sig: signal.Signals) -> None:
    """SIGTERM (a service manager, `kill`) and SIGHUP (its terminal closed) end the TUI, and
    the plugin's files go with it (exit handlers alone would not run on a signal)."""
    w = opencode_world
    tui = w.tui(f"sig{int(sig)}").start()
    record = tui.wait_record()
    os.kill(tui.pid or 0, sig)
    wait_for(lambda: not alive(tui.pid or 0), 20, what=f"the TUI gone after {sig.name}")
    assert not Path(record["_path"]).exists()
    assert not os.path.lexists(record["socket"])


def test_a_socket_path_too_long_for_unix_goes_to_the_runtime_dir(
        opencode_world: OpencodeWorld) -> None:
    """A CROSSTALK_HOME so deep that ``<state>/opencode/<key>.sock`` would pass 103 bytes: the
    record stays there, the socket goes to ``$XDG_RUNTIME_DIR/crosstalk-oc/`` (0700), and the
    record says where."""
    w = opencode_world
    w.state = w.root / ("deep-" * 16)
    w.state.mkdir(mode=0o700)
    serve = w.serve("long").start()
    record = serve.wait_record()
    name = key(serve.pid or 0, serve.cwd)
    assert Path(record["_path"]) == w.state / "opencode" / f"{name}.json"
    assert len(str(w.state / "opencode" / f"{name}.sock").encode()) > 103
    assert record["socket"] == str(w.runtime / "crosstalk-oc" / f"{name}.sock")
    assert mode(w.runtime / "crosstalk-oc") == 0o700
    assert mode(record["socket"]) == 0o600
    assert UnixHttp(record["socket"]).get("/global/health")["healthy"] is True
    assert serve.terminate() == -15
    assert not os.path.lexists(record["socket"])
    assert not Path(record["_path"]).exists()


def test_an_opencode_world_shares_a_claude_worlds_state_and_namespace(
        world: World, opencode_with_claude: OpencodeWorld) -> None:
    """The rig for cross-harness scenarios: opencode publishes into the Claude world's
    CROSSTALK_HOME, from inside the same loopback-only namespace."""
    w = opencode_with_claude
    assert (w.state, w.runtime, w.netns) == (world.state, world.runtime, world.netns)
    tui = w.tui("shared").start()
    record = tui.wait_record()
    assert Path(record["_path"]).parent == world.state / "opencode"
    assert os.readlink(f"/proc/{tui.pid}/ns/net") == world.netns.inode
    assert UnixHttp(record["socket"]).get("/global/health")["version"] == VERSION
