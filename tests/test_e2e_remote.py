"""Submit from a laptop (issue 14): the laptop user hpclaptop (no Slurm on PATH, no
SLURM_CONF, no USER/LOGNAME) drives the testbed through its login node, a real OpenSSH
server on 127.0.0.1:2222 (testbed/login.sh), with `hpclaunch --remote`.

What this cannot show: a real network between laptop and cluster (both are this
machine; timings over SSH are loopback figures), two-factor prompts, jump hosts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import laptop as lp
import testbed

# One xdist group with test_e2e_dev_remote, run one test after another on one worker: one
# login home, SSH master and `remote setup` for all; beside the other tests, whose jobs
# run from the testbed's work folder, not from the login home.
pytestmark = pytest.mark.testbed

SECRET = "s3cret-" + os.urandom(6).hex()
TOKEN = "tok-" + os.urandom(6).hex()
PROGRAM = """\
import hashlib, os, sys
from helper import VERSION
rank = os.environ["RANK"]
key = os.environ.get("WANDB_API_KEY", "")
tok = os.environ.get("MY_TOKEN", "")
digest = lambda s: hashlib.sha256(s.encode()).hexdigest()[:12]
leaks = 0
if rank == "0":  # every process's command line on the machine (one PID namespace here)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = open("/proc/%s/cmdline" % pid, "rb").read()
        except OSError:
            continue
        leaks += (key.encode() in line) if key else 0
        leaks += (tok.encode() in line) if tok else 0
print("rank", rank, "of", os.environ["WORLD_SIZE"], "v", VERSION, "key", digest(key),
      "tok", digest(tok), "leaks", leaks, flush=True)
sys.exit(int(os.environ.get("CODE", "0")) if rank == "3" else 0)
"""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def set_up(slurm_conf: Path) -> Iterator[None]:
    reason = lp.available()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    done = lp.Laptop(lp.home()).run("remote", "setup", lp.LOGIN, "--with", "stack", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installed hpclaunch-" in done.stdout, done.stdout
    yield
    lp.close_master()


@pytest.fixture
def project(set_up: None) -> Iterator[lp.Laptop]:
    found = lp.new_project(
        {"train.py": PROGRAM, "helper.py": "VERSION = 1\n", "data/big.bin": "x" * 100},
        ignore="data/\n",
    )
    yield found
    shutil.rmtree(found.cwd, ignore_errors=True)
    for mirror in (lp.login_home() / ".hpclaunch" / "projects").glob(f"{found.cwd.name}-*"):
        if mirror.is_dir():
            shutil.rmtree(mirror, ignore_errors=True)
        else:  # <mirror>.shipped, the list of what was shipped there
            mirror.unlink()
    testbed.wait_jobs_gone(lp.login_home(), timeout=60)  # the laptop's jobs


def _remote(project: lp.Laptop, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return project.run("--remote", lp.LOGIN, *args, **kw)  # type: ignore[arg-type]


def _files_holding(text: str, *roots: Path) -> list[str]:
    """Files the login node's user can read that hold `text` (grep as that user). Not the
    container images other fixtures made before the secret existed (the testbed's images/,
    work/image-*, work/sqsh-image-*, *.sqsh, *.sif: gigabytes, ~20 s of CPU a scan)."""
    images = ["--exclude-dir=images", "--exclude-dir=image-*", "--exclude-dir=sqsh-image-*"]
    images += ["--exclude=*.sqsh", "--exclude=*.sif"]
    found = subprocess.run(
        ["/usr/sbin/runuser", "-u", testbed.USER, "--", "grep", "-rlsF", "--devices=skip",
         *images, "--", text, *map(str, roots)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    return found.stdout.split()


def test_run_from_the_laptop(project: lp.Laptop) -> None:
    secrets = {"WANDB_API_KEY": SECRET, "MY_TOKEN": TOKEN}
    run = ["run", "--remote", lp.LOGIN, "-N", "2", "--tasks-per-node", "2", "--wait"]
    run += ["--forward-env", "MY_TOKEN", "--forward-env=WANDB_API_KEY"]  # used: they cross
    done = project.run(*run, "--", "python3", "train.py", env=secrets)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [ln for ln in done.stdout.splitlines() if " rank " in ln]
    assert len(lines) == 4, done.stdout
    for rank in range(4):
        assert any(f"rank {rank} of 4 v 1" in ln for ln in lines), done.stdout
    assert all(f"key {_digest(SECRET)} tok {_digest(TOKEN)}" in ln for ln in lines)
    assert "leaks 0" in next(ln for ln in lines if "rank 0 " in ln)
    readable = [lp.login_home(), testbed.state_dir(), Path("/tmp")]
    assert _files_holding(SECRET, *readable) == []
    assert _files_holding(TOKEN, *readable) == []

    # A rank's exit code comes back; one changed file is all that moves.
    project.write("helper.py", "VERSION = 2\n")
    failed = project.run(*run, "--env", "CODE=5", "--", "python3", "train.py")
    assert failed.returncode == 5, failed.stdout + failed.stderr
    assert "shipped 1 changed file(s)" in failed.stderr and ": helper.py\n" in failed.stderr, (
        failed.stderr
    )
    assert "v 2" in failed.stdout

    status = _remote(project, "status", "last", "--json")
    assert status.returncode == 0, status.stderr
    record = json.loads(status.stdout)
    assert record["state"] == "FAILED" and record["exit_code"] == 5, record
    logs = _remote(project, "logs", "last", "--rank", "3")
    assert logs.returncode == 0 and "rank 3 of 4 v 2" in logs.stdout, logs.stdout + logs.stderr
    runs = _remote(project, "runs")
    assert record["run_id"] in runs.stdout, runs.stdout


def test_ignored_path_refused_before_anything_moves(project: lp.Laptop) -> None:
    done = _remote(project, "run", "--", "python3", "train.py", "--data=data/big.bin")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "git ignores data/big.bin" in done.stderr
    assert not list((lp.login_home() / ".hpclaunch" / "projects").glob(f"{project.cwd.name}-*"))


def test_cancel_and_a_sweep_remotely(project: lp.Laptop) -> None:
    sleeper = _remote(
        project, "run", "--json", "--", "python3", "-c", "import time; time.sleep(300)"
    )
    assert sleeper.returncode == 0, sleeper.stderr
    run_id = json.loads(sleeper.stdout)["run_id"]
    for _ in range(100):  # attach and stack need the job's step running
        if json.loads(_remote(project, "status", run_id, "--json").stdout)["state"] == "RUNNING":
            break
    attach = _remote(project, "attach", run_id, "--", "hostname")
    stack = _remote(project, "stack", run_id)
    cancel = _remote(project, "cancel", run_id)
    assert stack.returncode == 0, stack.stdout + stack.stderr
    node = re.search(r"^rank 0 \((node[12])\):", stack.stdout, re.M)
    assert node, stack.stdout  # the run's node, as Slurm chose it beside the other tests
    assert attach.returncode == 0 and attach.stdout.strip() == node[1], attach.stderr
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    testbed.wait_jobs_gone(lp.login_home(), timeout=60)  # the laptop's jobs
    status = _remote(project, "status", run_id, "--json")
    assert json.loads(status.stdout)["state"] == "CANCELLED", status.stdout

    sweep = _remote(project, "sweep", "--grid", "x=1,2", "--", "python3", "-c", "print({x})")
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    waited = _remote(project, "sweep", "wait", "last")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    table = _remote(project, "sweep", "status", "last", "--json")
    assert table.returncode == 0, table.stderr
    points = json.loads(table.stdout)["points"]
    assert [p["state"] for p in points] == ["COMPLETED", "COMPLETED"], points


def _listing(folder: Path) -> list[tuple[str, int]]:
    return sorted(
        (str(p), p.lstat().st_mtime_ns) for p in folder.rglob("*") if "__pycache__" not in str(p)
    )


def _ssh_to(host: str) -> str:
    found = subprocess.run(["pgrep", "-a", "-u", lp.USER, "ssh"], capture_output=True, text=True)
    return "\n".join(ln for ln in found.stdout.splitlines() if host in ln)


def test_refusals_are_one_line_and_leave_nothing(project: lp.Laptop) -> None:
    remote_dir = lp.login_home() / ".hpclaunch"
    before = _listing(remote_dir)
    cases = {
        "nosuchhost.invalid": ("cannot find the host", "status", "last"),
        "testbed-badkey": ("refused the login", "status", "last"),
        "testbed-noslurm": ("has no Slurm", "remote", "setup"),
    }
    for host, (said, *command) in cases.items():
        argv = [*command, host] if command[0] == "remote" else ["--remote", host, *command]
        done = project.run(*argv)
        assert done.returncode == 2, (host, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and host in done.stderr, done.stderr
        assert said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert _ssh_to(host) == "", _ssh_to(host)
    assert _listing(remote_dir) == before

    # Another hpclaunch on the cluster: one file edited there.
    init = next(remote_dir.glob("venv/lib/python*/site-packages/hpclaunch/__init__.py"))
    original = init.read_bytes()
    try:
        init.write_bytes(original + b"\n# edited on the cluster\n")
        before = _listing(remote_dir / "projects")
        for argv in (["status", "last"], ["run", "--", "python3", "train.py"]):
            done = _remote(project, *argv)
            assert done.returncode == 2, done.stdout + done.stderr
            assert "runs another hpclaunch" in done.stderr, done.stderr
            assert f"hpclaunch remote setup {lp.LOGIN}" in done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
        assert _listing(remote_dir / "projects") == before
    finally:
        init.write_bytes(original)


def test_remote_check_table(set_up: None) -> None:
    done = lp.Laptop(lp.home()).run("remote", "check", lp.LOGIN)
    assert done.returncode == 0, done.stdout + done.stderr
    for row in ("connection", "multiplexing", "python", "slurm", "rsync", "hpclaunch"):
        assert any(ln.startswith(row) and " PASS " in ln for ln in done.stdout.splitlines()), row


API_USER = """\
import json, hpclaunch
run = hpclaunch.run(["python3", "train.py"], nodes=2, tasks_per_node=2, remote="testbed-login")
code = run.wait()
print(json.dumps({"id": run.id, "code": code, "state": run.state, "log": run.logs(rank=1)}))
"""


def test_python_api_with_remote(project: lp.Laptop) -> None:
    project.write("use_api.py", API_USER)
    done = project.cmd([str(lp.REPO / ".venv" / "bin" / "python"), "use_api.py"])
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["code"] == 0 and found["state"] == "COMPLETED", found
    assert "rank 1 of 4 v 1" in found["log"], found


def test_plot_and_top_of_a_gpu_run_remotely(project: lp.Laptop) -> None:
    """The GPU watch's samples (the nvidia-smi stand-in on the nodes' PATH) seen from
    the laptop: `top --once` streams back, `plot --data` brings the CSV back."""
    doubles = lp.REPO / "tests" / "doubles" / "gpu"
    pattern = testbed.work_dir() / f"pattern-{project.cwd.name}.json"  # a cluster path
    pattern.write_text(json.dumps({"gpus": [{"samples": [[95, 40000, 600.0]]}]}))
    pattern.chmod(0o644)
    try:
        done = _remote(
            project, "run", "-N", "2", "--gpus-per-node", "1", "--watch-interval", "0.5",
            "--setup", f"export PATH={doubles}:$PATH", "--wait",
            "--env", f"HPCLAUNCH_FAKE_GPU_PATTERN={pattern}",
            "--", "python3", "-c", "import time; time.sleep(4)",
        )  # fmt: skip
    finally:
        pattern.unlink()
    assert done.returncode == 0, done.stdout + done.stderr
    top = _remote(project, "top", "last", "--once")
    assert top.returncode == 0 and "node1" in top.stdout and "node2" in top.stdout, top.stdout
    plot = _remote(project, "plot", "last", "--data", "samples/gpu.csv")
    csv = project.cwd / "samples" / "gpu.csv"
    assert csv.is_file(), plot.stdout + plot.stderr
    lines = csv.read_text().splitlines()
    assert lines[0] == "time,node,gpu,busy_pct,mem_mib,power_w" and len(lines) > 2, lines[:3]
    assert not list((lp.login_home() / ".hpclaunch" / "tmp").iterdir())


def _mirror(project: lp.Laptop) -> Path:
    projects = lp.login_home() / ".hpclaunch" / "projects"
    found = [p for p in projects.glob(f"{project.cwd.name}-*") if p.is_dir()]
    assert len(found) == 1, found
    return found[0]


def _as_cluster_user(path: Path, text: str) -> None:
    """A file a job (or the user, logged in there) wrote into the mirror on the cluster."""
    import pwd

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    user = pwd.getpwnam(testbed.USER)
    for item in (path, path.parent):
        os.chown(item, user.pw_uid, user.pw_gid)


def test_a_reship_deletes_only_what_the_laptop_removed(project: lp.Laptop) -> None:
    """Issue 24 item 5: outputs, logs and data written on the cluster survive a re-ship
    (an ignored folder that exists only there, ignored data, an untracked note); a file
    the laptop removed is removed there too."""
    project.write(".gitignore", "data/\noutputs/\n")
    project.write("old.py", "gone soon\n")
    project.write("results.csv", "shipped once\n")
    first = _remote(project, "run", "--dry-run", "--", "python3", "train.py")
    assert first.returncode == 0, first.stdout + first.stderr
    mirror = _mirror(project)
    assert (mirror / "old.py").is_file() and not (mirror / "outputs").exists()
    cluster_only = ("outputs/result.txt", "outputs/logs/rank0.log", "data/made-there.bin")
    for rel in (*cluster_only, "notes.txt"):
        _as_cluster_user(mirror / rel, f"written on the cluster: {rel}\n")

    (project.cwd / "old.py").unlink()
    project.write("helper.py", "VERSION = 3\n")
    # Ignored from now on (and gone here): the cluster's copy, a job's output by now, stays.
    project.write(".gitignore", "data/\noutputs/\nresults.csv\n")
    (project.cwd / "results.csv").unlink()
    _as_cluster_user(mirror / "results.csv", "written on the cluster: results.csv\n")
    again = _remote(project, "run", "--dry-run", "--", "python3", "train.py")
    assert again.returncode == 0, again.stdout + again.stderr
    for rel in (*cluster_only, "notes.txt", "results.csv"):
        assert (mirror / rel).read_text() == f"written on the cluster: {rel}\n", rel
    assert not (mirror / "old.py").exists(), "the laptop removed it: so is the mirror's"
    assert (mirror / "helper.py").read_text() == "VERSION = 3\n"
    assert "removed there 1 file(s)" in again.stderr, again.stderr
    # What is shipped is private there, though the home is 0755 (as many are).
    assert (mirror.parent.stat().st_mode & 0o077) == 0, oct(mirror.parent.stat().st_mode)


@contextlib.contextmanager
def _requests_seen() -> Iterator[tuple[str, Path]]:
    """A PATH for the laptop whose `ssh` keeps a copy of every request sent to the
    cluster's hpclaunch (the standard input of calls running serve) in a file."""
    import pwd
    import uuid

    folder = lp.home() / f"bin-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o700)
    seen = folder / "requests.log"
    wrapper = folder / "ssh"
    real = shlex.quote(str(testbed.state_dir() / "laptop-bin" / "ssh"))
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *hpclaunch.cli.serve*)\n'
        f'  /usr/bin/tee -a {shlex.quote(str(seen))} | {real} "$@"; exit $? ;;\n'
        "esac\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o700)
    seen.touch(mode=0o600)
    user = pwd.getpwnam(lp.USER)
    for item in (folder, wrapper, seen):
        os.chown(item, user.pw_uid, user.pw_gid)
    try:
        yield f"{folder}:{testbed.state_dir() / 'laptop-bin'}", seen
    finally:
        shutil.rmtree(folder, ignore_errors=True)


CHECK = """\
import hashlib, os
digest = lambda s: hashlib.sha256(s.encode()).hexdigest()[:12]
print("env-file", os.path.exists(".env"), "key-file", os.path.exists("keys/id_ed25519"),
      "other", "OTHER_TOKEN" in os.environ, "hf", digest(os.environ.get("HF_TOKEN", "")),
      flush=True)
"""


def test_credentials_and_unused_secrets_stay_on_the_laptop(project: lp.Laptop) -> None:
    """Issue 24 item 5: an untracked .env (and a key) is neither shipped nor in the run's
    snapshot; a secret the command does not use (OTHER_TOKEN) reaches neither the request
    nor the ranks (the cluster's hpclaunch puts the request's variables in its own
    environment, which sbatch passes to the job); one named by --forward-env does."""
    env_secret = "dotenv-" + os.urandom(6).hex()
    project.write(".env", f"API_TOKEN={env_secret}\n")
    project.write("keys/id_ed25519", f"{env_secret}\n")
    project.write("check.py", CHECK)
    secrets = {"OTHER_TOKEN": SECRET, "HF_TOKEN": TOKEN}
    with _requests_seen() as (path, seen):
        done = _remote(
            project, "run", "--wait", "--forward-env", "HF_TOKEN", "--", "python3", "check.py",
            env={**secrets, "PATH": path},
        )  # fmt: skip
        requests = seen.read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"HF_TOKEN": ' in requests and TOKEN in requests, requests[:300]
    assert "OTHER_TOKEN" not in requests and SECRET not in requests
    said = f"env-file False key-file False other False hf {_digest(TOKEN)}"
    assert said in done.stdout, done.stdout + done.stderr
    assert "left out (credentials, never shipped): .env, keys/id_ed25519" in done.stderr
    mirror = _mirror(project)
    assert (mirror / "check.py").is_file() and not (mirror / ".env").exists()
    snapshots = [Path(top) for top, _, names in os.walk(mirror) if "check.py" in names]
    assert len(snapshots) == 2, snapshots  # the mirror and the run's code snapshot
    for top in snapshots:
        assert not (top / ".env").exists() and not (top / "keys/id_ed25519").exists(), top
    readable = [lp.login_home(), testbed.state_dir(), Path("/tmp")]
    assert _files_holding(env_secret, *readable) == []
    assert _files_holding(SECRET, *readable) == []


def test_outside_git_only_a_named_folder_ships(set_up: None) -> None:
    """Issue 24 item 5: a folder that is no git work tree ships only with --ship DIR
    (refused in one line before anything moves without it), less its credentials."""
    import pwd
    import uuid

    folder = lp.home() / f"plain-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    user = pwd.getpwnam(lp.USER)
    os.chown(folder, user.pw_uid, user.pw_gid)
    plain = lp.Laptop(folder)
    plain.write("train.py", "print('plain folder')\n")
    plain.write(".env", "API_TOKEN=x\n")
    projects = lp.login_home() / ".hpclaunch" / "projects"
    try:
        refused = plain.run("run", "--remote", lp.LOGIN, "--dry-run", "--", "python3", "train.py")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "not in a git work tree" in refused.stderr and "--ship DIR" in refused.stderr
        assert not list(projects.glob(f"{folder.name}-*"))
        done = plain.run(
            "run", "--remote", lp.LOGIN, "--ship", ".", "--dry-run", "--", "python3", "train.py"
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "left out (credentials, never shipped): .env" in done.stderr, done.stderr
        mirror = next(p for p in projects.glob(f"{folder.name}-*") if p.is_dir())
        assert (mirror / "train.py").is_file() and not (mirror / ".env").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for made in projects.glob(f"{folder.name}-*"):
            shutil.rmtree(made) if made.is_dir() else made.unlink()


def test_last_from_a_folder_shipped_outside_git_is_its_projects(set_up: None) -> None:
    """Issue 29: over --remote `last` is the shipped project's, for a folder outside git
    shipped with --ship too: `status` from the first folder (no --ship: only run and sweep
    take it) shows its own run, not the second folder's newer one (remote/shipmemory.py)."""
    import pwd
    import uuid

    user = pwd.getpwnam(lp.USER)
    projects = lp.login_home() / ".hpclaunch" / "projects"
    folders = [lp.home() / f"plain-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    run_ids: list[str] = []
    try:
        for folder in folders:
            folder.mkdir()
            os.chown(folder, user.pw_uid, user.pw_gid)
            plain = lp.Laptop(folder)
            plain.write("train.py", "print('plain')\n")
            done = plain.run(
                "run", "--remote", lp.LOGIN, "--ship", ".", "--wait", "--json",
                "--", "python3", "train.py",
            )  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            run_ids.append(json.loads(done.stdout.splitlines()[0])["run_id"])
        status = lp.Laptop(folders[0]).run("status", "--remote", lp.LOGIN, "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["run_id"] == run_ids[0], (status.stdout, run_ids)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
            for made in projects.glob(f"{folder.name}-*"):
                shutil.rmtree(made) if made.is_dir() else made.unlink()


def test_profile_init_over_remote_writes_the_clusters_profile_there(project: lp.Laptop) -> None:
    """`profile init NAME --remote HOST` asks the cluster's Slurm and writes the profile on
    the cluster (where its runs read it); a 2x1 GPU run from the laptop then uses it."""
    made = _remote(project, "profile", "init", "viassh", "--force", "--json")
    assert made.returncode == 0, made.stdout + made.stderr
    written = Path(json.loads(made.stdout)["file"])
    try:
        assert str(written).startswith(str(lp.login_home())), written
        shown = _remote(project, "profile", "show", "viassh", "--json")
        facts = {f["fact"]: f["value"] for f in json.loads(shown.stdout)["facts"]}
        assert facts["gpus"] == "2", shown.stdout
        ran = _remote(project, "run", "--cluster", "viassh", "-N", "2", "--gpus-per-node", "1",
                      "--wait", "--", "python3", "train.py")  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
    finally:
        written.unlink(missing_ok=True)
