"""The ``crosstalk`` command line: the parser, and one module per subcommand beside it.

Each subcommand's module is imported only when that subcommand runs (``crosstalk mcp``
start-up is measured; a bare ``crosstalk mcp``, the harness's start, skips the parser and
argparse altogether, ADR 0034). Subcommands that belong to capabilities not built yet say so
and exit 2, so a script can tell "not available" from success; ``demo`` already shows the
durable core that is built.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from crosstalk._version import __version__
from crosstalk.config import DELIVERY_TIMEOUT

if TYPE_CHECKING:
    import argparse

EXIT_USAGE = 2

#: subcommand -> (one-line help, what it will do once built)
_PLANNED: dict[str, tuple[str, str]] = {}


def build_parser() -> argparse.ArgumentParser:
    import argparse  # not for a bare ``crosstalk mcp`` (see :func:`main`)

    parser = argparse.ArgumentParser(
        prog="crosstalk",
        description="Message any AI coding-agent session on this machine by name.",
    )
    parser.add_argument("--version", action="version", version=f"crosstalk {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("mcp", help="run the shim: the stdio MCP server a harness starts")
    demo = sub.add_parser("demo", help="show CrossTalk working with no harness installed")
    demo.add_argument("--keep", action="store_true", help="keep the demo's state directory")
    send = sub.add_parser(
        "send", help="send a message to an agent by name or agent_id",
        description="Deliver one inform through the agent's uds ingress, as an unverified "
        "sender. Exit 0 accepted or queued, 1 another state, 3 no such agent or ambiguous, "
        "4 transport failure.")
    send.add_argument("words", nargs="+", metavar="[TO] TEXT",
                      help="the target (agent name, agent_id, claude:<pid|session-id|name>, "
                      "codex:<thread-id|name> or uds:<path>), then the message (- reads it "
                      "from stdin); with --to, just the message")
    send.add_argument("--to", action="append", metavar="TARGET",
                      help="broadcast: each target gets its own message (repeatable; needs "
                      "--confirm-count). Exit 5 when only some were delivered.")
    send.add_argument("--confirm-count", type=int, metavar="N",
                      help="how many agents the --to targets must name, or nothing is sent")
    send.add_argument("--json", action="store_true", help="print the whole ack as JSON")
    send.add_argument("--timeout", type=float, default=DELIVERY_TIMEOUT, metavar="SECONDS",
                      help=f"how long to wait for the ack (default {DELIVERY_TIMEOUT:.0f})")
    for verb, text in (("install", "register crosstalk mcp with Claude Code and Codex, and "
                                  "the skill"),
                       ("uninstall", "undo install exactly")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("--dry-run", action="store_true",
                       help="show what would change (a diff), change nothing")
    doctor = sub.add_parser(
        "doctor", help="diagnose the installation",
        description="What is installed where, which harness servers run, and what is wrong, "
        "each problem with the command that fixes it. Exit 1 if there is a problem.")
    doctor.add_argument("--fix", action="store_true",
                        help="apply CrossTalk's own fixes (stale descriptors, permissions)")
    agents = sub.add_parser(
        "agents", help="list every session on this machine",
        description="Every CrossTalk agent, Claude Code session and Codex thread on this "
        "machine: harness, status, whether CrossTalk serves it, whether it can be reached and "
        "why not.")
    agents.add_argument("--json", action="store_true", help="print the rows as JSON")
    tail = sub.add_parser("tail", help="print an agent's journal (every journal if none named)")
    tail.add_argument("agent", nargs="?", help="agent name or agent_id")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new records")
    tail.add_argument("--json", action="store_true", help="print records as JSON lines")
    watch = sub.add_parser(
        "watch", help="see every session and every message move, live (read-only)",
        description="Every session on this machine and every message across all agents, "
        "each state change as it happens. Full-screen on a terminal; --plain or --json (or "
        "a pipe) print one line per change. Changes nothing; Ctrl-C ends it (exit 0).")
    watch.add_argument("--plain", action="store_true", help="one readable line per change")
    watch.add_argument("--json", action="store_true", help="one JSON object per change")
    watch.add_argument("--agent", metavar="A", help="only this agent (name or agent_id)")
    watch.add_argument("--harness", metavar="H", help="only sessions/messages of harness H")
    watch.add_argument("--state", metavar="S", help="only messages in state S")
    capture = sub.add_parser(
        "capture", help="stream a running agent's raw wire, redacted, as JSON lines",
        description="Attach to a running agent without restarting it and print every frame "
        "its ingresses receive and its injector sends (uds, A2A, Claude inbox and receipts, "
        "Codex JSON-RPC), one JSON line each, every token and key redacted, until Ctrl-C. "
        "Exit 0 when interrupted, 1 refused, 3 no such agent, 4 transport failure. "
        "See docs/capture.md.")
    capture.add_argument("agent", help="the agent, named as crosstalk send names it")
    for name, (help_text, _) in _PLANNED.items():
        p = sub.add_parser(name, help=f"{help_text} (not built yet)")
        p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


# Each command imports what it needs only when it runs: `crosstalk mcp` start-up is measured.


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.demo import run_demo

    return run_demo(keep=args.keep)


def _mcp(args: argparse.Namespace | None, parser: argparse.ArgumentParser | None) -> int:
    ppid = os.getppid()  # before the heavy imports: the parent may die meanwhile
    from crosstalk.shim.serve import run_mcp

    return run_mcp(ppid)


def _install(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.install import run_install
    from crosstalk.config import state_dir

    return run_install(state_dir(), uninstall=args.command == "uninstall",
                       dry_run=args.dry_run)


def _doctor(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.doctor import run_doctor
    from crosstalk.config import state_dir

    return run_doctor(state_dir(), fix=args.fix)


def _agents(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.agents import run_agents
    from crosstalk.config import state_dir

    return run_agents(state_dir(), as_json=args.json)


def _send(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.send import run_broadcast, run_send
    from crosstalk.config import state_dir

    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.to:
        if len(args.words) != 1:
            parser.error("with --to, give just the message")
        if args.confirm_count is None:
            parser.error("a broadcast needs --confirm-count N")
        return run_broadcast(state_dir(), args.to, args.words[0],
                             confirm_count=args.confirm_count, as_json=args.json,
                             timeout=args.timeout)
    if len(args.words) != 2:
        parser.error("give a target and a message")
    return run_send(state_dir(), args.words[0], args.words[1], as_json=args.json,
                    timeout=args.timeout)


def _capture(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.capture import run_capture
    from crosstalk.config import state_dir

    return run_capture(state_dir(), args.agent)


def _tail(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.tail import run_tail
    from crosstalk.config import state_dir

    return run_tail(state_dir(), args.agent, follow=args.follow, as_json=args.json)


def _watch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from crosstalk.cli.watch import run_watch
    from crosstalk.config import state_dir

    return run_watch(state_dir(), plain=args.plain, as_json=args.json, agent=args.agent,
                     harness=args.harness, state=args.state)


_COMMANDS = {"demo": _demo, "mcp": _mcp, "install": _install, "uninstall": _install,
             "doctor": _doctor, "agents": _agents, "send": _send, "tail": _tail,
             "watch": _watch, "capture": _capture}


def main(argv: Sequence[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv) == ["mcp"]:
        # How every harness starts the shim: the full parser (a dozen subcommands) and the
        # argparse import are tens of ms before the first tools/list on a busy machine.
        return _mcp(None, None)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    command = _COMMANDS.get(args.command)
    if command is not None:
        return command(args, parser)
    _, plan = _PLANNED[args.command]
    print(f"crosstalk {args.command}: not built yet (it will {plan})", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
