"""Reading a job file: YAML with line numbers, ``${ENV}`` expansion and ``--set`` overrides.

The result is a plain nested dict plus a map from key paths to line numbers, so that
validation errors (``job.py``) can name the file, the key and the line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from teibatch.errors import JobSpecError

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

KeyPath = tuple[str, ...]


@dataclass
class RawJob:
    """A job file as loaded: the data, where it came from, and the line of every key."""

    data: dict[str, Any]
    file: str
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, path: KeyPath) -> int | None:
        """The line of ``path`` or of its closest parent that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def load_job_file(path: str | Path, overrides: list[str] | None = None,
                  environ: dict[str, str] | None = None) -> RawJob:
    """Load ``path``, apply ``--set key.path=value`` overrides, expand ``${VAR}`` and ``${VAR:-default}``."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise JobSpecError(f"cannot read the job file: {exc.strerror or exc}", file=file) from exc
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data: dict[str, Any] = loader.construct_document(root) if root is not None else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobSpecError(f"not valid YAML: {problem}", file=file, line=line) from exc
    finally:
        loader.dispose()
    if root is None:
        raise JobSpecError("the job file is empty", file=file)
    if not isinstance(root, yaml.MappingNode):
        raise JobSpecError("the job file must be a mapping of sections (corpus:, servers:, ...)",
                           file=file, line=root.start_mark.line + 1)
    lines: dict[KeyPath, int] = {}
    _record_lines(root, (), lines)
    raw = RawJob(data=data, file=file, lines=lines)
    for override in overrides or []:
        _apply_override(raw, override)
    raw.data = _expand_env(raw.data, (), raw, os.environ if environ is None else environ)
    return raw


def _record_lines(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = (*path, str(key_node.value))
            lines[key_path] = key_node.start_mark.line + 1
            _record_lines(value_node, key_path, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            item_path = (*path, str(index))
            lines[item_path] = item.start_mark.line + 1
            _record_lines(item, item_path, lines)


def _apply_override(raw: RawJob, override: str) -> None:
    key, sep, value_text = override.partition("=")
    if not sep or not key.strip():
        raise JobSpecError(f"--set expects key.path=value, got {override!r}")
    parts = key.strip().split(".")
    try:
        value = yaml.safe_load(value_text) if value_text.strip() else ""
    except yaml.YAMLError as exc:
        raise JobSpecError(f"--set {key}: the value is not valid YAML: {exc}") from exc
    target = raw.data
    for depth, part in enumerate(parts[:-1]):
        child = target.get(part)
        if child is None:
            child = target[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise JobSpecError(f"--set {key}: {where} is not a section", key=where)
        target = child
    target[parts[-1]] = value
    raw.lines.pop(tuple(parts), None)


def _expand_env(value: Any, path: KeyPath, raw: RawJob, environ: os._Environ[str] | dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _expand_env(v, (*path, str(k)), raw, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, (*path, str(i)), raw, environ) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise JobSpecError(
            f"environment variable {name} is not set (write ${{{name}:-default}} to give a default)",
            file=raw.file, key=".".join(path), line=raw.line_of(path))

    return _ENV_PATTERN.sub(substitute, value)
