"""Container pieces without Slurm: image lookup, binds, the task's command line, the
bootstrap's environment hand-over through a file descriptor, pip conflict messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpclaunch.config.jobspec import Bind, ContainerJob, JobSpec
from hpclaunch.config.profiles import ContainerBind, ContainerSettings, load_profile
from hpclaunch.errors import UserError
from hpclaunch.node import bootstrap
from hpclaunch.payload import containers, venvs
from hpclaunch.script.launchers import task_argv

BOOT = Path(bootstrap.__file__)


def test_image_by_path_name_and_module_variable(tmp_path: Path) -> None:
    folder = tmp_path / "sif-images"
    folder.mkdir()
    (folder / "torch.sif").write_bytes(b"#!/usr/bin/env run-singularity\nSIF_MAGIC")
    settings = ContainerSettings(image_dirs=(str(folder),))
    found = containers.resolve_image("torch", settings, {}, tmp_path)
    assert found == folder / "torch.sif"
    assert containers.image_kind(found) == "sif"
    env = {"SIF": str(folder / "torch.sif")}
    assert containers.resolve_image("$SIF", settings, env, tmp_path) == found
    with pytest.raises(UserError, match=r"\$SIF is not set"):
        containers.resolve_image("$SIF", settings, {}, tmp_path)
    with pytest.raises(
        UserError, match=r"not found \(a bare name is looked up only in the profile's image folders"
    ):
        containers.resolve_image("jax", settings, {}, tmp_path)


def test_bare_image_name_is_looked_up_only_in_the_profile_image_folders(tmp_path: Path) -> None:
    """Another user of a group folder can leave `torch.sif` in the current folder: a bare
    name never finds it; `./torch.sif` (a slash) means exactly that file."""
    folder = tmp_path / "sif-images"
    folder.mkdir()
    (folder / "torch.sif").write_bytes(b"SIF_MAGIC")
    cwd = tmp_path / "group-project"
    cwd.mkdir()
    for name in ("torch.sif", "jax.sif", "jax"):
        (cwd / name).write_bytes(b"SIF_MAGIC planted")
    settings = ContainerSettings(image_dirs=(str(folder),))
    assert containers.resolve_image("torch.sif", settings, {}, cwd) == folder / "torch.sif"
    assert containers.resolve_image("./torch.sif", settings, {}, cwd) == cwd / "torch.sif"
    assert containers.resolve_image("../sif-images/torch.sif", settings, {}, cwd).is_file()
    with pytest.raises(UserError) as refused:
        containers.resolve_image("jax.sif", settings, {}, cwd)
    line = refused.value.line()
    assert "\n" not in line and str(folder) in line and "Write ./jax.sif" in line, line
    with pytest.raises(UserError, match=r"sets no \[container\] image_dirs.*Write ./jax "):
        containers.resolve_image("jax", ContainerSettings(), {}, cwd)
    with pytest.raises(UserError, match="not found"):
        containers.resolve_image("./missing.sif", settings, {}, cwd)
    # A module's $SIF holding a bare name follows the same rule.
    with pytest.raises(UserError, match="image folders"):
        containers.resolve_image("$SIF", settings, {"SIF": "jax.sif"}, cwd)


def test_image_notes_name_the_file_and_warn_when_others_can_change_it(tmp_path: Path) -> None:
    image = tmp_path / "torch.sif"
    image.write_bytes(b"SIF_MAGIC")
    image.chmod(0o644)
    found = containers.image_notes("torch.sif", str(image))
    assert found == [
        f"hpclaunch: container image {image} (found in the profile's image folder {tmp_path})"
    ]
    assert containers.image_notes(str(image), str(image)) == [f"hpclaunch: container image {image}"]
    assert containers.image_notes("$SIF", str(image))[0].endswith("(from $SIF)")
    image.chmod(0o664)
    assert containers.image_notes(str(image), str(image))[1].startswith(
        f"container image {image} is writable by group: "
    )
    image.chmod(0o646)
    os.chown(image, 65534, 65534)  # tests run as root; any other user
    (_, warning) = containers.image_notes(str(image), str(image))
    assert f"{image} is owned by " in warning and "and writable by others:" in warning
    # The site's images belong to its own account: only their write bits count.
    for value in ("torch.sif", "$SIF"):
        (_, warning) = containers.image_notes(value, str(image))
        assert f"{image} is writable by others:" in warning
    image.chmod(0o644)
    assert len(containers.image_notes("torch.sif", str(image))) == 1


def test_bind_forms_and_refusals(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    assert containers.parse_bind("data", tmp_path, "apptainer") == Bind(
        src=str(tmp_path / "data"), dst=str(tmp_path / "data")
    )
    bind = containers.parse_bind(f"{tmp_path}/data:/d:ro", tmp_path, "apptainer")
    assert bind.spec() == f"{tmp_path}/data:/d:ro"
    for text, match in (
        ("missing", "does not exist"),
        ("data:rel", "relative"),
        ("data:/d:rx", "mode"),
        ("a:b:c:d", "SRC"),
    ):
        with pytest.raises(UserError, match=match):
            containers.parse_bind(text, tmp_path, "apptainer")
    with pytest.raises(UserError, match="read-write only"):
        containers.parse_bind("data:/d:ro", tmp_path, "charliecloud")


def test_job_binds_profile_sets_and_nesting() -> None:
    settings = load_profile("lumi").container
    own = [
        ("run", "/scratch/p/u/hpclaunch"),
        ("project", "/users/u/proj"),
        ("cwd", "/users/u/proj/src"),
    ]
    single = containers.job_binds(settings, 1, own, [])
    assert [b.src for b in single] == ["/pfs", "/scratch/p/u/hpclaunch", "/users/u/proj"]
    multi = containers.job_binds(settings, 2, own, [])
    assert [b.src for b in multi][:3] == [
        "/var/spool/slurmd",
        "/opt/cray",
        "/usr/lib64/libcxi.so.1",
    ]
    # Nothing under /scratch or /flash: no /pfs. A folder inside another is not bound twice.
    home_only = containers.job_binds(
        settings, 1, [("run", "/users/u/p/runs"), ("project", "/users/u/p")], []
    )
    assert [b.src for b in home_only] == ["/users/u/p"]
    # /tmp is the runtimes' own.
    assert containers.job_binds(ContainerSettings(), 1, [("run", "/tmp/x")], []) == []


def test_charliecloud_mount_points_in_a_directory_image(tmp_path: Path) -> None:
    image = tmp_path / "img"
    (image / "mnt").mkdir(parents=True)
    binds = [Bind(src="/x", dst="/mnt"), Bind(src="/y", dst="/data/y")]
    makeable, impossible = containers.missing_mount_points(
        image, "directory", binds, ContainerSettings()
    )
    assert (makeable, impossible) == (["/data/y"], [])
    job = ContainerJob(
        runtime="charliecloud", command="ch-run", image=str(image), mount_points=("/data/y",)
    )
    containers.make_mount_points(job)
    assert (image / "data" / "y").is_dir()
    image.chmod(0o555)
    try:
        if not os.access(image, os.W_OK):  # root writes anyway
            assert containers.missing_mount_points(
                image, "directory", [Bind("/z", "/z")], ContainerSettings()
            ) == ([], ["/z"])
    finally:
        image.chmod(0o755)


def _spec(launcher: str = "srun") -> JobSpec:
    return JobSpec(
        cluster="slurm",
        program=("python", "train.py"),
        nodes=2,
        tasks_per_node=4,
        launcher=launcher,
    )  # type: ignore[arg-type]


def test_task_line_reads_environment_from_fd_3() -> None:
    job = ContainerJob(
        runtime="apptainer", command="apptainer", image="/i.sif", cwd="/w",
        binds=(Bind("/a", "/a"), Bind("/b", "/c", ro=True)), flags=("--nv",),
    )  # fmt: skip
    inner = task_argv(_spec(), "python3", "/run/bootstrap.py", containers.ENV_FD)
    argv = containers.wrap(job, inner)
    assert argv[:4] == ["bash", "-c", containers.WRAPPER, "hpclaunch-task"]
    assert argv[4:] == [
        "apptainer", "exec", "--cleanenv", "--pwd", "/w", "--nv", "--bind", "/a,/b:/c:ro", "/i.sif",
        "python3", "-I", "-S", "/run/bootstrap.py", "--hpclaunch-env-fd=3", "python", "train.py",
    ]  # fmt: skip
    torchrun = task_argv(_spec("torchrun"), "python3", "/run/bootstrap.py", 3)
    assert torchrun[:6] == [
        "python3",
        "-I",
        "-S",
        "/run/bootstrap.py",
        "--hpclaunch-env-fd=3",
        "--hpclaunch-exec",
    ]
    assert torchrun[6] == "torchrun" and torchrun[-4:] == [
        "-S",
        "/run/bootstrap.py",
        "python",
        "train.py",
    ]
    ch = ContainerJob(
        runtime="charliecloud", command="ch-run", image="/img", cwd="/w", activate="$WITH_CONDA"
    )
    assert containers.runtime_argv(ch) == [
        "ch-run", "--unset-env=*", "--cd=/w", "/img", "--",
        "bash", "-c", '$WITH_CONDA && exec "$@"', "hpclaunch-activate",
    ]  # fmt: skip


def test_wrapper_hands_the_environment_over_and_the_bootstrap_filters_it(tmp_path: Path) -> None:
    """The real wrapper text, with `env -i` standing in for a runtime that cleans the
    environment: only names HPCLAUNCH_CONTAINER_PASS lists arrive, values intact."""
    dump = tmp_path / "env.txt"
    code = f"import os, json; open({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))"
    env = {
        "PATH": os.environ["PATH"],
        "HPCLAUNCH_CONTAINER_PASS": "SLURM_* KEEP_ME SECRET_TOKEN",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "KEEP_ME": "a b\nc$'\"",
        "SECRET_TOKEN": "s3cr3t",
        "DROP_ME": "x",
        "HPCLAUNCH_VENV": str(tmp_path / "venv"),
    }
    boot = [sys.executable, "-I", "-S", str(BOOT), "--hpclaunch-env-fd=3"]
    argv = ["bash", "-c", containers.WRAPPER, "t", "env", "-i", *boot, sys.executable, "-c", code]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    seen = json.loads(dump.read_text())
    assert seen["KEEP_ME"] == "a b\nc$'\"" and seen["SECRET_TOKEN"] == "s3cr3t"
    assert seen["RANK"] == "3" and seen["WORLD_SIZE"] == "4"
    assert "DROP_ME" not in seen and "HPCLAUNCH_VENV" not in seen
    assert seen["PYTHONNOUSERSITE"] == "1" and seen["PATH"].startswith("/usr/local/sbin")


def test_bootstrap_refuses_a_missing_environment_pipe() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(BOOT), "--hpclaunch-env-fd=9", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 125
    assert "did not reach the container" in done.stderr


def test_venv_activation_is_done_by_the_bootstrap(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HPCLAUNCH_VENV": "/v", "PYTHONHOME": "/x"}
    bootstrap.activate_venv(env)
    assert env == {"PATH": "/v/bin:/usr/bin:/bin", "HPCLAUNCH_VENV": "/v", "VIRTUAL_ENV": "/v"}
    bootstrap.activate_venv(env)  # twice (torchrun agent, then worker): PATH not doubled
    assert env["PATH"] == "/v/bin:/usr/bin:/bin"


PIP_DEP = """\
ERROR: Cannot install pkgc because these package versions have conflicting dependencies.

The conflict is caused by:
    pkgb 1.0 depends on pkga>=2.0
    The user requested (constraint) pkga==1.0
"""


def test_pip_conflicts_become_one_line_naming_the_image_package() -> None:
    err = venvs.conflict_error(PIP_DEP, "/img", "-r req.txt")
    assert err is not None
    assert err.render() == (
        "-r req.txt: pkgb 1.0 depends on pkga>=2.0, which would replace the image's pkga 1.0 "
        "(/img ships pkga==1.0, pinned in hpclaunch-constraints.txt). Ask for versions that "
        "work with pkga 1.0, or use an image that has what you need"
    )
    assert venvs.conflict_error("ERROR: No matching distribution found for x", "/img") is None


def test_requirement_folders_are_found_for_binding(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    req = tmp_path / "req.txt"
    req.write_text(f"--find-links {tmp_path}/wheels\n-f=wheels\ntorch>=2\n# /etc\n")
    assert venvs.local_paths(req) == [str(tmp_path / "wheels")] * 2


def test_profile_container_settings_validate() -> None:
    lumi = load_profile("lumi").container
    assert lumi.command == "singularity" and lumi.activate == "$WITH_CONDA"
    assert ContainerBind(path="/opt/cray", multi_node=True, node_local=True) in lumi.binds
    assert load_profile("slurm").container.gpu_flags == ("--nv",)
