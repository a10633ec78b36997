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
bash scripts/setup.sh --test
export PATH="$PWD/.venv/bin:$PATH"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
cleanup() { as_root bash testbed/down.sh >&2 || true; }
trap cleanup EXIT

conf_line=$(as_root bash testbed/up.sh | tail -n 1)
export "${conf_line?}"   # SLURM_CONF=<path>, the testbed's last line
echo "test: testbed up, ${conf_line}" >&2

echo "test: ruff" >&2
ruff check src tests bench examples
ruff format --check src tests bench examples
echo "test: mypy --strict" >&2
mypy
set_up=$((SECONDS - started))
echo "test: set-up, testbed, ruff and mypy took ${set_up} s; pytest" >&2
# Two phases. 1: every test not marked serial, in HPCLAUNCH_TEST_WORKERS parallel
# workers (pytest-xdist): unit tests share the CPUs, and end-to-end tests, which mostly
# wait on Slurm (time limits, signals, requeues), queue side by side on the testbed.
# 2: the tests marked serial (they crash or drain nodes, reconfigure slurmctld, count
# all jobs or wait for an idle cluster), one at a time with the cluster to themselves.
# Both run whatever the other's outcome; the exit status is the first failure's.
workers=${HPCLAUNCH_TEST_WORKERS:-4}
reports=$(mktemp -d)
pytest_started=$SECONDS
first=0
python -m pytest -q -n "$workers" -m "not serial" --durations=10 \
    --junitxml="$reports/parallel.xml" "$@" || first=$?
parallel_s=$((SECONDS - pytest_started))
second=0
python -m pytest -q -m serial --durations=10 --junitxml="$reports/serial.xml" "$@" || second=$?
# 5 is pytest's "nothing selected" (arguments naming only one phase's tests): not a
# failure unless neither phase selected anything.
status=0
for code in "$first" "$second"; do
    if [ "$code" != 0 ] && [ "$code" != 5 ] && [ "$status" = 0 ]; then status=$code; fi
done
if [ "$first" = 5 ] && [ "$second" = 5 ]; then status=5; fi
# The run ends with its ten slowest tests (where the suite's time goes) and its times.
python scripts/slowest.py -n 10 "$reports/parallel.xml" "$reports/serial.xml"
rm -rf "$reports"
echo "test: set-up, testbed, ruff and mypy ${set_up} s; pytest ${parallel_s} s side by side" \
    "(${workers} workers) + $((SECONDS - pytest_started - parallel_s)) s serial;" \
    "total $((SECONDS - started)) s; exit status ${status}" >&2
exit "$status"
