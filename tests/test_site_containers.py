"""The container runtime each site documents (issue 31: "the container runtime the site
documents"; issue 32 added the ones hpclaunch lacked): `--container` on Alps goes through
CSCS's Container Engine (the run's EDF with the aws-ofi-nccl hook, srun --environment=),
on Perlmutter through podman-hpc (`podman-hpc run --gpu` per rank). Rendered without
submitting, as tests/test_sites.py does: the testbed cannot show these sites."""

from __future__ import annotations

from pathlib import Path

import tomllib

from hpclaunch.planning import preparing
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import render

ENV = {"USER": "alice", "HOME": "/users/alice", "PATH": "/usr/bin:/bin"}


def plan(site: str, image: str, cwd: Path) -> render.BatchPlan:
    cli = {"cluster": site, "nodes": "2", "account": "proj1", "time": "1:00:00",
           "gpus_per_node": "4", "container": image}  # fmt: skip
    prepared = preparing.prepare_spec(cli, ("python", "train.py"), cwd, ENV)
    run_dir = cwd / "runs" / "RUN"
    paths = RunPaths(run_id="RUN", run_dir=run_dir, checkpoint_dir=run_dir / "checkpoints")
    return render.plan_batch(prepared.spec, prepared.profile, paths, cwd)


def test_alps_runs_containers_through_cscss_container_engine(tmp_path: Path) -> None:
    image = tmp_path / "torch.sqsh"
    image.write_bytes(b"hsqs" + bytes(200))  # a SquashFS file's magic, as the CE takes
    made = plan("alps", str(image), tmp_path)
    assert f"--environment={tmp_path}/runs/RUN/container.toml" in made.script
    [text] = [text for name, text in made.files if name == "container.toml"]
    edf = tomllib.loads(text)
    assert edf["image"] == str(image)
    assert edf["annotations"]["com.hooks.aws_ofi_nccl.enabled"] == "true"
    assert "apptainer" not in made.script and "--nv" not in made.script


def test_perlmutter_runs_containers_through_podman_hpc(tmp_path: Path) -> None:
    made = plan("perlmutter", "mytorch:1", tmp_path)
    assert "podman-hpc run --rm" in made.script and " --gpu " in made.script
    assert "apptainer" not in made.script
