"""What a call writes into its run folder before the job starts, and the ranks' program.

The function and its arguments are pickled with cloudpickle (the optional extra `call`;
one line when it is missing) behind a one-line header (the caller's Python and
cloudpickle versions), and
refused in one line above the payload limit, before anything is submitted. The
caller's cloudpickle (pure Python) travels too, into call/lib/: the ranks load the
payload with the copy that made it, so a job whose Python lacks cloudpickle works, and
a different version there never misreads it. node/callrank.py is the ranks' program.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import marshal
import pickle
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from hpclaunch import node
from hpclaunch.basics.units import parse_size
from hpclaunch.errors import UserError
from hpclaunch.payload.snapshot import human

# The file names node/callrank.py shares (tests/test_call.py checks they are equal).
CALL_DIR = "call"
PAYLOAD = "payload.pkl"
RESULT = "result-%d.pkl"
ERROR = "error-%d.pkl"
LIB = "lib"
CALL_RANK = "callrank.py"
DEFAULT_LIMIT = 100 * 1024 * 1024  # bytes: 100 MB
LIMIT_KEY = "call_limit"  # the key of `options` that is no run option: the payload limit

# The ranks' program: a few bytes of Python that run the shipped callrank.py of the
# rank's own run folder (its path is known in the job only: $HPCLAUNCH_RUN_DIR).
# exec, not runpy: runpy's imports would cost every rank milliseconds.
TRAMPOLINE = (
    f"import os;p=os.path.join(os.environ['HPCLAUNCH_RUN_DIR'],{CALL_DIR!r},{CALL_RANK!r});"
    "exec(compile(open(p,'rb').read(),p,'exec'),{'__name__':'__main__','__file__':p})"
)


def cloudpickle() -> ModuleType:
    try:
        return importlib.import_module("cloudpickle")
    except ImportError:
        raise UserError(
            "call",
            "cloudpickle is not installed here",
            "hpclaunch.call pickles the function with it",
            "pip install 'hpclaunch[call]' (or pip install cloudpickle)",
        ) from None


def limit_bytes(value: Any) -> int:
    """The payload limit: an int of bytes or a size text ("100M")."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        return parse_size(value, f"options[{LIMIT_KEY!r}]")
    raise UserError(
        f"options[{LIMIT_KEY!r}]", f"{value!r} is no size", "bytes or a text like '500M'", ""
    )


def payload(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], limit: int
) -> bytes:
    """The header line and the pickled call; a payload above `limit` is refused."""
    pickler = cloudpickle()
    try:
        blob: bytes = pickler.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # a lock, an open file, a generator among the arguments
        raise UserError(
            "call", f"{qualified_name(fn)} and its arguments do not pickle: {exc}", "", ""
        ) from None
    if len(blob) > limit:
        raise UserError(
            "call",
            f"{qualified_name(fn)} pickled with its arguments and closure is {human(len(blob))}",
            f"limit {human(limit)}",
            f"pass big data as files (stage=...), or raise options={{{LIMIT_KEY!r}: '...'}}",
        )
    # The ranks' Python must be this major.minor; node/callrank.py rebuilds a function
    # without importing cloudpickle when it knows this version's rebuilders.
    version = getattr(pickler, "__version__", "")
    header = "hpclaunch-call python=%d.%d cloudpickle=%s\n" % (*sys.version_info[:2], version)  # noqa: UP031
    return header.encode("ascii") + blob


def qualified_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}" if module else name


def run_files(data: bytes) -> tuple[tuple[str, bytes], ...]:
    """Every file the ranks read: the payload, callrank.py, the caller's cloudpickle."""
    files = [
        (f"{CALL_DIR}/{PAYLOAD}", data),
        (f"{CALL_DIR}/{CALL_RANK}", node.path(CALL_RANK).read_bytes()),
    ]
    return (*files, *_shipped_cloudpickle())


@functools.lru_cache(maxsize=1)
def _shipped_cloudpickle() -> tuple[tuple[str, bytes], ...]:
    """The caller's cloudpickle: its sources and their bytecode, compiled once per
    process as unchecked hash-based .pyc (PEP 552), which the ranks' Python (the same
    major.minor) loads without compiling the sources again or checking their mtimes."""
    package = Path(str(cloudpickle().__file__)).parent
    found: list[tuple[str, bytes]] = []
    for source in sorted(package.glob("*.py")):
        data = source.read_bytes()
        folder = f"{CALL_DIR}/{LIB}/cloudpickle"
        found.append((f"{folder}/{source.name}", data))
        code = compile(data, f"{folder}/{source.name}", "exec", dont_inherit=True)
        pyc = importlib.util.cache_from_source(source.name)  # __pycache__/NAME.cpython-3X.pyc
        header = importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")  # hash, unchecked
        found.append(
            (f"{folder}/{pyc}", header + importlib.util.source_hash(data) + marshal.dumps(code))
        )
    return tuple(found)


def program(python: str) -> tuple[str, ...]:
    return (python, "-I", "-c", TRAMPOLINE)
