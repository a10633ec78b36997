"""What a call's ranks left in its run folder, turned into the caller's answer: the
results in rank order (a big one loaded when read), or the first rank's exception
raised again as its own type (else RemoteError) with the rank, the node and the remote
traceback as notes."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar, Union, overload

from hpclaunch.calls import files
from hpclaunch.errors import HpclaunchError

T = TypeVar("T")
_UNREAD: Any = object()  # a big result not loaded yet


class RemoteError(HpclaunchError):
    """An exception on a rank that does not unpickle here (or a rank that gave nothing):
    `remote_type`, `rank`, `node`, `remote_traceback` say what and where."""

    def __init__(
        self, message: str, *, remote_type: str = "", rank: int = -1, node: str = ""
    ) -> None:
        super().__init__(message)
        self.remote_type = remote_type
        self.rank = rank
        self.node = node
        self.remote_traceback = ""


class Results(Sequence[T], Generic[T]):
    """Every rank's return value in rank order. A value whose pickle is above the call's
    limit stays in the run folder until it is read (`lazy` lists those ranks)."""

    def __init__(self, folder: Path, world: int, limit: int) -> None:
        self._folder = folder
        self._values: list[Any] = []
        for rank in range(world):
            path = folder / (files.RESULT % rank)
            self._values.append(_UNREAD if path.stat().st_size > limit else _load(path))

    @property
    def lazy(self) -> list[int]:
        """The ranks whose result is still only a file."""
        return [rank for rank, value in enumerate(self._values) if value is _UNREAD]

    def path(self, rank: int) -> Path:
        return self._folder / (files.RESULT % rank)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[T, list[T]]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        rank = range(len(self._values))[index]
        if self._values[rank] is _UNREAD:
            self._values[rank] = _load(self.path(rank))
        value: T = self._values[rank]
        return value

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # a mutable cache: as a list

    def __repr__(self) -> str:
        shown = [
            f"<rank {r}: not loaded>" if v is _UNREAD else repr(v)
            for r, v in enumerate(self._values)
        ]
        return f"Results([{', '.join(shown)}])"


def _load(path: Path) -> Any:
    with open(path, "rb") as fh:
        return files.cloudpickle().load(fh)


def outcome(folder: Path, world: int, limit: int, ended: Callable[[], str]) -> Results[Any]:
    """The results, or the exception of the rank that failed first; `ended()` says how
    the run ended (asked only for an error: it reads the record)."""
    missing = [r for r in range(world) if not (folder / (files.RESULT % r)).exists()]
    first = first_error(folder) if missing else None
    if first is not None:
        raise rebuilt(first, ended())
    if missing:
        ranks = ", ".join(map(str, missing))
        raise RemoteError(f"rank {ranks} gave no result: {ended()}")
    return Results(folder, world, limit)


def first_error(folder: Path) -> Optional[dict[str, Any]]:
    """The error a rank wrote first (the others were ended after it, or failed of it)."""
    found = []
    for path in folder.glob("error-*.pkl"):
        try:
            found.append(pickle.loads(path.read_bytes()))
        except (OSError, pickle.UnpicklingError, EOFError):
            continue
    return min(found, key=lambda info: (info["time"], info["rank"])) if found else None


def rebuilt(info: dict[str, Any], ended: str) -> BaseException:
    """The rank's exception as its own type when it unpickles here, else RemoteError;
    notes: the rank, its node, the remote traceback."""
    exc: Optional[BaseException] = None
    if info.get("exception") is not None:
        try:
            loaded = files.cloudpickle().loads(info["exception"])
            exc = loaded if isinstance(loaded, BaseException) else None
        except Exception:  # a type this side cannot import or build
            exc = None
    if exc is None:
        exc = RemoteError(
            f"{info['type']}: {info['message']}",
            remote_type=info["type"],
            rank=info["rank"],
            node=info["node"],
        )
    if isinstance(exc, RemoteError):
        exc.remote_traceback = info["traceback"]
    for note in (
        f"raised on rank {info['rank']}, node {info['node']} ({ended})",
        "remote traceback:\n" + info["traceback"].rstrip(),
    ):
        _add_note(exc, note)
    return exc


def _add_note(exc: BaseException, note: str) -> None:
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        exc.__notes__ = notes  # type: ignore[attr-defined,unused-ignore]  # Python < 3.11: the same attribute, shown by 3.11's traceback
    notes.append(note)
