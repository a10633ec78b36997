#!/usr/bin/env bash
# Bring a node back after testbed/crash-node.sh: start its slurmd again, as up.sh does
# (fresh private /tmp, like a rebooted machine), and wait until Slurm shows it up (idle,
# or already running a job that was waiting for it). ReturnToService=2 in up.sh's
# slurm.conf returns a DOWN node to service as soon as its slurmd registers.
#
#   bash testbed/restart-node.sh node2
#
# A node whose slurmd still runs is left alone (the script only waits). Fails, with the
# end of the node's log, when the slurmd dies or the node is not up within
# TESTBED_TIMEOUT seconds (default 60).
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
umask 022
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${TESTBED_STATE:-/var/tmp/hpclaunch-testbed}"
CONF="$STATE/slurm.conf"
MARK="HPCLAUNCH_TESTBED=$STATE" # as up.sh: down.sh looks for it before killing a PID
TIMEOUT="${TESTBED_TIMEOUT:-60}"
export SLURM_CONF="$CONF"

log() { printf 'testbed/restart-node.sh: %s\n' "$*" >&2; }

if [[ "$(id -u)" != 0 ]]; then
    log "must run as root"
    exit 1
fi
node="${1:-}"
case "$node" in
    node1 | node2) ;;
    *) log "usage: restart-node.sh node1|node2"; exit 2 ;;
esac
layout="$(cat "$STATE/layout" 2>/dev/null || true)"
case "$layout" in
    netns | localhost) ;;
    *) log "the testbed is not started (no $STATE/layout): run testbed/up.sh"; exit 1 ;;
esac

pid_file="$STATE/run/testbed-slurmd-$node.pid"
running() {
    local pid
    pid="$(cat "$pid_file" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
        grep -qzxF -- "$MARK" "/proc/$pid/environ" 2>/dev/null
}

# Whether PID still lives, once running() has said it is ours: a slurmd this script has
# just started may not carry MARK yet (until the fork has exec'd `env`, its environ is
# this script's: CI36 took one for dead), and one that died stays a zombie (state Z)
# until this script ends.
lives() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ "${stat##*) }" != Z* ]]
}

if running; then
    log "slurmd of $node already runs (pid $(cat "$pid_file"))"
else
    if [[ "$layout" == netns ]]; then
        mapfile -t left < <(ip netns pids "sl-$node" 2>/dev/null || true)
        if ((${#left[@]})); then
            log "processes still run in sl-$node without its slurmd (${left[*]}): crash it first"
            exit 1
        fi
    fi
    # shellcheck source=testbed/common.sh
    source "$HERE/common.sh"
    start_slurmd "$node" "$layout"
    log "started slurmd of $node (pid $(cat "$pid_file"))"
fi
pid="$(cat "$pid_file")"

# Up: responding (no `*`), neither down nor drained. A job that waited for the node may
# take it at once, so allocated/mixed count as up too.
deadline=$((SECONDS + TIMEOUT))
while :; do
    state="$(timeout 5 sinfo -h -N -n "$node" -o %T 2>/dev/null | head -n 1 || true)"
    case "$state" in
        idle | mixed | allocated | completing) break ;;
    esac
    if ! lives "$pid"; then
        log "slurmd of $node died; end of its log:"
        tail -n 25 "$STATE/log/slurmd-$node.log" >&2 || true
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        log "$node not up after ${TIMEOUT}s (sinfo says '${state:-nothing}')"
        tail -n 25 "$STATE/log/slurmd-$node.log" >&2 || true
        exit 1
    fi
    sleep 0.2
done
log "$node is up ($state)"
