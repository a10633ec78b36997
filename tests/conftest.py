"""Shared fixtures: the Slurm testbed and a folder + environment for its unprivileged user."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

import pytest

import testbed
from hpclaunch.slurm import commands
from slurm_replay import SlurmReplay

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
PROGRAMS = Path(__file__).parent / "programs"


@dataclass
class Hpc:
    """Runs `hpclaunch` (and other commands) as the testbed's unprivileged user."""

    cwd: Path
    env: dict[str, str]
    user: str = testbed.USER

    def run(
        self,
        *args: str,
        timeout: float = 180,
        env: dict[str, str] | None = None,
        check_user_error: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        return self.cmd(["hpclaunch", *args], timeout=timeout, env=env)

    def cmd(
        self, argv: list[str], timeout: float = 180, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environment = {**self.env, **(env or {})}
        return subprocess.run(
            ["runuser", "-u", self.user, "--", *argv],
            cwd=self.cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def folder(self, name: str) -> Path:
        """A new folder under cwd that the test user owns (the ranks write into it)."""
        path = self.cwd / name
        path.mkdir(parents=True)
        info = self.cwd.stat()
        os.chown(path, info.st_uid, info.st_gid)
        return path

    def runs(self) -> list[dict[str, Any]]:
        index = Path(self.env["XDG_DATA_HOME"]) / "hpclaunch" / "runs.jsonl"
        if not index.exists():
            return []
        return [json.loads(line) for line in index.read_text().splitlines()]

    def evidence(self, proc: subprocess.CompletedProcess[str], limit: int = 3000) -> str:
        """What a failed check shows: the command's output, and of each run folder its
        events, its logs' names and sizes, and what each log holds (so that a failure
        seen once in CI can be explained from its report alone)."""
        parts = [f"stdout: {proc.stdout[-limit:]!r}", f"stderr: {proc.stderr[-limit:]!r}"]
        for run_dir in self.run_dirs():
            parts.append(f"== {run_dir.name}")
            events = run_dir / "events.jsonl"
            if events.exists():
                parts.append(events.read_text(errors="replace")[-limit:])
            for log in sorted((run_dir / "logs").glob("**/*")):
                if log.is_file():
                    text = log.read_text(errors="replace")
                    parts.append(f"-- {log.relative_to(run_dir)} ({len(text)} chars): "
                                 f"{text[-500:]!r}")  # fmt: skip
        return "\n".join(parts)

    def run_dirs(self) -> list[Path]:
        root = self.cwd / "runs"
        if not root.exists():
            return []
        # Not .stage-cache/<pack>: run dirs are <exp>/<run-id>, neither hidden.
        return sorted(
            p for p in root.glob("*/*") if p.is_dir() and not p.parent.name.startswith(".")
        )


@pytest.fixture(scope="session")
def slurm_conf() -> Path:
    reason = testbed.skip_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"the Slurm testbed is required in CI: {reason}")
        pytest.skip(reason)
    conf = testbed.slurm_conf()
    assert conf is not None
    return conf


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as in a terminal for every process the tests start: a suite started in the
    background (`bash .ci/run &`, nohup) inherits SIGINT ignored, which then reaches every
    child, and the tests of what Ctrl-C does would fail for it (seen in this CI)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Each slow test's time in an earlier whole run (scripts/slowest.py --durations-out).
DURATIONS = Path(__file__).with_name("durations.json")


@pytest.hookimpl(tryfirst=True)  # before -m selects: the testbed mark added here counts
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test.sh), the longest tests first (their times from
    tests/durations.json), then the rest of the testbed's: they mostly wait on Slurm, so
    starting them early lets the unit tests fill the CPUs meanwhile instead of the run
    ending on a requeue test of four minutes dealt out last (scripts/test.sh deals them
    a test or a group (XDIST_GROUPS) at a time, --dist loadgroup, so that no worker gets the
    longest ones in a row). A group's tests stay together in the files' order, at the
    place of its longest test: a worker runs a group one test after another, and a test
    of another module in between would tear its module's fixtures down and build them
    again (the laptop group's `remote setup`, the runtimes group's image). A stable sort:
    every worker collects the same order, and the order within a group stays the files'
    own."""
    for item in items:
        # Whatever needs the testbed (every such fixture asks for slurm_conf) is marked so,
        # so that scripts/test.sh can run the unit tests beside the serial phase.
        if "slurm_conf" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.testbed)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        seconds = {}
    group_seconds: dict[str, float] = {}
    group_first: dict[str, int] = {}
    for place, item in enumerate(items):
        group = _xdist_group(item.nodeid)
        if group:
            own = float(seconds.get(item.nodeid, 0))
            group_seconds[group] = max(group_seconds.get(group, 0.0), own)
            group_first.setdefault(group, place)
    places = {id(item): place for place, item in enumerate(items)}

    def longest_first(item: pytest.Item) -> tuple[float, int, int]:
        group = _xdist_group(item.nodeid)
        own = group_seconds[group] if group else float(seconds.get(item.nodeid, 0))
        # One key for a whole group (its place: its first test's), so nothing comes between.
        place = group_first[group] if group else places[id(item)]
        return (-own, 0 if item.get_closest_marker("testbed") else 1, place)

    items.sort(key=longest_first)


# Modules whose tests run one after another on one pytest-xdist worker under scripts/test.sh
# (--dist loadgroup), so that their module fixtures are built once (the runtimes image and
# venv, the laptop's `remote setup`). Made here, by module: xdist 3.8's own `xdist_group`
# marker renames `item._nodeid`, which pytest 9 no longer reads (Node.nodeid comes from
# `_id`), and its scheduler then deals every test alone.
XDIST_GROUPS = {
    # One group per runtime ({param}: the test's first parameter), so that two workers
    # share the module's ~10 minutes, each building the image and venv once.
    "tests/test_e2e_runtimes.py": "runtimes-{param}",
    "tests/test_e2e_remote.py": "laptop",
    "tests/test_e2e_dev_remote.py": "laptop",
    # podman, podman-hpc and their image, installed and made once (tests/test_e2e_podman_hpc).
    "tests/test_e2e_podman_hpc.py": "podman-hpc",
}


def _xdist_group(nodeid: str) -> str:
    """The test's group (:data:`XDIST_GROUPS`, by its module), or ""."""
    path, _, name = nodeid.partition("::")
    group = XDIST_GROUPS.get(path, "")
    if "{param}" in group:  # test_x[pyxis] or test_x[pyxis---flag-said]: "pyxis"
        group = group.format(param=name.partition("[")[2].split("-")[0].rstrip("]"))
    return group


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadgroup with :data:`XDIST_GROUPS`: a group is one unit of work."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroups(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _xdist_group(nodeid) or str(super()._split_scope(nodeid))

    return ModuleGroups(config, log)


@pytest.fixture
def hpc(slurm_conf: Path, request: pytest.FixtureRequest) -> Iterator[Hpc]:
    """A fresh folder in the shared file system, owned by the test user, as cwd."""
    yield from _user_folder(slurm_conf, testbed.USER, _is_serial(request))


@pytest.fixture
def other(slurm_conf: Path, request: pytest.FixtureRequest) -> Iterator[Hpc]:
    """Like :func:`hpc`, for the testbed's second user (:data:`testbed.OTHER_USER`): the
    neighbour on a shared cluster who plants files where the test user's runs look."""
    yield from _user_folder(slurm_conf, testbed.OTHER_USER, _is_serial(request))


def _is_serial(request: pytest.FixtureRequest) -> bool:
    """Whether the test has the cluster to itself (marker ``serial``, run after the
    others by scripts/test.sh); the others run side by side with other tests' jobs."""
    return request.node.get_closest_marker("serial") is not None


def _user_folder(slurm_conf: Path, name: str, serial: bool) -> Iterator[Hpc]:
    user = pwd.getpwnam(name)
    folder = testbed.work_dir() / f"t-{uuid.uuid4().hex[:10]}"
    folder.mkdir(parents=True)
    (folder / "xdg").mkdir()
    for path in (folder, folder / "xdg"):
        os.chown(path, user.pw_uid, user.pw_gid)
    env = {
        "PATH": f"{VENV_BIN}:{testbed.USER_PATH}",
        "SLURM_CONF": str(slurm_conf),
        "HOME": user.pw_dir,
        "USER": name,
        "LOGNAME": name,
        "LANG": "C.UTF-8",
        "XDG_DATA_HOME": str(folder / "xdg"),
        "XDG_CONFIG_HOME": str(folder / "xdg"),
        "HPCLAUNCH_CLUSTER": "slurm",
    }
    yield Hpc(cwd=folder, env=env, user=name)
    if serial:  # the next test finds the cluster idle
        testbed.wait_idle(timeout=60)
    else:  # others' jobs may run beside this test's: wait for its own only
        try:
            testbed.wait_jobs_gone(folder, timeout=60)
        except TimeoutError:
            # A test that failed half-way may leave a job running for good: cancelled, so
            # that it does not hold the nodes the next tests wait for; the test errors.
            testbed.cancel_jobs_from(folder)
            raise
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def slurm_replay(monkeypatch: pytest.MonkeyPatch) -> SlurmReplay:
    """Slurm's commands answered in-process from recordings of the testbed's real Slurm
    (tests/slurm_replay.py), at hpclaunch's one command runner; none is answered until a
    test names its recordings with ``slurm_replay.answer(...)``."""

    replay = SlurmReplay()
    monkeypatch.setattr(commands, "run", replay.run)
    monkeypatch.setattr(commands, "query", replay.query)
    return replay


def load_json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fail_or_skip(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def build_test_image() -> tuple[Optional[Path], str]:
    """Run testbed/image.sh: the Debian + python3 directory image, built once (a built
    image is kept; the script also installs ch-run). (its path, "") or (None, why not).
    Every test that needs the image asks here, so none depends on the order tests run
    in (on a fresh machine the image exists only once something built it)."""
    # One build at a time: test workers running side by side (pytest-xdist) each ask, and
    # image.sh removes a build folder it finds half-done (another worker's, still going).
    # The lock is on the script itself: it exists wherever the tests run.
    script = REPO / "testbed" / "image.sh"
    with open(script) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = subprocess.run(
            ["bash", str(script)],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    if done.returncode != 0:
        return None, f"testbed/image.sh failed: {done.stderr[-2000:]}"
    return Path(done.stdout.strip().splitlines()[-1]), ""


@pytest.fixture(scope="session")
def base_image(slurm_conf: Path) -> Path:
    """The Debian + python3 directory image testbed/image.sh builds (root's: read-only
    for the test user, as a site's shared image would be)."""
    if not shutil.which("ch-run"):
        _fail_or_skip("Charliecloud (ch-run) is not installed: run testbed/up.sh")
    image, why = build_test_image()
    if image is None:
        _fail_or_skip(why)
    return image


@pytest.fixture(scope="session")
def wheel_dir(slurm_conf: Path) -> Iterator[Path]:
    """Hand-made wheels: pkga 1.0 and 2.0, pkgb (needs pkga>=2), pkgc (needs pkgb),
    pkgd (needs any pkga)."""
    from wheels import build_wheel

    folder = testbed.work_dir() / f"wheels-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    build_wheel(folder, "pkga", "1.0")
    build_wheel(folder, "pkga", "2.0")
    build_wheel(folder, "pkgb", "1.0", ("pkga>=2.0",))
    build_wheel(folder, "pkgc", "1.0", ("pkgb",))
    build_wheel(folder, "pkgd", "1.0", ("pkga",))
    for path in (folder, *folder.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def user_image(base_image: Path, wheel_dir: Path) -> Iterator[Path]:
    """A copy of the image that the test user owns (hpclaunch can make mount points in
    it), shipping pkga 1.0 as a container ships its framework, plus a marker file."""
    from wheels import install_into

    dest = testbed.work_dir() / f"image-{uuid.uuid4().hex[:6]}"
    subprocess.run(["cp", "-a", str(base_image), str(dest)], check=True, timeout=300)
    python = sorted(p.name for p in (dest / "usr" / "lib").glob("python3.*"))[-1]
    install_into(
        wheel_dir / "pkga-1.0-py3-none-any.whl", dest / f"usr/local/lib/{python}/dist-packages"
    )
    (dest / "hpclaunch-test-image").write_text("yes\n")
    # The image's copy of the shared work folder, where hpclaunch makes the mount points of
    # every test's folder: the test user's from the start. A test that runs as root with
    # this image (a packed venv through squashfuse) made it root's, and the user's later
    # runs on that pytest worker failed: "--bind: cannot make ... Permission denied".
    (dest / testbed.work_dir().relative_to("/")).mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{testbed.USER}:{testbed.USER}", str(dest)], check=True)
    yield dest
    shutil.rmtree(dest, ignore_errors=True)
