"""`hpclaunch profile init NAME`: a cluster profile for any Slurm site, made by asking it.

What the site says of itself, asked once each: `scontrol show config` (cluster name,
Slurm version, SelectType: whether --gpus-per-node is understood), `sinfo` with GRES and
features (partitions, GPUs, cores, memory, times), `scontrol show partition` (default
and maximum times, whole-node partitions, QoS), `scontrol show node` of one node of the
default partition (its CPU architecture), and `sacctmgr show qos` where accounting
answers, then `sacctmgr show assoc` of the user (the accounts, partitions and QoS they may
use, written as a fact to check `-A`/`--qos` against by eye). Nothing is asked of the
user. What is a guess is listed in the profile's `unverified` and said in its [sources]."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from datetime import date
from typing import Optional

from hpclaunch.basics.units import format_memory, format_time, parse_time
from hpclaunch.slurm import commands, discover

_TIMEOUT_S = 30.0
_NO_TIME = ("infinite", "unlimited", "n/a", "none")


@dataclass
class PartitionFacts:
    nodes: int = 0
    cpus: int = 0
    gpus: int = 0
    memory_mb: int = 0
    features: set[str] = field(default_factory=set)
    max_time: Optional[int] = None
    default_time: Optional[int] = None
    max_nodes: Optional[int] = None
    whole_node: bool = False
    qos: str = ""


@dataclass
class SiteFacts:
    cluster: str
    version: str
    select_type: str
    default_partition: str
    partitions: dict[str, PartitionFacts]
    arch: str = ""  # "" = not found
    qos_names: Optional[list[str]] = None  # None: accounting does not answer
    job_submit: str = ""  # JobSubmitPlugins: the site filters jobs by rules not listed here
    user: str = ""
    # (account, partition or "", QoS names) per association; None: not asked or no answer
    assoc: Optional[list[tuple[str, str, str]]] = None


def _query(argv: list[str]) -> Optional[str]:
    return commands.query(argv, timeout=_TIMEOUT_S)


def _seconds(text: str) -> Optional[int]:
    if not text or text.lower() in _NO_TIME:
        return None
    return parse_time(text, "Slurm time")


def _int(text: str) -> int:
    text = text.strip().rstrip("+")
    return int(text) if text.isdigit() else 0


def _sinfo() -> tuple[dict[str, PartitionFacts], str]:
    """Partitions from sinfo (one row per node shape): the largest node, GRES, features."""
    out = _query(["sinfo", "-h", "-o", "%P|%l|%L|%D|%c|%G|%m|%f|%s"]) or ""
    found: dict[str, PartitionFacts] = {}
    default = ""
    for line in out.splitlines():
        cells = line.split("|")
        if len(cells) != 9:
            continue
        name, limit, default_limit, count, cpus, gres, mem, features, max_nodes = cells
        if name.endswith("*"):
            name = default = name.rstrip("*")
        part = found.setdefault(name, PartitionFacts())
        part.nodes += _int(count)
        part.cpus = max(part.cpus, _int(cpus))
        part.gpus = max(part.gpus, discover.gres_gpus(gres))
        part.memory_mb = max(part.memory_mb, _int(mem))
        part.features |= {f for f in features.split(",") if f and f != "(null)"}
        part.max_time = _seconds(limit)
        part.default_time = _seconds(default_limit)
        part.max_nodes = _int(max_nodes.rpartition("-")[2]) or None
    return found, default


def _scontrol_partitions(found: dict[str, PartitionFacts]) -> None:
    """Whole-node partitions (OverSubscribe=EXCLUSIVE) and a partition's QoS."""
    out = _query(["scontrol", "show", "partition", "-o"]) or ""
    for line in out.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        part = found.get(words.get("PartitionName", ""))
        if part is None:
            continue
        part.whole_node = words.get("OverSubscribe", "").startswith("EXCLUSIVE")
        part.qos = "" if words.get("QoS", "N/A") == "N/A" else words["QoS"]
        if part.default_time is None:
            part.default_time = _seconds(words.get("DefaultTime", ""))


def _arch(partition: str) -> str:
    """The CPU architecture of one node of `partition` (scontrol show node's Arch)."""
    listed = _query(["sinfo", "-h", "-N", "-p", partition, "-o", "%N"]) or ""
    first = listed.split("\n", 1)[0].strip()
    if not first:
        return ""
    shown = _query(["scontrol", "show", "node", "-o", first]) or ""
    words = dict(w.split("=", 1) for w in shown.split() if "=" in w)
    arch = words.get("Arch", "")
    return arch if arch in ("x86_64", "aarch64") else ""


def _assoc(user: str) -> Optional[list[tuple[str, str, str]]]:
    """The user's associations: which accounts (and partitions, QoS) they may use."""
    argv = ["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}"]
    out = _query([*argv, "format=Account,Partition,QOS"])
    if out is None:
        return None
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return [(row[0], row[1], row[2]) for row in rows if len(row) >= 3 and row[0]]


def ask_site(user: str = "") -> SiteFacts:
    """Everything the site says of itself (raises NoController when Slurm is silent);
    `user`'s associations too where accounting answers."""
    config = discover.slurm_config()
    if config is None:
        raise discover.no_controller("profile init asks Slurm", discover.slurm_signs({}))
    partitions, default = _sinfo()
    _scontrol_partitions(partitions)
    qos = _query(["sacctmgr", "-n", "-P", "show", "qos", "format=Name"])
    return SiteFacts(
        cluster=config.get("ClusterName", ""),
        version=config.get("SLURM_VERSION", ""),
        select_type=config.get("SelectType", ""),
        default_partition=default,
        partitions=partitions,
        arch=_arch(default) if default else "",
        qos_names=None if qos is None else [q for q in qos.split() if q],
        job_submit=config.get("JobSubmitPlugins", "").replace("(null)", ""),
        user=user,
        assoc=_assoc(user) if qos is not None and user else None,
    )


def _toml(value: object) -> str:
    """A TOML value: JSON's strings, numbers, booleans and arrays are TOML's."""
    return json.dumps(value)


def profile_text(name: str, site: SiteFacts) -> str:
    """The profile file: facts from the site, sources saying where, guesses marked."""
    asked = f"asked {date.today().isoformat()}"
    default = site.partitions.get(site.default_partition, PartitionFacts())
    unverified = []
    arch = site.arch
    if not arch:  # no node answered: this machine's is a guess
        arch = platform.machine()
        unverified.append("arch")
    cons_tres = site.select_type.endswith("cons_tres")
    if not cons_tres:
        unverified.append("gpu_request")
    described = f"{site.cluster or name} (Slurm {site.version}), from profile init"
    lines = [
        f"# Written by `hpclaunch profile init {name}` from what Slurm on "
        f"{site.cluster or 'this cluster'} said of itself ({asked}).",
        "# The facts in `unverified` are guesses: check them, and fix this file.",
        f"name = {_toml(name)}",
        f"description = {_toml(described)}",
        'kind = "slurm"',
        "discover = true  # partitions not described here are read with sinfo at each run",
        f"detect_cluster_names = {_toml([site.cluster] if site.cluster else [])}",
        f"default_partition = {_toml(site.default_partition)}",
        f"arch = {_toml(arch)}",
        f"one_task_per_gpu = {_toml(default.gpus > 0)}",
        f"unverified = {_toml(unverified)}",
        "",
    ]
    if not cons_tres:  # --gpus-per-node needs select/cons_tres; GRES works everywhere
        lines += ["[sbatch_lines]", 'gpus-per-node = "--gres=gpu:{}"', ""]
    lines += ["[node]", f"cpus = {default.cpus}", f"gpus = {default.gpus}"]
    if default.memory_mb:
        lines.append(f"memory = {_toml(format_memory(default.memory_mb))}")
    if default.gpus and default.cpus:
        lines.append(f"cpus_per_gpu = {default.cpus // default.gpus}")
    lines.append("")
    for pname, part in sorted(site.partitions.items()):
        lines += _partition_lines(pname, part)
    lines += _sources_lines(site, asked, cons_tres)
    return "\n".join(lines) + "\n"


def _partition_lines(name: str, part: PartitionFacts) -> list[str]:
    lines = [f"[partitions.{_toml(name)}]", f"nodes = {part.nodes}"]
    if part.max_time is not None:
        lines.append(f"max_time = {_toml(format_time(part.max_time))}")
    if part.default_time is not None:
        lines.append(f"default_time = {_toml(format_time(part.default_time))}")
    if part.max_nodes:
        lines.append(f"max_nodes = {part.max_nodes}")
    lines += [f"whole_node = {_toml(part.whole_node)}", f"cpus = {part.cpus}",
              f"gpus = {part.gpus}", f"memory_mb = {part.memory_mb}"]  # fmt: skip
    if part.features:
        lines.append(f"# features (--constraint): {', '.join(sorted(part.features))}")
    if part.qos:
        lines.append(f"# the partition's QoS: {part.qos}")
    return [*lines, ""]


def _sources_lines(site: SiteFacts, asked: str, cons_tres: bool) -> list[str]:
    where = f"{site.cluster or 'the cluster'}, {asked}"
    sources = {
        "gpus": f"sinfo %G (GRES) on {where}",
        "cpus": f"sinfo %c on {where}",
        "memory": f"sinfo %m on {where}",
        "partition": f"sinfo and scontrol show partition on {where}",
        "arch": f"scontrol show node (Arch) on {where}"
        if site.arch
        else "guessed: this machine's (no node answered)",
        "gpu_request": f"scontrol show config: SelectType={site.select_type} on {where}"
        if cons_tres
        else f"guessed from SelectType={site.select_type} (no cons_tres: --gres)",
        "slurm_version": f"scontrol show config: SLURM_VERSION={site.version}",
        "accounting": "sacctmgr does not answer (no accounting here)"
        if site.qos_names is None
        else f"sacctmgr show qos answers: {', '.join(site.qos_names) or '(none)'}",
    }
    if site.assoc is not None:
        sources["accounts"] = f"sacctmgr show assoc user={site.user}: " + (
            "; ".join(_assoc_text(row) for row in site.assoc) or "(none)"
        )
    if site.job_submit:  # its rules reject jobs: add them as [[rules]] once known
        sources["rules"] = f"unknown: the site filters jobs (JobSubmitPlugins={site.job_submit})"
    return ["[sources]", *(f"{k} = {_toml(v)}" for k, v in sources.items())]


def _assoc_text(row: tuple[str, str, str]) -> str:
    """'proj1 (partition gpu, QoS normal,gpuqos)': one association as a fact."""
    account, partition, qos = row
    said = [f"partition {partition}" if partition else "", f"QoS {qos}" if qos else ""]
    inside = ", ".join(part for part in said if part)
    return f"{account} ({inside})" if inside else account
