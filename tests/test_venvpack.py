"""`hpclaunch env pack` and `--venv FILE.sqsh` on the submitting side (no Slurm needed):
the image, its record, the venv guard, and the job script's mount (or Apptainer's bind)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpclaunch.node import VENV_MOUNT, VENV_RECORD
from hpclaunch.node import path as node_path
from hpclaunch.payload import venvpack
from test_cli import env as env
from test_cli import hpclaunch

pytestmark = pytest.mark.skipif(not shutil.which("mksquashfs"), reason="no squashfs-tools")


def _venv(path: Path, record: dict[str, object] | None = None) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    (path / "lib" / "marker.py").write_text("WHERE = 'packed'\n")
    if record is not None:
        (path / VENV_RECORD).write_text(json.dumps(record))
    return path


def test_env_pack_writes_one_private_squashfs_file_that_names_the_venv(
    tmp_path: Path, env: dict[str, str]
) -> None:
    venv = _venv(tmp_path / "v", {"image": None, "image_id": None})
    proc = hpclaunch(["env", "pack", "v"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    image = tmp_path / "v.sqsh"
    assert f"packed {venv} into {image}" in proc.stderr
    assert (image.stat().st_mode & 0o777) == 0o600  # nothing hpclaunch writes is world-readable
    assert venvpack.is_packed(str(image))
    listing = subprocess.run(["unsquashfs", "-l", "-d", "", str(image)], capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    assert "/bin/python" in listing and "/lib/marker.py" in listing
    assert venvpack.PACKED_RECORD in " ".join(listing)
    data = venvpack.packed_record(str(image))
    assert data["venv"] == str(venv) and data["record"] == {"image": None, "image_id": None}
    assert venvpack.mount_path(str(image)) == str(venv)
    assert not list(tmp_path.glob(".v.sqsh.*"))  # the temporary name is gone
    # -o elsewhere, --json; packing again replaces the file (never appends to it).
    out = tmp_path / "out"
    out.mkdir()
    for _ in range(2):
        proc = hpclaunch(["env", "pack", "--json", "-o", "out/x.sqsh", str(venv)], tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == {"venv": str(venv), "image": str(out / "x.sqsh")}
    assert (out / "x.sqsh").stat().st_size == image.stat().st_size


def test_an_interrupted_env_pack_leaves_no_half_written_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C (or SIGTERM, which hpclaunch turns into one) while mksquashfs writes."""
    venv = _venv(tmp_path / "v", {"image": None, "image_id": None})

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(venvpack.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        venvpack.pack(venv, tmp_path / "v.sqsh")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v"]


def test_env_pack_refusals_are_one_line_and_leave_nothing(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "notavenv").mkdir()
    _venv(tmp_path / "v")
    cases = [
        (["env", "pack", "notavenv"], "VENV", "is not a venv"),
        (["env", "pack", "v", "-o", "v/inside.sqsh"], "-o", "is inside"),
        (["env", "pack", "v", "-o", "nowhere/x.sqsh"], "-o", "does not exist"),
    ]
    for args, field, text in cases:
        proc = hpclaunch(args, tmp_path, env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"hpclaunch: error: {field}") and text in proc.stderr
    # Without squashfs-tools: one line naming what to install.
    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(sys.executable, bare / "python3")
    proc = hpclaunch(["env", "pack", "v"], tmp_path, {**env, "PATH": str(bare)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "mksquashfs not found" in proc.stderr and "squashfs-tools" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "notavenv", "v"]


def _packed(tmp_path: Path, env: dict[str, str], record: dict[str, object]) -> tuple[Path, Path]:
    venv = _venv(tmp_path / "venvs" / "torch", record)
    proc = hpclaunch(["env", "pack", str(venv)], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    return venv, venv.with_name("torch.sqsh")


def _dry_run(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return hpclaunch(
        ["run", "--dry-run", "--cluster", "lumi", "-N", "2", "-A", "project_465000000",
         "-p", "standard-g", *args, "--", "python", "train.py"],
        tmp_path, env,
    )  # fmt: skip


def test_a_packed_venv_is_mounted_by_each_node_at_its_original_path(
    tmp_path: Path, env: dict[str, str]
) -> None:
    venv, image = _packed(tmp_path, env, {"image": None, "image_id": None})
    shutil.rmtree(venv)  # the nodes need only the image
    proc = _dry_run(tmp_path, env, "--venv", str(image))
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert f"export HPCLAUNCH_VENV={venv}" in script  # sys.prefix: the original path
    mount = next(line for line in script.splitlines() if "venv_mount.py" in line)
    assert mount.startswith("srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 ")
    marks, sent = mount.split()[-3:-1]
    assert mount.endswith(f"{image} {venv} {marks} {sent} &") and marks.endswith("/venvmount")
    # Sent once to every node with sbcast first (the mount reads this node's copy).
    send = next(line for line in script.splitlines() if "stage_bcast.py" in line)
    assert send.endswith(f"stage_bcast.py - {sent} {image}") and sent.endswith("broadcast.json")
    assert script.index(send) < script.index(mount)
    # The mount is waited for before the ranks' step and ended after it.
    lines = script.splitlines()
    ranks = next(i for i, line in enumerate(lines) if "bootstrap.py" in line)
    assert lines.index(mount) < ranks
    assert any('kill -USR1 "$HPCLAUNCH_VENV_PID"' in line for line in lines[ranks:])
    assert 'exit "$HPCLAUNCH_RC"' in lines[ranks:]  # the ranks' exit code, after the unmount


def test_apptainer_mounts_a_packed_venv_itself(tmp_path: Path, env: dict[str, str]) -> None:
    sif = tmp_path / "torch.sif"
    sif.write_bytes(b"SIF_MAGIC" + b"\0" * 200)
    venv, image = _packed(tmp_path, env, {"image": None, "image_id": None})
    proc = _dry_run(tmp_path, env, "--container", str(sif), "--venv", str(image))
    # A venv made without an image is refused for one: the guard holds for packed venvs.
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{image} (packed from {venv}) was made for no container" in proc.stderr
    from hpclaunch.payload.venvs import image_identity

    venv, image = _packed(
        tmp_path / "b", env, {"image": str(sif), "image_id": image_identity(str(sif))}
    )
    proc = _dry_run(tmp_path, env, "--container", str(sif), "--venv", str(image))
    assert proc.returncode == 0, proc.stderr
    assert f"{image}:{venv}:image-src=/" in proc.stdout
    assert f",{venv}," not in proc.stdout and "venv_mount.py" not in proc.stdout


def test_a_packed_venv_needs_a_batch_job_without_apptainer(
    tmp_path: Path, env: dict[str, str]
) -> None:
    _, image = _packed(tmp_path, env, {"image": None, "image_id": None})
    proc = hpclaunch(["run", "--venv", str(image), "--", "python", "-c", "1"], tmp_path, env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("hpclaunch: error: --venv: a packed venv without Apptainer")


def test_a_squashfs_file_not_made_by_env_pack_is_refused(
    tmp_path: Path, env: dict[str, str]
) -> None:
    (tmp_path / "data").mkdir()
    subprocess.run(["mksquashfs", str(tmp_path / "data"), str(tmp_path / "d.sqsh"), "-quiet"],
                   check=True, capture_output=True)  # fmt: skip
    proc = _dry_run(tmp_path, env, "--venv", str(tmp_path / "d.sqsh"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "without hpclaunch-packed.json" in proc.stderr and "hpclaunch env pack" in proc.stderr


FUSE = os.geteuid() == 0 and os.path.exists("/dev/fuse") and shutil.which("squashfuse")


@pytest.mark.skipif(not FUSE, reason="squashfuse as root with /dev/fuse")
def test_the_node_mount_serves_the_venv_at_its_path_until_told_to_stop(
    tmp_path: Path, env: dict[str, str]
) -> None:
    venv, image = _packed(tmp_path, env, {"image": None, "image_id": None})
    shutil.rmtree(venv)  # only the image is left
    marks = tmp_path / "marks"
    mount = subprocess.Popen(
        [sys.executable, "-I", "-S", str(node_path(VENV_MOUNT)), str(image), str(venv),
         str(marks)],
        env={"PATH": env["PATH"], "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7"},
    )  # fmt: skip
    try:
        for _ in range(200):
            if (marks / "ready-n1.7.0").exists():
                break
            time.sleep(0.05)
        assert (marks / "ready-n1.7.0").exists()
        assert os.path.ismount(venv) and (marks.stat().st_mode & 0o777) == 0o700
        code = "import sys, marker; print(sys.prefix, marker.WHERE)"
        env_venv = {"PATH": env["PATH"], "PYTHONPATH": str(venv / "lib")}
        done = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env_venv,
                              capture_output=True, text=True, check=True)  # fmt: skip
        assert done.stdout.split() == [str(venv), "packed"]
    finally:
        mount.send_signal(signal.SIGUSR1)
        assert mount.wait(timeout=30) == 0
    assert not os.path.ismount(venv) and venv.is_dir()  # the mount point stays
    # A damaged image: a failed- marker saying why, exit 1, nothing mounted.
    image.write_bytes(b"hsqs" + b"\0" * 100)
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(node_path(VENV_MOUNT)), str(image), str(venv),
         str(marks)],
        env={"PATH": env["PATH"], "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "8"},
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "squashfuse" in (marks / "failed-n1.8.0").read_text()
    assert done.stderr.startswith("hpclaunch: packed venv: squashfuse ") and not os.path.ismount(
        venv
    )


def test_a_packed_sweep_refuses_a_packed_venv_in_one_line(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """sweep --pack's script has no squashfuse step: a packed venv is refused there before
    anything is queued (its points would find no venv), the folder still works."""
    venv, image = _packed(tmp_path, env, {"image": None, "image_id": None})
    sweep = ["sweep", "--dry-run", "--cluster", "lumi", "-A", "project_465000000",
             "-p", "standard-g", "--pack", "--repeat", "2"]  # fmt: skip
    proc = hpclaunch([*sweep, "--venv", str(image), "--", "python", "t.py"], tmp_path, env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("hpclaunch: error: --pack") and "packed venv" in proc.stderr
    proc = hpclaunch([*sweep, "--venv", str(venv), "--", "python", "t.py"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
