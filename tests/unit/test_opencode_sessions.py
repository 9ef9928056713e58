"""Pure parts of the opencode harness: names, the live set's bookkeeping, discovery rows and
the SSE line reader."""

from __future__ import annotations

from crosstalk.harness.opencode.discovery import session_rows
from crosstalk.harness.opencode.http import _data
from crosstalk.harness.opencode.records import InstanceRecord
from crosstalk.harness.opencode.sessions import LiveSet, session_name

RECORD = InstanceRecord(pid=7, process_start="1", directory="/p", socket="/s.sock",
                        opencode_version="1.18.33", written_at=100.0, path="/r/7-x.json")


def _info(sid: str, **kw: object) -> dict[str, object]:
    return {"id": sid, "slug": "brave-otter", "title": "fix the build", "directory": "/p",
            "time": {"created": 100_500, "updated": 100_500}, **kw}


def test_a_placeholder_title_gives_way_to_the_slug() -> None:
    assert session_name(_info("ses_a")) == "fix the build"
    assert session_name(_info("ses_a", title="New session - 2026-12-02T06:00:00.000Z")) == (
        "brave-otter")
    assert session_name(_info("ses_a", title="Child session - 2026-12-02T06:00:00.000Z",
                              slug=None)) is None
    assert session_name(_info("ses_a", title="   ")) == "brave-otter"


def test_the_live_set_keeps_roots_and_maps_children_to_them() -> None:
    live = LiveSet()
    assert live.learn(_info("ses_root"))
    assert not live.learn(_info("ses_root"))  # nothing changed
    assert not live.learn(_info("ses_kid", parentID="ses_root"))
    assert live.root_of("ses_kid") == "ses_root"
    assert live.learn(_info("ses_root", title="renamed"))
    assert live.live == {"ses_root": "renamed"}
    assert not live.learn({"id": "not-a-session"})
    live.children.update({"ses_x": "ses_y", "ses_y": "ses_x"})  # forged: a cycle
    assert live.root_of("ses_x") in {"ses_x", "ses_y"}
    assert live.forget("ses_root")
    assert live.live == {}


def test_a_session_of_another_directory_of_the_project_is_not_this_instances() -> None:
    # opencode lists and reports sessions per project; every directory of one repository
    # is one project. Another directory's session is hosted by another process.
    live = LiveSet(directory="/p")
    assert not live.learn(_info("ses_other", directory="/p-worktree"))
    assert live.learn(_info("ses_here"))
    assert live.live == {"ses_here": "fix the build"}
    rows = session_rows(RECORD, [_info("ses_here"), _info("ses_other", directory="/p2")],
                        {"ses_other": {"type": "busy"}}, [])
    assert [r.session_ref for r in rows] == ["ses_here"]


def test_discovery_rows_show_only_sessions_this_process_ran() -> None:
    sessions = [_info("ses_idle"), _info("ses_busy"), _info("ses_wait"),
                _info("ses_old", time={"created": 1, "updated": 1}),
                _info("ses_oldbusy", time={"created": 1, "updated": 1}),
                _info("ses_kid", parentID="ses_busy"), {"id": 3}, "junk"]
    status = {"ses_busy": {"type": "busy"}, "ses_oldbusy": {"type": "retry"},
              "ses_wait": {"type": "busy"}}
    permissions = [{"id": "per_1", "sessionID": "ses_wait", "permission": "edit"}, 5]
    rows = {r.session_ref: r for r in session_rows(RECORD, sessions, status, permissions)}
    assert set(rows) == {"ses_idle", "ses_busy", "ses_wait", "ses_oldbusy"}
    assert rows["ses_idle"].status == "idle"
    assert rows["ses_busy"].status == "busy"
    assert rows["ses_oldbusy"].status == "busy"
    assert rows["ses_wait"].status == "waiting"
    assert rows["ses_wait"].detail == "edit"
    assert rows["ses_idle"].locator == RECORD.path
    assert session_rows(RECORD, {"not": "a list"}, None, None) == []


def test_the_sse_reader_takes_only_event_objects() -> None:
    assert _data('data: {"type": "server.connected", "properties": {}}') == {
        "type": "server.connected", "properties": {}}
    assert _data("data: [1]") is None
    assert _data("data: {torn") is None
    assert _data('data: {"type": 5}') is None
    assert _data(": heartbeat comment") is None
    assert _data("event: message") is None


def test_a_session_stored_in_the_records_millisecond_counts_as_after_it() -> None:
    # The plugin writes ``written_at`` with sub-millisecond precision; opencode stamps
    # sessions with ``Date.now()``, whole milliseconds. A session created in the same
    # millisecond as the record (CI saw it) was read as stored before and left out.
    record = InstanceRecord(pid=7, process_start="1", directory="/p", socket="/s.sock",
                            opencode_version="1.18.33", written_at=100.0004,
                            path="/r/7-x.json")
    assert record.written_ms == 100_000
    same_ms = _info("ses_same", time={"created": 100_000, "updated": 100_000})
    before = _info("ses_before", time={"created": 99_999, "updated": 99_999})
    rows = session_rows(record, [same_ms, before], {}, [])
    assert [r.session_ref for r in rows] == ["ses_same"]
