"""hpclaunch doctor's job: one short run of node/doctor_probe.py, submitted like any run
(same profile, masks, container, bootstrap), and the checks read from what its nodes
and ranks wrote: the nodes it got, srun --overlap, the binds on the nodes, node-local
space, the GPUs each node shows, the CPU masks the ranks got, the container and its
network plugin, MASTER_ADDR:MASTER_PORT from every rank, an all-reduce's bandwidth."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

from hpclaunch import launching, node
from hpclaunch.basics import filemodes, shell
from hpclaunch.config.jobspec import JobSpec
from hpclaunch.doctor.checks import FAIL, PASS, WARN, Check, failed, preflight
from hpclaunch.errors import NoController
from hpclaunch.handle import Run

PROBE = "doctor_probe.py"
ALLREDUCE_MIB = 64
LOW_LOCAL_BYTES = 1 << 30  # node-local space below this is a warning (staging needs it)


def probe_folder(planned: launching.Planned) -> Path:
    """Beside the runs of the doctor's experiment: under the run root, which every node
    sees and every container binds."""
    return planned.paths.run_dir.parent / f".doctor-{planned.paths.run_id}"


def options(
    given: Mapping[str, Any], spec: JobSpec, gpus: int, folder: Path, local_dir: str,
    binds: list[str], runs_here: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The doctor's run: the user's choices, the GPUs the nodes really have, a short time,
    no snapshot or watch, and the node probe as an srun --overlap step in --setup."""
    srun = [
        "srun", "--overlap", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1", "--cpus-per-task=1",
    ]  # fmt: skip
    step = [
        *(srun if not runs_here else []),  # the chosen backend's ranks run here: no srun
        "python3", *node.PYTHON_FLAGS, str(folder / PROBE), "node", "--out", str(folder / "out"),
        *(w for b in binds for w in ("--bind", b)),
    ]  # fmt: skip
    setup = [
        # The profile's node-local folder (its own shell text, as the batch script has it).
        f"HPCLAUNCH_DOCTOR_LOCAL={local_dir}",
        f'{shell.command(step)} --local "$HPCLAUNCH_DOCTOR_LOCAL" || '
        f'echo "hpclaunch doctor: {step[0]} failed (exit $?)"',
    ]
    values = {k: v for k, v in given.items() if v is not None}
    values.update(exp="doctor", no_snapshot=True, no_watch=True)
    values["setup"] = (*values.get("setup", ()), *setup)
    values.setdefault("time", "10")
    if gpus:
        values["gpus_per_node"] = gpus
    return values


def program(python: str, folder: Path, plugin: str) -> tuple[str, ...]:
    return (
        python, str(folder / PROBE), "rank", "--out", str(folder / "out"),
        "--plugin", plugin, "--allreduce-mib", str(ALLREDUCE_MIB),
    )  # fmt: skip


def diagnose(
    given: Mapping[str, Any], python: str, timeout_s: float, cwd: Path,
    environ: Mapping[str, str], say: Callable[[str], None],
) -> tuple[list[Check], dict[str, Any]]:  # fmt: skip
    """Every check: those before submitting, then (when none failed) the job's. Also
    what the JSON output adds: the run and the folder the probes wrote."""
    quiet = {**given, "exp": "doctor", "no_snapshot": True, "no_watch": True}
    try:
        first = launching.plan_run(
            launching.LaunchRequest(quiet, ("python3", "-c", "pass"), cwd, environ)
        )
    except NoController as exc:  # Slurm meant here and silent: the controller line FAILs
        return [Check("controller", FAIL, exc.problem, exc.fix)], {"submitted": False}
    spec, profile = first.spec, first.prepared.profile
    checks, gpus = preflight(spec, profile)
    if failed(checks):
        return checks, {"submitted": False}
    folder = probe_folder(first)
    plugin = profile.container.network_plugin if spec.container else ""
    binds = [b.path for b in profile.container.binds] if spec.container else []
    here = first.backend.runs_here
    # A local run's node-local folder is made where Python's tempfile makes folders
    # (backends/local.make_local_dir), whatever the profile's local_dir says.
    local_dir = shell.quote(tempfile.gettempdir()) if here else profile.local_dir
    values = options(given, spec, gpus, folder, local_dir, binds, here)
    req = launching.LaunchRequest(values, program(python, folder, plugin), cwd, environ)
    run, planned, job = run_job(req, folder, timeout_s, say)
    checks += job
    if planned is not None and run is not None:
        nodes, ranks = _outputs(folder, planned.spec)
        batch = run.run_dir / "logs" / "batch.out"
        if nodes or ranks:  # (nothing when the job never started)
            local = planned.backend.runs_here
            checks += node_checks(nodes, planned.spec.nodes, _text(batch), local)
            checks += gpu_checks(ranks, nodes, planned.spec.gpus_per_node, local)
        if ranks:
            checks += cpu_checks(ranks, planned.spec) + rank_checks(ranks, planned.spec, plugin)
        shutil.move(str(folder), str(run.run_dir / "doctor"))
    extra = {"submitted": True, "run_id": run.id if run else None}
    return checks, extra


def _outputs(folder: Path, spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    wait_files(folder, spec.nodes, "node")
    wait_files(folder, spec.ntasks, "rank")
    return read(folder, "node"), read(folder, "rank")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def run_job(
    req: launching.LaunchRequest, folder: Path, timeout_s: float, say: Callable[[str], None]
) -> tuple[Optional[Run], Optional[launching.Planned], list[Check]]:
    """Submit, wait at most timeout_s (cancelled after: nothing is left in the queue)."""
    with filemodes.writing("private"):  # under the run root: made as private as a run's
        filemodes.make_dirs(folder.parent, "private")
        folder.mkdir()
        shutil.copyfile(node.path(PROBE), folder / PROBE)
    planned = launching.plan_run(req)
    started = launching.start(req, planned)
    run = Run(started.paths.run_dir, started)
    say(f"hpclaunch doctor: job {started.job_id} submitted; waiting (at most {timeout_s:.0f} s)")
    try:
        code = run.wait(timeout=timeout_s)
    except TimeoutError:
        state = run.state
        run.cancel()
        detail = f"job {started.job_id} was still {state} after {timeout_s:.0f} s: cancelled"
        fix = "See `squeue --start`; run doctor again when the partition is less busy"
        return run, planned, [Check("job", FAIL, detail, fix)]
    record = run.record
    nodes = ", ".join(record.events.nodes) or "?"
    if code != 0:
        detail = f"job {started.job_id} ended {record.state}, exit code {code} (nodes: {nodes})"
        fix = f"See {started.paths.run_dir / 'logs'} (batch.out, rank-*.err)"
        return run, planned, [Check("job", FAIL, detail, fix)]
    return run, planned, [Check("job", PASS, f"job {started.job_id} ran on {nodes}")]


def read(folder: Path, prefix: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted((folder / "out").glob(prefix + "-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found.append(data)
    return found


def node_checks(
    nodes: list[dict[str, Any]], wanted: int, batch_out: str, local: bool = False
) -> list[Check]:
    if local:  # no srun: the probe ran here, from the --setup lines
        checks = [Check("node probe", PASS if nodes else FAIL, "ran on this machine")]
        return checks + _node_findings(nodes, local=True) if nodes else checks
    if len(nodes) < wanted:
        said = [ln for ln in batch_out.splitlines() if "srun" in ln][-1:]
        detail = f"the probe step ran on {len(nodes)} of {wanted} nodes" + (
            f": {said[0]}" if said else ""
        )
        fix = "Slurm >= 20.11 runs overlapping steps with srun --overlap; ask the admins"
        return [Check("srun --overlap", FAIL, detail, fix)]
    checks = [Check("srun --overlap", PASS, f"a step beside the job's on all {wanted} nodes")]
    return checks + _node_findings(nodes)


def _node_findings(nodes: list[dict[str, Any]], local: bool = False) -> list[Check]:
    checks = []
    missing = sorted({(b, n["node"]) for n in nodes for b, ok in n["binds"].items() if not ok})
    if missing:
        where = "; ".join(f"{b} on {n}" for b, n in missing)
        fix = "Remove it from the profile's [container] binds, or have it created on the nodes"
        checks.append(Check("binds", FAIL, f"missing: {where}", fix))
    elif nodes[0]["binds"]:
        checks.append(Check("binds", PASS, f"all {len(nodes[0]['binds'])} exist on every node"))
    free = [n["local_free_bytes"] for n in nodes if n.get("local_free_bytes") is not None]
    if free:
        least = min(free) / 2**30
        where = nodes[0].get("local") or "node-local"
        if local:  # the folder a local run really gets: one per run, in there
            where = os.path.join(where, f"{node.LOCAL_PREFIX}local-JOB-pPID.*")
        status = WARN if min(free) < LOW_LOCAL_BYTES else PASS
        fix = "Staging (--stage) needs room there: set local_dir in the profile"
        if local:
            fix = "Staging (--stage) needs room there: set TMPDIR to a larger folder"
        checks.append(Check("node-local space", status, f"{least:.1f} GiB free at {where}", fix))
    return checks


def gpu_checks(
    ranks: list[dict[str, Any]], nodes: list[dict[str, Any]], gpus: int, local: bool = False
) -> list[Check]:
    """The GPUs each node's ranks may use (the job's variables), against those asked. A
    local rank with no such variable sees every GPU of the machine (its tool's count);
    under Slurm the variable is the job's GRES, and a rank without it sees none."""
    if not gpus:
        return []
    tools = {n["node"]: n["tool"]["count"] for n in nodes if n.get("tool")}
    seen: dict[str, int] = {}
    for rank in ranks:
        listed = rank["gpus"].get("CUDA_VISIBLE_DEVICES") or rank["gpus"].get(
            "ROCR_VISIBLE_DEVICES", ""
        )
        count = len([g for g in listed.split(",") if g]) if listed else 0
        if not listed and local:
            count = tools.get(rank["node"], 0)
        seen[rank["node"]] = max(seen.get(rank["node"], 0), count)
    short = {n: c for n, c in seen.items() if c < gpus}
    text = ", ".join(f"{n}: {c}" for n, c in sorted(seen.items()))
    if tools:
        text += "; the nodes' tool lists " + ", ".join(f"{n}: {c}" for n, c in tools.items())
    if short:
        fix = "Check the profile's gpu_vars and the site's GRES (gres.conf) with the admins"
        return [Check("GPUs visible", FAIL, f"asked {gpus} per node, the ranks see {text}", fix)]
    return [Check("GPUs visible", PASS, f"{gpus} per node: {text}")]


def cpu_checks(ranks: list[dict[str, Any]], spec: JobSpec) -> list[Check]:
    """The CPUs each rank may run on: the profile's masks where it has them; else no two
    ranks of a node share a CPU and each has its --cpus-per-task."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for rank in ranks:
        by_node.setdefault(rank["node"], []).append(rank)
    masks = expected_cpus(spec.cpu_bind)
    wrong = []
    for node_ranks in by_node.values():
        for rank in node_ranks:
            cpus = set(rank["affinity"])
            want = masks[rank["local_rank"] % len(masks)] if masks else None
            if (want is not None and cpus != want) or len(cpus) < spec.cpus_per_task:
                wrong.append(f"rank {rank['rank']} on {rank['node']}: {_cpus(cpus)}")
        if not masks:
            shared = _shared([set(r["affinity"]) for r in node_ranks])
            if shared and len(node_ranks) > 1 and spec.cpu_bind not in ("", "none"):
                wrong.append(f"ranks on one node share CPUs {_cpus(shared)}")
    how = "the profile's masks" if masks else f"{spec.cpus_per_task} CPU(s) a rank"
    if wrong:
        fix = "Compare with the profile's cpu_bind and topology (LUMI: one CCD a GCD)"
        return [Check("CPU binding", FAIL, f"not {how}: " + "; ".join(wrong[:4]), fix)]
    one = ranks[0] if ranks else None
    sample = f"; rank 0: {_cpus(set(one['affinity']))}" if one else ""
    count = f"{len(ranks)} rank{'s' * (len(ranks) != 1)}"
    return [Check("CPU binding", PASS, f"{count} as asked ({how}){sample}")]


def expected_cpus(cpu_bind: str) -> list[set[int]]:
    """The CPUs per local rank that srun's --cpu-bind value gives: mask_cpu:0x3,0xc ->
    [{0, 1}, {2, 3}]; map_cpu:1,9 -> [{1}, {9}]; anything else -> [] (Slurm's choice)."""
    for part in cpu_bind.split(","):
        kind, _, first = part.partition(":")
        if kind in ("mask_cpu", "map_cpu"):
            items = [first, *cpu_bind.split(",")[cpu_bind.split(",").index(part) + 1 :]]
            if kind == "map_cpu":
                return [{int(i)} for i in items]
            return [
                {b for b in range(int(i, 16).bit_length()) if int(i, 16) >> b & 1} for i in items
            ]
    return []


def _shared(sets: list[set[int]]) -> set[int]:
    seen: set[int] = set()
    shared: set[int] = set()
    for cpus in sets:
        shared |= seen & cpus
        seen |= cpus
    return shared


def _cpus(cpus: set[int]) -> str:
    """0-3,8 for {0, 1, 2, 3, 8}."""
    out, items = [], sorted(cpus)
    while items:
        start = end = items.pop(0)
        while items and items[0] == end + 1:
            end = items.pop(0)
        out.append(str(start) if start == end else f"{start}-{end}")
    return ",".join(out) or "none"


def rank_checks(ranks: list[dict[str, Any]], spec: JobSpec, plugin: str) -> list[Check]:
    checks = []
    if spec.container is not None:
        outside = [str(r["rank"]) for r in ranks if not r["container"]]
        status = FAIL if outside else PASS
        detail = f"ranks {', '.join(outside)} ran outside it" if outside else "every rank inside"
        checks.append(Check("container", status, f"{spec.container.image}: {detail}"))
        if plugin:
            lacking = sorted({r["node"] for r in ranks if not r["plugin"]})
            found = next((r["plugin"][0] for r in ranks if r["plugin"]), "")
            fix = f"Use an image with the site's {plugin} (or bind it in and set LD_LIBRARY_PATH)"
            checks.append(
                Check("network plugin", FAIL, f"no {plugin}*.so in the image", fix)
                if lacking
                else Check("network plugin", PASS, found)
            )
    bad = [r for r in ranks if not r["rendezvous"].get("ok")]
    where = ranks[0]["rendezvous"].get("address", "?") if ranks else "?"
    if bad:
        text = "; ".join(
            f"rank {r['rank']} on {r['node']}: {r['rendezvous'].get('error')}" for r in bad
        )
        fix = "A firewall between the nodes, or MASTER_ADDR is not an address the nodes share"
        checks.append(Check("rendezvous", FAIL, f"{where}: {text}", fix))
    else:
        checks.append(Check("rendezvous", PASS, f"{where} reached from every rank ({len(ranks)})"))
    checks.append(_allreduce(ranks))
    return checks


def _allreduce(ranks: list[dict[str, Any]]) -> Check:
    first = next((r for r in ranks if r["rank"] == 0), None)
    result = first.get("allreduce") if first else None
    if not result or result.get("ok") is None:
        why = result.get("error") if result else "rank 0 reported nothing"
        fix = "Give the training venv's Python: hpclaunch doctor --python PATH"
        return Check("all-reduce", WARN, f"not measured: {why}", fix)
    if not result["ok"]:
        return Check("all-reduce", FAIL, result.get("error", "wrong sum"), "See NCCL_DEBUG=INFO")
    world = result["world"]
    if world < 2:
        return Check("all-reduce", PASS, f"{result['backend']}: one rank, nothing to reduce")
    return Check(
        "all-reduce",
        PASS,
        f"{result['backend']}, {world} ranks, {result['mib']} MiB: "
        f"{result['bus_gbps']:.2f} GB/s bus bandwidth ({result['seconds'] * 1e3:.0f} ms)",
    )


def wait_files(folder: Path, wanted: int, prefix: str, seconds: float = 5.0) -> None:
    """Shared file systems show another node's files late: give them a moment."""
    deadline = time.monotonic() + seconds
    while len(read(folder, prefix)) < wanted and time.monotonic() < deadline:
        time.sleep(0.2)
