"""Claude Code harness: its session registry, inbox socket and key files."""
