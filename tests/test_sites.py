"""The built-in site profiles against docs/sites.md: each site's facts table is parsed
from the doc and checked, row by row, against the profile and against that site's 2-node
dry-run (the command written above the table), so the doc and the code cannot drift.

A fake is unavoidable here: the testbed cannot show these sites' partitions, GPUs or
networks, so the scripts are rendered without submitting them (as test_lumi_golden does)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hpclaunch import node
from hpclaunch.basics.units import parse_memory, parse_time
from hpclaunch.config.profiles import SITES, Profile, load_profile
from hpclaunch.errors import SlurmError, UserError
from hpclaunch.planning import preparing
from hpclaunch.slurm import refusals

SITES_MD = Path(__file__).resolve().parents[1] / "docs" / "sites.md"
TABLED = [name for name in SITES if name != "lumi"]  # LUMI's facts: shared/LUMI.md
SNIPPET = re.compile(r"`([^`]+)`")


def site_sections() -> dict[str, tuple[str, list[tuple[str, str, str]]]]:
    """docs/sites.md: site -> (its dry-run command, its (fact, value, source) rows)."""
    sections: dict[str, tuple[str, list[tuple[str, str, str]]]] = {}
    for part in re.split(r"^## ", SITES_MD.read_text(encoding="utf-8"), flags=re.M)[1:]:
        name, _, text = part.partition("\n")
        command = re.search(r"^Dry-run: `([^`]+)`", text, re.M)
        if name.strip() not in TABLED or command is None:
            continue
        rows = []
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("fact",):
                rows.append((cells[0], cells[1], cells[2]))
        sections[name.strip()] = (command.group(1), rows)
    return sections


SECTIONS = site_sections()


def dry_run(command: str, tmp_path: Path) -> list[str]:
    """The site's 2-node dry-run as a user types it; its script's lines."""
    argv = shlex.split(command)
    assert argv[0] == "hpclaunch" and "--dry-run" in argv and argv[argv.index("-N") + 1] == "2"
    work = tmp_path / "proj"
    work.mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "USER": "alice",
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "LANG": "C.UTF-8"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "hpclaunch", *argv[1:]], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_every_site_has_a_facts_table() -> None:
    assert sorted(SECTIONS) == sorted(TABLED)
    text = SITES_MD.read_text(encoding="utf-8")
    for name in SITES:  # the table of sites names every built-in site
        assert re.search(rf"^\| {re.escape(name)} \|", text, re.M), name


@pytest.mark.parametrize("site", TABLED)
def test_dry_run_holds_every_fact_of_the_sites_table(site: str, tmp_path: Path) -> None:
    command, rows = SECTIONS[site]
    profile = load_profile(site)
    script = dry_run(command, tmp_path)
    # every fact the profile cites is a row, with the same source; unverified shown so
    assert [fact for fact, _, _ in rows] == list(profile.sources)
    for fact, value, source in rows:
        assert source == profile.sources[fact], fact
        assert source.startswith("unverified") == (fact in profile.unverified), fact
        if not source.startswith("unverified"):
            assert re.match(r"^(https?://|github\.com/)", source), (fact, source)
        check_fact(profile, fact, value, script)
    assert set(profile.unverified) <= set(profile.sources)


def check_fact(profile: Profile, fact: str, value: str, script: list[str]) -> None:
    snippets = SNIPPET.findall(value)
    lines = [s for s in snippets if s.startswith(("#SBATCH ", "export "))]
    for line in lines:  # a line of the 2-node script, whole
        assert line in script, f"{profile.name} {fact}: {line!r} not in the dry-run"
    if fact in ("gpus", "cpus"):
        assert int(value) == getattr(profile.node, fact)
    elif fact == "memory":
        assert parse_memory(value, fact) == profile.node.memory_mb
    elif fact == "arch":
        assert value == profile.arch
    elif fact == "partition":
        name = lines[0].split("=", 1)[1]
        limit = re.search(r"at most (\S+)", value)
        assert limit and parse_time(limit.group(1), fact) == profile.partitions[name].max_time
    elif fact == "default_time":
        part = profile.partitions[profile.default_partition_name()]
        assert parse_time(value, fact) == part.default_time
    elif fact == "min_poll_interval":
        assert value == f"{profile.min_poll_interval} s"
    elif fact == "account":
        assert re.match(profile.account_pattern, snippets[0])
    elif fact == "rules":
        assert snippets == [rule.message for rule in profile.rules]
    elif fact == "container":
        assert value == profile.container.runtime
    elif fact == "binding":  # srun's --cpu-bind: a word of the launch line
        assert snippets and any(snippets[0] in line for line in script), snippets
        if profile.cpu_bind == "none":  # none given: srun binds as the site's plugin does
            assert not any("--cpu-bind" in line for line in script), profile.name
    elif fact == "cpu_partition":  # the partition without GPUs, or none on that Slurm
        cpu = sorted(name for name, part in profile.partitions.items() if part.gpus == 0)
        assert cpu == ([] if value.startswith("none") else snippets[:1]), (profile.name, cpu)
        limit = re.search(r"at most (\S+)", value)
        if limit and cpu:
            assert parse_time(limit.group(1), fact) == profile.partitions[cpu[0]].max_time
    elif fact == "network" and not profile.env:  # InfiniBand sites: NCCL needs nothing
        assert "no variables" in value
    elif fact in ("gpu_request", "companions", "network", "rendezvous"):
        assert lines, f"{profile.name} {fact}: no script line in {value!r}"
    else:
        assert fact == "max_time"  # Perlmutter: no partition named, nothing to check


def held_facts(profile: Profile) -> set[str]:
    """The facts of issue 31's list that this profile sets: each must be cited or marked
    unverified (the facts table's rows are the profile's [sources])."""
    held = {"gpus", "cpus", "memory", "arch", "gpu_request", "container", "binding"}
    held.add("cpu_partition")  # "GPU and CPU partitions": a CPU one, or none said so
    held.add("partition" if profile.default_partition else "max_time")
    optional = {
        "network": bool(profile.env),
        "companions": bool(profile.sbatch_args),
        "rendezvous": bool(profile.rendezvous_suffix),
        "min_poll_interval": profile.min_poll_interval > 0,
        "rules": bool(profile.rules),
        "account": bool(profile.account_pattern),
    }
    return held | {fact for fact, holds in optional.items() if holds}


@pytest.mark.parametrize("site", TABLED)
def test_every_fact_a_profile_holds_is_cited_or_marked_unverified(site: str) -> None:
    profile = load_profile(site)
    assert sorted(held_facts(profile) - set(profile.sources)) == [], site


def test_sites_without_a_suffix_leave_master_addr_to_the_first_node(tmp_path: Path) -> None:
    for site in TABLED:
        if not load_profile(site).rendezvous_suffix:
            script = dry_run(SECTIONS[site][0], tmp_path / site)
            assert not any("HPCLAUNCH_MASTER_SUFFIX" in line for line in script), site


def _prepare(site: str, **options: str) -> None:
    cli = {"cluster": site, "nodes": "2", "account": "proj1", "time": "1:00:00", **options}
    env = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}
    preparing.prepare_spec(cli, ("python", "train.py"), Path("/project/alice/llm"), env)


def test_a_rule_of_the_site_refuses_before_sbatch_in_its_words() -> None:
    with pytest.raises(UserError) as no_qos:
        _prepare("marenostrum5", gpus_per_node="4")
    assert "--qos" in str(no_qos.value)
    assert "a job must specify a QoS" in str(no_qos.value)
    with pytest.raises(UserError) as few_cpus:
        _prepare("marenostrum5", gpus_per_node="4", qos="acc_debug", cpus_per_task="8")
    assert "for every GPU requested, 20 CPUs must be requested" in str(few_cpus.value)
    _prepare("marenostrum5", gpus_per_node="4", qos="acc_debug")  # 20 per GPU: accepted


def test_gpus_per_task_must_divide_the_nodes_gpus_on_alps() -> None:
    with pytest.raises(UserError) as uneven:
        _prepare("alps", gpus_per_node="4", tasks_per_node="3")
    assert "--tasks-per-node" in str(uneven.value)


def test_jean_zay_takes_only_h100_accounts() -> None:
    with pytest.raises(UserError) as plain:
        _prepare("jean-zay", gpus_per_node="4")
    assert "proj1" in str(plain.value)
    _prepare("jean-zay", gpus_per_node="4", account="abc@h100")


def _bootstrap() -> ModuleType:
    path = Path(node.__file__).with_name("bootstrap.py")
    spec = importlib.util.spec_from_file_location("site_bootstrap", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_master_addr_takes_the_sites_suffix_in_every_rank() -> None:
    """JSC: the first node's InfiniBand name (<node>i); elsewhere the node's own name."""
    boot = _bootstrap()
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_NODEID": "1",
             "SLURM_JOB_NODELIST": "jwb[0017-0018]", "SLURM_JOB_ID": "42"}  # fmt: skip
    env = {**slurm, node.HPCLAUNCH_MASTER_SUFFIX: "i"}
    boot.set_rank_env(env)
    assert env["MASTER_ADDR"] == "jwb0017i"
    plain = dict(slurm)
    boot.set_rank_env(plain)
    assert plain["MASTER_ADDR"] == "jwb0017"
    alone = {node.HPCLAUNCH_MASTER_SUFFIX: "i"}  # no node list: this machine, no suffix
    boot.set_rank_env(alone)
    assert alone["MASTER_ADDR"] == "127.0.0.1"


def test_the_readmes_first_screen_names_every_site() -> None:
    first_screen = "\n".join((SITES_MD.parents[1] / "README.md").read_text().splitlines()[:25])
    for name in SITES:
        assert f"(`{name}`)" in first_screen, name
    assert "docs/sites.md" in first_screen


def test_sbatchs_rejection_is_the_sites_words_as_a_user_error() -> None:
    """What sbatch prints when a site's job_submit filter refuses (slurm.log_user): the
    site's own line, exit 2; a Slurm that fails otherwise stays a Slurm failure."""
    said = SlurmError(
        "sbatch failed: sbatch: error: site rule: at least 2 CPUs per GPU; "
        "sbatch: error: Batch job submission failed: Unspecified error"
    )
    refused = refusals.refusal(said)
    assert isinstance(refused, UserError) and refused.exit_code == 2
    assert refused.render().startswith("sbatch: the site refused the job: site rule: at least")
    plain = SlurmError(
        "sbatch failed: sbatch: error: Batch job submission failed: Invalid qos specification"
    )
    assert "refused the job: Invalid qos specification." in refusals.refusal(plain).render()
    silent = SlurmError("sbatch: no answer after 30 s")
    assert refusals.refusal(silent) is silent


def test_the_table_of_sites_agrees_with_the_profiles() -> None:
    text = SITES_MD.read_text(encoding="utf-8")
    for site in TABLED:
        row = re.search(rf"^\| {re.escape(site)} \| (.*) \|$", text, re.M)
        assert row, site
        cells = row.group(1).split(" | ")
        _, gpus, request, companions, rendezvous, arch, floor, containers, unverified = cells
        profile = load_profile(site)
        assert int(gpus) == profile.node.gpus
        assert request == f"`{profile.sbatch_lines.get('gpus-per-node', '--gpus-per-node={}')}`"
        assert SNIPPET.findall(companions) == list(profile.sbatch_args)
        suffix = profile.rendezvous_suffix
        assert rendezvous == (f"`<node>{suffix}`" if suffix else "first node")
        assert arch == profile.arch and floor == f"{profile.min_poll_interval} s"
        assert containers == profile.container.runtime, site
        assert int(unverified) == len(profile.unverified), site


def test_total_and_per_task_spell_only_the_gpu_request(tmp_path: Path) -> None:
    (tmp_path / "hpclaunch.toml").write_text(
        '[clusters.alps.sbatch_lines]\nqos = "--qos={total}"\n'
    )
    env = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}
    cli = {"cluster": "alps", "nodes": "2", "account": "p", "gpus_per_node": "4", "qos": "x"}
    with pytest.raises(UserError) as caught:
        preparing.prepare_spec(cli, ("python", "t.py"), tmp_path, env)
    assert "sbatch_lines.qos" in str(caught.value) and "holding one {}" in str(caught.value)


def test_a_forbidden_line_is_refused_in_the_sites_words(tmp_path: Path) -> None:
    """A site that takes GPUs only through GRES: a profile without that spelling, with
    the rule, refuses --gpus-per-node before sbatch (the testbed's filter's rule)."""
    (tmp_path / "hpclaunch.toml").write_text(
        "[[clusters.frontier.rules]]\n"
        'kind = "forbid_line"\nline = "--gpus-per-node"\n'
        'message = "request GPUs with --gres=gpu:N"\n'
    )
    env = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}
    cli = {"cluster": "frontier", "nodes": "2", "account": "p", "gpus_per_node": "8"}
    with pytest.raises(UserError) as caught:
        preparing.prepare_spec(cli, ("python", "t.py"), tmp_path, env)
    said = str(caught.value)
    assert "#SBATCH --gpus-per-node=8" in said and "frontier says: request GPUs with" in said


def test_jean_zays_qos_ladder_asks_t4_beyond_20_hours() -> None:
    with pytest.raises(UserError) as long:
        _prepare("jean-zay", gpus_per_node="4", account="abc@h100", time="30:00:00")
    assert "--qos=qos_gpu_h100-t4" in str(long.value) and "jobs over 20 h" in str(long.value)
    _prepare("jean-zay", gpus_per_node="4", account="abc@h100", time="30:00:00",
             qos="qos_gpu_h100-t4")  # fmt: skip


def test_a_cpu_partition_takes_cpu_work_and_refuses_gpus() -> None:
    """Leonardo's DCGP nodes (dcgp_usr_prod): a job there asks no GPU; GPUs are refused."""
    _prepare("leonardo", partition="dcgp_usr_prod", cpus_per_task="112")
    with pytest.raises(UserError) as caught:
        _prepare("leonardo", partition="dcgp_usr_prod", gpus_per_node="4")
    assert "--gpus-per-node" in str(caught.value) and "dcgp_usr_prod" in str(caught.value)
