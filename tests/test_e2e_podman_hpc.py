"""podman-hpc on the real testbed: NERSC's wrapper (PyPI podman-hpc 1.2.2,
github.com/NERSC/podman-hpc) over Debian 12's podman 4.3.1, both the real programs.
`hpclaunch image import` of a local root file system (`podman-hpc import`, then
`podman-hpc migrate`, which squashes it into the shared store every node reads), 2 nodes
x 2 ranks inside it with --stage, --venv and the rank contract checked as for
Charliecloud (tests/test_e2e_containers.py), podman's refusal of an option it does not
know, a requeue inside the container (the program saves on the signal), attach
--container and stack.

Installed only when these tests run (set-up time would count against every CI run):
podman, fuse-overlayfs, inotify-tools (apt-get) and podman-hpc (pip, into a venv of its
own in the testbed's shared folder), under a file lock; the module skips, with the
reason, where apt-get or pip cannot.

As root: here /dev/fuse is root's only (crw-------), so fuse-overlayfs, which podman-hpc
mounts every image with (its fuse-overlayfs-wrap), and squashfuse run for root only. A
real site runs podman-hpc rootless (NERSC: subuid ranges, /dev/fuse open to users;
docs.nersc.gov/development/containers/podman-hpc/overview).

The site's podman-hpc configuration is the one the wheel ships
(etc/podman_hpc/podman_hpc.yaml: graph root and run root under each node's /tmp), with
this machine's paths, and its squash store on the shared folder ($SQUASH_DIR,
siteconfig.py); this machine's podman settings are in a containers.conf of the test's
(CONTAINERS_CONF below says why). `migrate` runs mksquashfs inside the image
(migrate2scratch.py `_mksq`, a static `mksquashfs.static` by default), which Debian lacks:
MKSQUASHFS below.

What these cannot show: rootless podman, a real GPU (`--gpu`: the testbed's are fake),
the site's hooks (podman-hpc's modules bind the GPU and MPI libraries through an OCI
hook a site installs), shared-run (one container per node).
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import rank_contract
import testbed
from conftest import PROGRAMS, VENV_BIN, Hpc, _user_folder

pytestmark = pytest.mark.testbed

PACKAGES = ("podman", "fuse-overlayfs", "inotify-tools", "uidmap", "runc")
PODMAN_HPC = "podman-hpc==1.2.2"
# podman-hpc's own configuration (its etc/podman_hpc/podman_hpc.yaml), this machine's paths.
CONFIG = """\
podman_bin: "/usr/bin/podman"
mount_program: "{venv}/bin/fuse-overlayfs-wrap"
modules_dir: "{venv}/etc/podman_hpc/modules.d"
mksquashfs_bin: "{venv}/mksquashfs-4.5"
shared_run_exec_args: ["-e", "SLURM_*", "-e", "PALS_*", "-e", "PMI_*"]
shared_run_command: ["sleep", "infinity"]
localid_var: "SLURM_LOCALID"
tasks_per_node_var: "SLURM_STEP_TASKS_PER_NODE"
ntasks_pattern: "[0-9]+"
graph_root_template: "/tmp/{{{{ uid }}}}_hpc/storage"
run_root_template: "/tmp/{{{{ uid }}}}_hpc"
config_home_template: "/tmp/{{{{ uid }}}}_hpc/config"
"""
# This machine's podman settings (containers.conf(5), read from $CONTAINERS_CONF). Root
# here lacks CAP_SYS_RESOURCE (`grep CapEff /proc/self/status`: bit 24 clear), so the
# limits podman sets by default for root (nofile 1048576) fail: "crun: setrlimit
# `RLIMIT_NOFILE`: Operation not permitted"; crun 1.8 refuses the hybrid cgroup layout
# ("cgroups in hybrid mode not supported"), runc with cgroupfs runs.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc=30000:30000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""
# podman-hpc migrate runs its mksquashfs inside the image (bound at /mksq) with
# `-xattrs-exclude security.capability` (migrate2scratch.py), an option of squashfs-tools
# 4.6; Debian 12 has 4.5.1 and no static build: this drops that option and runs Debian's
# mksquashfs, which the test image carries (with liblzo2, which it lacks).
MKSQUASHFS = """\
#!/bin/sh
for arg in "$@"; do
    shift
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    if [ "$arg" = -xattrs-exclude ]; then skip=1; continue; fi
    set -- "$@" "$arg"
done
exec /usr/local/bin/mksquashfs "$@" -no-xattrs
"""


@dataclass(frozen=True)
class PodmanHpc:
    env: dict[str, str]  # what a job and `image import` need: PATH, config, $SCRATCH
    image: str  # the image's name in podman-hpc's storage


def _apt_install() -> str:
    """Empty once podman and what podman-hpc runs are installed, else why not."""
    if all(shutil.which(p) for p in ("podman", "fuse-overlayfs", "inotifywait", "runc")):
        return ""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Another apt-get (a test image build) may hold the lock: wait for it, not fail.
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    install = ["apt-get", *lock, "install", "-y", "--no-install-recommends", *PACKAGES]
    for argv in (install, ["apt-get", "update"], install):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode == 0 and argv == install:
            return ""
    return f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr[-1000:]}"


def _pip_install(venv: Path) -> str:
    """Empty once podman-hpc is in its venv (seen by both nodes), else why not."""
    if (venv / "bin" / "podman-hpc").exists():
        return ""
    shutil.rmtree(venv, ignore_errors=True)
    for argv in (
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "--quiet", PODMAN_HPC],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            return f"{' '.join(argv[-2:])} failed: {done.stderr[-1000:]}"
    return ""


@pytest.fixture(scope="module")
def installed(slurm_conf: Path) -> dict[str, str]:
    """podman (apt-get) and podman-hpc (its own venv), installed once under a lock;
    the environment that finds them."""
    venv = testbed.state_dir() / "podman-hpc"
    with open(testbed.state_dir() / "podman-hpc.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        why = _apt_install() or _pip_install(venv)
        if why:
            pytest.skip(why)
        (venv / "podman_hpc.yaml").write_text(CONFIG.format(venv=venv))
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        (venv / "containers.conf").write_text(CONTAINERS_CONF.format(nofile=nofile))
        (venv / "mksquashfs-4.5").write_text(MKSQUASHFS)
        (venv / "mksquashfs-4.5").chmod(0o755)
    return {"PATH": f"{venv}/bin:{VENV_BIN}:{testbed.USER_PATH}",
            "PODMANHPC_CONFIG_FILE": str(venv / "podman_hpc.yaml"),
            "CONTAINERS_CONF": str(venv / "containers.conf")}  # fmt: skip


@pytest.fixture
def root(slurm_conf: Path) -> Iterator[Hpc]:
    """A fresh shared folder of root's (fuse-overlayfs and squashfuse need root here)."""
    yield from _user_folder(slurm_conf, "root", False)


def _as_root(env: dict[str, str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env={**env, "HOME": str(cwd), "USER": "root", "LANG": "C.UTF-8"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def podman(installed: dict[str, str], user_image: Path, slurm_conf: Path) -> Iterator[PodmanHpc]:
    """`hpclaunch image import` (podman-hpc import + migrate) of the test image, as root,
    into a squash store of this module's ($SCRATCH/storage), and a venv made inside it
    with `hpclaunch env create`."""
    folder = testbed.work_dir() / f"podman-{uuid.uuid4().hex[:8]}"
    rootfs = folder / "rootfs"
    folder.mkdir()
    # Hard links: the image's files are not copied; the one library added is not in it.
    subprocess.run(["cp", "-al", str(user_image), str(rootfs)], check=True, timeout=300)
    shutil.copy2("/usr/lib/x86_64-linux-gnu/liblzo2.so.2", rootfs / "usr/lib/x86_64-linux-gnu")
    shutil.copy2("/usr/bin/mksquashfs", rootfs / "usr/local/bin")
    # podman-hpc's squash store ($SQUASH_DIR, else $SCRATCH/storage: siteconfig.py).
    env = {**installed, "SQUASH_DIR": str(folder / "squash"), "SLURM_CONF": str(slurm_conf)}
    name = f"hpclaunch-test-{folder.name}:1"
    done = _as_root(env, ["hpclaunch", "image", "import", "--container-runtime",
                          "podman-hpc", "--name", name, str(rootfs)], folder)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"for podman-hpc: {name} (in podman-hpc's storage)" in done.stderr, done.stderr
    # Migrated once: the squashed copy every node mounts (fuse-overlayfs-wrap, squashfuse).
    assert list((folder / "squash" / "overlay" / "l").glob("*.squash")), done.stderr
    try:
        yield PodmanHpc(env=env, image=name)
    finally:
        _as_root(env, ["podman-hpc", "rmi", "--force", name], folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def venv(podman: PodmanHpc) -> Iterator[Path]:
    """`hpclaunch env create` for the image: made inside it by `podman-hpc run` (here, on
    the machine the tests run on: a login node's)."""
    folder = testbed.work_dir() / f"venv-{podman.image.split(':')[0]}"
    done = _as_root(podman.env, ["hpclaunch", "env", "create", "--container-runtime",
                                 "podman-hpc", "--container", podman.image, str(folder)],
                    testbed.work_dir())  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (folder / "bin" / "python").exists()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _run(root: Hpc, podman: PodmanHpc, *args: str) -> subprocess.CompletedProcess[str]:
    return root.run("run", "--container-runtime", "podman-hpc", "--container", podman.image,
                    *args, env=podman.env, timeout=600)  # fmt: skip


def test_two_by_two_in_the_image(root: Hpc, podman: PodmanHpc, venv: Path) -> None:
    """2 nodes x 2 ranks in the image with --stage, --venv, a --bind to a path the image
    lacks: the rank contract, the TCP rendezvous, the data, the venv, no secret in files,
    and only the variables hpclaunch names crossing into the container."""
    shutil.copy(PROGRAMS / "container_probe.py", root.cwd / "probe.py")
    out, data, other = root.folder("out"), root.folder("data"), root.folder("other")
    (data / "data.txt").write_text("staged")
    (other / "file.txt").write_text("mapped")
    proc = root.run(
        "run", "-N", "2", "--tasks-per-node", "2", "--wait", "--container", podman.image,
        "--container-runtime", "podman-hpc", "--stage", f"{data}:DATA", "--venv", str(venv),
        "--bind", f"{other}:/hpclaunch-mapped/deeper", "--env", "WANDB_API_KEY",
        "--", "bash", "-c", 'exec python3 probe.py "$1" "$HPCLAUNCH_DATA_DATA/data.txt" "$2"',
        "probe", str(out), "/hpclaunch-mapped/deeper/file.txt",
        env={**podman.env, "HOST_ONLY_VARIABLE": "host", "WANDB_API_KEY": "s3cr3t-value-42"},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = rank_contract.two_by_two(out)
    run_dir = root.run_dirs()[-1]
    env_seen = [r["env"] for r in reports]
    # Inside the image (podman's own environment: `container`), only named variables.
    assert all(r["image_marker"] for r in reports)
    assert {e["HOST_ONLY_VARIABLE"] for e in env_seen} == {None}
    rank_contract.staged_venv_bind(reports, run_dir, venv, root.cwd, "s3cr3t-value-42")
    assert "podman-hpc run --rm" in (run_dir / "job.sh").read_text()


def test_an_option_podman_does_not_know_fails_the_job(root: Hpc, podman: PodmanHpc) -> None:
    """A site flag podman does not know (the profile's [container] flags) reaches podman
    through podman-hpc, which passes `run`'s options on: the run ends FAILED with
    podman's line in its batch log."""
    clusters = root.cwd / "xdg" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True)
    (clusters / "slurm.toml").write_text('[container]\nflags = ["--podman-foo=1"]\n')
    proc = _run(root, podman, "--wait", "--", "true")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    run_dir = root.run_dirs()[-1]
    assert "unknown flag: --podman-foo" in (run_dir / "logs" / "batch.out").read_text()
    status = json.loads(root.run("status", run_dir.name, "--json").stdout)
    assert status["state"] == "FAILED", status


def test_requeue_inside_the_image_saves_and_resumes(root: Hpc, podman: PodmanHpc) -> None:
    """The time-limit signal reaches the program inside the container (podman run
    proxies the signals it gets to the container's process), it saves, the next attempt
    resumes in a new container."""
    from test_e2e_requeue import SIGNAL_LATER, SLOW_START_STEPS, _check_resumed, _program

    _program(root)
    steps = SLOW_START_STEPS
    proc = _run(root, podman, "-N", "2", "--tasks-per-node", "2", *SIGNAL_LATER,
                "--env", f"STEPS={steps}", "--wait", "--",
                "python3", "count_steps_fast_resume.py")  # fmt: skip
    _check_resumed(root, proc, ranks=4, steps=steps)


def test_image_import_migrated_the_image_once(podman: PodmanHpc) -> None:
    """The module's `hpclaunch image import` (fixture `podman`): podman-hpc lists the
    migrated copy as a read-only image of its squash store, the one the nodes run."""
    done = _as_root(podman.env, ["podman-hpc", "images", "--filter", "readonly=true",
                                 "--format", "{{.Repository}}:{{.Tag}}"],
                    testbed.work_dir())  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"localhost/{podman.image}"], done.stdout


def test_attach_container_enters_the_image(root: Hpc, podman: PodmanHpc) -> None:
    """attach --container: a step on node2 with the job's own podman-hpc run line."""
    release = root.cwd / "release"
    proc = _run(root, podman, "--json", "-N", "2", "--", "bash", "-c",
                f"until [ -e {release} ]; do sleep 0.2; done")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = json.loads(proc.stdout.splitlines()[-1])
    run_id, run_dir = started["run_id"], Path(started["run_dir"])
    try:
        events = run_dir / "events.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if events.exists() and events.read_text().count('"rank_start"') >= 2:
                break
            time.sleep(0.5)
        probe = "cat /hpclaunch-test-image; echo $HPCLAUNCH_RUN_DIR; echo $SLURMD_NODENAME"
        shown = root.run("attach", run_id, "--container", "--node", "node2", "--", "sh",
                         "-c", probe, env=podman.env, timeout=300)  # fmt: skip
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert shown.stdout.splitlines()[:2] == ["yes", str(run_dir)], shown.stdout
    finally:
        release.write_text("")


def test_stack_inside_the_image(root: Hpc, podman: PodmanHpc) -> None:
    """py-spy on the nodes reads the ranks inside the image: `--pid=host` keeps the
    recorded pids the host's."""
    from test_e2e_stack import _check_groups, _start

    if not (VENV_BIN / "py-spy").exists():
        pytest.skip("py-spy is not installed in .venv: pip install -e '.[test]'")
    started = _start(root, "--container", podman.image, "--container-runtime", "podman-hpc",
                     env=podman.env)  # fmt: skip
    assert started["logs"].count(" image\n") == 4, started["logs"]  # the ranks run in it
    try:
        _check_groups(root, started["job_id"])
    finally:
        root.run("cancel", started["job_id"], env=podman.env)
    # srun SIGKILLs the other tasks (`podman run`) once one has died of the TERM; their
    # containers run on under conmon, where each rank's bootstrap sees its task gone.
    run_dir = root.run_dirs()[-1]
    deadline = time.monotonic() + 30
    while _ranks_alive(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ranks_alive(run_dir) == [], "ranks outlived the cancelled job"


def _ranks_alive(run_dir: Path) -> list[str]:
    """The processes (the nodes share this machine's PIDs) started from run_dir's files."""
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(w.startswith(str(run_dir).encode() + b"/") for w in words):
            alive.append(cmdline.parent.name)
    return alive


def test_a_gpu_job_turns_on_podman_hpcs_gpu_module(root: Hpc, podman: PodmanHpc) -> None:
    """A job with GPUs runs `podman-hpc run --gpu`: the gpu module the wheel ships
    (modules.d/gpu.yaml: ENABLE_GPU=1, NVIDIA_VISIBLE_DEVICES passed) accepts it, and
    Slurm's GPU for the rank crosses. The testbed's GPUs are fake: the libraries the
    site's hook binds with it are not shown."""
    env = "os.environ.get('ENABLE_GPU'), os.environ.get('CUDA_VISIBLE_DEVICES')"
    program = f"import os; print('GPU', {env})"
    proc = _run(root, podman, "--gpus-per-node", "1", "--no-watch", "--wait", "--",
                "python3", "-c", program)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " --gpu " in (root.run_dirs()[-1] / "job.sh").read_text()
    seen = [line.split("GPU ", 1)[1] for line in proc.stdout.splitlines() if "GPU " in line]
    # One of the node's two GPUs, whichever Slurm gave: another test's job may hold GPU 0
    # (CI saw "1 1" with the suite's tests side by side).
    assert seen in (["1 0"], ["1 1"]), proc.stdout[-2000:]
