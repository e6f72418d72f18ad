"""Reading a job file: YAML with line numbers, ``${ENV}`` expansion and ``--set`` overrides.

The result is a plain nested dict plus a map from key paths to line numbers and a map from key
paths to the ``--set`` that gave them, so that validation errors (``job.py``) can name the file,
the key and the line — or the command-line option a value came from. A file that is not UTF-8
(the line of the first bad byte) and a key written twice in one mapping (the line of the second)
are refused here, before any value is read.
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
    overrides: dict[KeyPath, str] = field(default_factory=dict)
    """Key paths set on the command line, each with its ``--set`` text (``corpus.shard_docs=5``)."""

    def line_of(self, path: KeyPath) -> int | None:
        """The line of ``path`` or of its closest parent that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def override_of(self, path: KeyPath) -> str | None:
        """The ``--set`` text a problem at ``path`` comes from, or ``None`` when it comes from the file.

        A problem inside a value given by ``--set`` comes from it; so does a problem with a whole
        section that the file does not have but a ``--set`` created.
        """
        for key in reversed(self.overrides):
            if path[:len(key)] == key:
                return self.overrides[key]
        if path not in self.lines:
            for key in reversed(self.overrides):
                if key[:len(path)] == path:
                    return self.overrides[key]
        return None

    def overrides_under(self, path: KeyPath) -> list[str]:
        """The ``--set`` texts that changed something inside ``path``."""
        return [text for key, text in self.overrides.items() if key[:len(path)] == path]


def load_job_file(path: str | Path, overrides: list[str] | None = None,
                  environ: dict[str, str] | None = None) -> RawJob:
    """Load ``path``, apply ``--set key.path=value`` overrides, expand ``${VAR}`` and ``${VAR:-default}``."""
    file = str(path)
    try:
        raw_bytes = Path(path).read_bytes()
    except OSError as exc:
        raise JobSpecError(f"cannot read the job file: {exc.strerror or exc}", file=file) from exc
    text = _decode(raw_bytes, file)
    try:
        loader = yaml.SafeLoader(text)  # checks every character at once
        try:
            root = loader.get_single_node()
            if root is not None:
                _refuse_duplicate_keys(root, (), file, set())
            data: dict[str, Any] = loader.construct_document(root) if root is not None else {}
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise JobSpecError(f"not valid YAML: {_yaml_problem(exc)}", file=file, line=_yaml_line(exc, text)) from exc
    if root is None:
        raise JobSpecError("the job file is empty", file=file)
    if not isinstance(root, yaml.MappingNode):
        raise JobSpecError("the job file must be a mapping of sections (corpus:, servers:, ...)",
                           file=file, line=root.start_mark.line + 1)
    lines: dict[KeyPath, int] = {}
    _record_lines(root, (), lines)
    raw = RawJob(data=data, file=file, lines=lines)
    problems: list[JobSpecError] = []
    for override in overrides or []:
        try:
            _apply_override(raw, override)
        except JobSpecError as exc:
            problems.append(exc)
    if not problems:
        raw.data = _expand_env(raw.data, (), raw, os.environ if environ is None else environ, problems)
    if problems:
        raise every_problem(problems)
    return raw


def _decode(data: bytes, file: str) -> str:
    """The file's text; ``JobSpecError`` at the line and column of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise JobSpecError(f"not UTF-8: byte 0x{data[exc.start]:02x} at column {column} cannot be decoded; "
                           "save the job file as UTF-8", file=file, line=line) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character #x{exc.character:04x} is not allowed in YAML"
    return getattr(exc, "problem", None) or str(exc)


def _yaml_line(exc: yaml.YAMLError, text: str) -> int | None:
    if isinstance(exc, yaml.reader.ReaderError):
        return text.count("\n", 0, exc.position) + 1
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 1 if mark is not None else None


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_duplicate_keys(node: yaml.Node, path: KeyPath, file: str, visited: set[int]) -> None:
    """``JobSpecError`` at the second of two equal keys in one mapping, at any depth.

    YAML loaders keep the last value silently; in a job file that hides a mistake. Keys brought in
    by a merge (``<<: *defaults``) may be overridden: only keys written in the mapping count.
    """
    if id(node) in visited:  # an alias: already checked where its anchor is
        return
    visited.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                _refuse_duplicate_keys(value_node, path, file, visited)
                continue
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode):
                if key in seen:
                    raise JobSpecError(f"duplicate key {key!r} (first on line {seen[key]}); YAML would keep only "
                                       "the last one: remove one of them", file=file, key=".".join((*path, key)),
                                       line=line)
                seen[key] = line
            _refuse_duplicate_keys(value_node, (*path, key), file, visited)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(item, (*path, str(index)), file, visited)


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


MAX_PROBLEMS_SHOWN = 20
"""Problems one error lists at most; past it, the count of the rest (never fewer than two of them)."""


def every_problem(problems: list[JobSpecError]) -> JobSpecError:
    """One error for ``problems``: the problem itself when alone, else every one on its own line.

    Each line keeps its own place (``file:line: key:`` or ``--set key=value:``); the error's
    ``file``, ``key`` and ``line`` are the first problem's. A list longer than
    :data:`MAX_PROBLEMS_SHOWN` ends with how many more there are (always two or more).
    """
    if len(problems) == 1:
        return problems[0]
    shown = problems if len(problems) <= MAX_PROBLEMS_SHOWN + 1 else problems[:MAX_PROBLEMS_SHOWN]
    lines = [f"{len(problems)} problems:", *(f"  {problem}" for problem in shown)]
    if len(shown) < len(problems):
        lines.append(f"  and {len(problems) - len(shown)} more not shown here: fix these, then "
                     "`teibatch validate` lists the rest")
    error = JobSpecError("\n".join(lines))
    error.file, error.key, error.line = problems[0].file, problems[0].key, problems[0].line
    return error


def override_error(override: str, message: str, key: str | None = None) -> JobSpecError:
    """A ``JobSpecError`` about a ``--set`` value: it names the option as typed, never a file line."""
    error = JobSpecError(f"--set {override}: {message}")
    error.key = key
    return error


def override_key(override: str) -> KeyPath:
    """The key path a ``--set key.path=value`` sets."""
    return tuple(part.strip() for part in override.partition("=")[0].strip().split("."))


def _apply_override(raw: RawJob, override: str) -> None:
    key, sep, value_text = override.partition("=")
    if not sep or not key.strip():
        raise JobSpecError(f"--set expects key.path=value, got {override!r}")
    parts = override_key(override)
    if not all(parts):
        raise override_error(override, "a key path is names joined by dots, like corpus.shard_docs")
    try:
        value = yaml.safe_load(value_text) if value_text.strip() else ""
    except yaml.YAMLError as exc:
        raise override_error(override, f"the value is not valid YAML: {_yaml_problem(exc)}", ".".join(parts)) from None
    target = raw.data
    for depth, part in enumerate(parts[:-1]):
        child = target.get(part)
        if child is None:
            child = target[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise override_error(override, f"{where} is not a section", where)
        target = child
    target[parts[-1]] = value
    for known in [p for p in raw.lines if p[:len(parts)] == parts]:
        del raw.lines[known]
    raw.overrides.pop(parts, None)
    raw.overrides[parts] = override


def _expand_env(value: Any, path: KeyPath, raw: RawJob, environ: os._Environ[str] | dict[str, str],
                problems: list[JobSpecError]) -> Any:
    """``value`` with every ``${VAR}`` expanded; a variable that is not set is added to ``problems``."""
    if isinstance(value, dict):
        return {k: _expand_env(v, (*path, str(k)), raw, environ, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, (*path, str(i)), raw, environ, problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        problem = f"environment variable {name} is not set (write ${{{name}:-default}} to give a default)"
        override = raw.override_of(path)
        if override is not None:
            problems.append(override_error(override, problem, ".".join(path)))
        else:
            problems.append(JobSpecError(problem, file=raw.file, key=".".join(path), line=raw.line_of(path)))
        return match.group(0)

    return _ENV_PATTERN.sub(substitute, value)
