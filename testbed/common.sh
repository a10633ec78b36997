# Sourced by testbed/up.sh and testbed/restart-node.sh (not run on its own): how a
# daemon of the testbed is started, so a node restarted after a crash runs exactly as
# up.sh started it. The caller sets STATE (the state folder), CONF (its slurm.conf) and
# MARK (HPCLAUNCH_TESTBED=$STATE, the variable down.sh looks for before killing a PID).
# shellcheck shell=bash

# start NAME COMMAND...: start a daemon, record its PID in run/testbed-NAME.pid.
# Each daemon runs in its own session (setsid, so a caller that kills its process group
# on exit does not take the cluster down), with stdin/stdout/stderr and fd 3 away from
# the caller's pipes (else `$(up.sh)` would never end). setsid, setpriv, nsenter and
# unshare all exec, so $! is the daemon's own PID.
start() {
    local name="$1"
    shift
    env "$MARK" setsid "$@" </dev/null >>"$STATE/log/$name.out" 2>&1 3>&- &
    echo "$!" >"$STATE/run/testbed-$name.pid"
}

# start_slurmd NODE LAYOUT: start NODE's slurmd (LAYOUT netns or localhost).
start_slurmd() {
    local node="$1" layout="$2"
    if [[ "$layout" == netns ]]; then
        # nsenter (not `ip netns exec`, which remounts /sys and slurmd then dies with
        # "No filesystem mounted on /sys/fs/cgroup"); unshare gives the node its own
        # hostname and mount table, where a fresh tmpfs becomes its private /tmp (so a
        # node that crashed comes back with an empty /tmp, as a rebooted machine would).
        # The node name and conf path reach the inner sh as "$1" "$2", not pasted
        # into its code, so no quoting can go wrong.
        # The node's resolver is 127.0.0.1 (nothing listens there): a name that
        # /etc/hosts does not know fails at once instead of waiting 2 x 5 s for the
        # host's nameserver, which a node namespace cannot reach (no forwarding).
        # PyTorch's c10d looks such names up on every connection.
        # shellcheck disable=SC2016
        start "slurmd-$node" nsenter --net="/run/netns/sl-$node" unshare --uts --mount \
            sh -c 'mount -t tmpfs -o size=512m,mode=1777 tmpfs /tmp && hostname "$1" &&
                   mount --bind "$3" /etc/resolv.conf &&
                   exec slurmd -D -N "$1" -f "$2"' sh "$node" "$CONF" "$STATE/resolv.conf"
    else
        start "slurmd-$node" slurmd -D -N "$node" -f "$CONF"
    fi
}
