"""One rank of `hpclaunch.call`: load the pickled function, call it, pickle what it gave.

Shipped into the run folder as call/callrank.py and started by the bootstrap as the
rank's program (`python -I -c <trampoline>`, the trampoline finding this file through
$HPCLAUNCH_RUN_DIR). Standard library, plus the cloudpickle copied beside it
(call/lib/, with its bytecode) by the submitting side: the very copy that pickled the
payload, so the two always agree, and the call works where the job's Python has no
cloudpickle. Python >= 3.8. It imports what it needs only when it needs it: the
added cost of a call is mostly this process's imports.

Files (in <run>/call/, the names equal to hpclaunch.calls.files'):
  payload.pkl       `hpclaunch-call python=X.Y`, a newline, the pickled (fn, args, kwargs)
  result-R.pkl      rank R's return value (cloudpickle), written aside then renamed
  error-R.pkl       rank R's exception: a pickled dict (type, message, traceback, node,
                    the exception itself pickled when it pickles); the rank exits 1
"""

from __future__ import annotations  # annotations stay strings: `typing` is never imported

import os
import pickle
import sys

TYPE_CHECKING = False  # mypy treats this name as true; at run time nothing below is imported
if TYPE_CHECKING:
    from typing import Any, Optional

CALL_DIR = "call"
PAYLOAD = "payload.pkl"
RESULT = "result-%d.pkl"
ERROR = "error-%d.pkl"
LIB = "lib"
HPCLAUNCH_RUN_DIR = "HPCLAUNCH_RUN_DIR"


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
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return __import__("cloudpickle").dumps(value, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]


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


def _check_python(header: bytes) -> None:
    """The header line `hpclaunch-call python=3.11`: the caller's major.minor."""
    want = header.decode("ascii", "replace").partition("python=")[2].strip()
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
            header, _, blob = fh.read().partition(b"\n")
        _check_python(header)
        # pickle imports cloudpickle (call/lib) itself where the payload needs it: a
        # function pickled by value does, one of an importable module does not.
        fn, args, kwargs = pickle.loads(blob)
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
