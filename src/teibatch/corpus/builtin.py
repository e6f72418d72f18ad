"""Builtin sample corpora: real English text every Python installation carries, read at run time.

``builtin:stdlib-docs`` is the docstrings of a fixed list of standard-library modules (module,
class, function and method docstrings) plus the help topics of ``pydoc_data.topics``: a few
thousand documents, no download and no data file in the repository. The quickstart job and the
tests use it so they work on a fresh machine without network.

The records are the same for the same Python version: modules are walked in a fixed order,
names in sorted order, each object once, and memory addresses (``0x7f...``) are masked.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from teibatch.errors import CorpusError

BUILTIN_PREFIX = "builtin:"
BUILTIN_ID_FIELD = "id"
"""The field builtin records carry their natural id in; used when the job sets no ``id_field``."""

MIN_DOC_CHARS = 40
"""Docstrings shorter than this (``"Return self."``, generated dataclass reprs) are left out."""

# Standard-library modules present on CPython 3.10-3.13 on Linux that import without side effects
# (mostly pure Python, plus a few always-built C modules with rich docstrings).
# Fixed and sorted: the corpus must not depend on what else happens to be installed or imported.
STDLIB_DOC_MODULES: tuple[str, ...] = (
    "abc", "argparse", "array", "ast", "asyncio.base_events", "asyncio.base_futures", "asyncio.coroutines",
    "asyncio.events", "asyncio.exceptions", "asyncio.format_helpers", "asyncio.futures", "asyncio.locks",
    "asyncio.protocols", "asyncio.queues", "asyncio.runners", "asyncio.selector_events", "asyncio.sslproto",
    "asyncio.staggered", "asyncio.streams", "asyncio.subprocess", "asyncio.tasks", "asyncio.transports",
    "asyncio.trsock", "asyncio.unix_events", "atexit", "base64", "bdb", "binascii", "bisect", "builtins",
    "bz2", "calendar", "cmath", "cmd", "code", "codecs", "codeop", "collections", "collections.abc",
    "colorsys", "compileall", "concurrent.futures", "concurrent.futures._base",
    "concurrent.futures.process", "concurrent.futures.thread", "configparser", "contextlib", "copy",
    "copyreg", "csv", "ctypes", "dataclasses", "datetime", "dbm", "dbm.dumb", "difflib", "dis", "doctest",
    "email.base64mime", "email.charset", "email.contentmanager", "email.encoders", "email.errors",
    "email.feedparser", "email.generator", "email.header", "email.headerregistry", "email.iterators",
    "email.message", "email.mime.application", "email.mime.multipart", "email.mime.text", "email.parser",
    "email.policy", "email.quoprimime", "email.utils", "encodings.punycode", "enum", "faulthandler",
    "fcntl", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gc", "getopt",
    "getpass", "gettext", "glob", "graphlib", "grp", "gzip", "hashlib", "heapq", "hmac", "html",
    "html.parser", "http", "http.client", "http.cookiejar", "http.cookies", "http.server", "imaplib",
    "importlib", "importlib.abc", "importlib.machinery", "importlib.metadata", "importlib.resources",
    "importlib.util", "inspect", "io", "ipaddress", "itertools", "json", "json.decoder", "json.encoder",
    "keyword", "linecache", "locale", "logging", "logging.config", "logging.handlers", "lzma", "mailbox",
    "marshal", "math", "mimetypes", "mmap", "modulefinder", "multiprocessing.connection",
    "multiprocessing.context", "multiprocessing.heap", "multiprocessing.managers", "multiprocessing.pool",
    "multiprocessing.process", "multiprocessing.queues", "multiprocessing.reduction",
    "multiprocessing.shared_memory", "multiprocessing.synchronize", "multiprocessing.util", "netrc",
    "numbers", "opcode", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools", "pkgutil",
    "platform", "plistlib", "poplib", "posixpath", "pprint", "profile", "pstats", "pty", "pwd",
    "py_compile", "pyclbr", "pydoc", "queue", "quopri", "random", "re", "reprlib", "resource",
    "rlcompleter", "runpy", "sched", "secrets", "select", "selectors", "shelve", "shlex", "shutil",
    "signal", "smtplib", "socket", "socketserver", "sqlite3", "ssl", "stat", "statistics", "string",
    "stringprep", "subprocess", "symtable", "sys", "sysconfig", "tabnanny", "tarfile", "tempfile",
    "textwrap", "threading", "time", "timeit", "token", "tokenize", "trace", "traceback", "tracemalloc",
    "tty", "types", "typing", "unicodedata", "unittest.async_case", "unittest.case", "unittest.loader",
    "unittest.main", "unittest.mock", "unittest.result", "unittest.runner", "unittest.suite",
    "unittest.util", "urllib.error", "urllib.parse", "urllib.request", "urllib.response",
    "urllib.robotparser", "uuid", "venv", "warnings", "wave", "weakref", "webbrowser", "wsgiref.handlers",
    "wsgiref.headers", "wsgiref.simple_server", "wsgiref.util", "wsgiref.validate", "xml.dom",
    "xml.dom.domreg", "xml.dom.expatbuilder", "xml.dom.minicompat", "xml.dom.minidom", "xml.dom.pulldom",
    "xml.etree.ElementTree", "xml.sax", "xml.sax.expatreader", "xml.sax.handler", "xml.sax.saxutils",
    "xml.sax.xmlreader", "xmlrpc.client", "xmlrpc.server", "zipapp", "zipfile", "zipimport", "zlib",
    "zoneinfo"
)

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


@dataclass(frozen=True)
class BuiltinCorpus:
    """One builtin corpus: its ``name`` (after ``builtin:``) and the rows it serves."""

    name: str
    records: tuple[dict[str, str], ...]
    fingerprint: str

    @property
    def source(self) -> str:
        return BUILTIN_PREFIX + self.name


def is_builtin(path: str) -> bool:
    """Whether a corpus path names a builtin corpus (``builtin:<name>``)."""
    return path.startswith(BUILTIN_PREFIX)


def load_builtin(path: str) -> BuiltinCorpus:
    """The builtin corpus ``path`` names, built once per process; unknown names raise ``CorpusError``."""
    name = path[len(BUILTIN_PREFIX):] if is_builtin(path) else path
    build = _BUILDERS.get(name)
    if build is None:
        known = ", ".join(BUILTIN_PREFIX + n for n in sorted(_BUILDERS))
        raise CorpusError(f"{path}: no such builtin corpus (known: {known})")
    return _cached(name, build)


@functools.cache
def _cached(name: str, build: Callable[[], Iterator[dict[str, str]]]) -> BuiltinCorpus:
    records = tuple(build())
    digest = hashlib.blake2b(digest_size=8)
    for record in records:
        digest.update(record["id"].encode())
        digest.update(b"\0")
        digest.update(record["text"].encode())
        digest.update(b"\0")
    version = ".".join(str(part) for part in sys.version_info[:3])
    return BuiltinCorpus(name, records, f"python-{version}:{len(records)}:{digest.hexdigest()}")


def stdlib_docs() -> Iterator[dict[str, str]]:
    """Docstrings of ``STDLIB_DOC_MODULES`` then ``pydoc_data`` topics, in a fixed order."""
    seen: set[int] = set()
    for module_name in STDLIB_DOC_MODULES:
        with warnings.catch_warnings():  # importing or touching deprecated names (typing.re) warns
            warnings.simplefilter("ignore")
            module = _import_quietly(module_name)
            records = list(_module_docs(module, seen)) if module is not None else []
        yield from records
    yield from _topics()


def _import_quietly(name: str) -> ModuleType | None:
    """Import a module if this Python has it; ``None`` when it fails to import."""
    try:
        return importlib.import_module(name)
    except Exception:  # any module that fails to import is simply left out of the sample
        return None


def _module_docs(module: ModuleType, seen: set[int]) -> Iterator[dict[str, str]]:
    name = module.__name__
    record = _record(name, name, module.__doc__, "module")
    if record:
        yield record
    for attr, obj in _own_members(module, name):
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        qualname = f"{name}.{attr}"
        record = _record(f"{name}:{attr}", qualname, obj.__doc__, "docstring")
        if record:
            yield record
        if inspect.isclass(obj):
            yield from _class_docs(obj, name, attr, seen)


def _class_docs(cls: type, module: str, cls_name: str, seen: set[int]) -> Iterator[dict[str, str]]:
    for attr in sorted(vars(cls)):
        if attr.startswith("_"):
            continue
        raw = vars(cls)[attr]
        obj = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        if not (isinstance(obj, property) or inspect.isroutine(obj)):
            continue
        doc = obj.__doc__
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        record = _record(f"{module}:{cls_name}.{attr}", f"{module}.{cls_name}.{attr}", doc, "docstring")
        if record:
            yield record


def _own_members(module: ModuleType, name: str) -> list[tuple[str, Any]]:
    """Public classes and functions defined in ``module`` itself (not imported into it), sorted."""
    members = []
    for attr in sorted(vars(module)):
        if attr.startswith("_"):
            continue
        obj = vars(module)[attr]
        if (inspect.isclass(obj) or inspect.isroutine(obj)) and getattr(obj, "__module__", None) == name:
            members.append((attr, obj))
    return members


def _record(doc_id: str, title: str, doc: object, source: str) -> dict[str, str] | None:
    if not isinstance(doc, str):
        return None
    text = _ADDRESS.sub("0x...", inspect.cleandoc(doc)).strip()
    if len(text) < MIN_DOC_CHARS:
        return None
    return {"id": doc_id, "text": text, "source": source, "title": title}


def _topics() -> Iterator[dict[str, str]]:
    topics = _import_quietly("pydoc_data.topics")
    table = getattr(topics, "topics", {}) if topics is not None else {}
    for name in sorted(table):
        record = _record(f"topic:{name}", name, table[name], "topic")
        if record:
            yield record


_BUILDERS: dict[str, Callable[[], Iterator[dict[str, str]]]] = {"stdlib-docs": stdlib_docs}
