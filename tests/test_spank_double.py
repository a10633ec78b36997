"""Tests of the Pyxis / CSCS Container Engine test double (tests/doubles/spank/srun)
itself, without Slurm: the options it takes off srun's command line, those it refuses
as srun or the plugins would, the EDF it reads. A recording script stands in for the
real srun behind it; tests/test_e2e_runtimes.py runs the double with the real srun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DOUBLE = Path(__file__).resolve().parent / "doubles" / "spank"
SRUN = DOUBLE / "srun"


def _srun(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """(rc, stderr, the argv the real srun got or None)."""
    real = tmp_path / "real"
    real.mkdir(exist_ok=True)
    log = tmp_path / "argv.json"
    fake = real / "srun"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(log)!r}, 'w'))\n"
    )
    fake.chmod(0o755)
    path = f"{DOUBLE}:{real}:/usr/bin:/bin"
    full = {"PATH": path, "HOME": str(tmp_path), **(env or {})}
    done = subprocess.run(
        [str(SRUN), *args], env=full, capture_output=True, text=True, timeout=60, check=False
    )
    got = json.loads(log.read_text()) if log.exists() else None
    return done.returncode, done.stderr, got


def test_other_srun_lines_pass_through_unchanged(tmp_path: Path) -> None:
    rc, _, got = _srun(tmp_path, "--overlap", "-w", "node1", "hostname", "--container-x")
    assert rc == 0 and got == ["--overlap", "-w", "node1", "hostname", "--container-x"]


def test_pyxis_options_become_the_node_side_entry(tmp_path: Path) -> None:
    rc, err, got = _srun(
        tmp_path, "--nodes=2", "--container-image", "/i/x.sqsh",
        "--container-mounts=/a:/a,/b:/c:ro", "--container-mounts=/t:/t",
        "--container-workdir=/w", "--no-container-mount-home", "--container-env=A,B",
        "-w", "node1", "python3", "x.py", "--container-image=/not/an/option",
    )  # fmt: skip
    assert rc == 0, err
    assert got[:3] == ["--nodes=2", "-w", "node1"]
    assert got[4:7] == ["-I", "-S", str(DOUBLE / "enter-image")]
    config = json.loads(got[7])
    assert config == {
        "runtime": "pyxis", "image": "/i/x.sqsh", "workdir": "/w", "mount_home": False,
        "mounts": [["/a", "/a", ""], ["/b", "/c", "ro"], ["/t", "/t", ""]],
        "env_names": ["A", "B"],
    }  # fmt: skip
    assert got[8:] == ["python3", "x.py", "--container-image=/not/an/option"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--container-foo=1", "true"], "srun: unrecognized option '--container-foo=1'\n"
         'Try "srun --help" for more information\n'),
        (["--container-image=/i.sqsh", "--container-name=n", "true"],
         "srun: error: pyxis double: --container-name is not emulated"),
        (["--container-image=nvcr.io#nvidia/pytorch:24.05", "true"],
         "registry images are not emulated"),
        (["--container-mounts=/a", "--container-image=/i.sqsh", "true"],
         "srun: error: pyxis: invalid mount: /a"),
        (["--container-writable=yes", "--container-image=/i.sqsh", "true"],
         "option '--container-writable' doesn't allow an argument"),
    ],
)  # fmt: skip
def test_refusals(tmp_path: Path, args: list[str], message: str) -> None:
    rc, err, got = _srun(tmp_path, *args)
    assert rc == (255 if "unrecognized" in message else 1) and message in err and got is None


def test_ce_reads_the_edf_and_its_base_environments(tmp_path: Path) -> None:
    edf_dir = tmp_path / ".edf"
    edf_dir.mkdir()
    (edf_dir / "base.toml").write_text(
        'mounts = ["/base:/base"]\n[env]\nFROM_BASE = "1"\n[annotations]\n"com.hooks.x" = "true"\n'
    )
    run_edf = tmp_path / "run.toml"
    run_edf.write_text(
        'base_environment = "base"\nimage = "/i/x.sqsh"\nworkdir = "/w"\n'
        'mounts = ["/a:/a:ro"]\n[env]\nA = "${A:-}"\n'
    )
    rc, err, got = _srun(tmp_path, f"--environment={run_edf}", "--ntasks=4", "true")
    assert rc == 0, err
    config = json.loads(got[5])
    assert config["image"] == "/i/x.sqsh" and config["workdir"] == "/w"
    assert config["mounts"] == ["/base:/base", "/a:/a:ro"]
    assert config["env"] == {"FROM_BASE": "1", "A": "${A:-}"}
    assert config["annotations"] == {"com.hooks.x": "true"}
    (edf_dir / "bad.toml").write_text('image = "/i.sqsh"\nimgae = "typo"\n')
    (tmp_path / "argv.json").unlink()
    rc, err, got = _srun(tmp_path, "--environment=bad", "true")
    assert rc == 1 and "unknown EDF entry 'imgae'" in err and got is None


def test_node_side_expands_the_ce_env_as_documented(tmp_path: Path) -> None:
    """${VAR}, ${VAR:-default}, $$ (docs.cscs.ch/software/container-engine/edf)."""
    code = (
        "import importlib.machinery, importlib.util, sys\n"
        f"loader = importlib.machinery.SourceFileLoader('enter', {str(DOUBLE / 'enter-image')!r})\n"
        "spec = importlib.util.spec_from_loader('enter', loader)\n"
        "mod = importlib.util.module_from_spec(spec); loader.exec_module(mod)\n"
        "print(mod.expand('${A}/${B:-x}/$${A}/${C:-}', {'A': '1'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1/x/${A}/"
    assert os.access(DOUBLE / "enter-image", os.X_OK) and os.access(SRUN, os.X_OK)


def test_ce_sqsh_mounts_are_taken_other_mount_flags_refused(tmp_path: Path) -> None:
    """The EDF's `FILE:DST:sqsh` (a SquashFS file mounted at DST, docs.cscs.ch/software/
    container-engine/edf "mounts") reaches the node side, which unpacks it; flags the
    double does not know exit 1 naming them."""
    run_edf = tmp_path / "run.toml"
    run_edf.write_text('image = "/i/x.sqsh"\nmounts = ["/v.sqsh:/v:sqsh"]\n')
    rc, err, got = _srun(tmp_path, f"--environment={run_edf}", "true")
    assert rc == 0, err
    assert json.loads(got[-2])["mounts"] == ["/v.sqsh:/v:sqsh"]
    run_edf.write_text('image = "/i/x.sqsh"\nmounts = ["/a:/a:bogus"]\n')
    (tmp_path / "argv.json").unlink()
    rc, err, got = _srun(tmp_path, f"--environment={run_edf}", "true")
    assert rc == 1 and "mount flags 'bogus'" in err and got is None
