#!/usr/bin/env bash
# Crash one node of the testbed as a power cut would: SIGKILL, at once, its slurmd and
# every process inside the node (job steps, batch shells, the user's tasks). Nothing
# gets a chance to clean up or to tell the controller; the node's private /tmp goes
# with its mount namespace. Slurm notices by itself: once the node has not answered for
# SlurmdTimeout (10 s in up.sh's slurm.conf) it is DOWN and its jobs end as NODE_FAIL
# (or are requeued, for jobs submitted with --requeue).
#
#   bash testbed/crash-node.sh node2
#   bash testbed/restart-node.sh node2    # its slurmd again; waits until it is up
#
# Needs the netns layout (up.sh's default): a node is then exactly the processes in its
# network namespace sl-NODE. In the localhost fallback all nodes share one namespace and
# the script refuses (exit 2).
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
STATE="${TESTBED_STATE:-/var/tmp/hpclaunch-testbed}"

log() { printf 'testbed/crash-node.sh: %s\n' "$*" >&2; }

if [[ "$(id -u)" != 0 ]]; then
    log "must run as root"
    exit 1
fi
node="${1:-}"
case "$node" in
    node1 | node2) ;;
    *) log "usage: crash-node.sh node1|node2"; exit 2 ;;
esac
layout="$(cat "$STATE/layout" 2>/dev/null || true)"
if [[ "$layout" != netns ]]; then
    log "needs the testbed's netns layout (this one is '${layout:-not started}')"
    exit 2
fi
ns="sl-$node"
if [[ ! -e "/run/netns/$ns" ]]; then
    log "no namespace $ns: is the testbed up?"
    exit 1
fi

# A process waiting on a FUSE request that no one will answer survives SIGKILL (state D,
# request_wait_answer): seen once, a rank's ch-run (Debian's Charliecloud 0.31) whose
# SquashFUSE server had gone while the rank itself still held /dev/fuse. Aborting the
# connections with requests waiting frees it (the kernel's fusectl file system). Only
# after SIGKILL has had its chance: a healthy request is answered in milliseconds.
abort_stuck_fuse() {
    local connections=/sys/fs/fuse/connections conn
    [[ -d "$connections" ]] || return 0
    if [[ -z "$(ls -A "$connections")" ]]; then
        mount -t fusectl none "$connections" 2>/dev/null || return 0
    fi
    for conn in "$connections"/*/; do
        if [[ "$(cat "$conn/waiting" 2>/dev/null || echo 0)" -gt 0 ]]; then
            log "aborting FUSE connection $(basename "$conn") (requests waiting on it)"
            echo 1 >"$conn/abort" 2>/dev/null || true
        fi
    done
}

# Kill until the namespace is empty: a process may fork between listing and killing.
# A killed process leaves the namespace at once (a zombie has no namespaces left).
killed=0
for ((i = 0; i < 100; i++)); do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    ((${#pids[@]})) || break
    kill -KILL "${pids[@]}" 2>/dev/null || true
    killed=$((killed + ${#pids[@]}))
    if ((i == 40)); then abort_stuck_fuse; fi
    sleep 0.05
done
mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
if ((${#pids[@]})); then
    log "processes still alive in $ns after SIGKILL: ${pids[*]}"
    exit 1
fi
# The recorded slurmd is gone: down.sh and restart-node.sh see no stale PID.
rm -f "$STATE/run/testbed-slurmd-$node.pid"
log "$node crashed ($killed process(es) killed)"
