#!/usr/bin/env bash
# The README's second command: set up, start the Slurm testbed (installs Slurm when
# missing; needs root or sudo), run ruff, mypy and the whole pytest suite, and stop the
# testbed again even when something fails.
set -euo pipefail
cd "$(dirname "$0")/.."
case "$PWD/" in
    /tmp/*) echo "test: the checkout is under /tmp, which each testbed node has private;" \
                 "clone it elsewhere (e.g. /var/tmp or your home)" >&2; exit 2 ;;
esac
started=$SECONDS
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
cleanup() { as_root bash testbed/down.sh >&2 || true; }

# The testbed starts (a minute or more on a fresh machine: packages, daemons, nodes)
# while setup.sh builds .venv and ruff runs; its log is printed when it is up. Then, in
# the same background job (one apt at a time), testbed/image.sh builds the test image
# (debootstrap, ~2 minutes on a fresh machine): the tests that need it (tests/conftest.py
# runs image.sh, which waits on the build's lock) find it built or nearly, instead of
# starting the build themselves in the middle of the suite. Both may need apt: when
# setup.sh must install python3-venv, the testbed starts after it.
up_log=$(mktemp)
up_out=$(mktemp)
image_log=$(mktemp)
# up.sh's exit status comes through a pipe (fd 7, opened both ways, so that the write
# never blocks, even when this script has ended early).
up_done=$(mktemp -u)
mkfifo -m 0600 "$up_done"
exec 7<>"$up_done"
rm -f "$up_done"
start_testbed() {
    trap cleanup EXIT
    {
        status=0
        as_root bash testbed/up.sh >"$up_out" 2>"$up_log" || status=$?
        echo "$status" >&7
        if [ "$status" = 0 ]; then as_root bash testbed/image.sh >"$image_log" 2>&1 || true; fi
    } </dev/null >/dev/null 2>&1 &
    up_pid=$!
}
system_python=python3
if [ -x /usr/bin/python3 ]; then system_python=/usr/bin/python3; fi
if "$system_python" -c 'import ensurepip, venv' >/dev/null 2>&1; then start_testbed; fi
bash scripts/setup.sh --test
if [ -z "${up_pid-}" ]; then start_testbed; fi
export PATH="$PWD/.venv/bin:$PATH"
# Bytecode caches on, whatever the caller's shell says: the suite starts thousands of
# Python processes (pytest workers that rewrite every test module's asserts, `hpclaunch`,
# the ranks' bootstrap), and each would otherwise compile its modules again.
unset PYTHONDONTWRITEBYTECODE

# Each pytest worker imports every test module, and the first import of one rewrites its
# asserts (~10 s of CPU for the suite; pytest caches it in __pycache__): one collection
# now, beside ruff and the testbed's start, and the workers below find it done.
python -m pytest --collect-only -q >/dev/null 2>&1 &
collect_pid=$!
echo "test: ruff" >&2
ruff check src tests bench examples
ruff format --check src tests bench examples
wait "$collect_pid" || true   # a collection error is reported by the phases themselves
mypy_log=$(mktemp)
read -r up_status <&7   # up.sh's exit status, once it ends (image.sh goes on)
exec 7<&-   # not inherited by the tests' processes from here on
cat "$up_log" >&2
if [ "$up_status" != 0 ]; then echo "test: testbed/up.sh failed ($up_status)" >&2; exit "$up_status"; fi
conf_line=$(tail -n 1 "$up_out")
rm -f "$up_log" "$up_out"
export "${conf_line?}"   # SLURM_CONF=<path>, the testbed's last line
echo "test: testbed up, ${conf_line}" >&2
set_up=$((SECONDS - started))
echo "test: set-up, testbed and ruff took ${set_up} s; pytest" >&2
# Three phases, by what a test needs (tests/conftest.py marks every test that needs the
# testbed `testbed`; `serial`: it needs the cluster, or this host's /tmp, to itself):
# 1. the testbed's side-by-side tests in HPCLAUNCH_TEST_WORKERS pytest-xdist workers,
#    longest first, a test or a group at a time to a worker (--dist loadgroup: a worker
#    holds at most three; xdist's default first deal gave one worker the nine longest
#    tests in a row, ~850 s alone; a module whose fixtures take a minute to build, such
#    as test_e2e_runtimes' image and venv, is a group or two (tests/conftest.py's
#    XDIST_GROUPS), built once a group); they mostly wait on Slurm (time limits, requeues);
# 2. the testbed's serial tests one at a time (they crash or drain nodes, reconfigure
#    slurmctld, count all jobs or wait for an idle cluster), mostly waiting too, while
#    the unit tests (no testbed, not serial) fill the CPUs beside them in their own
#    workers, their output kept and printed after;
# 3. the serial unit tests (they compare this host's whole /tmp before and after).
# Every phase runs whatever the others' outcome; the exit status is the first failure's.
# Six side-by-side workers on CI's two cores: with five, the phase was bound by its
# tests' waits as much as by the CPUs (83 % busy; tests/durations.json's times summed to
# five times the phase's length), so a sixth test waits beside them.
workers=${HPCLAUNCH_TEST_WORKERS:-6}
unit_workers=${HPCLAUNCH_UNIT_WORKERS:-2}
reports=$(mktemp -d)
# How busy the CPUs were in each phase (from /proc/stat's first line: busy jiffies over
# all jiffies), to tell a phase that waits on Slurm from one that waits for CPUs.
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9; exit}' /proc/stat; }
busy_since() {  # busy_since "BUSY TOTAL" -> percent busy since then
    local now
    now=$(cpu_ticks)
    awk -v a="$1" -v b="$now" 'BEGIN{split(a,x," "); split(b,y," ");
        d=y[2]-x[2]; printf "%d", (d > 0 ? 100*(y[1]-x[1])/d : 0)}'
}
pytest_started=$SECONDS
ticks=$(cpu_ticks)
codes=()
python -m pytest -q -n "$workers" --dist loadgroup -m "testbed and not serial" \
    --junitxml="$reports/side-by-side.xml" "$@" && codes+=(0) || codes+=($?)
side_s=$((SECONDS - pytest_started))
side_busy=$(busy_since "$ticks")
ticks=$(cpu_ticks)
# mypy (about a minute of one CPU) runs beside the serial tests, which mostly wait (the
# side-by-side phase keeps the CPUs busy), niced so that it never slows them; its verdict
# is printed and counted at the end.
echo "test: mypy --strict (beside the serial tests; its result comes at the end)" >&2
nice -n 10 mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
python -m pytest -q -n "$unit_workers" -m "not testbed and not serial" \
    --junitxml="$reports/unit.xml" "$@" >"$reports/unit.log" 2>&1 &
unit_pid=$!
python -m pytest -q -m "serial and testbed" \
    --junitxml="$reports/serial.xml" "$@" && codes+=(0) || codes+=($?)
wait "$unit_pid" && codes+=(0) || codes+=($?)
echo "test: the unit tests, run beside the serial ones:" >&2
cat "$reports/unit.log"
beside_s=$((SECONDS - pytest_started - side_s))
beside_busy=$(busy_since "$ticks")
python -m pytest -q -m "serial and not testbed" \
    --junitxml="$reports/serial-unit.xml" "$@" && codes+=(0) || codes+=($?)
# 5 is pytest's "nothing selected" (arguments naming only some phases' tests): not a
# failure unless no phase selected anything.
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
echo "test: mypy --strict:" >&2
cat "$mypy_log" >&2
rm -f "$mypy_log"
status=0
if [ "$mypy_status" != 0 ]; then status=$mypy_status; fi
selected=0
for code in "${codes[@]}"; do
    if [ "$code" != 5 ]; then selected=1; fi
    if [ "$code" != 0 ] && [ "$code" != 5 ] && [ "$status" = 0 ]; then status=$code; fi
done
if [ "$selected" = 0 ]; then status=5; fi
# The run ends with its ten slowest tests (where the suite's time goes) and its times.
python scripts/slowest.py -n 10 "$reports"/*.xml
# ... and every test of a minute or more, for the note on where the time goes.
python scripts/slowest.py --at-least 60 "$reports"/*.xml
wait "$up_pid" || true   # the image build, long ended
grep '^testbed/image.sh: ' "$image_log" | tail -n 2 >&2 || true
rm -f "$image_log"
# HPCLAUNCH_TEST_REPORTS=DIR keeps the JUnit reports (tests/durations.json is refreshed
# from them: python scripts/slowest.py --durations-out tests/durations.json DIR/*.xml).
if [[ -n "${HPCLAUNCH_TEST_REPORTS:-}" ]]; then
    mkdir -p "$HPCLAUNCH_TEST_REPORTS" && cp "$reports"/*.xml "$HPCLAUNCH_TEST_REPORTS"/ || true
fi
rm -rf "$reports"
echo "test: set-up, testbed and ruff ${set_up} s; pytest: testbed side by side" \
    "${side_s} s (${workers} workers, CPUs ${side_busy}% busy), serial beside the unit" \
    "tests ${beside_s} s (CPUs ${beside_busy}% busy)," \
    "serial unit tests $((SECONDS - pytest_started - side_s - beside_s)) s;" \
    "total $((SECONDS - started)) s; exit status ${status}" >&2
exit "$status"
