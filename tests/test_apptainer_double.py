"""Tests of the Apptainer test double (tests/doubles/apptainer) itself, without Slurm.

The double stands in for Apptainer/SingularityCE, which cannot be installed on this
machine kind; it runs `exec` with Charliecloud's ch-run. These tests run it directly on
the image that testbed/image.sh builds (built here when missing, as root or in CI; else
skipped; failed in CI when it cannot be built).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
DOUBLE = REPO / "tests" / "doubles" / "apptainer"
SINGULARITY = DOUBLE.with_name("singularity")
STATE = Path(os.environ.get("TESTBED_STATE") or "/var/tmp/hpclaunch-testbed")
IMAGE = STATE / "images" / "debian-python"
MARKER = "etc/hpclaunch-image"  # written last by testbed/image.sh; only in the image
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TEST_USER = "hpcuser"
# Prints what the program sees inside, as JSON.
PROBE = (
    "import json, os, sys; print(json.dumps({'env': dict(os.environ), 'exe': sys.executable,"
    f" 'cwd': os.getcwd(), 'marker': os.path.exists('/{MARKER}')}}))"
)


def _base_env() -> dict[str, str]:
    """A small, known host environment (the double runs with python3 from PATH)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir,
        "USER": pwd.getpwuid(os.getuid()).pw_name,
    }


def run(
    *args: str,
    env: Optional[Mapping[str, str]] = None,
    program: Path = DOUBLE,
    cwd: Optional[Path] = None,
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, str(program), *args],
        env={**_base_env(), **(env or {})},
        cwd=cwd or tempfile.gettempdir(),  # shared with the container
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def probe(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _unavailable() -> str:
    if not shutil.which("ch-run"):
        return "Charliecloud's ch-run is not installed (sudo bash testbed/image.sh installs it)"
    if not (IMAGE / MARKER).is_file():
        return f"no test image at {IMAGE} (build it: sudo bash testbed/image.sh)"
    return ""


@pytest.fixture(scope="session")
def image() -> Path:
    reason = _unavailable()
    if reason and (os.environ.get("CI") or os.geteuid() == 0):
        # Build it (as root: image.sh installs ch-run and debootstraps). These tests run
        # before any testbed test has built it, and a fresh machine has none.
        from conftest import build_test_image

        reason = build_test_image()[1] or _unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the double's test image is required in CI: {reason}")
        pytest.skip(reason)
    return IMAGE


@pytest.fixture(scope="session")
def writable_image(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the image that the current user owns and may write (~250 MB)."""
    dest = tmp_path_factory.mktemp("double-image") / "debian-python"
    # As non-root, cp reports the few files it may not read; the copy still runs.
    subprocess.run(["cp", "-a", str(image), str(dest)], capture_output=True, timeout=300)
    assert (dest / "usr" / "bin" / "python3").exists()
    assert os.access(dest, os.W_OK)
    yield dest
    shutil.rmtree(dest, ignore_errors=True)


# -- the grammar (no image needed) ------------------------------------------------------


def test_version_per_name() -> None:
    assert run("--version").stdout == "apptainer version 1.3.4-double\n"
    assert run("version").stdout == "1.3.4-double\n"
    assert run("--version", program=SINGULARITY).stdout == "singularity-ce version 4.1.0-double\n"


def test_unknown_flag_is_refused_like_apptainer() -> None:
    proc = run("exec", "--xyz", "/nowhere", "true")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith('Error for command "exec": unknown flag: --xyz\n')
    proc = run("exec", "-Z", "/nowhere", "true")
    assert proc.returncode == 1
    assert "unknown shorthand flag: 'Z' in -Z" in proc.stderr


def test_bad_values_and_missing_arguments_are_refused() -> None:
    proc = run("exec", "--env", "NOVALUE", "/nowhere", "true")
    assert proc.returncode == 1 and "must be formatted as key=value" in proc.stderr
    proc = run("exec", "--cleanenv=maybe", "/nowhere", "true")
    assert proc.returncode == 1 and "strconv.ParseBool" in proc.stderr
    proc = run("exec", "/nowhere")
    assert proc.returncode == 1 and "requires at least 2 arg(s), only received 1" in proc.stderr
    proc = run("exec", "--bind")
    assert proc.returncode == 1 and "flag needs an argument: --bind" in proc.stderr


def test_real_options_it_cannot_emulate_are_fatal() -> None:
    proc = run("exec", "--fakeroot", "/nowhere", "true")
    assert proc.returncode == 255
    assert proc.stderr.startswith("FATAL:   ") and "--fakeroot is not emulated" in proc.stderr
    proc = run("run", "/nowhere")
    assert proc.returncode == 255 and "'run' is not emulated" in proc.stderr


def test_images_it_cannot_run_are_fatal(tmp_path: Path) -> None:
    proc = run("exec", str(tmp_path / "missing.sif"), "true")
    assert proc.returncode == 255
    assert "could not open image" in proc.stderr and "no such file or directory" in proc.stderr
    sif = tmp_path / "image.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\nSIF_MAGIC0001" + b"\0" * 64)
    proc = run("exec", str(sif), "true")
    assert proc.returncode == 255
    assert "SIF images cannot run here, only directory (sandbox) images" in proc.stderr


# -- running (the image from testbed/image.sh) -------------------------------------------


def test_cleanenv_exec_runs_python_in_the_image(image: Path) -> None:
    env = {"APPTAINERENV_FOO": "bar", "HOST_ONLY": "leaks", "PYTHONPATH": "/nowhere"}
    seen = probe(run("exec", "--cleanenv", str(image), "python3", "-c", PROBE, env=env))
    assert seen["marker"] and seen["exe"] == "/usr/bin/python3"
    inside = seen["env"]
    assert inside["FOO"] == "bar"
    assert inside["PATH"] == DEFAULT_PATH
    assert inside["HOME"] == _base_env()["HOME"]
    assert inside["APPTAINER_CONTAINER"] == str(image)
    # Nothing else from the host: only what Apptainer itself sets (LC_CTYPE: Python's
    # own locale coercion under LANG=C; CH_RUNNING: ch-run's).
    assert set(inside) - {"LC_CTYPE"} == {
        "FOO", "PATH", "HOME", "LANG", "LD_LIBRARY_PATH", "PS1", "CH_RUNNING",
        "APPTAINER_COMMAND", "APPTAINER_CONTAINER", "APPTAINER_NAME", "APPTAINER_ENVIRONMENT",
    }  # fmt: skip


def test_without_cleanenv_the_host_environment_passes(image: Path) -> None:
    env = {"APPTAINERENV_FOO": "bar", "HOST_ONLY": "passes", "LD_LIBRARY_PATH": "/host/lib"}
    inside = probe(run("exec", str(image), "python3", "-c", PROBE, env=env))["env"]
    assert inside["HOST_ONLY"] == "passes" and inside["FOO"] == "bar"
    assert "APPTAINERENV_FOO" not in inside
    # As in Apptainer: the container's own PATH and library path, not the host's.
    assert inside["PATH"] == DEFAULT_PATH
    assert inside["LD_LIBRARY_PATH"] == "/.singularity.d/libs"


def test_env_values_stay_off_the_ch_run_command_line(image: Path) -> None:
    secret = "s3cr3t-value-42"
    proc = run(
        "--debug", "exec", "-e", "--env", f"TOKEN={secret},OTHER=x y", "--pwd", "/usr",
        "--", str(image), "--", "python3", "-c", PROBE,
    )  # fmt: skip
    seen = probe(proc)
    assert seen["env"]["TOKEN"] == secret and seen["env"]["OTHER"] == "x y"
    assert seen["cwd"] == "/usr"
    line = next(x for x in proc.stderr.splitlines() if "exec " in x and "ch-run" in x)
    assert "--unset-env=*" in line and "--set-env=/dev/fd/" in line and "--cd=/usr" in line
    assert secret not in proc.stderr


def test_singularity_name_reads_singularityenv(image: Path) -> None:
    env = {"SINGULARITYENV_FOO": "bar", "APPTAINERENV_BAR": "no"}
    proc = run("exec", "-e", str(image), "python3", "-c", PROBE, env=env, program=SINGULARITY)
    inside = probe(proc)["env"]
    assert inside["FOO"] == "bar" and "BAR" not in inside
    assert inside["SINGULARITY_NAME"] == "debian-python"


def test_missing_bind_source_is_fatal(image: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    proc = run("exec", "-B", f"{missing}:/data", str(image), "true")
    assert proc.returncode == 255
    assert proc.stderr.startswith("FATAL:   container creation failed: mount hook function")
    assert f"mount source {missing} doesn't exist" in proc.stderr


def test_missing_program_is_fatal(image: Path) -> None:
    proc = run("exec", str(image), "no-such-program")
    assert proc.returncode == 255
    assert '"no-such-program": executable file not found in $PATH' in proc.stderr


def test_bind_to_a_new_destination_in_a_writable_image(
    writable_image: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "file.txt").write_text("from the host")
    (tmp_path / "single.txt").write_text("one file")
    binds = f"{data}:/hpclaunch-double/deeper/data:ro,{tmp_path / 'single.txt'}:/single.txt"
    proc = run(
        "exec", "--bind", binds, str(writable_image),
        "cat", "/hpclaunch-double/deeper/data/file.txt", "/single.txt",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "from the hostone file"
    # The mount points were made in the copy, never in the shared image.
    assert (writable_image / "hpclaunch-double" / "deeper" / "data").is_dir()
    assert not (IMAGE / "hpclaunch-double").exists()
    # Only for explicit binds: a current directory the image lacks is not made (warned).
    # A folder outside /tmp, /var/tmp and $HOME, which Apptainer mounts by itself (the
    # checkout may lie under any of them).
    elsewhere = Path(tempfile.mkdtemp(prefix="hpclaunch-cwd-", dir="/srv"))
    try:
        proc = run("exec", str(writable_image), "pwd", cwd=elsewhere)
    finally:
        elsewhere.rmdir()
    assert proc.returncode == 0, proc.stderr
    assert f"not mounting the current directory {elsewhere}" in proc.stderr
    assert not (writable_image / elsewhere.relative_to("/")).exists()


def test_bind_to_a_new_destination_in_a_read_only_image_is_fatal(image: Path) -> None:
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(TEST_USER)
        except KeyError:
            pytest.skip(f"root may write the image and there is no {TEST_USER} to run as")
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"
        prefix = (runuser, "-u", TEST_USER, "--", "env", f"USER={TEST_USER}")
    elif os.access(image, os.W_OK):
        pytest.skip(f"{image} is writable by this user")
    proc = run(
        "exec", "-B", "/etc:/hpclaunch-double-ro/etc", str(image), "true",
        prefix=prefix, cwd=Path("/"), env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 255, proc.stderr
    assert "destination /hpclaunch-double-ro/etc doesn't exist in container" in proc.stderr
    assert not (image / "hpclaunch-double-ro").exists()


def test_inherited_fd_3_reaches_the_program(image: Path) -> None:
    proc = subprocess.run(
        ["bash", "-c", 'exec 3< <(echo hi) && exec "$@"', "x", str(DOUBLE), "exec",
         "--cleanenv", str(image), "python3", "-c", "import os; print(os.read(3, 10))"],
        env=_base_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "b'hi\\n'\n"


def test_program_exit_status_passes_through(image: Path) -> None:
    proc = run("exec", str(image), "python3", "-c", "raise SystemExit(7)")
    assert proc.returncode == 7
