"""Package re-exports resolved on first access (PEP 562), for packages every start imports.

A package ``__init__`` that imports its modules to re-export their names makes every import of
any module below it pay for all of them: ``crosstalk`` itself (every ``crosstalk.*`` import)
and the harness packages, whose entry points a shim loads to answer ``tools/list`` (ADR 0033,
0034). The names stay public API: ``from crosstalk.harness.claude import Injector`` still
works, and mypy sees them through the package's ``TYPE_CHECKING`` block.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, where: Mapping[str, str],
            namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` comes from the module ``where[name]``
    on first access and is then cached in ``namespace`` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__


def by_module(groups: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """``{module: names}`` turned into ``{name: module}``, the shape :func:`exports` reads."""
    return {name: module for module, names in groups.items() for name in names}
