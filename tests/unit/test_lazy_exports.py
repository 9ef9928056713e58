"""Package re-exports that resolve on first access (``crosstalk._lazy``, ADR 0034).

Each check runs in a fresh interpreter: what a package import loads is the point, and this
process has loaded everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

import crosstalk.a2a
import crosstalk.harness.claude
import crosstalk.harness.codex
import crosstalk.harness.opencode


def _fresh(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    return dict(json.loads(out.stdout))


@pytest.mark.parametrize("package", [crosstalk.a2a, crosstalk.harness.claude,
                                     crosstalk.harness.codex, crosstalk.harness.opencode])
def test_every_listed_name_resolves_to_its_module(package: types.ModuleType) -> None:
    names = list(package.__all__)
    assert names
    for name in names:
        value = getattr(package, name)
        assert value is not None
        assert name in vars(package)  # cached: the second access is a plain lookup


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = crosstalk.harness.claude.nope  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        exec("from crosstalk.harness.codex import nope")


def test_a_plugin_import_leaves_the_injection_side_unloaded_until_a_name_is_used() -> None:
    got = _fresh(
        "import json, sys\n"
        "import crosstalk.harness.claude.plugin\n"
        "before = 'crosstalk.harness.claude.injector' in sys.modules\n"
        "from crosstalk.harness.claude import Injector\n"
        "print(json.dumps({'before': before, 'after': 'crosstalk.harness.claude.injector' in "
        "sys.modules, 'name': Injector.__name__}))\n")
    assert got == {"before": False, "after": True, "name": "Injector"}


def test_the_a2a_server_side_loads_without_the_client_side() -> None:
    got = _fresh(
        "import json, sys\n"
        "from crosstalk.a2a.server import A2AServer\n"
        "before = 'crosstalk.a2a.client' in sys.modules\n"
        "from crosstalk.a2a import send\n"
        "print(json.dumps({'before': before, 'after': 'crosstalk.a2a.client' in sys.modules,"
        " 'send': send.__module__}))\n")
    assert got == {"before": False, "after": True, "send": "crosstalk.a2a.client"}


def test_the_shim_keeps_httpx_cli_out_and_httpx_works() -> None:
    got = _fresh(
        "import json, sys\n"
        "from crosstalk.shim.serve import skip_httpx_cli\n"
        "skip_httpx_cli()\n"
        "import httpx\n"
        "r = httpx.Response(200, json={'ok': True})\n"
        "print(json.dumps({'rich': 'rich' in sys.modules, 'pygments': 'pygments' in "
        "sys.modules, 'body': r.json(), 'main': callable(httpx.main)}))\n")
    assert got == {"rich": False, "pygments": False, "body": {"ok": True}, "main": True}
