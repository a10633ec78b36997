"""Configuration layers: profile < user profile < hpclaunch.toml < environment < CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpclaunch.config import layering
from hpclaunch.errors import UserError
from hpclaunch.planning import preparing

ENV = {"USER": "alice", "PATH": "/usr/bin:/bin"}


@pytest.fixture(autouse=True)
def _no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _resolve(
    tmp: Path, cli: dict[str, object], env: dict[str, str] | None = None
) -> preparing.Prepared:
    config_home = {"XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]}  # the fixture's
    environ = {**ENV, **config_home, **(env or {})}
    return preparing.prepare_spec(cli, ("python", "train.py"), tmp, environ)


def test_project_file_is_found_up_to_the_git_root(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "hpclaunch.toml").write_text(
        '[run]\ncluster = "lumi"\naccount = "project_1"\nnodes = 3\n'
    )
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    resolved = _resolve(sub, {})
    assert resolved.project_file == tmp_path / "hpclaunch.toml"
    assert resolved.spec.cluster == "lumi" and resolved.spec.nodes == 3
    assert dict(resolved.spec.sources)["nodes"] == "project"


def test_search_stops_at_git_root(tmp_path: Path) -> None:
    (tmp_path / "hpclaunch.toml").write_text("[run]\nnodes = 3\n")
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    assert layering.find_project_file(repo, {}) is None


def test_cli_beats_env_beats_project(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "hpclaunch.toml").write_text(
        '[run]\ncluster = "lumi"\naccount = "project_1"\npartition = "small-g"\nnodes = 2\n'
    )
    env = {"SBATCH_ACCOUNT": "project_2", "SBATCH_PARTITION": "dev-g"}
    spec = _resolve(tmp_path, {}, env).spec
    assert (spec.account, spec.partition) == ("project_2", "dev-g")
    spec = _resolve(tmp_path, {"account": "project_3", "nodes": "1"}, env).spec
    assert (spec.account, spec.partition, spec.nodes) == ("project_3", "dev-g", 1)
    assert dict(spec.sources)["account"] == "cli"
    assert dict(spec.sources)["partition"] == "env:SBATCH_PARTITION"


def test_hpclaunch_cluster_env_and_config_env(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text('[run]\nexp = "from-config"\n')
    spec = _resolve(
        tmp_path, {}, {"HPCLAUNCH_CLUSTER": "local", "HPCLAUNCH_CONFIG": str(other)}
    ).spec
    assert spec.cluster == "local" and spec.exp == "from-config"


def test_user_and_project_profiles_override_builtin(tmp_path: Path) -> None:
    user_dir = tmp_path / "config" / "hpclaunch" / "clusters"
    user_dir.mkdir(parents=True)
    (user_dir / "lumi.toml").write_text('[partitions.small-g]\nmax_time = "00:30:00"\n')
    with pytest.raises(
        UserError, match=r"--time: 01:00:00 on small-g \(the partition's limit is 00:30:00\)"
    ):
        _resolve(
            tmp_path,
            {"cluster": "lumi", "account": "project_1", "partition": "small-g", "time": "60"},
        )
    (tmp_path / ".git").mkdir()
    (tmp_path / "hpclaunch.toml").write_text(
        '[clusters.mine]\nkind = "local"\nrun_root = "/data/runs"\n[run]\ncluster = "mine"\n'
    )
    spec = _resolve(tmp_path, {}).spec
    assert spec.cluster == "mine" and spec.run_root == "/data/runs"


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ("[run]\nnodez = 2\n", "[run] nodez"),
        ("[runs]\nnodes = 2\n", "unknown table"),
        ("[run]\nnodes = 'x'\n", "[run] nodes"),
        ("[run]\nexclusive = 'yes'\n", "[run] exclusive"),
        ("[run\n", "not valid TOML"),
        ('[clusters.x]\nkind = "moon"\n[run]\ncluster = "x"\n', "cluster profile x: kind"),
    ],
)
def test_bad_project_files_give_one_line(tmp_path: Path, toml: str, field: str) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "hpclaunch.toml").write_text(toml)
    with pytest.raises(UserError) as info:
        _resolve(tmp_path, {"cluster": "local"} if "cluster" not in toml else {})
    assert field in str(info.value)
    assert "\n" not in str(info.value)


def test_lumi_defaults_follow_lumi_md(tmp_path: Path) -> None:
    spec = _resolve(tmp_path, {"cluster": "lumi", "account": "project_465000000"}).spec
    assert (spec.partition, spec.gpus_per_node, spec.tasks_per_node, spec.cpus_per_task) == (
        "standard-g",
        8,
        8,
        7,
    )
    assert spec.mem_per_gpu_mb == 60 * 1024
    assert spec.cpu_bind.startswith("verbose,mask_cpu:0x00fe000000000000,")
    assert spec.run_root == "/scratch/project_465000000/alice/hpclaunch"


def test_default_job_name_is_the_script(tmp_path: Path) -> None:
    from hpclaunch.planning.validate import default_job_name

    assert default_job_name(("python", "-u", "src/train.py", "--lr", "1")) == "train.py"
    assert default_job_name(("python3", "-m", "pkg.main")) == "pkg.main"
    assert default_job_name(("./run.sh",)) == "run.sh"


def test_slurm_runs_go_to_scratch_per_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generic clusters: $SCRATCH/<git top-level folder name> when SCRATCH is set."""
    from hpclaunch.config.profiles import Partition
    from hpclaunch.slurm import discover

    monkeypatch.setattr(discover, "slurm_config", lambda: {"ClusterName": "site"})
    monkeypatch.setattr(discover, "partitions", lambda: {"cpu": Partition(default=True)})
    monkeypatch.setattr(discover, "in_allocation", lambda environ: False)
    repo = tmp_path / "myproject"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    spec = _resolve(repo / "src", {"cluster": "slurm"}, {"SCRATCH": "/scratch/me"}).spec
    assert (spec.run_root, spec.project) == ("/scratch/me/myproject", "myproject")
    assert _resolve(repo / "src", {"cluster": "slurm"}).spec.run_root == "runs"
    assert (
        _resolve(repo, {"cluster": "slurm", "run_root": "/x"}, {"SCRATCH": "/s"}).spec.run_root
        == "/x"
    )
