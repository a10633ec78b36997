"""A directory's pack, part by part: written by tar, read back with tarfile against the
listing it was made from (stage.py packs, node/stage_guard.py unpacks), and described
for stage.json by each part's size and mtime, which the guard checks before unpacking.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hpclaunch.errors import UserError
from hpclaunch.node import LINKS_PART, PACK_PART

if TYPE_CHECKING:
    import tarfile

# tarfile and the guard's link rule are imported where a pack is read back: every run
# imports this module (stage.json's part facts), few runs pack.


def tar_part(src: str, tmp: Path, part: str, names: list[str]) -> None:
    """One part: exactly these names, none recursed into; a hard link is stored as the
    file it is (--hard-dereference), so that every member is a folder, a file or a link."""
    listing = tmp / f".list-{part}"
    listing.write_bytes(b"".join(os.fsencode(rel) + b"\0" for rel in names))
    done = subprocess.run(
        ["tar", "-cf", str(tmp / part), "-C", src, "--no-recursion", "--hard-dereference",
         "--null", "-T", str(listing)],
        stderr=subprocess.PIPE,
        check=False,
    )  # fmt: skip
    listing.unlink()
    if done.returncode != 0:
        raise UserError(
            "--stage",
            f"packing {src} failed: {done.stderr.decode(errors='replace').strip()}",
            "",
            "Check the folder is readable",
        )


def _kinds() -> dict[bytes, str]:
    import tarfile

    return {tarfile.DIRTYPE: "folder", tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file",
            tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hard link"}  # fmt: skip


def check_pack(src: str, tmp: Path, layout: list[list[str]], links: frozenset[str]) -> None:
    """Read the written parts back (tarfile) against the listing they were made from:
    each holds exactly its names, part 00 only folders, the others only files, links.tar
    only symlinks that point inside the tree, and nothing lies under a symlink. A tree
    changed while it was packed (a folder swapped for a symlink: its files would be
    unpacked through it, anywhere) is refused, and the pack is not kept."""
    from hpclaunch.node.stage_guard import link_problems

    kinds = _kinds()
    expected = [(PACK_PART % i, names, "folder" if i == 0 else "file") for i, names in
                enumerate(layout)]  # fmt: skip
    if links:
        expected.append((LINKS_PART, sorted(links), "symlink"))
    problems: list[str] = []
    targets: dict[str, str] = {}
    for part, names, kind in expected:
        missing = set(names)
        for member in _members(tmp / part):
            found = kinds.get(member.type, "special file")
            if member.name not in missing:
                problems.append(f"{part} holds {member.name}, not listed for it (or twice)")
            elif found != kind:
                problems.append(f"{member.name} is a {found}, listed as a {kind}")
            elif member.issym():
                targets[member.name] = member.linkname
            missing.discard(member.name)
        if missing:
            problems.append(f"{part} lacks {min(missing)}")
    for name in (n for names in layout for n in names):
        link = next((parent for parent in _parents(name) if parent in targets), "")
        if link:
            problems.append(f"{name} lies under the symlink {link}")
    problems += link_problems(targets)
    if problems:
        _refuse(src, problems, only_links=bool(targets) and problems == link_problems(targets))


def _members(path: Path) -> Iterator[tarfile.TarInfo]:
    """A tar's members one by one, none kept: a part may list millions of files."""
    import tarfile

    with tarfile.open(path, "r:") as tar:  # uncompressed: no guessing at compressions
        while True:
            member = tar.next()
            if member is None:
                return
            tar.members = []  # type: ignore[attr-defined]  # next() appends there; not needed
            yield member


def _refuse(src: str, problems: list[str], only_links: bool) -> None:
    more = f" (and {len(problems) - 1} more)" if problems[1:] else ""
    if only_links:
        raise UserError(
            "--stage",
            f"{src}: {problems[0]}{more}",
            "staged symlinks must point inside the staged folder",
            "Point it inside the folder, or replace it by what it points to (cp -L)",
        )
    raise UserError(
        "--stage",
        f"{src}: {problems[0]}{more}",
        "the folder changed while it was packed",
        "Pack it again once nothing changes it (run the command again)",
    )


def _parents(name: str) -> Iterator[str]:
    head = name
    while "/" in head:
        head = head.rpartition("/")[0]
        yield head


def is_part(name: str) -> bool:
    """Whether a file of a pack folder is one of its tars."""
    head, _, tail = PACK_PART.partition("%02d")
    return name == LINKS_PART or (name.startswith(head) and name.endswith(tail))


def part_facts(folder: str) -> list[list[object]]:
    """[name, size, mtime_ns] of each part of a pack, for stage.json: the guard unpacks
    only parts that still match ([] while the pack is not written)."""
    try:
        names = [name for name in os.listdir(folder) if is_part(name)]
    except FileNotFoundError:
        return []
    facts: list[list[object]] = []
    for name in sorted(names):
        info = os.lstat(os.path.join(folder, name))
        facts.append([name, info.st_size, info.st_mtime_ns])
    return facts


MAX_PARTS = 8  # tars a folder is packed into, unpacked side by side on a node
FILES_PER_PART = 2000  # fewer files than this per part are not worth a second process


def split(
    items: list[tuple[str, int, int, bool]], links: frozenset[str] = frozenset()
) -> list[list[str]]:
    """Folders in part 0 (unpacked last, so a read-only folder's mode never blocks the
    files going into it), files spread over the other parts, balanced by bytes; the
    symlinks (`links`) in none of them: links.tar holds them."""
    files = [(rel, size) for rel, size, _, is_dir in items if not is_dir and rel not in links]
    count = max(1, min(MAX_PARTS, len(files) // FILES_PER_PART))
    parts: list[list[str]] = [[rel for rel, _, _, is_dir in items if is_dir]]
    parts += [[] for _ in range(count)]
    load = [0] * count
    for rel, size in files:  # sorted by path: neighbours land in the same part
        i = min(range(count), key=load.__getitem__) if count > 1 else 0
        parts[i + 1].append(rel)
        load[i] += size + 512
    return parts


def parts(folder: str) -> list[str]:
    """A pack's tars in unpack order: the file parts, then part 0 (the folders)."""
    head, _, tail = PACK_PART.partition("%02d")
    names = sorted(n for n in os.listdir(folder) if n.startswith(head) and n.endswith(tail))
    return [os.path.join(folder, n) for n in names[1:] + names[:1]]
