"""`hpclaunch profile list | show | init` without Slurm: the listing (a user file
overrides a built-in one), a profile's facts with their sources and what is unverified,
and the profile `init` writes from what a site says of itself (Slurm's answers replayed
here as text; tests/test_e2e_profile_init.py asks the testbed's real Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from hpclaunch.config.profiles import Profile, load_profile
from hpclaunch.slurm import commands, discover, profileinit

HPCLAUNCH = [sys.executable, "-m", "hpclaunch"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "USER": "alice",
            "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "LANG": "C.UTF-8"}  # fmt: skip


def hpclaunch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HPCLAUNCH, *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def clusters(env: dict[str, str]) -> Path:
    folder = Path(env["XDG_CONFIG_HOME"]) / "hpclaunch" / "clusters"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_list_names_builtins_and_yours_and_which_overrides(env: dict[str, str]) -> None:
    (clusters(env) / "jean-zay.toml").write_text('default_partition = "gpu_p5"\n')
    (clusters(env) / "mine.toml").write_text('description = "my lab"\nkind = "slurm"\n')
    proc = hpclaunch(env, "profile", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert rows["jean-zay"]["origin"] == "built-in, overridden by yours"
    assert rows["mine"]["origin"] == "yours" and rows["mine"]["description"] == "my lab"
    assert rows["frontier"]["origin"] == "built-in"
    for site in ("alps", "juwels-booster", "jupiter", "leonardo", "marenostrum5",
                 "perlmutter", "isambard-ai", "jean-zay", "frontier", "lumi"):  # fmt: skip
        assert site in rows
    text = hpclaunch(env, "profile", "list").stdout
    assert "mine" in text and "built-in, overridden by yours" in text


def test_show_gives_each_fact_its_source_and_marks_the_unverified(env: dict[str, str]) -> None:
    proc = hpclaunch(env, "profile", "show", "juwels-booster", "--json")
    assert proc.returncode == 0, proc.stderr
    facts = {f["fact"]: f for f in json.loads(proc.stdout)["facts"]}
    assert facts["gpus"]["value"] == "4" and not facts["gpus"]["unverified"]
    assert facts["gpus"]["source"].startswith("https://apps.fz-juelich.de/")
    assert facts["rendezvous"]["value"] == "<first node>i" and facts["rendezvous"]["unverified"]
    assert facts["gpu_request"]["value"] == "--gres=gpu:{}"
    assert facts["cpu_partition"]["value"] == "batch" and facts["cpu_partition"]["unverified"]
    assert facts["binding"]["value"] == "none given" and facts["container"]["value"] == "apptainer"
    frontier = json.loads(hpclaunch(env, "profile", "show", "frontier", "--json").stdout)
    shown = {f["fact"]: f["value"] for f in frontier["facts"]}
    assert shown["cpu_partition"] == "none" and shown["binding"] == "--cpu-bind=mask"
    text = hpclaunch(env, "profile", "show", "juwels-booster").stdout
    assert "source: UNVERIFIED" in text and "unverified: partition, gpu_request" in text


def test_show_takes_the_users_override_of_a_builtin(env: dict[str, str]) -> None:
    (clusters(env) / "alps.toml").write_text(
        'unverified = []\n[node]\nmemory = "470G"\n[sources]\nmemory = "https://x.example/m"\n'
    )
    facts = {f["fact"]: f for f in json.loads(
        hpclaunch(env, "profile", "show", "alps", "--json").stdout)["facts"]}  # fmt: skip
    assert facts["memory"] == {"fact": "memory", "value": "470G",
                               "source": "https://x.example/m", "unverified": False}  # fmt: skip


def test_show_of_an_unknown_profile_is_one_line(env: dict[str, str]) -> None:
    proc = hpclaunch(env, "profile", "show", "nosuch")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "unknown cluster" in proc.stderr


@pytest.mark.parametrize("name", ["lumi", "../x", "has space"])
def test_init_refuses_builtin_and_bad_names_before_asking(env: dict[str, str], name: str) -> None:
    proc = hpclaunch(env, "profile", "init", name)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_init_keeps_an_existing_profile_without_force(env: dict[str, str]) -> None:
    (clusters(env) / "mine.toml").write_text('kind = "slurm"\n')
    proc = hpclaunch(env, "profile", "init", "mine")
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert (clusters(env) / "mine.toml").read_text() == 'kind = "slurm"\n'


# What a Slurm 22.05 site like the testbed answers (tests/record_slurm.py's shapes).
SINFO = "gpu*|1-00:00:00|00:30:00|2|64|gpu:a100:4(S:0-1)|512000|a100,ib|8\n" \
        "gpu*|1-00:00:00|00:30:00|1|64|gpu:a100:4|256000|a100|8\n" \
        "cpu|2-00:00:00|n/a|10|128|(null)|256000|(null)|infinite\n"  # fmt: skip
PARTS = "PartitionName=gpu AllowGroups=ALL Default=YES QoS=gpuqos DefaultTime=00:30:00 " \
        "MaxTime=1-00:00:00 OverSubscribe=EXCLUSIVE\n" \
        "PartitionName=cpu AllowGroups=ALL QoS=N/A DefaultTime=NONE OverSubscribe=NO\n"  # fmt: skip


ASSOC = "proj1||normal,gpuqos\nproj2|gpu|normal\n"  # sacctmgr -P Account,Partition,QOS


def fake_site(monkeypatch: pytest.MonkeyPatch, select: str, qos: Optional[str]) -> None:
    assoc = None if qos is None else ASSOC  # no accounting: neither answers
    answers = {
        ("sinfo", "-h", "-o"): SINFO,
        ("scontrol", "show", "partition"): PARTS,
        ("sinfo", "-h", "-N"): "gpu01\ngpu02\n",
        ("scontrol", "show", "node"): "NodeName=gpu01 Arch=aarch64 CoresPerSocket=32\n",
        ("sacctmgr", "-n", "-P"): qos,
    }
    config = {"ClusterName": "mycluster", "SLURM_VERSION": "22.05.8", "SelectType": select,
              "JobSubmitPlugins": "lua" if qos is None else "(null)"}  # fmt: skip
    monkeypatch.setattr(discover, "slurm_config", lambda: config)

    def query(argv: list[str], timeout: float) -> Optional[str]:
        if argv[:5] == ["sacctmgr", "-n", "-P", "show", "assoc"]:
            assert argv[5] == "user=alice", argv  # the user's own associations
            return assoc
        return answers[tuple(argv[:3])]

    monkeypatch.setattr(commands, "query", query)


def write_and_load(tmp_path: Path, text: str) -> Profile:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    folder = tmp_path / "hpclaunch" / "clusters"
    folder.mkdir(parents=True)
    (folder / "mysite.toml").write_text(text)
    return load_profile("mysite", None, env)


def test_init_writes_what_the_site_says_and_marks_no_guess(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_site(monkeypatch, "select/cons_tres", "normal\ngpuqos\n")
    text = profileinit.profile_text("mysite", profileinit.ask_site("alice"))
    profile = write_and_load(tmp_path, text)
    assert profile.detect_cluster_names == ("mycluster",)
    assert profile.default_partition == "gpu" and profile.arch == "aarch64"
    node = profile.node
    assert (node.gpus, node.cpus, node.memory_mb) == (4, 64, 512000)
    gpu = profile.partitions["gpu"]
    assert (gpu.max_time, gpu.default_time, gpu.max_nodes, gpu.whole_node, gpu.nodes) == (
        86400,
        1800,
        8,
        True,
        3,
    )
    cpu = profile.partitions["cpu"]
    assert (cpu.max_time, cpu.default_time, cpu.gpus, cpu.whole_node) == (172800, None, 0, False)
    assert profile.unverified == () and profile.sbatch_lines == {}
    assert "22.05.8" in profile.sources["slurm_version"]
    assert "normal, gpuqos" in profile.sources["accounting"]
    assert "rules" not in profile.sources  # no job_submit filter
    assert profile.sources["accounts"] == (  # sacctmgr show assoc: where -A/--qos may go
        "sacctmgr show assoc user=alice: proj1 (QoS normal,gpuqos); "
        "proj2 (partition gpu, QoS normal)"
    )
    assert "# features (--constraint): a100, ib" in text and "QoS: gpuqos" in text


def test_init_marks_its_guesses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No cons_tres: --gpus-per-node is not understood, so the GPU line is --gres (a
    guess); no accounting; a node without Arch: this machine's, a guess."""
    fake_site(monkeypatch, "select/cons_res", None)
    site = profileinit.ask_site("alice")
    site.arch = ""
    profile = write_and_load(tmp_path, profileinit.profile_text("mysite", site))
    assert set(profile.unverified) == {"arch", "gpu_request"}
    assert profile.sbatch_lines == {"gpus-per-node": "--gres=gpu:{}"}
    assert "does not answer" in profile.sources["accounting"]
    assert "accounts" not in profile.sources  # not asked where accounting is silent
    assert profile.sources["rules"] == "unknown: the site filters jobs (JobSubmitPlugins=lua)"
    assert profile.arch == os.uname().machine


def test_init_over_remote_goes_to_the_cluster_whole(tmp_path: Path) -> None:
    """--remote HOST: the cluster's hpclaunch asks its own Slurm and writes the profile
    there, where its runs read it (remote/choose.py forwards every command but remote)."""
    from hpclaunch.remote.choose import choose

    env = {"HOME": str(tmp_path)}
    chosen = choose(["profile", "init", "mylab", "--remote", "login.example"], tmp_path, env)
    assert chosen is not None
    assert (chosen.host, chosen.argv) == ("login.example", ("profile", "init", "mylab"))
