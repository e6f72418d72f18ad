"""The public surface of teibatch.fleet (re-exports only, sorted) and the layout behind it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import teibatch.fleet
from teibatch import errors
from teibatch.fleet.base import Provider

PROVIDERS = Path(teibatch.fleet.__file__).parent / "providers"


def test_all_is_sorted_and_importable() -> None:
    names = teibatch.fleet.__all__
    assert names == sorted(names)
    assert all(hasattr(teibatch.fleet, name) for name in names)


def test_each_provider_in_its_own_module_importing_only_shared_machinery() -> None:
    exported = [getattr(teibatch.fleet, name) for name in teibatch.fleet.__all__]
    providers = [c for c in exported if inspect.isclass(c) and issubclass(c, Provider) and c is not Provider]
    assert len(providers) == 7
    assert sorted(c.__module__ for c in providers) == sorted(
        f"teibatch.fleet.providers.{path.stem}" for path in PROVIDERS.glob("*.py") if path.stem != "__init__")
    for path in PROVIDERS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("teibatch."):
                # from the defining module, never through a package: no provider depends on another
                assert node.module != "teibatch.fleet", (path.name, node.module)
                assert not (node.module or "").startswith("teibatch.fleet.providers"), (path.name, node.module)


def test_every_error_the_fleet_defines_is_in_errors() -> None:
    for info in pkgutil.walk_packages(teibatch.fleet.__path__, "teibatch.fleet."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith("teibatch"):
                assert value.__module__ == errors.__name__, (info.name, name)
