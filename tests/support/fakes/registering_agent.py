"""A real registering process for the registry tests (run as a script; the parent side is
:class:`tests.support.agent_proc.AgentProc`).

``python registering_agent.py <state dir> [--barrier-fd N]`` prints ``{"event": "ready", ...}``
and then executes one JSON command per stdin line, answering each with one JSON line on stdout.
It uses only the public registry API, in the order a shim does (seed §3): agent lock, name
lock, credential, descriptor. End of stdin exits *without* cleanup, like a crash; ``exit`` runs
the normal exit path first.

Its ``register`` is not :func:`tests.support.agents.register_agent`: it can sweep between
taking the agent lock and publishing (the window the registry tests widen on purpose) and it
reports the whole name choice, and it runs in a process of its own, which the rig never does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from crosstalk import proc
from crosstalk.core.ids import agent_id_for, new_instance_id
from crosstalk.core.naming import name_candidates
from crosstalk.store.files import FileLock
from crosstalk.store.registry import (
    AgentBusy,
    Descriptor,
    DescriptorLiveness,
    Registration,
    Registry,
    own_process_identity,
)


def main(argv: list[str]) -> int:
    home = Path(argv[0])
    barrier_fd = int(argv[argv.index("--barrier-fd") + 1]) if "--barrier-fd" in argv else None
    registry = Registry(home)
    registration: Registration | None = None
    held: list[FileLock] = []
    me: dict[str, Any] = {}

    def say(**data: Any) -> None:
        sys.stdout.write(json.dumps(data) + "\n")
        sys.stdout.flush()

    def sweep_loop(cmd: dict[str, Any]) -> dict[str, Any]:
        """Sweep repeatedly; with ``until_live``, until that agent is listed live, then more."""
        removed: list[str] = []
        rounds = 0
        extra = int(cmd.get("extra_rounds", 0))
        target = cmd.get("until_live")
        deadline = time.monotonic() + float(cmd.get("timeout", 30))
        seen_live = target is None
        while True:
            removed += registry.sweep_stale()
            rounds += 1
            if not seen_live:
                listed, _ = registry.scan()
                seen_live = any(
                    i.descriptor.agent_id == target and i.liveness is DescriptorLiveness.LIVE
                    for i in listed
                )
            elif extra <= 0:
                break
            else:
                extra -= 1
            if time.monotonic() > deadline:
                return {"removed": removed, "rounds": rounds, "timed_out": True}
        return {"removed": removed, "rounds": rounds, "timed_out": False}

    def register(cmd: dict[str, Any]) -> dict[str, Any]:
        nonlocal registration
        harness, session, cwd = cmd["harness"], cmd["session"], cmd["cwd"]
        agent_id = agent_id_for(harness, session)
        try:
            registration = registry.acquire(agent_id)
        except AgentBusy:
            result: dict[str, Any] = {"ok": False, "error": "AgentBusy", "agent_id": agent_id}
            if cmd.get("sweep_if_busy"):
                result["sweep"] = sweep_loop({**cmd, "until_live": agent_id})
            return result
        removed: list[str] = []
        for _ in range(int(cmd.get("pre_publish_sweeps", 0))):
            removed += registry.sweep_stale()  # widens the window between lock and publish
        choice = registration.take_name(
            name_candidates(harness, cwd, agent_id, cmd.get("name"))
        )
        cred = registration.issue_credential()
        pid, started = own_process_identity()
        instance_id = new_instance_id()
        registration.publish(Descriptor(
            agent_id=agent_id, name=choice.name, harness=harness, session_ref=session,
            cwd=cwd, pid=pid, started_at=started, instance_id=instance_id,
            credential_ref=str(cred), pid_domain=proc.pid_domain(),
        ))
        me.update(harness=harness, session=session, cwd=cwd, session_name=cmd.get("name"))
        assert registration.descriptor is not None
        return {
            "ok": True, "agent_id": agent_id, "name": choice.name,
            "preferred": choice.preferred, "is_fallback": choice.is_fallback,
            "preferred_holder": (
                choice.preferred_holder.agent_id if choice.preferred_holder else None
            ),
            "instance_id": instance_id, "token": registration.token, "pid": pid,
            "descriptor": registration.descriptor.to_json().decode(), "removed": removed,
        }

    def stale_exit(cmd: dict[str, Any]) -> dict[str, Any]:
        """Run the exit path a dead registration would run, with its agent id and instance id.

        With ``forge_lock``, the registration believes it holds the agent lock without holding
        the flock (the situation the instance_id check exists for); otherwise it must really
        take the lock first, as :meth:`Registry.acquire` does.
        """
        agent_id = cmd["agent_id"]
        if cmd.get("forge_lock"):
            lock_path = registry.agent_lock_path(agent_id)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            reg = Registration(registry, agent_id, FileLock(lock_path, fd))
            how = "forged"
        else:
            try:
                reg = registry.acquire(agent_id)
            except AgentBusy:
                return {"ok": False, "error": "AgentBusy", "swept": registry.sweep_stale()}
            how = "acquired"
        reg.descriptor = Descriptor.from_json(cmd["descriptor"].encode())
        reg.token = cmd.get("token")
        reg.close()
        return {"ok": True, "lock": how, "swept": registry.sweep_stale()}

    def rename(cmd: dict[str, Any]) -> dict[str, Any]:
        assert registration is not None
        candidates = cmd.get("candidates") or list(name_candidates(
            me["harness"], me["cwd"], registration.agent_id, me["session_name"]
        ))
        choice = registration.rename(candidates)
        assert registration.descriptor is not None
        return {"name": choice.name, "is_fallback": choice.is_fallback,
                "descriptor_name": registration.descriptor.name}

    def hold_lock(cmd: dict[str, Any]) -> dict[str, Any]:
        lock = FileLock.try_acquire(Path(cmd["path"]))
        if lock is not None:
            held.append(lock)
        return {"held": lock is not None}

    def close(cmd: dict[str, Any]) -> dict[str, Any]:
        if registration is not None:
            registration.close()
        return {"ok": True}

    handlers = {
        "register": register, "rename": rename, "sweep": sweep_loop, "hold_lock": hold_lock,
        "stale_exit": stale_exit, "close": close, "exit": close,
    }
    say(event="ready", pid=os.getpid())
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "barrier":
            assert barrier_fd is not None
            say(op=op, event="waiting")
            while os.read(barrier_fd, 1):
                pass  # EOF once the parent closes the only write end: everyone starts at once
            continue
        say(op=op, **handlers[op](cmd))
        if op == "exit":
            return 0
    return 0  # stdin closed: leave like a crash (the kernel drops the flocks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
