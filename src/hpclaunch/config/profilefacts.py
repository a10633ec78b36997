"""What `hpclaunch profile list` and `profile show NAME` say: the profiles there are
(built-in, the user's own, which one overrides which) and one profile's facts, each with
its source and whether it is unverified (a profile's `sources` and `unverified`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpclaunch.basics.units import format_memory, format_time
from hpclaunch.config.options import BY_NAME
from hpclaunch.config.profiles import (
    BUILTIN,
    Profile,
    list_user_profiles,
    load_profile,
    user_profile_dir,
)
from hpclaunch.errors import UserError


def listing(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every profile by name: where it comes from and what it describes."""
    users = set(list_user_profiles(environ))
    rows = []
    for name in sorted(set(BUILTIN) | users):
        origin = "built-in" if name in BUILTIN else "yours"
        if name in BUILTIN and name in users:
            origin = "built-in, overridden by yours"
        try:
            described = load_profile(name, None, environ).description
        except UserError as exc:  # a damaged user file: listed, with its one line
            described = f"(unreadable: {exc.render()})"
        file = str(user_profile_dir(environ) / f"{name}.toml") if name in users else ""
        rows.append({"name": name, "origin": origin, "description": described, "file": file})
    return rows


def _partitions(profile: Profile) -> str:
    shown = []
    for name, part in profile.partitions.items():
        limit = f" (at most {format_time(part.max_time)})" if part.max_time else ""
        mark = "*" if name == profile.default_partition_name() else ""
        shown.append(f"{name}{mark}{limit}")
    return ", ".join(shown)


def facts(profile: Profile) -> list[dict[str, Any]]:
    """The profile's facts in a fixed order: fact, value, source, unverified."""
    node = profile.node
    part = profile.partition(profile.default_partition_name())
    default_time = part.default_time if part else None
    gpu_line = profile.sbatch_lines.get("gpus-per-node", BY_NAME["gpus-per-node"].line)
    values: dict[str, str] = {
        "gpus": str(node.gpus),
        "cpus": "" if node.cpus is None else str(node.cpus),
        "memory": "" if node.memory_mb is None else format_memory(node.memory_mb),
        "arch": profile.arch,
        "partition": _partitions(profile),
        "default_time": "" if default_time is None else format_time(default_time),
        "max_time": "",
        "gpu_request": gpu_line,
        "companions": " ".join(profile.sbatch_args),
        "account": profile.account_pattern or ("required" if profile.account_required else ""),
        "rendezvous": f"<first node>{profile.rendezvous_suffix}",
        "network": " ".join(f"{k}={v}" for k, v in profile.env.items()),
        "container": profile.container.runtime,
        "binding": f"--cpu-bind={profile.cpu_bind}" if profile.cpu_bind != "none" else "none given",
        "cpu_partition": ", ".join(n for n, p in profile.partitions.items() if p.gpus == 0)
        or "none",
        "min_poll_interval": f"{profile.min_poll_interval} s",
        "rules": "; ".join(rule.message for rule in profile.rules),
    }
    for key in profile.sources:  # a fact a profile cites that has no value above
        values.setdefault(key, "")
    rows = []
    for fact, value in values.items():
        source = profile.sources.get(fact, "")
        if not value and not source:
            continue
        rows.append(
            {"fact": fact, "value": value, "source": source,
             "unverified": fact in profile.unverified}
        )  # fmt: skip
    return rows


def show_text(profile: Profile, rows: list[dict[str, Any]]) -> str:
    """`profile show NAME`'s table: fact, value, source; unverified facts marked."""
    lines = [f"{profile.name}: {profile.description}"]
    width = max((len(r["fact"]) for r in rows), default=4)
    for row in rows:
        source = row["source"] or "-"
        if row["unverified"]:
            source = "UNVERIFIED" + source.removeprefix("unverified")
        lines.append(f"  {row['fact']:<{width}}  {row['value'] or '-'}")
        lines.append(f"  {'':<{width}}  source: {source}")
    unverified = [r["fact"] for r in rows if r["unverified"]]
    if unverified:
        lines.append(
            f"unverified: {', '.join(unverified)} (no public source was checked for these; "
            f"override them in {profile.name}.toml of your clusters folder)"
        )
    return "\n".join(lines)
