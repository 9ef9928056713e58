"""Real Claude Code sessions, driven in tmux against our mock API, with nothing but loopback.

Three layers, each owning what it starts and stopping it in reverse order:

* :class:`Netns` — a network namespace holder (``unshare -n sh -c 'ip link set lo up; exec
  sleep infinity'``). Everything that speaks TCP — the mock API, every Claude process and so
  every ``crosstalk mcp`` shim and its A2A listener — is started in it with ``nsenter -t <pid>
  -n``. It has only ``lo``: nothing can leave the machine. Unix sockets and files are shared
  with the test process (only the network namespace differs), which is how the tests steer
  the mock, read its log, run ``crosstalk send`` and read every registry.
* :class:`World` — what the sessions of one test share, as on a real user's machine: HOME,
  CLAUDE_CONFIG_DIR (one config dir: sessions see each other's records), CROSSTALK_HOME,
  XDG_RUNTIME_DIR (Claude's ``cc-socks`` and the shims' uds ingresses), and one mock API
  (requests told apart by their ``X-Claude-Code-Session-Id`` header).
* :class:`LiveClaude` — one interactive ``claude`` in its own tmux server, with CrossTalk as
  its MCP server ``crosstalk`` (``<this python> -m crosstalk mcp``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.live.support.mock_api import MockControl, last_user, message_text, read_log

HERE = Path(__file__).resolve().parent
MOCK_SCRIPT = HERE / "mock_api.py"
#: A dummy key: its last 20 characters are pre-approved in ``.claude.json``.
API_KEY = "sk-ant-api03-crosstalk-live-dummy-000000000000"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Each tool of the ``crosstalk`` MCP server runs without a permission prompt.
ALLOW_RULES = ["mcp__crosstalk", "mcp__crosstalk__*"]

#: The input prompt glyph of the TUI.
PROMPT = "\u276f"
#: Start-up dialogs the pre-seeded config is meant to avoid; seeing one is a rig failure.
STARTUP_DIALOGS = ("trust this folder", "Detected a custom API key", "Make auto mode",
                   "Bypass Permissions mode", "Choose the text style", "Select login method")

Entry = dict[str, Any]


class LiveError(RuntimeError):
    """The live rig could not be set up (no namespace, no binary, Claude did not start)."""


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the test process dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def wait_for(check: Callable[[], Any], timeout: float, step: float = 0.1,
             what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; :class:`TimeoutError` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(step)


#: A process the teardown has just stopped (a tmux server after ``kill-server``, the mock) may
#: still be exiting, with no command line left, when the leak check looks: it gets this long.
EXIT_SETTLE = 2.0


def settle_members(netns: Netns) -> None:
    """Wait (briefly) for processes already exiting to leave the namespace."""
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not netns.members(), EXIT_SETTLE, step=0.05, what="namespace empty")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 1:].split()[0] != b"Z"


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (by scanning /proc for parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_bytes()
        except OSError:
            continue
        ppid = int(raw[raw.rfind(b")") + 1:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def kill_all(pids: list[int], grace: float = 3.0) -> list[int]:
    """SIGTERM, wait, SIGKILL; returns the pids that were still running when asked to stop."""
    running = [p for p in pids if alive(p)]
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in running:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return running


# -- the network namespace ------------------------------------------------------------------


class Netns:
    """A network namespace with only ``lo`` (up), kept alive by a sleeping holder process."""

    def __init__(self) -> None:
        tools = {t: shutil.which(t) for t in ("unshare", "nsenter", "ip", "tmux")}
        missing = [t for t, path in tools.items() if path is None]
        if missing:
            raise LiveError(f"the live suite needs {', '.join(missing)} on PATH "
                            "(Debian packages util-linux, iproute2, tmux)")
        unshare, ip = str(tools["unshare"]), str(tools["ip"])
        self.holder = subprocess.Popen(
            [unshare, "-n", "sh", "-c",
             f"{ip} link set lo up && echo ready && exec sleep infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent)
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline().decode().strip()
        if line != "ready":
            self.holder.kill()
            _, err = self.holder.communicate(timeout=5)
            raise LiveError("cannot create a loopback-only network namespace with `unshare -n` "
                            f"(needs root or unprivileged user namespaces): "
                            f"{err.decode(errors='replace').strip() or 'holder exited'}")
        self.pid = self.holder.pid
        self._check_only_loopback()

    def argv(self, *cmd: str) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-n", "--", *cmd]

    def run(self, *cmd: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*cmd), capture_output=True, text=True, timeout=timeout,
                              check=False)

    def _check_only_loopback(self) -> None:
        links = self.run("ip", "-o", "link", "show")
        names = [line.split(":")[1].strip().split("@")[0]
                 for line in links.stdout.splitlines() if line.strip()]
        addrs = self.run("ip", "-o", "addr", "show")
        if links.returncode != 0 or names != ["lo"] or "UP" not in links.stdout:
            self.close()
            raise LiveError(f"the namespace is not loopback-only: {links.stdout!r}")
        for line in addrs.stdout.splitlines():
            fields = line.split()
            if fields[1] != "lo":
                self.close()
                raise LiveError(f"unexpected address in the namespace: {line!r}")

    @property
    def inode(self) -> str:
        return os.readlink(f"/proc/{self.pid}/ns/net")

    def members(self) -> list[int]:
        """Every process in this namespace except the holder (for leak checks)."""
        inode, out = self.inode, []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != self.pid:
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "ns" / "net") == inode and alive(int(entry.name)):
                        out.append(int(entry.name))
        return out

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.holder.wait(timeout=5)
        for stream in (self.holder.stdout, self.holder.stderr):
            if stream is not None:
                stream.close()


# -- the mock API ---------------------------------------------------------------------------


class Mock:
    """Our mock Messages API, running inside the namespace; steered over its control socket.
    (The Codex rig's mock Responses API is the same process shape with another script.)"""

    script: Path = MOCK_SCRIPT
    stem = "mock"
    label = "mock API"

    def __init__(self, netns: Netns, root: Path) -> None:
        self.log_path = root / f"{self.stem}.jsonl"
        self.control_path = root / f"{self.stem}.sock"
        self.stderr_path = root / f"{self.stem}.err"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                netns.argv(sys.executable, str(self.script), "--log", str(self.log_path),
                           "--control", str(self.control_path)),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                preexec_fn=_die_with_parent)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().split()
        if len(line) != 2 or line[0] != "PORT":
            self.close()
            raise LiveError(f"{self.label} did not start: "
                            f"{self.stderr_path.read_text()[-2000:]}")
        self.port = int(line[1])
        self.control = MockControl(str(self.control_path))
        wait_for(self.control.ping, 10, what="mock control socket")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def entries(self) -> list[Entry]:
        return read_log(str(self.log_path))

    def add_rules(self, *rules: dict[str, Any]) -> None:
        self.control.add_rules(*rules)

    def open_gate(self, name: str) -> None:
        """Let the requests held at gate ``name`` (a rule's ``"gate"``) be answered."""
        self.control.open_gate(name)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- helpers on logged requests ------------------------------------------------------------


def is_main(entry: Entry) -> bool:
    """A main-loop request: POST /v1/messages carrying tools (title and side requests carry
    none)."""
    body = entry.get("body")
    return (entry.get("method") == "POST" and entry.get("path", "").split("?")[0]
            .endswith("/v1/messages") and isinstance(body, dict) and bool(body.get("tools")))


def last_user_text(entry: Entry) -> str:
    """All text of the request's last user message (its blocks joined by newlines)."""
    body = entry.get("body")
    return message_text(last_user(body)) if isinstance(body, dict) else ""


def request_text(entry: Entry) -> str:
    """All text of every message of the request (user, assistant and ``role:"system"`` turns:
    a peer message that arrives mid-turn is a system turn, not the last user message)."""
    body = entry.get("body")
    messages = body.get("messages") if isinstance(body, dict) else None
    return "\n".join(message_text(m) for m in messages or [])


def user_text_blocks(entry: Entry) -> list[str]:
    """The text blocks of the request's last user message, one string each (Claude puts
    ``<system-reminder>`` blocks before the turn's own text)."""
    body = entry.get("body")
    content = last_user(body).get("content") if isinstance(body, dict) else None
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]


def tool_results(entry: Entry) -> list[dict[str, Any]]:
    """The tool_result blocks of the request's last user message."""
    body = entry.get("body")
    content = last_user(body).get("content") if isinstance(body, dict) else None
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


# -- one test's world ----------------------------------------------------------------------


class World:
    """The shared setting of the sessions of one test (see the module docstring)."""

    def __init__(self, netns: Netns, binary: Path, *, python: str = sys.executable) -> None:
        self.netns = netns
        self.binary = binary
        self.python = python
        # Short: sun_path is 108 bytes and Claude refuses socket paths over 103.
        self.root = Path(tempfile.mkdtemp(prefix="ctl-", dir="/tmp"))
        self.home = self.root / "home"
        self.config_dir = self.root / "claude"
        self.state = self.root / "state"
        self.runtime = self.root / "run"
        for d in (self.home, self.config_dir, self.state, self.runtime):
            d.mkdir(mode=0o700)
        self.sessions: list[LiveClaude] = []
        self.leftovers: list[str] = []
        self._seed_settings()
        try:
            self.mock = Mock(netns, self.root)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _seed_settings(self) -> None:
        """``.claude.json``: onboarding done, the dummy key approved, and the world's root
        trusted (trust covers every directory below it, so each session's cwd is trusted
        without a later write racing Claude's own rewrites of this file). ``settings.json``:
        CrossTalk's tools allowed without a prompt (and bypass mode's warning accepted, for a
        session started with ``permission_mode="bypassPermissions"``)."""
        (self.config_dir / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "theme": "dark", "numStartups": 5,
            "bypassPermissionsModeAccepted": True, "autoUpdates": False,
            "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []},
            "projects": {str(self.root): {"hasTrustDialogAccepted": True,
                                          "hasCompletedProjectOnboarding": True,
                                          "projectOnboardingSeenCount": 1,
                                          "allowedTools": []}},
        }, indent=1))
        (self.config_dir / "settings.json").write_text(json.dumps({
            "permissions": {"allow": ALLOW_RULES},
            "skipDangerousModePermissionPrompt": True,
        }, indent=1))

    @property
    def env(self) -> dict[str, str]:
        """The environment of a CrossTalk command run by the test (``crosstalk send``)."""
        inherited = {k: v for k, v in os.environ.items()
                     if not (k.startswith(("CLAUDE_CODE_", "CROSSTALK_"))
                             or k in ("CLAUDECODE", "CLAUDE_PROJECT_DIR", "CLAUDE_CONFIG_DIR"))}
        return {**inherited, "HOME": str(self.home), "CLAUDE_CONFIG_DIR": str(self.config_dir),
                "CROSSTALK_HOME": str(self.state), "XDG_RUNTIME_DIR": str(self.runtime)}

    def session(self, name: str, **kwargs: Any) -> LiveClaude:
        claude = LiveClaude(self, name, **kwargs)
        self.sessions.append(claude)
        return claude

    def descriptors(self) -> list[dict[str, Any]]:
        """Every readable CrossTalk descriptor in ``<CROSSTALK_HOME>/agents``."""
        out = []
        for path in sorted((self.state / "agents").glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                if isinstance(data, dict):
                    out.append(data)
        return out

    def journal(self, agent_id: str) -> list[dict[str, Any]]:
        """The records of ``<CROSSTALK_HOME>/journal/<agent_id>.jsonl`` (read without locking,
        a torn tail skipped), oldest first."""
        from crosstalk.store.journal_read import read_journal  # the package under test

        return list(read_journal(self.state / "journal" / f"{agent_id}.jsonl").records)

    def journal_summary(self, limit: int = 40) -> str:
        """One line per journal record of every agent (for failure diagnostics)."""
        lines: list[str] = []
        for path in sorted((self.state / "journal").glob("*.jsonl")):
            records = self.journal(path.stem)
            lines.append(f"journal {path.stem}: {len(records)} records")
            for rec in records[-limit:]:
                text = str(rec.get("text") or "").replace("\n", "\\n")
                lines.append(f"  {rec.get('seq')} {rec.get('subject')} {rec.get('id')} "
                             f"{rec.get('state')} {rec.get('reason') or ''} {text[:80]}")
        return "\n".join(lines)

    def crosstalk(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the ``crosstalk`` CLI of this venv, outside the namespace, as a user would."""
        script = Path(self.python).parent / "crosstalk"
        argv = [str(script)] if script.exists() else [self.python, "-m", "crosstalk"]
        return subprocess.run([*argv, *args], capture_output=True,
                              text=True, timeout=timeout, env=self.env, cwd=self.root,
                              check=False)

    def close(self) -> None:
        """Stop every session and the mock; then anything still in the namespace is a leak
        (killed, and noted in :attr:`leftovers`)."""
        for claude in reversed(self.sessions):
            try:
                self.leftovers.extend(claude.stop())
            except Exception as exc:  # keep tearing down the rest
                self.leftovers.append(f"{claude.name}: stop failed: {exc!r}")
        self.mock.close()
        settle_members(self.netns)
        for pid in kill_all(self.netns.members()):
            self.leftovers.append(f"process {pid} ({' '.join(cmdline(pid)) or '?'}) was still in "
                                  "the namespace after teardown; killed")
        shutil.rmtree(self.root, ignore_errors=True)

    def diagnostics(self) -> str:
        parts = [f"world {self.root}"]
        for claude in self.sessions:
            parts.append(claude.diagnostics())
        with contextlib.suppress(OSError):
            parts.append("mock stderr:\n" + self.mock.stderr_path.read_text()[-2000:])
        with contextlib.suppress(Exception):
            parts.append(self.journal_summary())
        return "\n".join(parts)


# -- one Claude session ----------------------------------------------------------------------


class LiveClaude:
    """One interactive Claude Code session in its own tmux server, inside the namespace."""

    def __init__(self, world: World, name: str, *, crosstalk: bool = True,
                 permission_mode: str = "manual", extra_args: tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None) -> None:
        self.world = world
        self.name = name
        self.crosstalk = crosstalk
        self.permission_mode = permission_mode
        self.extra_args = extra_args
        #: More of Claude's environment (inherited by the MCP servers it starts).
        self.extra_env = dict(extra_env or {})
        self.dir = world.root / f"s-{name}"
        self.cwd = self.dir / name  # Claude derives a first name from the cwd's basename
        self.cwd.mkdir(parents=True)
        self.tmux_socket = self.dir / "tmux.sock"
        self.debug_log = self.dir / "claude-debug.log"
        self.mcp_config = self.dir / "mcp.json"
        self.pid: int | None = None
        self._children: set[int] = set()
        self._session_ids: set[str] = set()
        self.stopped = False

    # -- start ----------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        w = self.world
        return {"PATH": SYSTEM_PATH, "HOME": str(w.home), "TERM": "xterm-256color",
                "LANG": "C.UTF-8", "CLAUDE_CONFIG_DIR": str(w.config_dir),
                "XDG_RUNTIME_DIR": str(w.runtime), "ANTHROPIC_BASE_URL": w.mock.base_url,
                "ANTHROPIC_API_KEY": API_KEY, "DISABLE_AUTOUPDATER": "1",
                **({"IS_SANDBOX": "1"} if self.permission_mode == "bypassPermissions" else {}),
                **self.extra_env}

    def _argv(self) -> list[str]:
        argv = [str(self.world.binary), "--name", self.name,
                "--permission-mode", self.permission_mode,
                "--debug-file", str(self.debug_log)]
        if self.crosstalk:
            w = self.world
            self.mcp_config.write_text(json.dumps({"mcpServers": {"crosstalk": {
                "type": "stdio", "command": w.python, "args": ["-m", "crosstalk", "mcp"],
                "env": {"CROSSTALK_HOME": str(w.state), "XDG_RUNTIME_DIR": str(w.runtime),
                        "CROSSTALK_LOG": "INFO"}}}}, indent=1))
            argv += ["--mcp-config", str(self.mcp_config)]
        return argv + list(self.extra_args)

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A tmux client command (runs outside the namespace; the server is inside)."""
        done = subprocess.run(["tmux", "-S", str(self.tmux_socket), *args], capture_output=True,
                              text=True, timeout=15, check=False)
        if check and done.returncode != 0:
            raise LiveError(f"tmux {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def start(self, timeout: float = 45.0) -> LiveClaude:
        """Start Claude and wait until its registry record exists and its prompt is drawn."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self._env().items())
        command = f"exec env -i {env} {shlex.join(self._argv())}"
        done = subprocess.run(
            self.world.netns.argv("tmux", "-S", str(self.tmux_socket), "new-session", "-d",
                                  "-s", "cc", "-x", "200", "-y", "50", "-c", str(self.cwd),
                                  command,
                                  # keep the pane (and its last screen) if claude dies early
                                  ";", "set-option", "-t", "cc", "remain-on-exit", "on"),
            capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise LiveError(f"tmux new-session failed: {done.stderr.strip()}")
        pane = self.tmux("display-message", "-p", "-t", "cc", "#{pane_pid}").stdout.strip()
        self.pid = int(pane)
        binary = self.world.binary.resolve()

        def exe() -> str:  # the pane runs sh, which execs env, which execs claude
            with contextlib.suppress(OSError):
                return os.readlink(f"/proc/{self.pid}/exe")
            return ""
        try:
            wait_for(lambda: Path(exe()) == binary, 10, step=0.02, what="claude exec")
        except TimeoutError:
            raise LiveError(f"tmux pane process {self.pid} is {exe()!r}, not claude\n"
                            + self.diagnostics()) from None
        try:
            wait_for(self._ready, timeout, what="claude session record and prompt")
        except TimeoutError as exc:
            raise LiveError(f"{exc}\n{self.diagnostics()}") from None
        return self

    def _ready(self) -> bool:
        screen = self.screen()
        for dialog in STARTUP_DIALOGS:
            if dialog in screen:
                raise LiveError(f"{self.name}: Claude shows a start-up dialog ({dialog!r}); the "
                                f"pre-seeded config no longer covers it\n{self.diagnostics()}")
        if not alive(self.pid or 0):
            raise LiveError(f"{self.name}: claude exited during start-up\n{self.diagnostics()}")
        # The record is written only once start-up dialogs are through; then the prompt box.
        return self.record() is not None and PROMPT in screen

    # -- what the session shows ----------------------------------------------------------

    @property
    def record_path(self) -> Path:
        return self.world.config_dir / "sessions" / f"{self.pid}.json"

    def record(self) -> dict[str, Any] | None:
        """Claude's registry record ``<config>/sessions/<pid>.json`` (None if absent or torn)."""
        try:
            data = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("sessionId") else None

    @property
    def session_id(self) -> str:
        record = self.record()
        if record is None:
            raise LiveError(f"session {self.name}: no registry record")
        return str(record["sessionId"])

    def descriptor(self) -> dict[str, Any] | None:
        """This session's CrossTalk descriptor (``harness: claude``, ``session_ref`` = the
        record's current ``sessionId``)."""
        record = self.record()
        if record is None:
            return None
        for desc in self.world.descriptors():
            if desc.get("harness") == "claude" and desc.get("session_ref") == record["sessionId"]:
                return desc
        return None

    def wait_descriptor(self, timeout: float = 20.0) -> dict[str, Any]:
        result: dict[str, Any] = wait_for(self.descriptor, timeout,
                                          what=f"CrossTalk descriptor of {self.name}")
        return result

    def wait_named(self, timeout: float = 15.0) -> dict[str, Any]:
        """The descriptor once it carries the session's ``--name``: Claude records a name
        derived from the cwd first and the given one ~0.2 s later; the shim follows."""
        def named() -> dict[str, Any] | None:
            desc = self.descriptor()
            return desc if desc is not None and desc.get("name") == self.name else None
        try:
            result: dict[str, Any] = wait_for(named, timeout,
                                              what=f"descriptor named {self.name!r}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; descriptor: {self.descriptor()}\n"
                                 f"{self.diagnostics()}") from None
        return result

    def screen(self) -> str:
        done = self.tmux("capture-pane", "-p", "-t", "cc", check=False)
        return done.stdout if done.returncode == 0 else ""

    def status(self) -> str | None:
        record = self.record()
        return str(record.get("status")) if record else None

    def wait_mcp_connected(self, timeout: float = 30.0) -> None:
        """Until Claude's debug log says the ``crosstalk`` MCP server is connected (its tools
        can be called)."""
        needle = 'MCP server "crosstalk": Successfully connected'

        def connected() -> bool:
            try:
                return needle in self.debug_log.read_text(errors="replace")
            except OSError:
                return False
        try:
            wait_for(connected, timeout, what=f"{self.name}: crosstalk MCP server connected")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    def wait_idle(self, timeout: float = 30.0) -> None:
        wait_for(lambda: self.status() == "idle", timeout, what=f"{self.name} idle")

    def shim_pids(self) -> list[int]:
        """Live ``crosstalk mcp`` processes started by this Claude."""
        if self.pid is None:
            return []
        pids = [p for p in descendants(self.pid)
                if cmdline(p)[-3:] == ["-m", "crosstalk", "mcp"]]
        self._children.update(pids)
        return pids

    # -- driving it ----------------------------------------------------------------------

    def send_keys(self, text: str, *, enter: bool = True) -> None:
        """Type ``text`` into the prompt (literally), then press Enter."""
        self.tmux("send-keys", "-t", "cc", "-l", text)
        if enter:
            time.sleep(0.5)  # let the TUI take the text as typed, not as part of a paste
            self.tmux("send-keys", "-t", "cc", "Enter")

    def requests(self) -> list[Entry]:
        """The mock's log entries for this session (by ``X-Claude-Code-Session-Id``)."""
        record = self.record()
        if record:  # every session id it ever had (``/clear`` starts a new one)
            self._session_ids.add(str(record["sessionId"]))
        return [e for e in self.world.mock.entries() if e.get("session") in self._session_ids]

    def main_requests(self) -> list[Entry]:
        return [e for e in self.requests() if is_main(e)]

    def wait_for_request(self, predicate: Callable[[Entry], bool], timeout: float = 30.0,
                         *, after: int = 0) -> Entry:
        """The first of this session's logged requests with ``seq > after`` matching
        ``predicate``."""
        def find() -> Entry | None:
            return next((e for e in self.requests()
                         if e.get("seq", 0) > after and predicate(e)), None)
        try:
            found: Entry = wait_for(find, timeout, step=0.1,
                                    what=f"a matching request from {self.name}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None
        return found

    def last_seq(self) -> int:
        entries = self.world.mock.entries()
        return int(entries[-1]["seq"]) if entries else 0

    # -- stop -----------------------------------------------------------------------------

    def stop(self, timeout: float = 15.0) -> list[str]:
        """``/exit``, then kill whatever is left. Returns notes on processes that had to be
        killed (a shim outliving its Claude is a bug worth reporting)."""
        if self.stopped:
            return []
        self.stopped = True
        notes: list[str] = []
        if self.pid is not None:
            self._children.update(descendants(self.pid))
            self.shim_pids()
            if alive(self.pid):
                with contextlib.suppress(LiveError, subprocess.TimeoutExpired):
                    self.tmux("send-keys", "-t", "cc", "Escape", check=False)
                    self.tmux("send-keys", "-t", "cc", "-l", "/exit", check=False)
                    time.sleep(0.5)
                    self.tmux("send-keys", "-t", "cc", "Enter", check=False)
                with contextlib.suppress(TimeoutError):
                    wait_for(lambda: not alive(self.pid or 0), timeout, what="claude exit")
            if alive(self.pid):
                notes.append(f"{self.name}: claude {self.pid} ignored /exit; killed")
                kill_all([self.pid])
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not any(alive(p) for p in self._children), 5.0, what="children")
        for pid in kill_all(sorted(self._children)):
            notes.append(f"{self.name}: child {pid} {' '.join(cmdline(pid)) or '?'} outlived "
                         "claude by 5 s; killed")
        with contextlib.suppress(LiveError, subprocess.TimeoutExpired):
            self.tmux("kill-server", check=False)
        return notes

    # -- diagnostics ----------------------------------------------------------------------

    def diagnostics(self) -> str:
        lines = [f"--- session {self.name} pid={self.pid} record={self.record()}"]
        with contextlib.suppress(Exception):
            lines.append("screen:\n" + self.screen())
        with contextlib.suppress(OSError):
            log = self.debug_log.read_text(errors="replace").splitlines()
            mcp = [line for line in log if 'MCP server "crosstalk"' in line
                   or "uds-messaging" in line]
            lines.append("debug log, crosstalk MCP server and inbox lines:\n"
                         + "\n".join(line[:400] for line in mcp[-40:]))
            lines.append("debug log tail:\n" + "\n".join(line[:400] for line in log[-40:]))
        return "\n".join(lines)

