"""One rank of `hpclaunch.call`: load the pickled function, call it, pickle what it gave.

Shipped into the run folder as call/callrank.py and started by the bootstrap as the
rank's program (`python -I -c <trampoline>`, the trampoline finding this file through
$HPCLAUNCH_RUN_DIR). Standard library, plus the cloudpickle copied beside it
(call/lib/, with its bytecode) by the submitting side: the very copy that pickled the
payload, so the two always agree, and the call works where the job's Python has no
cloudpickle. Python >= 3.8. It imports what it needs only when it needs it: the
added cost of a call is mostly this process's imports. A function pickled by value (a
notebook's, a script's) names a few of cloudpickle's rebuilders; this file has its own
of those (_REBUILDERS), so such a function loads without importing cloudpickle, whose
import costs a rank some 40 ms (dataclasses, inspect, typing, logging); anything else
the payload names (a class of the notebook, say) imports the shipped cloudpickle.

Files (in <run>/call/, the names equal to hpclaunch.calls.files'):
  payload.pkl       `hpclaunch-call python=X.Y cloudpickle=V`, a newline, the pickled
                    (fn, args, kwargs)
  result-R.pkl      rank R's return value (cloudpickle), written aside then renamed
  error-R.pkl       rank R's exception: a pickled dict (type, message, traceback, node,
                    the exception itself pickled when it pickles); the rank exits 1
"""

from __future__ import annotations  # annotations stay strings: `typing` is never imported

import builtins
import os
import sys

# The C pickler alone: pickle.py would import re, struct and enum on top (some 5 ms).
try:
    import _pickle as pickle
except ImportError:  # an interpreter without the accelerator
    import pickle  # type: ignore[no-redef]

TYPE_CHECKING = False  # mypy treats this name as true; at run time nothing below is imported
if TYPE_CHECKING:
    from typing import Any, Optional

CALL_DIR = "call"
PAYLOAD = "payload.pkl"
RESULT = "result-%d.pkl"
ERROR = "error-%d.pkl"
LIB = "lib"
HPCLAUNCH_RUN_DIR = "HPCLAUNCH_RUN_DIR"
PROTOCOL = 5  # pickle's highest protocol from Python 3.8 on (_pickle has no constant)
CLOUDPICKLE = "cloudpickle.cloudpickle"  # the module its payloads name for rebuilders
REBUILDS_LIKE = "3."  # the cloudpickle versions whose rebuilders _REBUILDERS mirror


def _make_function(
    code: Any, globals_: dict[str, Any], name: str, argdefs: Any, closure: Any
) -> Any:
    import types  # imported already by _pickle (functools), as below

    globals_["__builtins__"] = builtins.__dict__
    return types.FunctionType(code, globals_, name, argdefs, closure)


def _make_empty_cell() -> Any:
    import types

    return types.CellType()


def _make_cell(value: Any) -> Any:
    import types

    return types.CellType(value)


def _function_setstate(fn: Any, state: Any) -> None:
    """A function's __dict__, globals, closure cells and other attributes, which its
    pickle carries after the function itself (a recursive function names itself)."""
    attributes, slots = state
    fn.__dict__.update(attributes)
    fn.__globals__.update(slots.pop("__globals__"))
    fn.__globals__["__builtins__"] = builtins.__dict__
    cells = slots.pop("__closure__")
    slots.pop("_cloudpickle_submodules")  # imported already by unpickling them
    for mine, given in zip(fn.__closure__ or (), cells or ()):
        try:
            mine.cell_contents = given.cell_contents
        except ValueError:  # an empty cell
            continue
    for key, value in slots.items():
        setattr(fn, key, value)


def _builtin_type(name: str) -> Any:
    import types

    return type if name == "ClassType" else getattr(types, name)


def _subimport(name: str) -> Any:
    __import__(name)
    return sys.modules[name]


_REBUILDERS = {
    "_make_function": _make_function,
    "_make_empty_cell": _make_empty_cell,
    "_make_cell": _make_cell,
    "_function_setstate": _function_setstate,
    "_builtin_type": _builtin_type,
    "subimport": _subimport,
}


class _Unpickler(pickle.Unpickler):
    """The payload's unpickler: cloudpickle's rebuilders of functions from this file
    when the pickling cloudpickle's are known to match, the rest as pickle finds them."""

    def __init__(self, data: bytes, own_rebuilders: bool) -> None:
        import io  # imported already at the interpreter's start

        super().__init__(io.BytesIO(data))
        self.own_rebuilders = own_rebuilders

    def find_class(self, module: str, name: str) -> Any:
        if self.own_rebuilders and module == CLOUDPICKLE and name in _REBUILDERS:
            return _REBUILDERS[name]
        return super().find_class(module, name)


def _write(path: str, data: bytes) -> None:
    """`data` into `path` whole or not at all (aside, then renamed), private."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _node() -> str:
    import socket  # only for an error: a rank that succeeds imports no more than it needs

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _dumps(value: Any) -> bytes:
    """pickle's C pickler (no import); cloudpickle for what only it pickles (a lambda)."""
    try:
        return pickle.dumps(value, protocol=PROTOCOL)
    except Exception:
        return __import__("cloudpickle").dumps(value, protocol=PROTOCOL)  # type: ignore[no-any-return]


def _error(exc: BaseException, rank: int) -> bytes:
    """What the caller needs to raise `exc` again: itself when it pickles, else its
    type's name and message; always the node and the traceback as text here."""
    import time
    import traceback

    try:
        pickled: Optional[bytes] = _dumps(exc)
    except Exception:  # an exception holding an unpicklable value: its text still goes
        pickled = None
    kind = type(exc)
    return pickle.dumps(
        {
            "rank": rank,
            "node": _node(),
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(kind, exc, exc.__traceback__)),
            "exception": pickled,
            "time": time.time(),
        }
    )


def _header(line: bytes) -> dict[str, str]:
    """The header line `hpclaunch-call python=3.11 cloudpickle=3.1.3` as a dict."""
    words = line.decode("ascii", "replace").split()[1:]
    return dict(word.partition("=")[::2] for word in words)


def _check_python(header: dict[str, str]) -> None:
    """The caller's major.minor against this Python's."""
    want = header.get("python", "")
    mine = "%d.%d" % sys.version_info[:2]  # noqa: UP031 - a tuple's two ints
    if want != mine:
        raise RuntimeError(
            f"the job's Python is {mine}, the caller's {want}: a pickled function "
            f"needs the same major.minor (give venv= or container= with Python {want})"
        )


def main() -> int:
    os.umask(0o077)  # nothing this writes is world-readable
    rank = int(os.environ.get("RANK", "0"))
    folder = os.path.join(os.environ[HPCLAUNCH_RUN_DIR], CALL_DIR)
    # The job's working folder (the code snapshot) first: a function pickled by
    # reference is imported from the user's modules there, as `python train.py` would.
    sys.path.insert(0, os.getcwd())
    sys.path.insert(0, os.path.join(folder, LIB))  # the pickler's own cloudpickle
    try:
        with open(os.path.join(folder, PAYLOAD), "rb") as fh:
            line, _, blob = fh.read().partition(b"\n")
        header = _header(line)
        _check_python(header)
        # pickle imports cloudpickle (call/lib) itself where the payload names more of it
        # than _REBUILDERS: a function of an importable module names none of it.
        own = header.get("cloudpickle", "").startswith(REBUILDS_LIKE)
        fn, args, kwargs = _Unpickler(blob, own).load()
        data = _dumps(fn(*args, **kwargs))
    except BaseException as exc:  # every failure goes back to the caller
        _write(os.path.join(folder, ERROR % rank), _error(exc, rank))
        import traceback

        traceback.print_exc()
        return 1
    _write(os.path.join(folder, RESULT % rank), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
