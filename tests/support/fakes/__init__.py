"""Fakes of the processes CrossTalk talks to: a Claude Code session, its MCP launcher, the
Codex app-server, a uds sender and a registering agent. The scripts here run by path as child
processes and import only the standard library and ``crosstalk``."""
