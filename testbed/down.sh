#!/usr/bin/env bash
# Stop the Slurm testbed started by testbed/up.sh and remove what it set up on the host:
# its daemons (by the PIDs up.sh recorded under $TESTBED_STATE/run), the processes left
# in the node namespaces, the namespaces sl-node1/sl-node2, the bridge sl-br0 and its
# veths, and the tagged lines in /etc/hosts. Anything else (a munged that up.sh found
# running, the user hpcuser, the state folder with logs and work/) is left alone.
#
# Idempotent: with nothing running it does nothing and exits 0. up.sh calls it first to
# clear what an earlier run left behind.
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
STATE="${TESTBED_STATE:-/var/tmp/hpclaunch-testbed}"
CONF="$STATE/slurm.conf"
# Names shared with up.sh (keep them in sync there).
MARK="HPCLAUNCH_TESTBED=$STATE"
BRIDGE=sl-br0
HOSTS_TAG="# hpclaunch-testbed"
NODES=(node1 node2)

log() { printf 'testbed/down.sh: %s\n' "$*" >&2; }
trap 'log "failed at line $LINENO (exit $?)"' ERR

if [[ "$(id -u)" != 0 ]]; then
    log "must run as root"
    exit 1
fi

# alive PID: the process exists and is not a zombie (a dead daemon whose parent does
# not reap it still answers `kill -0`).
alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat:0:1}" != Z ]]
}

# ours PID: alive and started by up.sh for this state folder (it put $MARK into the
# environment of every daemon), so a PID reused by an unrelated process is never killed.
ours() {
    [[ "$1" =~ ^[0-9]+$ ]] && alive "$1" && grep -qzxF -- "$MARK" "/proc/$1/environ" 2>/dev/null
}

# stop SECONDS PID...: SIGTERM, up to SECONDS to exit, then SIGKILL.
stop() {
    local limit="$1" pid left i
    shift
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < limit * 10; i++)); do
        left=()
        for pid in "$@"; do
            if alive "$pid"; then left+=("$pid"); fi
        done
        ((${#left[@]})) || return 0
        sleep 0.1
    done
    log "still running after SIGTERM, sending SIGKILL: ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null || true
}

# recorded NAME: the PID up.sh recorded for daemon NAME, if that process is still ours.
recorded() {
    local file="$STATE/run/testbed-$1.pid" pid
    [[ -f "$file" ]] || return 1
    pid="$(cat "$file")"
    ours "$pid" || return 1
    echo "$pid"
}

# 1. Cancel the cluster's jobs while slurmctld still runs, so their processes end
#    cleanly on both layouts (KillWait=5 s). Skipped when no job is there.
if recorded slurmctld >/dev/null && [[ -f "$CONF" ]]; then
    mapfile -t jobs < <(SLURM_CONF="$CONF" timeout 5 squeue -h -o %A 2>/dev/null || true)
    if ((${#jobs[@]})); then
        log "cancelling ${#jobs[@]} job(s)"
        SLURM_CONF="$CONF" timeout 10 scancel "${jobs[@]}" 2>/dev/null || true
        for ((i = 0; i < 150; i++)); do
            [[ -z "$(SLURM_CONF="$CONF" timeout 5 squeue -h -o %A 2>/dev/null || true)" ]] && break
            sleep 0.1
        done
    fi
fi

# 2. The login node's sshd (testbed/login.sh) and its open sessions (a laptop's master
#    connection keeps one for 10 minutes). sshd rewrites its process title, and with it
#    the environment area ours() reads: it is known by its PID file and its own
#    config's path in that title.
sshd_pid_file="$STATE/run/testbed-sshd.pid"
if [[ -f "$sshd_pid_file" ]]; then
    pid="$(cat "$sshd_pid_file")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" &&
        grep -qaF -- "$STATE/ssh/sshd_config" "/proc/$pid/cmdline" 2>/dev/null; then
        mapfile -t sessions < <(pgrep -P "$pid" || true)
        log "stopping sshd (pid $pid) and ${#sessions[@]} session(s)"
        stop 5 "$pid" "${sessions[@]}"
    fi
fi

# 3. The Slurm daemons, then munged (only when up.sh started it; otherwise there is no
#    record of it and it keeps running).
pids=()
for name in slurmd-node1 slurmd-node2 slurmctld; do
    if pid="$(recorded "$name")"; then
        log "stopping $name (pid $pid)"
        pids+=("$pid")
    fi
done
stop 10 "${pids[@]}"
if pid="$(recorded munged)"; then
    log "stopping munged (pid $pid)"
    stop 10 "$pid"
fi

# 4. Everything still inside a node's network namespace belongs to the testbed (job
#    steps and user tasks that outlived slurmd, or a slurmd not recorded); then the
#    namespaces, veths and bridge. Deleting a netns whose processes still live would
#    keep its veth alive, and the next `ip link add` would fail with "File exists",
#    so the host ends of the veths are deleted explicitly too.
if command -v ip >/dev/null 2>&1; then
    for node in "${NODES[@]}"; do
        ns="sl-$node"
        veth="sl-veth${node#node}"
        if [[ -e "/run/netns/$ns" ]]; then
            mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
            if ((${#pids[@]})); then
                # slurmstepd and srun shrug off one SIGTERM: do not wait long.
                log "stopping ${#pids[@]} process(es) left in namespace $ns"
                stop 2 "${pids[@]}"
            fi
        fi
        # The veth first: a namespace is torn down asynchronously, so its veth can
        # linger for a moment after `ip netns del`.
        if ip link show "$veth" >/dev/null 2>&1; then
            log "removing $veth"
            ip link del "$veth" 2>/dev/null || true
        fi
        if [[ -e "/run/netns/$ns" ]]; then
            log "removing namespace $ns"
            ip netns del "$ns" 2>/dev/null || rm -f "/run/netns/$ns"
        fi
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        log "removing bridge $BRIDGE"
        ip link del "$BRIDGE"
    fi
fi

# 5. The tagged /etc/hosts lines. Rewritten in place (not `sed -i`, which replaces the
#    file) because in containers /etc/hosts is often a bind mount.
if grep -qF -- "$HOSTS_TAG" /etc/hosts 2>/dev/null; then
    log "removing testbed lines from /etc/hosts"
    hosts_new="$(grep -vF -- "$HOSTS_TAG" /etc/hosts || true)"
    printf '%s\n' "$hosts_new" >/etc/hosts
fi

# 6. PID files: ours and Slurm's own (stale ones would mislead the next start).
rm -f "$STATE"/run/*.pid
exit 0
