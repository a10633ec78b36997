"""hpclaunch stage guard: puts staged data on a node and takes it away again.

Runs on every node of a job, one task per node, as a background step beside the ranks
(``srun --overlap ... python3 -I -S <run_dir>/stage_node.py run <run_dir>/stage.json``),
and in-process for the local backend. It is a copy in the run directory and runs with
the nodes' own python3, so: standard library only, Python >= 3.6 (LUMI's compute nodes
run SLES's 3.6), never imports the hpclaunch package (the rules: hpclaunch/node/__init__.py,
which also holds the host's definition of the constants below marked "shared"). The run
directory knows it as stage_node.py. It must stay one file (it is copied alone into the
run directory and run with ``-I``, which puts no folder of it on sys.path), hence its
length. Per node it:

1. removes this user's node-local folders of jobs that no longer run (a node crash left
   them; only folders this user owns, never a running job's or a local run's);
2. makes the job's node-local folder fresh under ``$HPCLAUNCH_LOCAL_PARENT``
   (``mkdtemp``: mode 700, an unpredictable name ``hpclaunch-<jobid>[-a<N>].<random>``,
   so nothing another user planted at a predictable path is used or gets in the way),
   records its path in ``$HPCLAUNCH_LOCAL_RECORD/<node>.<jobid>[-a<N>]`` for the ranks
   (the bootstrap reads it and sets ``$HPCLAUNCH_LOCAL``), and unpacks every staged item
   into ``<folder>/data/<NAME>`` (``tar -xf``; a single file is copied; a SquashFS
   image is unpacked with unsquashfs unless the container binds it);
3. writes ``<run_dir>/stage/ready-<node>`` (or ``failed-<node>`` with the reason): the
   batch script starts the ranks once every node is ready;
4. waits for SIGUSR1 (sent by the batch script when the ranks are done) or SIGTERM (sent
   by Slurm on scancel and at the time limit), then copies the ``--stage-out`` results back to
   shared storage (a source that is a symlink or resolves outside the folder is refused)
   and removes the folder and its record.

It appends ``stage_ready`` (after 3) and ``stage_done`` (after 4, or after a failed 2) to
``<run_dir>/events.jsonl``.

It must stay one file: it is copied alone into the run directory and runs there. The
host imports its pack checks (link_problems) so that packing and unpacking judge alike.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

# typing's generics, not the builtin ones: Python 3.6 runs this file.
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple  # noqa: F401 - type comments

PREFIX = "hpclaunch-stage: "

# Shared with the host side (hpclaunch/node/__init__.py has the same values; a test
# compares them): this file runs alone, so it cannot import them.
EVENTS = "events.jsonl"
STAGE_READY, STAGE_DONE = "stage_ready", "stage_done"
STAGE_MARKS = "stage"
READY, FAILED = "ready-", "failed-"
DIRECTORY, ARCHIVE, SQUASHFS, FILE = "directory", "archive", "squashfs", "file"
PACK_PART = "part-%02d.tar"
LINKS_PART = "links.tar"
LOCAL_PREFIX = "hpclaunch-"
HPCLAUNCH_LOCAL = "HPCLAUNCH_LOCAL"
HPCLAUNCH_LOCAL_PARENT = "HPCLAUNCH_LOCAL_PARENT"
HPCLAUNCH_LOCAL_RECORD = "HPCLAUNCH_LOCAL_RECORD"
HPCLAUNCH_ATTEMPT = "HPCLAUNCH_ATTEMPT"
HPCLAUNCH_STAGE_MARKS = "HPCLAUNCH_STAGE_MARKS"  # --requeue: the attempt's stage/ folder
HPCLAUNCH_STAGE_BCAST = "HPCLAUNCH_STAGE_BCAST"  # the map of sbcast's node-local copies

# hpclaunch-<jobid>[-a<N>].<random> (a Slurm job's, attempt N of a --requeue job),
# hpclaunch-local-<id>-p<pid>.<random> (a local run's, supervised by process <pid>), and
# hpclaunch-bcast-<jobid>.<random>.<n> (a file sbcast sent, stage_bcast.py: a job stopped
# before its drop step or guards, cancelled or timed out, leaves it; no attempt in its name).
LEFTOVER = re.compile(
    "^" + re.escape(LOCAL_PREFIX)
    + r"(?:(?P<bcast>bcast-)?(?P<job>\d+)(?:-a(?P<attempt>\d+))?"
    + r"|local-(?P<local>\d+)-p(?P<pid>\d+))"
    + r"\.[A-Za-z0-9_]+(?(bcast)\.\d+|)$"
)  # fmt: skip


def say(text: str) -> None:
    sys.stderr.write(PREFIX + text + "\n")
    sys.stderr.flush()


def node_name(env: Mapping[str, str]) -> str:
    # The bootstrap's rule too: the same node has the same name in every file of a run.
    return env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def event(run_dir: str, record: Mapping[str, Any]) -> None:
    """Append one JSON line to the run's events.jsonl (one write on O_APPEND, so lines of
    several nodes never interleave). Events are for watching: nothing here may fail."""
    line = json.dumps(dict(record, time=time.time())) + "\n"
    try:
        fd = os.open(os.path.join(run_dir, EVENTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError:
        return
    try:
        os.write(fd, line.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def live_jobs(user: str) -> Optional[Set[str]]:
    """Job ids of `user` that Slurm still knows (None when squeue cannot tell)."""
    try:
        done = subprocess.run(
            # %A: an array task's own job id (its node-local folder's name), %i: 123_4.
            ["squeue", "-h", "-u", user, "-o", "%A %i"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    ids = set()
    for word in done.stdout.decode().split():
        ids.add(word.split("_")[0].split("+")[0])  # array / het job suffixes
    return ids


def local_tag(env: Mapping[str, str]) -> str:
    """<jobid>, or <jobid>-a<N> for attempt N of a job run with --requeue (Slurm keeps the
    job id across attempts; an earlier attempt's folder is a leftover of this one)."""
    job = env.get("SLURM_JOB_ID") or "0"
    attempt = env.get(HPCLAUNCH_ATTEMPT, "")
    return "%s-a%s" % (job, attempt) if attempt.isdigit() else job


def make_local(parent: str, tag: str) -> str:
    """A new node-local folder: mode 700 whatever the umask, a name nobody can guess
    (mkdtemp), so a folder or symlink another user planted is never used and never in
    the way. A missing parent (a $TMPDIR of the submitting machine) falls back to /tmp."""
    if not os.path.isdir(parent):
        parent = "/tmp"
    import tempfile  # here: the host imports this module for signals_held

    return tempfile.mkdtemp(prefix=LOCAL_PREFIX + tag + ".", dir=parent)


def record_local(record_dir: str, node: str, tag: str, local: str) -> str:
    """Write the folder's path for the ranks of this node (the bootstrap reads it);
    returns the record's path. Written whole (a private temporary file, renamed)."""
    os.makedirs(record_dir, mode=0o700, exist_ok=True)
    path = os.path.join(record_dir, "%s.%s" % (node, tag))
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, local.encode())
    finally:
        os.close(fd)
    os.rename(tmp, path)
    return path


def leftovers(folder: str, tag: str = "", local: bool = False) -> List[str]:
    """This user's node-local folders and broadcast copies (names: LEFTOVER) in `folder`
    but this job's: of other Slurm jobs, and of this job's other attempts (`tag`:
    local_tag(); a copy's name has no attempt, so every copy of this job stays: the drop
    step removes an earlier attempt's). Local runs' folders too when `local` (`hpclaunch
    clean` decides those by their launcher). Only real folders and regular files this
    user owns: never a symlink, never anyone else's."""
    found = []  # type: List[str]
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    uid = os.getuid()
    current, _, my_attempt = tag.partition("-a")
    for name in names:
        match = LEFTOVER.match(name)
        if not match or (match.group("local") and not local):
            continue
        bcast = bool(match.group("bcast"))
        if match.group("job") == current and (
            bcast or (match.group("attempt") or "") == my_attempt
        ):
            continue  # this attempt of this job (another node's, where /tmp is shared)
        path = os.path.join(folder, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        kind = stat.S_ISREG if bcast else stat.S_ISDIR  # lstat: a symlink is neither
        if info.st_uid == uid and kind(info.st_mode):
            found.append(path)
    return found


def remove_leftover(path: str) -> None:
    """Remove what leftovers() found: a folder, or a broadcast copy (a file)."""
    if LEFTOVER.match(os.path.basename(path)).group("bcast"):  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def clean_leftovers(folder: str, user: str, tag: str, dry_run: bool = False) -> List[str]:
    """Remove this user's Slurm jobs' folders whose jobs no longer run, and this job's
    earlier attempts' (one attempt runs at a time); returns what was (or would be)
    removed. Local runs' folders are `hpclaunch clean`'s (it asks their launcher)."""
    candidates = leftovers(folder, tag)
    current = tag.partition("-a")[0]
    if not candidates:
        return []
    live = live_jobs(user or str(os.getuid()))
    if live is None:
        return []  # cannot tell which jobs still run: touch nothing
    removed = []
    for path in candidates:
        job = LEFTOVER.match(os.path.basename(path)).group("job")  # type: ignore[union-attr]
        if job in live and job != current:
            continue
        if not dry_run:
            remove_leftover(path)
        removed.append(path)
    return removed


# Shared path -> this node's copy, sent by sbcast (stage_bcast.py; the batch script names
# its map in $HPCLAUNCH_STAGE_BCAST): read instead of the shared file, removed once used.
COPIES = {}  # type: Dict[str, str]


def broadcast_copies(env: Mapping[str, str]) -> Dict[str, str]:
    """The map's copies that are on this node, regular files and this user's."""
    try:
        with open(env.get(HPCLAUNCH_STAGE_BCAST) or "") as handle:
            sent = json.load(handle)
    except (OSError, ValueError):
        return {}
    found = {}  # type: Dict[str, str]
    for shared, copy in sent.items() if isinstance(sent, dict) else ():
        with contextlib.suppress(OSError):
            info = os.lstat(copy)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                found[shared] = copy
    return found


def source(path: str) -> str:
    """What to read for a shared file: this node's broadcast copy where there is one."""
    return COPIES.get(path, path)


def drop_copies(paths: List[str]) -> None:
    for path in paths:
        copy = COPIES.pop(path, "")
        if copy:
            with contextlib.suppress(OSError):
                os.unlink(copy)


def unpack(item: Mapping[str, Any], local: str) -> None:
    target = os.path.join(local, "data", item["name"])
    os.makedirs(target, exist_ok=True)
    kind, archive = item["kind"], item["archive"]
    if kind == FILE:
        shutil.copy2(source(archive), os.path.join(target, item["file"]))
    elif kind == SQUASHFS:
        if item.get("bound"):
            return  # the container runtime mounts the image itself
        run_all([["unsquashfs", "-q", "-f", "-n", "-d", target, source(archive)]], 1)
    elif kind == DIRECTORY:
        unpack_pack(archive, item.get("parts") or [], target)
        return
    else:  # ARCHIVE
        # GNU tar finds gzip/zstd/xz compression by itself when reading a file.
        run_all([["tar", "-xf", source(archive), "-C", target]], 1)
    drop_copies([archive])


def checked_parts(folder, recorded):
    # type: (str, List[List[Any]]) -> List[str]
    """The pack's parts as stage.json lists them (name, size, mtime_ns, recorded when
    it was packed and checked), each still of that size and mtime and this user's: a
    part replaced or rewritten since (another user, another run) is refused before
    anything is unpacked."""
    if not recorded:
        raise OSError("stage.json lists no parts for the pack %s: submit the run again" % folder)
    names = []  # type: List[str]
    for name, size, mtime_ns in recorded:
        if os.path.basename(name) != name or not (name == LINKS_PART or name.endswith(".tar")):
            raise OSError("stage.json names an odd pack part %r" % name)
        path = os.path.join(folder, name)
        info = os.lstat(path)  # lstat: a symlink is not the part that was packed
        if info.st_uid != os.getuid():
            raise OSError(
                "the pack part %s is not yours (uid %d): refusing it" % (path, info.st_uid)
            )
        if (info.st_size, info.st_mtime_ns) != (size, mtime_ns) or not stat.S_ISREG(info.st_mode):
            raise OSError(
                "the pack part %s changed since it was packed (size %d, mtime %d recorded; "
                "now %d, %d): pack again (hpclaunch clean --stage-cache, then run again)"
                % (path, size, mtime_ns, info.st_size, info.st_mtime_ns)
            )
        names.append(name)
    with contextlib.suppress(OSError):
        os.utime(folder)  # the cache's "last used" time (it prunes the least recently used)
    return names


def unpack_pack(folder, recorded, target):
    # type: (str, List[List[Any]], str) -> None
    """A folder's pack: part 00 holds the folders, the other parts the files, unpacked side
    by side, one per CPU this task may use (the ranks wait for it); the symlinks come
    last, made here from links.tar once each is known to point inside the tree."""
    names = checked_parts(folder, recorded)  # the shared parts' sizes and times
    tars = [["tar", "-xf", source(os.path.join(folder, n)), "-C", target]
            for n in sorted(n for n in names if n != LINKS_PART)]  # fmt: skip
    # Folders first, so that parallel tars never race to create the same parent, and
    # writable meanwhile; part 00 again at the end restores their modes and times.
    run_all(tars[:1], 1)
    for top, _dirs, _files in os.walk(target):
        mode = os.stat(top).st_mode
        if mode & 0o700 != 0o700:
            os.chmod(top, mode | 0o700)
    run_all(tars[1:], cpus())
    if LINKS_PART in names:
        make_links(source(os.path.join(folder, LINKS_PART)), target)
    run_all(tars[:1], 1)
    drop_copies([os.path.join(folder, n) for n in names])


def bad_name(name):
    # type: (str) -> str
    """Why a member name cannot be unpacked as it is ('' when it can): it must be a
    plain relative path, with no '..' , '.' or empty component."""
    if name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        return "%r is not a plain relative path" % name
    return ""


def _resolve(links, folder, target, hops):
    # type: (Mapping[str, str], List[str], str, List[int]) -> Optional[List[str]]
    """Where `target`, read in `folder` (components below the tree's root), leads when the
    tree's own symlinks (`links`: name -> target) are followed as the kernel would follow
    them; None when it leaves the tree (an absolute target, '..' above the root)."""
    if target.startswith("/"):
        return None
    where = list(folder)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                return None
            where.pop()
            continue
        where.append(part)
        link = links.get("/".join(where))
        if link is not None:
            hops[0] += 1
            if hops[0] > 40:  # the kernel's own limit: ELOOP, the link leads nowhere
                return where
            found = _resolve(links, where[:-1], link, hops)
            if found is None:
                return None
            where = found
    return where


def link_problems(links):
    # type: (Mapping[str, str]) -> List[str]
    """What makes a tree's symlinks (name -> target) unsafe to make, in words: a name that
    is not a plain relative path or that lies under another symlink, a target that leads
    out of the tree. The same check runs when packing and on the node."""
    problems = []  # type: List[str]
    for name in sorted(links):
        parts = name.split("/")
        why = bad_name(name)
        if not why and any("/".join(parts[:i]) in links for i in range(1, len(parts))):
            why = "%s lies under another symlink of the tree" % name
        if not why and _resolve(links, parts[:-1], links[name], [0]) is None:
            why = "the symlink %s -> %s points outside the staged folder" % (name, links[name])
        if why:
            problems.append(why)
    return problems


def make_links(part, target):
    # type: (str, str) -> None
    """Make the symlinks links.tar lists, after every folder and file is in place (none
    is followed by the unpacking), and only when all of them point inside the tree."""
    import tarfile  # here: launching imports this module, and submitting needs no tarfile

    with tarfile.open(part, "r:") as tar:
        members = tar.getmembers()
    odd = [m.name for m in members if not m.issym()]
    links = dict((m.name, m.linkname) for m in members if m.issym())
    problems = link_problems(links) + ["%s is not a symlink" % n for n in odd]
    if problems:
        raise OSError("refusing the pack's symlinks: %s" % "; ".join(problems[:3]))
    root = os.path.realpath(target)
    for name in sorted(links):
        path = os.path.join(target, name)
        parent = os.path.dirname(path)
        if os.path.realpath(parent) != os.path.normpath(os.path.join(root, os.path.dirname(name))):
            raise OSError("refusing the symlink %s: its folder is not inside %s" % (name, target))
        os.symlink(links[name], path)


def cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return 1


@contextlib.contextmanager
def signals_held():  # type: () -> Iterator[None]
    """SIGINT, SIGTERM and SIGHUP wait until the block is done, then arrive as sent.

    A handler that raises (Ctrl-C; hpclaunch's SIGTERM in the local backend) inside
    subprocess.Popen, after the fork but before Popen returns, leaves a child nobody
    tracks: a tar that went on unpacking into the folder being removed. Only the main
    thread may change handlers (and only it runs them), so elsewhere nothing is held."""
    held = []  # type: List[int]
    old = {}  # type: Dict[int, Any]
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for number, handler in old.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        for number in held:
            os.kill(os.getpid(), number)  # its own handler now runs, as if sent just now


def run_all(commands: List[List[str]], width: int) -> None:
    """Run the commands, at most `width` at a time; raise OSError on the first failure."""
    pending = list(commands)
    running = []  # type: List[Tuple[str, subprocess.Popen[bytes]]]
    failure = ""
    try:
        while pending or running:
            while pending and len(running) < width and not failure:
                argv = pending.pop(0)
                with signals_held():  # tracked before an interruption can end the start
                    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
                    running.append((argv[0], proc))
            if not running:
                break
            name, proc = running[0]
            _, err = proc.communicate()
            running.pop(0)
            if proc.returncode != 0 and not failure:
                failure = "%s failed: %s" % (name, err.decode(errors="replace").strip())
    except BaseException:
        # Interrupted: no unpacking may go on writing into a folder about to be removed.
        for _, proc in running:
            proc.kill()
            proc.wait()
        raise
    if failure:
        raise OSError(failure)


def merge_tree(src: str, dest: str) -> None:
    """copytree into a folder that may exist (dirs_exist_ok needs Python 3.8)."""
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(src):
        path, target = os.path.join(src, name), os.path.join(dest, name)
        if os.path.islink(path):
            if os.path.lexists(target):
                os.unlink(target)
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path):
            merge_tree(path, target)
        else:
            shutil.copy2(path, target)


def inside(local: str, path: str) -> bool:
    """Whether `path` is no symlink and resolves inside the node-local folder."""
    root = os.path.realpath(local)
    return not os.path.islink(path) and os.path.realpath(path).startswith(root + os.sep)


def stage_out(spec: Mapping[str, Any], local: str, node: str) -> bool:
    """Copy each --stage-out SRC (relative to the node-local folder) to DEST, per node
    when the job has more than one node. A SRC that is a symlink or resolves outside the
    folder is refused (a program's or anyone's link would copy other files out). Errors
    are reported, never fatal: cleanup follows. Returns whether every SRC was copied."""
    ok = True
    for src, dest in spec.get("stage_out", []):
        path = os.path.join(local, src)
        if spec.get("nodes", 1) > 1:
            dest = os.path.join(dest, node)
        if os.path.lexists(path) and not inside(local, path):
            say("--stage-out: %s is a symlink or leads out of the node-local folder on %s; "
                "nothing copied" % (path, node))  # fmt: skip
            ok = False
            continue
        try:
            if os.path.isdir(path):
                merge_tree(path, dest)
            elif os.path.exists(path):
                os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
                shutil.copy2(path, dest)
            else:
                say("--stage-out: %s does not exist on %s; nothing copied" % (path, node))
                ok = False
                continue
            say("--stage-out: %s -> %s" % (path, dest))
        except OSError as exc:
            say("--stage-out: copying %s to %s failed on %s: %s" % (path, dest, node, exc))
            ok = False
    return ok


def open_local(env: Mapping[str, str], node: str) -> Tuple[str, str]:
    """Steps 1 and 2a: leftovers, then the job's fresh folder on this node and its record
    for the ranks; returns (folder, record)."""
    parent = env.get(HPCLAUNCH_LOCAL_PARENT) or "/tmp"
    tag = local_tag(env)
    for path in clean_leftovers(parent, env.get("USER", ""), tag):
        say("removed %s (a job or an attempt that no longer runs)" % path)
    local = make_local(parent, tag)
    try:
        return local, record_local(env[HPCLAUNCH_LOCAL_RECORD], node, tag, local)
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise


def prepare(spec: Mapping[str, Any], local: str) -> None:
    """Step 2b: the staged data unpacked in the (new, private) node-local folder."""
    for item in spec.get("items", []):
        unpack(item, local)


def finish(spec: Mapping[str, Any], local: str, node: str, record: str = "") -> bool:
    """Step 4: --stage-out, then the node-local folder goes; returns whether both worked."""
    ok = stage_out(spec, local, node)
    drop_copies(list(COPIES))  # what a failed unpack left
    shutil.rmtree(local, ignore_errors=True)
    if record:
        with contextlib.suppress(OSError):
            os.unlink(record)
    return ok and not os.path.lexists(local)


class _Stop:
    asked = False
    waiting = False


class _Stopped(Exception):
    pass


def _on_term(signum: int, frame: object) -> None:
    _Stop.asked = True
    if _Stop.waiting:  # break out of pause(), also between the check and the call
        raise _Stopped()


def _mark(run_dir: str, what: str, node: str, text: str = "") -> None:
    """<run_dir>/stage/<what><node> (what: READY or FAILED), written whole or not at all."""
    folder = os.environ.get(HPCLAUNCH_STAGE_MARKS) or os.path.join(run_dir, STAGE_MARKS)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, ".%s%s.%d" % (what, node, os.getpid()))
    with open(tmp, "w") as handle:
        handle.write(text)
    os.rename(tmp, os.path.join(folder, what + node))


def run(spec_path: str) -> int:
    # SIGUSR1: the batch script's "the ranks are done" (srun forwards it to the tasks;
    # SIGTERM to srun would make it kill the step outright). SIGTERM: scancel or the time
    # limit, from Slurm to every step. Both end the same way: stage-out, then cleanup.
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_term)
    signal.signal(signal.SIGCONT, signal.SIG_IGN)
    with open(spec_path) as handle:
        spec = json.load(handle)
    env = os.environ
    node = node_name(env)
    run_dir = spec["run_dir"]
    started = time.time()
    local = record = ""
    try:
        local, record = open_local(env, node)
        COPIES.update(broadcast_copies(env))
        prepare(spec, local)
    except OSError as exc:
        say("staging failed on %s: %s" % (node, exc))
        _mark(run_dir, FAILED, node, str(exc))
        if local:
            finish({}, local, node, record)
        event(run_dir, {"event": STAGE_DONE, "node": node, "ok": False})
        return 1
    _mark(run_dir, READY, node, "%.3f" % (time.time() - started))
    event(run_dir, {"event": STAGE_READY, "node": node})
    try:
        _Stop.waiting = True
        while not _Stop.asked:
            signal.pause()  # until SIGTERM: the ranks are done, cancelled or out of time
    except _Stopped:
        pass
    _Stop.waiting = False
    ok = finish(spec, local, node, record)
    event(run_dir, {"event": STAGE_DONE, "node": node, "ok": ok})
    return 0


def main(argv: List[str]) -> int:
    if len(argv) == 3 and argv[1] == "run":
        return run(argv[2])
    if len(argv) >= 2 and argv[1] == "clean":
        folder = argv[2] if len(argv) > 2 else "/tmp"
        dry = "--dry-run" in argv
        for path in clean_leftovers(folder, os.environ.get("USER", ""), "", dry):
            print(("would remove " if dry else "removed ") + path)
        return 0
    sys.stderr.write("usage: stage_node.py run STAGE_JSON | clean [FOLDER] [--dry-run]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
