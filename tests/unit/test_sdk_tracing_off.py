"""The a2a-sdk's OpenTelemetry spans are off in a CrossTalk process unless the user turns
them on (ADR 0047): the switch is read once, when the SDK's telemetry module is imported."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import crosstalk.a2a.handler, a2a.utils.telemetry as t; "
         "print(t.otel_installed, t.otel_enabled)")


def probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_sdk_traces_nothing_by_default() -> None:
    assert probe() == "True False"  # the API is installed (the MCP SDK brings it), unused


def test_a_user_who_asks_for_the_sdks_spans_gets_them() -> None:
    assert probe(OTEL_INSTRUMENTATION_A2A_SDK_ENABLED="true") == "True True"
