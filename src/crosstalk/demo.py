"""``crosstalk demo``: the durable core at work, in a throw-away state directory.

It uses the real registry (flocks, temp+rename descriptors, 0600 credentials) and the real
journal (fsync per append, torn-tail repair, retention by dependency set). Message delivery
between two sessions joins this demo when the receiver chain lands.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from crosstalk.config import journal_path
from crosstalk.core.ids import agent_id_for, new_instance_id, new_message_id
from crosstalk.core.naming import name_candidates
from crosstalk.store.journal import Journal
from crosstalk.store.registry import Descriptor, Registration, Registry, own_process_identity


def _say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def _register(reg: Registry, harness: str, session: str, name: str, cwd: str) -> Registration:
    agent_id = agent_id_for(harness, session)
    registration = reg.acquire(agent_id)
    choice = registration.take_name(name_candidates(harness, cwd, agent_id, name))
    cred = registration.issue_credential()
    pid, started = own_process_identity()
    registration.publish(Descriptor(
        agent_id=agent_id, name=choice.name, harness=harness, session_ref=session, cwd=cwd,
        pid=pid, started_at=started, instance_id=new_instance_id(), credential_ref=str(cred),
    ))
    note = f" ('{choice.preferred}' is held, so the fallback name)" if choice.is_fallback else ""
    _say("register", f"{harness} session {session} -> agent {agent_id} named '{choice.name}'{note}")
    return registration


def run_demo(*, keep: bool = False) -> int:
    home = Path(tempfile.mkdtemp(prefix="crosstalk-demo-"))
    try:
        reg = Registry(home)
        _say("state", f"state directory {home} (mode {oct(home.stat().st_mode & 0o777)})")
        cwd = os.getcwd()
        a = _register(reg, "claude", "3f1c-demo-session-a", "reviewer", cwd)
        b = _register(reg, "codex", "019a-demo-thread-b", "builder", cwd)
        c = _register(reg, "codex", "019a-demo-thread-c", "reviewer", cwd)
        for d in reg.live():
            _say("list", f"{d.name:<28} {d.harness:<7} {d.agent_id}  (token stays in "
                 f"{Path(d.credential_ref).name}, mode 0600)")

        jpath = journal_path(reg.home, b.agent_id)
        jpath.parent.mkdir(mode=0o700, exist_ok=True)
        clock = [1_000_000.0]
        journal = Journal(jpath, clock=lambda: clock[0])
        inform, ask = new_message_id(), new_message_id()
        for state in ("submitted", "dispatching", "accepted"):
            journal.append({"subject": "message", "id": inform, "state": state})
        journal.append({"subject": "message", "id": ask, "state": "submitted", "kind": "ask",
                        "text": "which test is flaky?"})
        journal.append({"subject": "ask", "id": ask, "state": "open"})
        _say("journal", f"5 records appended, each fsynced before append() returned "
             f"(last seq {journal.last_seq})")

        with open(journal.path, "ab") as f:  # what a crash mid-write leaves behind
            f.write(b'{"c":"00000000","r":{"subject":"mess')
        replay = Journal(journal.path).replay()
        _say("crash", f"a torn half-line was appended; replay kept {len(replay.records)} records "
             f"and discarded {[d.reason for d in replay.damage]}")

        clock[0] += 25 * 3600
        result = journal.apply_retention()
        _say("retain", f"25 h later: {result.dropped} resolved records dropped, {result.kept} kept "
             "(the open ask keeps its whole dependency set)")
        journal.close()

        for r in (a, b, c):
            r.close()
        _say("exit", f"registrations closed; live descriptors left: {len(reg.live())}")
        print("\nNext: two embedded sessions exchanging send / ask / reply through the receiver,"
              " uds and A2A (coming with the receiver chain).")
        return 0
    finally:
        if keep:
            print(f"state kept in {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
