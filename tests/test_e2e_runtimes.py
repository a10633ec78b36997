"""Pyxis/enroot and the CSCS Container Engine on the real testbed, through the srun test
double tests/doubles/spank/srun (neither plugin installs here: tests/doubles/README.md):
the image made by `hpclaunch image import` from a local root file system, 2 nodes x 2
ranks inside it with --stage and the rank contract checked as for Charliecloud
(tests/test_e2e_containers.py), the stand-in's refusal of an unknown option, a requeue
inside the container (the program saves on the signal), attach --container.

Why a wrapper on the job's PATH and not a SPANK plugin built against libslurm-dev: the
plugin would go into the shared testbed's plugstack.conf, on every node, for every
developer's jobs; the wrapper only changes the jobs that ask for it, and the real srun
still places the tasks and delivers the signals. What these tests cannot show: enroot's
own import and its user namespace, read-only mounts (ch-run binds read-write), the CE's
hooks (aws-ofi-nccl, CXI), a registry pull, a real GPU (the testbed's are fake).
podman-hpc: the real one (PyPI's over Debian's podman), as root, in
tests/test_e2e_podman_hpc.py.
"""

from __future__ import annotations

import ast
import json
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rank_contract
import testbed
from conftest import PROGRAMS, REPO, VENV_BIN, Hpc, _user_folder

# One xdist group (tests/conftest.py's XDIST_GROUPS): the module-scoped image and venv (a
# minute to build, another to remove with the unpacked copies) are built once, not on
# every worker that gets one of its tests.
pytestmark = pytest.mark.testbed

SPANK = REPO / "tests" / "doubles" / "spank"
RUNTIMES = ["pyxis", "ce"]


@pytest.fixture(scope="module")
def squashfs(user_image: Path) -> Iterator[Path]:
    """`hpclaunch image import` of the test user's directory image, as that user."""
    folder = testbed.work_dir() / f"sqsh-{user_image.name}"
    folder.mkdir(exist_ok=True)
    shutil.chown(folder, testbed.USER, testbed.USER)
    image = folder / "image.sqsh"
    image.unlink(missing_ok=True)
    done = subprocess.run(
        ["runuser", "-u", testbed.USER, "--", f"{VENV_BIN}/hpclaunch", "image", "import",
         "--container-runtime", "pyxis", "-o", str(image), str(user_image)],
        cwd=folder, capture_output=True, text=True, timeout=600, check=False,
        env={"PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(folder)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f": {image} (" in done.stderr and image.read_bytes()[:4] == b"hsqs"
    yield image
    shutil.rmtree(folder, ignore_errors=True)
    _remove_unpacked(pwd.getpwnam(testbed.USER).pw_uid)
    _remove_unpacked(0)  # the root tests' (test_a_packed_venv_inside_the_image)


def _remove_unpacked(uid: int) -> None:
    """The stand-in's unpacked images (per node and version of an image file) whose file
    is gone and that no task holds (tests/doubles/spank/enter-image --prune). Not the
    others: another pytest-xdist worker's jobs may be running in theirs, and removing a
    folder that is a mount point in a container's namespace detaches that mount there
    (Linux >= 3.18): its ranks lost their run folder mid-run (the requeue test failed)."""
    nodes = sorted(map(str, Path(f"/var/tmp/hpclaunch-spank-double-{uid}").glob("*")))
    if nodes:
        subprocess.run(["python3", str(SPANK / "enter-image"), "--prune", *nodes], check=True)


@pytest.fixture(scope="module")
def venv(squashfs: Path, slurm_conf: Path) -> Path:
    """`hpclaunch env create` for the Pyxis image: made inside it, in a one-task srun job
    (Pyxis enters images only in srun), through the stand-in."""
    path = squashfs.parent / "venv"
    done = subprocess.run(
        ["runuser", "-u", testbed.USER, "--", f"{VENV_BIN}/hpclaunch", "env", "create",
         "--container-runtime", "pyxis", "--container", str(squashfs), str(path)],
        cwd=squashfs.parent, capture_output=True, text=True, timeout=600, check=False,
        env={"PATH": f"{SPANK}:{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
             "HOME": str(squashfs.parent), "SLURM_CONF": str(slurm_conf), "USER": testbed.USER},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (path / "bin" / "python").exists()
    return path


@pytest.fixture
def root(slurm_conf: Path) -> Iterator[Hpc]:
    """A fresh shared folder of root's: squashfuse needs root here (no setuid fusermount)."""
    yield from _user_folder(slurm_conf, "root", False)
    _remove_unpacked(0)


def _env(hpc: Hpc) -> dict[str, str]:
    return {"PATH": f"{SPANK}:{hpc.env['PATH']}"}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_by_two_in_the_image(hpc: Hpc, squashfs: Path, venv: Path, runtime: str) -> None:
    """2 nodes x 2 ranks in the image with --stage, --venv, a --bind to a path the image
    lacks: the rank contract, the TCP rendezvous, the data, the venv, no secret in files."""
    shutil.copy(PROGRAMS / "container_probe.py", hpc.cwd / "probe.py")
    # A barrier first: each node unpacks the image before its ranks start (as enroot
    # does), so the nodes' ranks start seconds apart, longer than the probe's 5 s wait.
    (hpc.cwd / "run.sh").write_text(
        'touch "$1/started-$RANK"\n'
        'until [ "$(ls "$1" | grep -c started-)" -ge 4 ]; do sleep 0.2; done\n'
        'exec python3 probe.py "$1" "$HPCLAUNCH_DATA_DATA/data.txt" "$2"\n'
    )
    out = hpc.folder("out")
    data = hpc.folder("data")
    (data / "data.txt").write_text("staged")
    other = hpc.folder("other")
    (other / "file.txt").write_text("mapped")
    env = {**_env(hpc), "HOST_ONLY_VARIABLE": "host", "WANDB_API_KEY": "s3cr3t-value-42"}
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "2", "--wait", "--container", str(squashfs),
        "--container-runtime", runtime, "--stage", f"{data}:DATA", "--venv", str(venv),
        "--bind", f"{other}:/hpclaunch-mapped/deeper", "--env", "WANDB_API_KEY",
        "--", "bash", "run.sh", str(out), "/hpclaunch-mapped/deeper/file.txt",
        env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = rank_contract.two_by_two(out)
    run_dir = hpc.run_dirs()[-1]
    env_seen = [r["env"] for r in reports]
    # Inside the image (ch-run under the double), the host's environment passed as
    # Pyxis and the CE pass it (not cleaned, unlike Apptainer/Charliecloud).
    assert {e["CH_RUNNING"] for e in env_seen} == {"Weird Al Yankovic"}
    assert {e["HOST_ONLY_VARIABLE"] for e in env_seen} == {"host"}
    rank_contract.staged_venv_bind(reports, run_dir, venv, hpc.cwd, "s3cr3t-value-42")
    if runtime == "ce":
        assert (run_dir / "container.toml").is_file()


def _profile_flags(hpc: Hpc, *flags: str) -> None:
    """The user's own profile file adds runtime flags (config layers: a site's profile)."""
    clusters = hpc.cwd / "xdg" / "hpclaunch" / "clusters"
    clusters.mkdir(parents=True, exist_ok=True)
    (clusters / "slurm.toml").write_text(f"[container]\nflags = {json.dumps(list(flags))}\n")
    shutil.chown(clusters.parent, testbed.USER, testbed.USER)
    for path in (clusters, clusters / "slurm.toml"):
        shutil.chown(path, testbed.USER, testbed.USER)


@pytest.mark.parametrize(
    ("runtime", "flag", "said"),
    [
        ("pyxis", "--container-foo=1", "srun: unrecognized option '--container-foo=1'"),
        ("ce", "--environment-file=x", "srun: unrecognized option '--environment-file=x'"),
    ],
)
def test_an_option_the_runtime_does_not_know_fails_the_job_in_srun(
    hpc: Hpc, squashfs: Path, runtime: str, flag: str, said: str
) -> None:
    """A site flag the runtime does not know reaches srun, which refuses it: the run
    ends FAILED with srun's line in its batch log (the stand-in's refusal, as srun's)."""
    _profile_flags(hpc, flag)
    proc = hpc.run(
        "run", "--wait", "--container", str(squashfs), "--container-runtime", runtime,
        "--", "true", env=_env(hpc), timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout + proc.stderr
    run_dir = hpc.run_dirs()[-1]
    assert said in (run_dir / "logs" / "batch.out").read_text()
    status = json.loads(hpc.run("status", run_dir.name, "--json").stdout)
    assert status["state"] == "FAILED", status


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_requeue_inside_the_image_saves_and_resumes(hpc: Hpc, squashfs: Path, runtime: str) -> None:
    """The time-limit signal reaches the program inside the container (the task is the
    program: enter-image and ch-run exec it), it saves, the next attempt resumes (the CE's
    requeued job reads the same EDF from the run folder)."""
    from test_e2e_requeue import SIGNAL_LATER, SLOW_START_STEPS, _check_resumed, _program

    # Slow on the first attempt, fast once resumed: one requeue. The later signal: each
    # node unpacks the image before its ranks start (the stand-in as enroot), which took
    # more than the 10 s `-t 1 --signal-before 20` may leave on a loaded testbed.
    _program(hpc)
    steps = SLOW_START_STEPS
    proc = hpc.run(
        "run", "-N", "2", "--tasks-per-node", "2", *SIGNAL_LATER, "--env", f"STEPS={steps}",
        "--wait", "--container", str(squashfs), "--container-runtime", runtime,
        "--", "python3", "count_steps_fast_resume.py",
        env=_env(hpc), timeout=600,
    )  # fmt: skip
    _check_resumed(hpc, proc, ranks=4, steps=steps)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_attach_container_enters_the_image(hpc: Hpc, squashfs: Path, runtime: str) -> None:
    """attach --container: a step with the job's --container-* options (the CE: the run's
    EDF), on node2."""
    release = hpc.cwd / "release"
    proc = hpc.run(
        "run", "--json", "-N", "2", "--container", str(squashfs), "--container-runtime",
        runtime, "--", "bash", "-c", f"until [ -e {release} ]; do sleep 0.2; done",
        env=_env(hpc),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started = json.loads(proc.stdout.splitlines()[-1])
    run_id, run_dir = started["run_id"], Path(started["run_dir"])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            events = run_dir / "events.jsonl"
            if events.exists() and events.read_text().count('"rank_start"') >= 2:
                break
            time.sleep(0.5)
        probe = "cat /hpclaunch-test-image; echo $HPCLAUNCH_RUN_DIR; echo $CH_RUNNING"
        shown = hpc.run(
            "attach", run_id, "--container", "--node", "node2", "--", "sh", "-c", probe,
            env=_env(hpc), timeout=300,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert shown.stdout.splitlines()[:3] == ["yes", str(run_dir), "Weird Al Yankovic"]
    finally:
        release.write_text("")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_stack_inside_the_image(hpc: Hpc, squashfs: Path, runtime: str) -> None:
    """py-spy on the nodes reads the ranks inside the image: enroot (and ch-run under the
    stand-in) keep the host's PID namespace, so the recorded pids are the host's."""
    from test_e2e_stack import _check_groups, _start

    if not (VENV_BIN / "py-spy").exists():
        pytest.skip("py-spy is not installed in .venv: pip install -e '.[test]'")
    started = _start(
        hpc, "--container", str(squashfs), "--container-runtime", runtime, env=_env(hpc)
    )
    assert started["logs"].count(" image\n") == 4, started["logs"]  # the ranks run in it
    try:
        _check_groups(hpc, started["job_id"])
    finally:
        hpc.run("cancel", started["job_id"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_packed_venv_inside_the_image(
    root: Hpc, squashfs: Path, venv: Path, runtime: str
) -> None:
    """Issue 33 with these runtimes: the venv made for the image, packed (`env pack`), its
    folder emptied; 2 ranks on 2 nodes run from it at its original path. The CE mounts the
    file itself (the EDF's `FILE:PATH:sqsh`; the stand-in unpacks it per node, so the mount
    itself is not shown); Pyxis binds the squashfuse mount each node made (as root: the
    testbed has no setuid fusermount). The emptied folder stays as the mount point: the
    venv lies inside the project folder, bound first, and ch-run (which the stand-in
    enters the image with) makes no mount point under a bind."""
    copy = root.cwd / "venv"
    shutil.copytree(venv, copy, symlinks=True)  # the module's venv stays for the others
    packed = root.run("env", "pack", str(copy))
    assert packed.returncode == 0, packed.stderr
    shutil.rmtree(copy)  # the nodes see the image only
    copy.mkdir()
    program = (
        "import os, sys; print('IMPORTED', os.environ['RANK'], sys.prefix, [l.split()[2] "
        "for l in open('/proc/self/mounts') if l.split()[1] == sys.prefix])"
    )
    proc = root.run(
        "run", "-N", "2", "--wait", "--container", str(squashfs), "--container-runtime",
        runtime, "--venv", f"{copy}.sqsh", "--", "python3", "-c", program,
        env=_env(root), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = sorted(line.split("IMPORTED ")[1] for line in proc.stdout.splitlines()
                  if "IMPORTED " in line)  # fmt: skip
    assert [line.split()[:2] for line in seen] == [["0", str(copy)], ["1", str(copy)]], seen
    script = (root.run_dirs()[-1] / "job.sh").read_text()
    if runtime == "pyxis":  # squashfuse's mount on each node, bound in
        # squashfuse's mount, bound in (twice: inside the bound project folder, and again).
        kinds = [set(ast.literal_eval(line.split(" ", 2)[2])) for line in seen]
        assert kinds == [{"fuse.squashfuse"}] * 2, seen
        assert "venv_mount.py" in script
    else:
        edf = (root.run_dirs()[-1] / "container.toml").read_text()
        assert f'"{copy}.sqsh:{copy}:sqsh"' in edf and "venv_mount.py" not in script


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_ranks_run_the_node_local_copy_of_the_image(
    hpc: Hpc, squashfs: Path, runtime: str
) -> None:
    """Issue 33's image broadcast for these runtimes (image_broadcast_min_nodes = 2 in
    the project file: the testbed has 2 nodes): the batch script sends the image to each
    node's /tmp with sbcast, and each node's stand-in unpacks that copy (Pyxis's
    --container-image, the CE's EDF image "${HPCLAUNCH_IMAGE}"), never the shared file;
    the ranks run inside it; no copy is left on either node after the job. Where sbcast
    is refused, each node unpacks the shared file, and the batch output has one note."""
    from test_e2e_image_bcast import _broadcast_always, _no_copies_left

    if testbed.layout() != "netns":
        pytest.skip("the nodes share one /tmp here: a copy per node cannot be told apart")
    _broadcast_always(hpc)
    shutil.chown(hpc.cwd / "hpclaunch.toml", testbed.USER, testbed.USER)  # read if the user's
    # enter-image runs `unsquashfs` from the task's PATH: this one logs what it unpacks.
    wrappers, log = hpc.folder("bin"), hpc.folder("unpacked")
    unsquashfs = wrappers / "unsquashfs"
    unsquashfs.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}/"$SLURMD_NODENAME"\n'
        f'exec {shutil.which("unsquashfs")} "$@"\n'
    )
    unsquashfs.chmod(0o755)
    marker = "open('/hpclaunch-test-image').read().strip()"  # only the image has it
    program = f"import os; print('INSIDE', os.environ['SLURMD_NODENAME'], {marker})"
    # The stand-in unpacks once per node and version of a file (tests/doubles/spank): a new
    # modification time makes each node unpack the shared file again, as enroot would.
    os.utime(squashfs)
    for how in ("broadcast", "refused"):
        if how == "refused":  # a site that refuses sbcast: each node reads the shared file
            (wrappers / "sbcast").write_text(
                "#!/bin/sh\necho 'sbcast: error: refused' >&2\nexit 1\n"
            )
            (wrappers / "sbcast").chmod(0o755)
        proc = hpc.run(
            "run", "-N", "2", "--wait", "--container", str(squashfs), "--container-runtime",
            runtime, "--", "python3", "-c", program,
            env={"PATH": f"{wrappers}:{_env(hpc)['PATH']}"}, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        inside = [
            line.split("INSIDE ")[1] for line in proc.stdout.splitlines() if "INSIDE " in line
        ]
        assert sorted(inside) == ["node1 yes", "node2 yes"], proc.stdout[-2000:]
        run_dir = hpc.run_dirs()[-1]
        sent = json.loads((run_dir / "broadcast.json").read_text())
        batch = (run_dir / "logs" / "batch.out").read_text()
        # Sent: each node unpacked its copy. Refused: the shared file, with the one note.
        copy = sent.get(str(squashfs), str(squashfs))
        assert list(sent) == ([str(squashfs)] if how == "broadcast" else [""]), sent
        assert os.path.basename(copy).startswith("hpclaunch-bcast-") == (how == "broadcast")
        assert ("hpclaunch: note: sbcast of" in batch) == (how == "refused"), batch[-2000:]
        for node in ("node1", "node2"):
            assert (log / node).read_text().splitlines()[-1] == copy, (how, node)
        _no_copies_left(hpc)
