"""`hpclaunch logs`: a run's output, tagged [node rank], optionally followed to its end."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TextIO, Union

import click

from hpclaunch.cli.common import RUN_OR_LAST, all_projects_option, environ, find_run_dir
from hpclaunch.observe.logs import AttemptFollower, LogFollower, safe_write

if TYPE_CHECKING:
    from hpclaunch.records.runrecord import RunRecord


@click.command("logs", epilog=RUN_OR_LAST)
@click.argument("run", default="last")
@click.option("--rank", type=int, default=None, help="Only this rank's output.")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing new output until the run ends; then its summary line, and its "
    "exit code as ours.",
)
@click.option(
    "--attempt",
    type=int,
    default=None,
    help="A requeued run's attempt N (0, 1, ...): its ranks' output; default the latest.",
)
@click.option("--no-tag", is_flag=True, help="Print lines without the [node rank] prefix.")
@click.option(
    "-n",
    "--tail",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Only the last N lines of the output so far (then, with --follow, every new one).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="The output so far (with --follow, to the run's end), one JSON object per line: "
    "run_id, node, rank, text.",
)
@all_projects_option
def logs_cmd(
    run: str,
    rank: Optional[int],
    follow: bool,
    attempt: Optional[int],
    no_tag: bool,
    tail: Optional[int],
    as_json: bool,
    all_projects: bool,
) -> int:
    """Print a run's output, each line tagged [node rank]; stderr lines go to stderr.
    A run with --requeue shows its latest attempt (--attempt N for another)."""
    from hpclaunch.errors import UserError
    from hpclaunch.handle import Run
    from hpclaunch.records import runrecord
    from hpclaunch.records.runpaths import attempt_numbers, rank_logs

    run_dir = find_run_dir(run, all_projects)
    record = runrecord.load(run_dir)
    if rank is not None and (rank < 0 or (record.world_size and rank >= record.world_size)):
        top = f"0 to {record.world_size - 1}" if record.world_size else "at least 0"
        raise UserError("--rank", f"{rank}", f"{record.run_id} has ranks {top}", "Pick one of them")
    if attempt is not None:
        numbers = attempt_numbers(run_dir)
        if attempt not in numbers:
            has = f"attempts {numbers[0]} to {numbers[-1]}" if numbers else "no attempts"
            raise UserError(
                "--attempt", str(attempt), f"{record.run_id} has {has}", "Pick one of them"
            )
        if follow:
            raise UserError("--attempt", "with --follow", "", "Follow without --attempt")
    if as_json and not follow:  # a listing: one object per line of output (docs/json.md)
        _list_as_json(Run(run_dir).logs(rank, attempt), record.run_id, tail)
        return 0
    # --follow --json: a stream, every line (stdout's and stderr's) one object on stdout.
    streamed = _JsonLines(record.run_id) if as_json else None
    base_out, base_err = (streamed, streamed) if streamed is not None else (sys.stdout, sys.stderr)
    kept: deque[tuple[_Tail, str]] = deque(maxlen=tail)
    tails = [_Tail(base_out, kept), _Tail(base_err, kept)] if tail is not None else []
    out, err = (tails[0], tails[1]) if tails else (base_out, base_err)
    no_tag = no_tag and streamed is None  # the tag is what the objects' node and rank come from
    follower: Union[LogFollower, AttemptFollower]
    if attempt is not None:
        follower = LogFollower(
            rank_logs(run_dir, attempt),
            out,
            err,
            rank=rank,
            include_batch=False,
            tag=not no_tag,
        )
    else:
        follower = AttemptFollower(
            run_dir / "logs",
            out,
            err,
            rank=rank,
            include_batch=rank is None,
            tag=not no_tag,
        )
    follower.poll()
    if tails:  # what is there now: its last lines, in the order written; then all that is new
        _Tail.release(tails)
    ended = _follow(follower, run_dir, record.cluster) if follow else None
    follower.drain()
    if streamed is not None:
        streamed.finish()
    if ended is None:
        return 0
    # Followed to its end: the run's own summary line and exit code, as `run --wait` ends.
    from hpclaunch.basics import states
    from hpclaunch.cli.common import coloured_states
    from hpclaunch.cli.reporting import summary

    click.echo(f"hpclaunch: {coloured_states(summary(ended))}", err=True)
    if ended.exit_code is not None:
        return ended.exit_code
    return 0 if ended.state == states.State.COMPLETED.value else 1


def _list_as_json(output: str, run_id: str, tail: Optional[int]) -> None:
    lines = output.splitlines()
    if tail is not None:
        lines = lines[-tail:] if tail else []
    for line in lines:
        click.echo(json.dumps({"run_id": run_id, **_tagged(line)}))


def _follow(
    follower: Union[LogFollower, AttemptFollower], run_dir: Path, cluster: str
) -> Optional[RunRecord]:
    """Until the run has ended (its record), or Ctrl-C (None): handle.follow_to_end, the
    one wait loop under the cluster's min_poll_interval."""
    from hpclaunch.handle import follow_to_end
    from hpclaunch.observe.waiting import for_cluster

    backoff = for_cluster(cluster, environ())
    ended = None
    with contextlib.suppress(KeyboardInterrupt):
        ended = follow_to_end(run_dir, follower, backoff=backoff)
    time.sleep(0.3)
    return ended


class _Tail(io.StringIO):
    """stdout or stderr of `logs --tail N` until release: the lines written go to a deque
    both streams share, so the last N of them stay, in the order written (memory for N
    lines, whatever the log's size); release prints them, then writes go through."""

    def __init__(self, stream: TextIO, kept: deque[tuple[_Tail, str]]) -> None:
        super().__init__()
        self._stream = stream
        self._kept: Optional[deque[tuple[_Tail, str]]] = kept

    def write(self, text: str) -> int:
        if self._kept is None:
            safe_write(self._stream, text)
        else:
            self._kept.extend((self, line) for line in text.splitlines(True))
        return len(text)

    def flush(self) -> None:
        if self._kept is None:
            self._stream.flush()

    def isatty(self) -> bool:  # the tags' colours are decided by the real stream
        return self._stream.isatty()

    @staticmethod
    def release(streams: list[_Tail]) -> None:
        kept = streams[0]._kept or deque()
        for stream in streams:
            stream._kept = None
        for stream, line in kept:
            safe_write(stream._stream, line)
        for stream in streams:
            stream._stream.flush()


class _JsonLines(io.StringIO):
    """What `logs --follow --json` prints to: each line the followers write (tagged, from
    stdout or stderr) becomes one object on stdout, as `logs --json` lists the output so
    far; a line not ended yet waits for its end (or `finish`)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self._run_id = run_id
        self._part = ""

    def write(self, text: str) -> int:
        *lines, self._part = (self._part + text).split("\n")
        for line in lines:
            click.echo(json.dumps({"run_id": self._run_id, **_tagged(line)}))
        return len(text)

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:  # plain tags, whole lines: what the objects are made of
        return False

    def finish(self) -> None:
        if self._part:
            self.write("\n")


_TAG = re.compile(r"\[(\S+) (\d+)\] ?(.*)", re.DOTALL)


def _tagged(line: str) -> dict[str, object]:
    """`[node rank] text` -> its parts; a line of the batch shell has no node or rank."""
    found = _TAG.fullmatch(line)
    if found is None:
        return {"node": None, "rank": None, "text": line}
    return {"node": found.group(1), "rank": int(found.group(2)), "text": found.group(3)}
