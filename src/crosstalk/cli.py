"""The ``crosstalk`` command line.

Subcommands that belong to capabilities not built yet say so and exit 2, so a script can tell
"not available" from success; ``demo`` already shows the durable core that is built.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from crosstalk import __version__

EXIT_USAGE = 2

#: subcommand -> (one-line help, what it will do once built)
_PLANNED: dict[str, tuple[str, str]] = {
    "mcp": ("run the shim: the MCP server a harness starts", "serve the seven tools over stdio"),
    "install": ("register CrossTalk with Claude Code and Codex", "edit both harness configs"),
    "uninstall": ("undo install exactly", "restore both harness configs"),
    "agents": ("list every session on this machine", "show name, harness, status, reachability"),
    "send": ("send a message to an agent by name", "deliver through the agent's uds ingress"),
    "tail": ("follow an agent's journal", "print journal records as they are written"),
    "doctor": ("diagnose the installation", "check harnesses, sockets, permissions, stale state"),
    "capture": ("dump one inbound frame for diagnosis", "record one frame from a socket"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crosstalk",
        description="Message any AI coding-agent session on this machine by name.",
    )
    parser.add_argument("--version", action="version", version=f"crosstalk {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="show CrossTalk working with no harness installed")
    demo.add_argument("--keep", action="store_true", help="keep the demo's state directory")
    for name, (help_text, _) in _PLANNED.items():
        p = sub.add_parser(name, help=f"{help_text} (not built yet)")
        p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "demo":
        from crosstalk.demo import run_demo

        return run_demo(keep=args.keep)
    _, plan = _PLANNED[args.command]
    print(f"crosstalk {args.command}: not built yet (it will {plan})", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
