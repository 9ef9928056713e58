"""Durable state on disk: the per-agent journal and the registry of live agents."""
