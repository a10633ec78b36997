"""`hpclaunch env create` inside a test image that ships pkga 1.0 (hand-made wheels,
tests/wheels.py), and `run --venv` on the testbed with the real Charliecloud runtime."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import Hpc

pytestmark = pytest.mark.testbed

CH = ("--container-runtime", "charliecloud")


def _requirements(hpc: Hpc, wheels: Path, name: str, *lines: str) -> Path:
    path = hpc.cwd / name
    path.write_text("\n".join(["--no-index", f"--find-links {wheels}", *lines]) + "\n")
    return path


def _create(hpc: Hpc, image: Path, req: Path, venv: str) -> tuple[int, str]:
    (hpc.cwd / "venvs").mkdir(exist_ok=True)
    os.chown(hpc.cwd / "venvs", *(hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid))
    proc = hpc.cmd(
        ["hpclaunch", "env", "create", "--container", str(image), *CH, "-r", str(req), venv],
        timeout=300,
    )
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ("pkga==2.0", "the requirements ask for pkga==2.0"),  # directly
        ("pkgc", "pkgb 1.0 depends on pkga>=2.0"),  # through a dependency of a dependency
    ],
)
def test_a_requirement_that_would_replace_the_image_package_fails_naming_it(
    hpc: Hpc, user_image: Path, wheel_dir: Path, line: str, cause: str
) -> None:
    req = _requirements(hpc, wheel_dir, "req.txt", line)
    code, err = _create(hpc, user_image, req, "venvs/v")
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("hpclaunch: error: -r "), last
    assert "would replace the image's pkga 1.0" in last and cause in last, last
    assert not (hpc.cwd / "venvs" / "v").exists()  # nothing half-made is left


def test_a_venv_without_conflict_installs_and_the_job_imports_both(
    hpc: Hpc, user_image: Path, wheel_dir: Path, base_image: Path
) -> None:
    req = _requirements(hpc, wheel_dir, "req.txt", "pkgd")
    code, err = _create(hpc, user_image, req, "venvs/ok")
    assert code == 0, err
    venv = hpc.cwd / "venvs" / "ok"
    assert "pkga==1.0" in (venv / "hpclaunch-constraints.txt").read_text().splitlines()
    program = (
        "import os, sys, pkga, pkgd; "
        "print('IMPORTED', pkga.__version__, pkgd.__version__, sys.prefix, os.environ['RANK'])"
    )
    proc = hpc.run(
        "run", "-N", "2", "--wait", "--container", str(user_image), *CH, "--venv", str(venv),
        "--", "python3", "-c", program,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    seen = sorted(x.split("IMPORTED ")[1] for x in proc.stdout.splitlines() if "IMPORTED" in x)
    assert seen == [f"1.0 1.0 {venv} 0", f"1.0 1.0 {venv} 1"]
    # The same venv for another image is refused before submission, in one line.
    proc = hpc.run(
        "run", "--container", str(base_image), *CH, "--venv", str(venv), "--", "python3", "x.py"
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "was made for" in proc.stderr, proc.stderr
    assert str(user_image) in proc.stderr


def test_user_site_packages_the_image_ships_are_named_at_submission(
    hpc: Hpc, user_image: Path
) -> None:
    home = hpc.folder("home")
    meta = home / ".local" / "lib" / "python3.11" / "site-packages" / "pkga-0.5.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: pkga\nVersion: 0.5\n")
    for path in (home / ".local", *home.joinpath(".local").rglob("*")):
        os.chown(path, *(hpc.cwd.stat().st_uid, hpc.cwd.stat().st_gid))
    # runuser resets HOME to the user's own: set it after.
    proc = hpc.cmd(
        ["env", f"HOME={home}", "hpclaunch", "run", "--dry-run", "--container", str(user_image),
         *CH, "--", "python3", "x.py"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "hpclaunch: warning:" in proc.stderr and "pkga" in proc.stderr, proc.stderr
    assert "PYTHONNOUSERSITE=1" in proc.stderr
