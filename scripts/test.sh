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
echo "test: set-up, testbed, ruff and mypy took $((SECONDS - started)) s; pytest" >&2
# --durations: the run ends with its ten slowest tests (where the suite's time goes).
python -m pytest -q --durations=10 "$@"
