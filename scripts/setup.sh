#!/usr/bin/env bash
# Create .venv with hpclaunch (editable) and what the example and tests need.
# Usage: bash scripts/setup.sh [--test]   (--test adds pytest, hypothesis, ruff, mypy)
# Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# The system's python3: the tests run jobs as an unprivileged user, who must be able to
# execute the venv's interpreter (a root-only pyenv would not do).
PYTHON=${PYTHON:-python3}
if [ -x /usr/bin/python3 ]; then PYTHON=${PYTHON/#python3//usr/bin/python3}; fi

# A fresh Debian 12 has python3 but not its venv module (package python3-venv).
if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "setup: installing python3-venv" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip >&2
fi
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    "$PYTHON" -m venv .venv
fi
# plot: `hpclaunch sweep plot` / `plot` draw PNGs (a headline feature), so the demo has it.
extras="[plot]"
if [ "${1:-}" = "--test" ]; then extras="[test,plot]"; fi
# torch==2.13.0 only for the example and tests (numpy beside it: without it torch warns
# "Failed to initialize NumPy" in every rank); hpclaunch itself never needs torch.
packages=(-e ".${extras}" "torch==2.13.0" numpy)
# uv when pip's settings on this machine translate to it (scripts/uv_install.py: the same
# sources, in parallel; ~40 s where pip takes ~2 min), pip otherwise.
if ! .venv/bin/python scripts/uv_install.py "${packages[@]}" >&2; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "${packages[@]}" >&2
fi
# Bytecode for hpclaunch's own (editable) source, which no installer compiles: the tests
# run `hpclaunch` as other users, who cannot write it, and would compile it every time.
.venv/bin/python -m compileall -q -j 0 src >/dev/null
echo "setup: ready (.venv)" >&2
