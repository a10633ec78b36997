"""Pyxis/enroot, the CSCS Container Engine and podman-hpc without Slurm: the runtime
chosen (profile key or --container-runtime), the job script each renders (the dry-run),
the run's EDF, the images each accepts and refuses.

What these cannot show: that the real Pyxis, CE or podman-hpc accept these lines (none
installs here: tests/test_e2e_runtimes.py runs them through stand-ins on the testbed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib

from hpclaunch.config.jobspec import Bind, ContainerJob
from hpclaunch.errors import UserError
from hpclaunch.planning import preparing
from hpclaunch.records.runpaths import RunPaths
from hpclaunch.script import render

RUN_ID = "20260101-000000-000-abcd"
SITE = """name = "gpusite"
kind = "slurm"
default_partition = "gpu"
run_root = "{root}/runs"

[partitions.gpu]
max_time = "1-00:00:00"
max_nodes = 64
gpus = 8
default = true

[container]
runtime = "{runtime}"
image_dirs = ["{images}"]
"""


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    """A GPU site profile in the user's config folder, its image folder with a SquashFS
    file (`hsqs` magic) and a directory image."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "pytorch.sqsh").write_bytes(b"hsqs" + b"\0" * 124)
    (images / "rootfs").mkdir()
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    try:
        yield tmp_path
    finally:
        if old is None:
            del os.environ["XDG_CONFIG_HOME"]
        else:
            os.environ["XDG_CONFIG_HOME"] = old


def _profile(root: Path, runtime: str, extra: str = "") -> None:
    clusters = root / "config" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True, exist_ok=True)
    text = SITE.format(root=root, runtime=runtime, images=root / "images") + extra
    (clusters / "gpusite.toml").write_text(text)


def _plan(root: Path, runtime: str, extra: str = "", **cli: object) -> render.BatchPlan:
    _profile(root, runtime, extra)
    project = root / "project"
    project.mkdir(exist_ok=True)
    environ = {
        "HOME": str(root),
        "PATH": "/usr/bin:/bin",
        "XDG_CONFIG_HOME": str(root / "config"),
        "WANDB_API_KEY": "s3cret",
    }
    options = {"cluster": "gpusite", "nodes": "2", "gpus_per_node": "2", "time": "10", **cli}
    options.setdefault("container", "pytorch")
    options.setdefault("env", ("WANDB_API_KEY", "LR=0.1"))
    prepared = preparing.prepare_spec(options, ("python", "train.py"), project, environ)
    spec = prepared.spec
    run_dir = Path(spec.run_root) / spec.exp / RUN_ID
    paths = RunPaths(RUN_ID, run_dir, run_dir / "checkpoints")
    return render.plan_batch(spec, prepared.profile, paths, project)


def _srun(plan: render.BatchPlan) -> list[str]:
    return [str(w) for w in plan.srun_argv]


def test_pyxis_runs_the_ranks_through_srun_container_options(site: Path) -> None:
    plan = _plan(site, "pyxis")
    argv = _srun(plan)
    image = str(site / "images" / "pytorch.sqsh")
    assert argv[argv.index(f"--container-image={image}") + 1].startswith("--container-mounts=")
    mounts = next(a for a in argv if a.startswith("--container-mounts="))
    assert f"{site}/runs:{site}/runs" in mounts and f"{site}/project:{site}/project" in mounts
    assert f"--container-workdir={site}/project" in argv
    assert "--no-container-mount-home" in argv
    env = next(a for a in argv if a.startswith("--container-env=")).split("=", 1)[1].split(",")
    for name in ("HPCLAUNCH_RUN_DIR", "MASTER_ADDR", "MASTER_PORT", "LR", "WANDB_API_KEY"):
        assert name in env
    assert "s3cret" not in plan.script  # a secret's name only, never its value
    # The task is the bootstrap itself: no wrapper, no fd 3 (Pyxis passes the environment).
    task = [str(w) for w in plan.task_argv]
    assert task[:3] == ["python3", "-I", "-S"] and task[-2:] == ["python", "train.py"]
    assert not any("hpclaunch-env-fd" in w for w in task)
    assert "--container-image=" in plan.script and "Pyxis/enroot" in plan.script
    assert plan.files == ()


def test_pyxis_profile_flags_ro_binds_and_the_cli_choice(site: Path) -> None:
    data = site / "data"
    data.mkdir()
    plan = _plan(site, "apptainer", container_runtime="pyxis", bind=(f"{data}:/data:ro",))
    mounts = next(a for a in _srun(plan) if a.startswith("--container-mounts="))
    assert mounts.endswith(f",{data}:/data:ro")


def test_ce_writes_the_runs_edf_and_passes_environment(site: Path) -> None:
    extra = (
        'base_environment = ["alps-base"]\n'
        '[container.annotations]\n"com.hooks.aws_ofi_nccl.enabled" = "true"\n'
    )
    plan = _plan(site, "ce", extra=extra.replace("[container.", "\n[container."))
    edf_path = site / "runs" / "default" / RUN_ID / "container.toml"
    assert f"--environment={edf_path}" in _srun(plan)
    (name, text), *_ = plan.files
    assert name == "container.toml"
    edf = tomllib.loads(text)
    assert edf["image"] == str(site / "images" / "pytorch.sqsh")
    assert edf["workdir"] == str(site / "project")
    assert f"{site}/runs:{site}/runs" in edf["mounts"]
    assert edf["base_environment"] == ["alps-base"]
    assert edf["annotations"] == {"com.hooks.aws_ofi_nccl.enabled": "true"}
    assert edf["env"]["HPCLAUNCH_RUN_DIR"] == "${HPCLAUNCH_RUN_DIR:-}"
    assert edf["env"]["WANDB_API_KEY"] == "${WANDB_API_KEY:-}"
    # Per-node and per-task values stay the host's (inherited by the container).
    assert "SLURMD_NODENAME" not in edf["env"] and "CUDA_VISIBLE_DEVICES" not in edf["env"]
    assert "s3cret" not in text and "s3cret" not in plan.script
    assert not any("hpclaunch-env-fd" in str(w) for w in plan.task_argv)


def test_edf_escapes_dollar_in_paths() -> None:
    from hpclaunch.payload import runtimes

    job = ContainerJob(
        runtime="ce", command="srun", image="/i/a$b.sqsh", cwd="/w",
        binds=(Bind('/d"x', "/d"),), pass_env=("LC_*", "TZ"),
    )  # fmt: skip
    edf = tomllib.loads(runtimes.edf_text(job, ["A"]))
    assert edf["image"] == "/i/a$$b.sqsh" and edf["mounts"] == ['/d"x:/d']
    assert list(edf["env"]) == ["MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "A", "TZ"]


def test_podman_hpc_runs_each_rank_in_podman_hpc_run(site: Path) -> None:
    plan = _plan(site, "podman-hpc", container="pytorch:24.05")
    task = [str(w) for w in plan.task_argv]
    head = task[: task.index("pytorch:24.05")]
    assert head[:6] == ["podman-hpc", "run", "--rm", "--network=host", "--pid=host", "--gpu"]
    assert f"--volume={site}/runs:{site}/runs" in head
    assert f"--workdir={site}/project" in head
    for name in ("--env=SLURM_*", "--env=HPCLAUNCH_*", "--env=WANDB_*", "--env=LR"):
        assert name in head
    after = task[task.index("pytorch:24.05") + 1 :]
    assert after[:3] == ["python3", "-I", "-S"] and after[-2:] == ["python", "train.py"]
    assert not any("hpclaunch-env-fd" in w for w in task)
    assert "podman-hpc run" in plan.script and "s3cret" not in plan.script


@pytest.mark.parametrize(
    ("runtime", "image", "words"),
    [
        ("pyxis", "nvcr.io#nvidia/pytorch:24.05-py3", "registry reference"),
        ("ce", "docker://ubuntu:24.04", "registry reference"),
        ("pyxis", "rootfs", "is a directory image"),
        ("ce", "rootfs", "is a directory image"),
        ("podman-hpc", "./rootfs", "is not an image name"),
    ],
)
def test_images_each_runtime_refuses(site: Path, runtime: str, image: str, words: str) -> None:
    with pytest.raises(UserError) as caught:
        _plan(site, runtime, container=image)
    assert words in str(caught.value) and "--container" in str(caught.value)


def test_unknown_runtime_is_refused_by_the_option(site: Path) -> None:
    with pytest.raises(UserError) as caught:
        _plan(site, "apptainer", container_runtime="enroot")
    assert "podman-hpc" in str(caught.value)


@pytest.mark.parametrize("runtime", ["pyxis", "ce"])
def test_srun_runtimes_are_refused_on_a_local_run(tmp_path: Path, runtime: str) -> None:
    """A local run starts its ranks without srun: Pyxis's or the CE's options would be
    lost and the ranks would run outside the image."""
    options = {"cluster": "local", "container": "x.sqsh", "container_runtime": runtime}
    with pytest.raises(UserError) as caught:
        preparing.prepare_spec(options, ("python", "t.py"), tmp_path, {"HOME": str(tmp_path)})
    assert f"{runtime} on a local run" in str(caught.value)


def _attach_plan(tmp_path: Path, runtime: str, image: str, command: list[str]) -> Any:
    from hpclaunch.observe import attach
    from hpclaunch.records import runrecord

    run_dir = tmp_path / "runs" / "default" / RUN_ID
    run_dir.mkdir(parents=True)
    runrecord.create(
        run_dir,
        {"run_id": RUN_ID, "run_dir": str(run_dir), "backend": "slurm", "job_id": "42",
         "state": "RUNNING", "nodes": 2, "tasks_per_node": 1, "cwd": str(tmp_path)},
    )  # fmt: skip
    container = {
        "runtime": runtime, "command": "srun" if runtime != "podman-hpc" else "podman-hpc",
        "image": image, "binds": [{"src": "/data", "dst": "/d", "ro": True}], "flags": [],
        "cwd": "/work", "pass_env": ["NCCL_*"],
    }  # fmt: skip
    spec = {"env": {"LR": "0.1"}, "venv": "/v", "container": container}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    target = attach.Target(RUN_ID, "42", ("node1", "node2"), "node2")
    environ = {"PATH": "/usr/bin:/bin", "HOME": "/h"}
    record = runrecord.load(run_dir)
    return attach.plan_attach(record, target, command, container=True, pty=False, environ=environ)


def test_attach_container_enters_a_pyxis_image_through_srun(tmp_path: Path) -> None:
    """attach --container (and stack, which attaches py-spy) start a step with the job's
    own --container-* options; the exec-only bootstrap activates the venv without fd 3."""
    p = _attach_plan(tmp_path, "pyxis", "/img/x.sqsh", ["py-spy", "dump"])
    argv = list(p.argv)
    at = argv.index("--container-image=/img/x.sqsh")
    assert argv[at + 1 : at + 4] == [
        "--container-mounts=/data:/d:ro", "--container-workdir=/work", "--no-container-mount-home"
    ]  # fmt: skip
    env = argv[at + 4].split("=", 1)[1].split(",")
    assert {"HPCLAUNCH_RUN_DIR", "HPCLAUNCH_VENV", "LR", "TERM"} <= set(env)
    assert argv[at + 5 :][-3:] == ["--hpclaunch-exec", "py-spy", "dump"]
    assert not any(a.startswith("--hpclaunch-env-fd") for a in argv)
    assert p.env["HPCLAUNCH_VENV"] == "/v"


def test_attach_container_ce_uses_the_runs_edf_podman_its_run(tmp_path: Path) -> None:
    ce = _attach_plan(tmp_path / "ce", "ce", "/img/x.sqsh", ["true"])
    edf = tmp_path / "ce" / "runs" / "default" / RUN_ID / "container.toml"
    assert f"--environment={edf}" in ce.argv
    podman = _attach_plan(tmp_path / "pod", "podman-hpc", "pytorch:24.05", ["true"])
    argv = list(podman.argv)
    start = argv.index("podman-hpc")
    assert argv[start : start + 3] == ["podman-hpc", "run", "--rm"]
    assert "--volume=/data:/d:ro" in argv and "--env=LR" in argv and "--env=TERM" in argv
    assert argv[-2:] == ["--hpclaunch-exec", "true"]


# --- image import -------------------------------------------------------------------------


def _rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "os-release").write_text('PRETTY_NAME="test"\n')
    return root


def _hpclaunch(cwd: Path, *args: str, path: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(cwd), "XDG_CONFIG_HOME": str(cwd / "config")}
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    argv = [sys.executable, "-m", "hpclaunch", *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("runtime", ["pyxis", "ce"])
def test_image_import_of_a_root_file_system_makes_a_private_squashfs(
    tmp_path: Path, runtime: str
) -> None:
    """The real mksquashfs with enroot's options; what Pyxis/the CE then mount is the
    file itself (tests/test_e2e_runtimes.py runs ranks in such a file)."""
    if not shutil.which("mksquashfs") or not shutil.which("unsquashfs"):
        pytest.skip("squashfs-tools is not installed")
    root = _rootfs(tmp_path)
    done = _hpclaunch(tmp_path, "image", "import", "--container-runtime", runtime, str(root))
    assert done.returncode == 0, done.stderr
    image = tmp_path / "rootfs.sqsh"
    assert f"imported {root} for {runtime}: {image} (" in done.stderr
    assert image.read_bytes()[:4] == b"hsqs" and image.stat().st_mode & 0o077 == 0
    listing = subprocess.run(["unsquashfs", "-l", str(image)], capture_output=True, text=True)
    assert "squashfs-root/etc/os-release" in listing.stdout
    again = _hpclaunch(tmp_path, "image", "import", "--container-runtime", runtime, str(root))
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert f"--output: {image} exists" in again.stderr
    json_out = _hpclaunch(
        tmp_path, "image", "import", "--container-runtime", runtime, str(root),
        "-o", "other.sqsh", "--json",
    )  # fmt: skip
    answer = json.loads(json_out.stdout)
    assert answer["image"] == str(tmp_path / "other.sqsh") and answer["size"] > 0


def test_image_import_refusals_are_one_line(tmp_path: Path) -> None:
    missing = _hpclaunch(tmp_path, "image", "import", "--container-runtime", "pyxis", "nothere")
    assert missing.returncode == 2 and "SOURCE: 'nothere' is not a folder" in missing.stderr
    empty = tmp_path / "bin"
    empty.mkdir()
    (empty / "python3").symlink_to(sys.executable)
    (empty / "tar").symlink_to(shutil.which("tar") or "/bin/tar")
    pull = subprocess.run(
        [sys.executable, "-m", "hpclaunch", "image", "import", "--container-runtime", "pyxis",
         "docker://nvcr.io#nvidia/pytorch:24.05-py3"],
        cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": str(empty)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert pull.returncode == 2 and pull.stderr.count("\n") == 1
    assert "enroot is not on PATH" in pull.stderr


def test_image_import_for_podman_hpc_imports_then_migrates(tmp_path: Path) -> None:
    """podman-hpc is not installed here: a stand-in on PATH records its command lines
    and the tar stream it is given. What this cannot show: that podman-hpc accepts the
    stream and squashes the image (the real podman-hpc's `import` and `migrate`)."""
    root = _rootfs(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.txt"
    stand_in = bin_dir / "podman-hpc"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        f'if [ "$1" = import ]; then tar -t > {tmp_path}/members.txt; fi\n'
        'if [ "$1" = images ]; then echo localhost/mytorch:1; fi\n'
    )
    stand_in.chmod(0o755)
    done = _hpclaunch(
        tmp_path, "image", "import", "--container-runtime", "podman-hpc", str(root),
        "--name", "mytorch:1", path=str(bin_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[:2] == ["import - mytorch:1", "migrate mytorch:1"]
    assert calls[2:] == ["images --filter readonly=true --format {{.Repository}}:{{.Tag}}"]
    assert "./etc/os-release" in (tmp_path / "members.txt").read_text()
    assert "for podman-hpc: mytorch:1 (in podman-hpc's storage)" in done.stderr


@pytest.mark.parametrize("runtime", ["pyxis", "ce", "podman-hpc"])
def test_staged_data_is_bound_in_where_the_container_has_its_own_tmp(
    site: Path, runtime: str
) -> None:
    """--stage unpacks on each node under $HPCLAUNCH_LOCAL_PARENT (/tmp by default), which
    these runtimes hide behind the container's own /tmp: it is bound in."""
    data = site / "data"
    data.mkdir()
    (data / "x.txt").write_text("x")
    image = "pytorch:1" if runtime == "podman-hpc" else "pytorch"
    plan = _plan(site, runtime, container=image, stage=(str(data),))
    if runtime == "ce":
        edf = tomllib.loads(plan.files[0][1])
        assert "${HPCLAUNCH_LOCAL_PARENT}:${HPCLAUNCH_LOCAL_PARENT}" in edf["mounts"]
    else:
        flag = "--container-mounts=" if runtime == "pyxis" else "--volume="
        assert f'{flag}"${{HPCLAUNCH_LOCAL_PARENT}}":"${{HPCLAUNCH_LOCAL_PARENT}}"' in plan.script
    plain = _plan(site, runtime, container=image)
    assert "HPCLAUNCH_LOCAL_PARENT" not in plain.script + "".join(t for _, t in plain.files)


def test_env_create_starts_a_pyxis_image_in_a_one_task_srun() -> None:
    """`env create` on a login node: Pyxis only enters images in srun, so the venv is made
    in a one-task job of its own (tests/test_e2e_runtimes.py makes one on the testbed);
    the CE is refused in one line (its EDF would need a file of its own)."""
    from hpclaunch.payload import containers

    job = ContainerJob(
        runtime="pyxis", command="srun", image="/i/x.sqsh", cwd="/w",
        binds=(Bind("/v", "/v"),), pass_env=("TZ",),
    )  # fmt: skip
    assert containers.runtime_argv(job, clean=False) == [
        "srun", "--nodes=1", "--ntasks=1", "--quiet", "--container-image=/i/x.sqsh",
        "--container-mounts=/v:/v", "--container-workdir=/w", "--no-container-mount-home",
        "--container-env=SLURMD_NODENAME,MASTER_ADDR,MASTER_PORT,OMP_NUM_THREADS,TZ",
    ]  # fmt: skip
    with pytest.raises(UserError, match="ce for env create"):
        containers.runtime_argv(ContainerJob(runtime="ce", command="srun", image="/i.sqsh"))


def test_doctor_takes_a_podman_hpc_image_name_as_seen() -> None:
    """doctor's image check: a podman-hpc image is a name in its storage, not a path."""
    from hpclaunch.config.jobspec import JobSpec
    from hpclaunch.config.profiles import load_profile
    from hpclaunch.doctor import checks

    job = ContainerJob(runtime="podman-hpc", command="podman-hpc", image="pytorch:24.05")
    spec = JobSpec(cluster="slurm", program=("true",), container=job)
    seen = checks._seen_here(spec, load_profile("slurm"))
    assert [(c.name, c.status) for c in seen] == [("image", checks.PASS)]


def test_podman_hpc_ranks_get_signals_through_the_bootstrap(site: Path) -> None:
    """The ranks run under podman's conmon, outside Slurm's step: the bootstrap (the
    container's first process, which `podman run` signals) passes signals on."""
    plan = _plan(site, "podman-hpc", container="pytorch:24.05")
    assert "HPCLAUNCH_FORWARD_SIGNALS=always" in plan.script
    pyxis = _plan(site, "pyxis", container="pytorch")
    assert "HPCLAUNCH_FORWARD_SIGNALS" not in pyxis.script


def test_image_import_for_podman_hpc_says_when_migrate_made_no_copy(tmp_path: Path) -> None:
    """podman-hpc migrate exits 0 when its squash fails (seen with the real one on the
    testbed: "ERROR:root:Squash Failed", exit 0): the import looks for the read-only
    copy and says it is missing, in one line."""
    root = _rootfs(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "podman-hpc"
    stand_in.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = import ]; then cat > /dev/null; fi\n'
        'if [ "$1" = migrate ]; then echo "ERROR:root:Squash Failed" >&2; fi\n'
    )
    stand_in.chmod(0o755)
    done = _hpclaunch(
        tmp_path, "image", "import", "--container-runtime", "podman-hpc", str(root),
        "--name", "mytorch:1", path=str(bin_dir),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hpclaunch: error: image import: podman-hpc migrate made no")
    assert "imported" not in done.stderr and "Traceback" not in done.stderr


def test_a_podman_hpc_image_is_named_as_a_name_not_a_found_file() -> None:
    """The dry-run's note: a podman-hpc image is a name in its storage, not a file found
    in an image folder (it said "found in the profile's image folder " with no folder)."""
    from hpclaunch.payload.images import image_notes

    notes = image_notes("pytorch:24.05", "pytorch:24.05")
    assert notes == ["hpclaunch: container image pytorch:24.05 (a name in podman-hpc's storage)"]


def test_podman_hpc_chosen_over_an_apptainer_profile_gets_its_own_gpu_flag(site: Path) -> None:
    """--container-runtime podman-hpc on a profile made for Apptainer (the slurm
    profile's gpu_flags = ["--nv"]): podman-hpc's --gpu, not Apptainer's --nv, which
    podman refuses ("Error: unknown flag: --nv", the real podman-hpc on the testbed)."""
    extra = 'gpu_flags = ["--nv"]\n'
    plan = _plan(site, "apptainer", extra, container="pytorch:24.05",
                 container_runtime="podman-hpc")  # fmt: skip
    task = [str(w) for w in plan.task_argv]
    head = task[: task.index("pytorch:24.05")]
    assert "--gpu" in head and "--nv" not in head
