"""A GPU cloud's own OpenAPI file, as the fakes use it: every request checked, every answer checked.

The files are the providers' published specifications, kept outside the project in
``../shared/clouds`` (relative to the repository root; CI has them). :func:`load_spec` finds one and
skips the test, with the reason, where it is absent: the provider tests need the fake, and the fake
needs the spec.

:class:`OpenApiSpec` finds the operation of a request (method and path template; a trailing ``/`` is
not part of the path, as the clouds' routers treat it), then checks

* the path parameters and the query against the operation's parameters (types, enums, patterns,
  required ones; a query parameter the operation does not declare is refused by name);
* the body against the operation's request schema (JSON Schema 2020-12, as OpenAPI 3.1 says; the
  ``$ref``s resolve inside the spec file), which is where unknown fields (``unevaluatedProperties`` /
  ``additionalProperties: false``), wrong enums and missing required fields are caught;
* an answer against the response the operation declares for its status (or ``default``), body and
  media type.

Each check returns the problems found, one line each, naming the field (``$.cloudType: ...``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

#: ../shared/clouds relative to the repository root (tests/fleet/cloudspec.py → the root is two levels up)
SPEC_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "clouds"
SPEC_URI = "urn:cloud-spec"
_METHODS = ("get", "put", "post", "delete", "patch")


def load_spec(file_name: str) -> OpenApiSpec:
    """The spec file ``../shared/clouds/<file_name>``; the calling test is skipped, with the reason, without it."""
    path = SPEC_DIR / file_name
    if not path.is_file():
        pytest.skip(f"the cloud's OpenAPI file {file_name} is not in ../shared/clouds (next to the repository); "
                    "the fake checks every request against it")
    return _parsed(path)


_CACHE: dict[Path, OpenApiSpec] = {}


def _parsed(path: Path) -> OpenApiSpec:
    if path not in _CACHE:
        text = path.read_text(encoding="utf-8")
        _CACHE[path] = OpenApiSpec(json.loads(text) if path.suffix == ".json" else yaml.safe_load(text))
    return _CACHE[path]


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


@dataclass
class Operation:
    """One operation of the spec: ``method`` and ``template`` (``/v2/pods/{id}``), with its JSON pointer."""

    method: str
    template: str
    pattern: re.Pattern[str]
    pointer: str
    spec: dict[str, Any] = field(repr=False)
    parameters: list[dict[str, Any]] = field(repr=False)

    @property
    def name(self) -> str:
        return str(self.spec.get("operationId") or f"{self.method} {self.template}")


class OpenApiSpec:
    """An OpenAPI 3.1 document: find an operation, check a request, check an answer."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.registry: Registry[Any] = Registry().with_resource(
            SPEC_URI, Resource.from_contents(document, default_specification=DRAFT202012))
        self._validators: dict[str, Draft202012Validator] = {}

    @cached_property
    def operations(self) -> list[Operation]:
        found = []
        for template, item in self.document["paths"].items():
            shared = item.get("parameters", [])
            for method in _METHODS:
                if method not in item:
                    continue
                regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template.rstrip("/")))
                params = [self.resolve(p) for p in [*shared, *item[method].get("parameters", [])]]
                found.append(Operation(method.upper(), template, re.compile(regex),
                                       f"#/paths/{_escape(template)}/{method}", item[method], params))
        return found

    def resolve(self, node: Any) -> Any:
        """``node``, or what its ``$ref`` (inside this document) points at."""
        while isinstance(node, dict) and "$ref" in node:
            node = self.registry.resolver(SPEC_URI).lookup(SPEC_URI + node["$ref"]).contents
        return node

    def find(self, method: str, path: str) -> tuple[Operation, dict[str, str]] | None:
        """The operation ``method path`` calls, and its path parameters; ``None``: the spec has no such route."""
        path = path.rstrip("/") or "/"
        for operation in self.operations:
            match = operation.pattern.fullmatch(path)
            if match and operation.method == method:
                return operation, match.groupdict()
        return None

    def _validator(self, pointer: str) -> Draft202012Validator:
        if pointer not in self._validators:
            self._validators[pointer] = Draft202012Validator({"$ref": SPEC_URI + pointer}, registry=self.registry)
        return self._validators[pointer]

    def _problems(self, pointer: str, value: Any, where: str) -> list[str]:
        problems = []
        for error in sorted(self._validator(pointer).iter_errors(value), key=lambda e: list(e.absolute_path)):
            at = f"{where}{''.join(f'.{p}' for p in error.absolute_path)}"
            message = error.message
            if error.validator in ("unevaluatedProperties", "additionalProperties") and isinstance(error.instance,
                                                                                                    dict):
                # A field that failed its own check counts as "unevaluated" too (JSON Schema 2020-12): name only
                # the fields no schema declares, as the providers do ("additional properties 'x' not allowed").
                unknown = sorted(set(error.instance) - self._declared(error.schema))
                if not unknown:
                    continue
                message = f"additional properties {', '.join(repr(n) for n in unknown)} not allowed"
            problems.append(f"{at}: {message}")
        return problems

    def _declared(self, schema: Any) -> set[str]:
        """The property names ``schema`` declares, through ``$ref``, ``allOf``, ``anyOf``, ``oneOf``, if/then."""
        schema = self.resolve(schema)
        if not isinstance(schema, dict):
            return set()
        names = set(schema.get("properties", {}))
        for key in ("allOf", "anyOf", "oneOf"):
            for part in schema.get(key, []):
                names |= self._declared(part)
        for key in ("then", "else"):
            if key in schema:
                names |= self._declared(schema[key])
        return names

    def request_problems(self, operation: Operation, path_params: dict[str, str], query: dict[str, list[str]],
                         body: Any) -> list[str]:
        """What is wrong with a request to ``operation`` by the spec: one line per problem, naming the field."""
        problems = []
        declared = {p["name"]: p for p in operation.parameters}
        for name in query:
            if declared.get(name, {}).get("in") != "query":
                problems.append(f"query parameter {name!r} is not a parameter of {operation.name}")
        for index, param in enumerate(operation.parameters):
            where = param["in"]
            values = (path_params if where == "path" else query if where == "query" else {}).get(param["name"])
            if values is None:
                if param.get("required") and where in ("path", "query"):
                    problems.append(f"{where} parameter {param['name']!r} is required")
                continue
            raw = values if isinstance(values, list) else [values]
            value = _typed(raw, self.resolve(param.get("schema", {})), explode=param.get("explode", True))
            pointer = self._parameter_pointer(operation, param, index)
            problems += self._problems(pointer, value, f"{where} parameter {param['name']}")
        content = self.resolve(operation.spec.get("requestBody", {})).get("content", {})
        if "application/json" in content:
            if body is None:
                if self.resolve(operation.spec["requestBody"]).get("required"):
                    problems.append("$: a JSON body is required")
            else:
                pointer = f"{operation.pointer}/requestBody/content/application~1json/schema"
                if "$ref" in operation.spec["requestBody"]:
                    pointer = operation.spec["requestBody"]["$ref"] + "/content/application~1json/schema"
                problems += self._problems(pointer, body, "$")
        elif body is not None:
            problems.append(f"$: {operation.name} takes no body")
        return problems

    def _parameter_pointer(self, operation: Operation, param: dict[str, Any], index: int) -> str:
        """The JSON pointer of a parameter's schema (where ``$ref``s inside it resolve from)."""
        item = self.document["paths"][operation.template]
        shared = item.get("parameters", [])
        raw = shared[index] if index < len(shared) else operation.spec["parameters"][index - len(shared)]
        if "$ref" in raw:
            return f"{raw['$ref']}/schema"
        base = (f"#/paths/{_escape(operation.template)}/parameters/{index}" if index < len(shared)
                else f"{operation.pointer}/parameters/{index - len(shared)}")
        return f"{base}/schema"

    def response_problems(self, operation: Operation, status: int, body: Any, content_type: str) -> list[str]:
        """What is wrong with an answer ``status`` + ``body`` to ``operation`` by the spec."""
        responses = operation.spec.get("responses", {})
        key = str(status) if str(status) in responses else f"{str(status)[0]}XX" if f"{str(status)[0]}XX" in \
            responses else "default" if "default" in responses else None
        if key is None:
            return [f"{operation.name} declares no answer {status}"]
        pointer = f"{operation.pointer}/responses/{key}"
        if "$ref" in responses[key]:
            pointer = responses[key]["$ref"]
        content = self.resolve(responses[key]).get("content")
        if not content:
            return [] if body is None else [f"{operation.name} {status}: the spec declares no body, one was sent"]
        if content_type not in content:
            return [f"{operation.name} {status}: media type {content_type} is not one of {sorted(content)}"]
        if "schema" not in content[content_type]:
            return []
        return self._problems(f"{pointer}/content/{_escape(content_type)}/schema", body, f"answer {status} $")


def _typed(raw: list[str], schema: dict[str, Any], *, explode: bool) -> Any:
    """A query or path value as its schema's type (``form`` style: an array is comma-separated unless exploded)."""
    kind = schema.get("type")
    if kind == "array":
        items = [part for value in raw for part in (value.split(",") if not explode else [value])]
        return [_scalar(item, schema.get("items", {})) for item in items]
    return _scalar(raw[-1], schema)


def _scalar(text: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    try:
        if "integer" in kinds:
            return int(text)
        if "number" in kinds:
            return float(text)
    except ValueError:
        return text  # the validator names it: "'x' is not of type 'integer'"
    if "boolean" in kinds and text in ("true", "false"):
        return text == "true"
    return text
