#!/usr/bin/env bash
# Start a real two-node Slurm cluster on this one machine, for hpclaunch's tests.
#
#   bash testbed/up.sh            # prints progress on stderr, last stdout line: SLURM_CONF=<path>
#   export "$(bash testbed/up.sh | tail -n 1)"
#
# Layout (default): slurmctld and munged run on the host; each of node1 and node2 is a
# slurmd in its own network + UTS + mount namespace (own address, own hostname, own
# tmpfs /tmp, like separate machines), joined to the host by a bridge:
#   controller 10.200.0.1 (sl-br0), node1 10.200.0.11, node2 10.200.0.12.
# Where namespaces are refused (unprivileged containers), it falls back to two slurmd on
# localhost (`slurmd -N nodeN`, ports 6831-6832): same hostname and /tmp on both nodes.
# Force a layout with TESTBED_LAYOUT=netns|localhost (default: auto).
#
# Node crashes (netns layout): `bash testbed/crash-node.sh node2` SIGKILLs everything in
# the node; Slurm sets it DOWN after SlurmdTimeout (10 s). `bash testbed/restart-node.sh
# node2` starts its slurmd again (common.sh starts it as this script does) and waits
# until it is up; ReturnToService=2 puts it back in service by itself.
#
# Everything lives in one state folder, OUTSIDE /tmp (a node's /tmp is private to it):
# TESTBED_STATE (default /var/tmp/hpclaunch-testbed). Jobs are run by the unprivileged
# user hpcuser, whose shared work folder is $TESTBED_STATE/work.
#
# Re-running is safe: it first stops what an earlier run started (testbed/down.sh) and
# clears leftovers of runs whose processes were killed (namespaces, bridge, /etc/hosts
# lines, stale PID files, /run/munge), then starts a fresh cluster (job ids restart at 1).
set -euo pipefail

# stdout carries only the final SLURM_CONF= line, so callers can capture it; all
# progress and every command's output go to stderr. fd 3 keeps the real stdout.
exec 3>&1 1>&2

# Daemons live in /usr/sbin, which a CI shell may not have on PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
# Files the daemons create (logs, jobcomp.txt) must be readable by hpcuser.
umask 022

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${TESTBED_STATE:-/var/tmp/hpclaunch-testbed}"
LAYOUT_WANTED="${TESTBED_LAYOUT:-auto}"
TIMEOUT="${TESTBED_TIMEOUT:-60}"
TB_USER=hpcuser
OTHER_USER=hpcother  # tests/testbed.py OTHER_USER
CONF="$STATE/slurm.conf"
# Every daemon we start carries this variable in its environment: down.sh checks it
# in /proc/PID/environ before killing a recorded PID, so a reused PID is never hit.
MARK="HPCLAUNCH_TESTBED=$STATE"
# Names shared with down.sh (keep them in sync there).
BRIDGE=sl-br0
HOSTS_TAG="# hpclaunch-testbed"
NODES=(node1 node2)
CTL_IP=10.200.0.1
declare -A NODE_IP=([node1]=10.200.0.11 [node2]=10.200.0.12)
CTL_NAME=slurmctl   # name of the controller's bridge address, for jobs on the nodes

log() { printf 'testbed/up.sh: %s\n' "$*"; }
trap 'log "failed at line $LINENO (exit $?)"' ERR

if [[ "$(id -u)" != 0 ]]; then
    log "must run as root (it starts daemons, creates namespaces and a user)"
    exit 1
fi
case "$STATE" in
    /tmp | /tmp/*)
        log "TESTBED_STATE=$STATE is under /tmp, which is private to each node; use e.g. /var/tmp"
        exit 1 ;;
    /*) ;;
    *) log "TESTBED_STATE must be an absolute path, got '$STATE'"; exit 1 ;;
esac
T0=$SECONDS

# ---------------------------------------------------------------------------------
# 1. Install what is missing (fresh machines and CI start without Slurm).
# ---------------------------------------------------------------------------------
missing=()
# command:package pairs; the commands are what this script and the tests call.
for pair in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge \
    ip:iproute2 ss:iproute2 nsenter:util-linux unshare:util-linux setpriv:util-linux \
    ch-run:charliecloud-runtime debootstrap:debootstrap mksquashfs:squashfs-tools squashfuse:squashfuse \
    runuser:util-linux ps:procps python3:python3 \
    sshd:openssh-server ssh-keygen:openssh-client rsync:rsync git:git; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
# The tests may create a Python venv as hpcuser; Debian's python3 needs python3-venv.
if command -v dpkg-query >/dev/null 2>&1 &&
    [[ "$(dpkg-query -W -f='${Status}' python3-venv 2>/dev/null || true)" != *"ok installed"* ]]; then
    missing+=(python3-venv)
fi
if ((${#missing[@]})); then
    # Deduplicate (iproute2 and util-linux provide several commands).
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
# The munge package normally creates the key; make one if it did not.
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi

# ---------------------------------------------------------------------------------
# 2. Clear what earlier runs left: stop their daemons (by recorded PIDs), remove
#    namespaces, bridge, veths, /etc/hosts lines and PID files. down.sh does exactly that.
# ---------------------------------------------------------------------------------
TESTBED_STATE="$STATE" bash "$HERE/down.sh"

# A munged that is still answering was not started by us (down.sh stopped ours): reuse
# it. Otherwise /run/munge may hold a dead munged's socket and PID file, which make a
# new munged refuse to start: clear it.
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
# Checked before munge_ok, which retries for ~2 s when the socket is stale.
munged_gone() {
    local pid
    [[ -S /run/munge/munge.socket.2 ]] || return 0
    pid="$(cat /run/munge/munged.pid 2>/dev/null)" || return 1
    [[ ! -e "/proc/$pid" ]] || [[ "$(cut -d ' ' -f 3 "/proc/$pid/stat" 2>/dev/null)" == Z ]]
}
if munged_gone || ! munge_ok; then
    rm -rf /run/munge
fi

# Another cluster (e.g. a testbed with another TESTBED_STATE) on the controller port
# would make slurmctld die with a confusing log; say so plainly.
if ss -Hltn 'sport = :6817' | grep -q .; then
    log "port 6817 is already in use (another slurmctld? see: ss -ltnp 'sport = :6817')"
    exit 1
fi

# ---------------------------------------------------------------------------------
# 3. The unprivileged user that submits jobs, with a home and a shared work folder it
#    may write (for job output and a Python venv).
# ---------------------------------------------------------------------------------
if ! id -u "$TB_USER" >/dev/null 2>&1; then
    log "creating user $TB_USER"
    useradd -m -s /bin/bash "$TB_USER"
fi
user_home="$(getent passwd "$TB_USER" | cut -d: -f6)"
install -d -o "$TB_USER" -g "$TB_USER" -m 0755 "$user_home" "$STATE/work"
# A second, unrelated user on the same machine and nodes: the shared-cluster tests plant
# files as it (symlinks and folders at paths another user's job might use).
if ! id -u "$OTHER_USER" >/dev/null 2>&1; then
    log "creating user $OTHER_USER"
    useradd -m -s /bin/bash "$OTHER_USER"
fi

# ---------------------------------------------------------------------------------
# 4. State folder: a fresh cluster each time (job ids restart, so the old job
#    completion file would mislead `sacct -c`); work/ is kept, it holds users' files.
# ---------------------------------------------------------------------------------
install -d -m 0755 "$STATE"
rm -rf "$STATE/state" "$STATE/spool" "$STATE/log"
# The Pyxis/CE stand-in's unpacked images are named JOBID.STEP (tests/doubles/spank): with
# job ids restarting, an earlier cluster's folder would pass for a new job's step.
rm -rf /var/tmp/hpclaunch-spank-double-*
install -d -m 0755 "$STATE/state" "$STATE/spool" "$STATE/log" "$STATE/run" "$STATE/dev" \
    "$STATE/spool/slurmd-node1" "$STATE/spool/slurmd-node2"
# `sacct -c` loads the jobcomp plugin, which opens this file for appending even just
# to read it, so hpcuser needs write access to use `sacct -c`. slurmctld resets the
# mode to 0644 when it opens the file (so a group bit would not last) but keeps the
# owner: hpcuser owns it; slurmctld, as root, still appends to it.
: >"$STATE/jobcomp.txt"
chown "$TB_USER:$TB_USER" "$STATE/jobcomp.txt"
chmod 0644 "$STATE/jobcomp.txt"

# Fake GPUs: Slurm's gres/gpu accepts only character devices, so make /dev/null
# look-alikes (c 1 3), two per node. Where mknod is refused, a symlink to /dev/null is
# also a character device to Slurm's stat().
for node in "${NODES[@]}"; do
    for i in 0 1; do
        dev="$STATE/dev/$node-gpu$i"
        [[ -c "$dev" ]] && continue
        rm -f "$dev"
        mknod -m 0666 "$dev" c 1 3 2>/dev/null || ln -s /dev/null "$dev"
    done
done

# ---------------------------------------------------------------------------------
# 5. Choose the layout: separate namespaces per node when the kernel lets us.
# ---------------------------------------------------------------------------------
# Network for one node: a namespace with a veth into the bridge. Each step is checked
# by hand (`|| return 1`) because set -e does not apply inside a function run by `if`.
setup_node_net() {
    local node="$1" ns="sl-$1" veth="sl-veth${1#node}"
    ip netns add "$ns" || return 1
    ip link add "$veth" type veth peer name eth0 netns "$ns" || return 1
    ip link set "$veth" master "$BRIDGE" up || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" addr add "${NODE_IP[$node]}/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    # Lets jobs reach the host's other addresses too (the host answers them locally).
    ip -n "$ns" route add default via "$CTL_IP" || return 1
    # The private /tmp and hostname need a mount + UTS namespace: try it once here.
    nsenter --net="/run/netns/$ns" unshare --uts --mount \
        sh -c 'mount -t tmpfs -o size=1m tmpfs /tmp && hostname probe' || return 1
}
setup_netns() {
    ip link add "$BRIDGE" type bridge || return 1
    ip addr add "$CTL_IP/24" dev "$BRIDGE" || return 1
    ip link set "$BRIDGE" up || return 1
    local node
    for node in "${NODES[@]}"; do
        setup_node_net "$node" || return 1
    done
}

layout=""
case "$LAYOUT_WANTED" in
    auto | netns)
        if setup_netns; then
            layout=netns
        elif [[ "$LAYOUT_WANTED" == netns ]]; then
            log "TESTBED_LAYOUT=netns but network/mount namespaces are refused here"
            exit 1
        else
            log "namespaces refused here; falling back to two slurmd on localhost"
            # Remove the half-made namespaces/bridge before going on.
            TESTBED_STATE="$STATE" bash "$HERE/down.sh"
            layout=localhost
        fi ;;
    localhost) layout=localhost ;;
    *) log "TESTBED_LAYOUT must be auto, netns or localhost, got '$LAYOUT_WANTED'"; exit 1 ;;
esac
# The tests read this to know whether hostnames and /tmp differ between nodes.
echo "$layout" >"$STATE/layout"

# /etc/hosts: names of the nodes (and the controller's bridge address), tagged so
# down.sh removes exactly these lines. Rewritten in place (not `sed -i`, which
# replaces the file) because in containers /etc/hosts is often a bind mount.
hosts_lines=()
if [[ "$layout" == netns ]]; then
    hosts_lines+=("$CTL_IP $CTL_NAME $HOSTS_TAG")
    for node in "${NODES[@]}"; do
        hosts_lines+=("${NODE_IP[$node]} $node $HOSTS_TAG")
    done
else
    for node in "${NODES[@]}"; do
        hosts_lines+=("127.0.0.1 $node $HOSTS_TAG")
    done
fi
hosts_new="$(grep -vF -- "$HOSTS_TAG" /etc/hosts || true)"
printf '%s\n' "$hosts_new" "${hosts_lines[@]}" >/etc/hosts

# ---------------------------------------------------------------------------------
# 6. slurm.conf and gres.conf.
# ---------------------------------------------------------------------------------
# CPUs as slurmd sees them here (both "nodes" are this machine); RealMemory a bit
# under the machine's memory, modest so jobs asking for memory still fit.
cpus="$(nproc)"
# Describe the cores as slurmd finds them (else it logs "Node configuration differs
# from hardware" and --cpu-bind=cores sees a made-up layout), when that agrees with nproc.
topology=""
hw="$(slurmd -C 2>/dev/null | head -n 1 || true)"
if [[ "$hw" =~ SocketsPerBoard=([0-9]+)\ CoresPerSocket=([0-9]+)\ ThreadsPerCore=([0-9]+) ]] &&
    ((BASH_REMATCH[1] * BASH_REMATCH[2] * BASH_REMATCH[3] == cpus)); then
    topology=" Sockets=${BASH_REMATCH[1]} CoresPerSocket=${BASH_REMATCH[2]} ThreadsPerCore=${BASH_REMATCH[3]}"
fi
mem_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
real_mem=$((mem_mb * 3 / 4))
if ((real_mem > 8000)); then real_mem=8000; fi

if [[ "$layout" == netns ]]; then
    ctl_host="localhost($CTL_IP)"
    node_lines="NodeName=node1 NodeAddr=${NODE_IP[node1]} CPUs=$cpus$topology RealMemory=$real_mem Gres=gpu:2 State=UNKNOWN
NodeName=node2 NodeAddr=${NODE_IP[node2]} CPUs=$cpus$topology RealMemory=$real_mem Gres=gpu:2 State=UNKNOWN"
else
    # Debian's slurmd supports several daemons per host, told apart by -N and port.
    ctl_host="localhost"
    node_lines="NodeName=node[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[6831-6832] CPUs=$cpus$topology RealMemory=$real_mem Gres=gpu:2 State=UNKNOWN"
fi

# Every job shares cores, up to TESTBED_OVERSUBSCRIBE (default 4) jobs a core
# (OverSubscribe=FORCE:N): the test suite's side-by-side end-to-end tests mostly sleep and
# wait on Slurm and would otherwise queue behind each other for the machine's few cores
# (with 2 cores a node, 4 one-core jobs filled the testbed and a sweep's points ran one
# after another). FORCE, not YES: with YES a job shares only when it asks with sbatch's
# --oversubscribe, and sbatch reads no environment variable for it (`man sbatch`, INPUT
# ENVIRONMENT VARIABLES), so the suite could not ask without changing what hpclaunch
# submits. Serial tests have the cluster to themselves and see no one beside them.
# CPU binding stays on the real cores; GPUs are never shared.
share=""
oversubscribe=${TESTBED_OVERSUBSCRIBE:-4}
if [[ "$oversubscribe" =~ ^[2-9]$ ]]; then share=" OverSubscribe=FORCE:$oversubscribe"; fi

cat >"$CONF" <<EOF
# Written by testbed/up.sh ($layout layout); rewritten on every run.
ClusterName=lab
SlurmctldHost=$ctl_host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Short credential life: a requeued job may start 11 s (cred_expire + 1) after its requeue
# instead of 121 s, on the next backfill pass (bf_interval=5 below: 30 s by default).
AuthInfo=cred_expire=10
MailProg=/bin/true
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/slurmd-%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
# No cgroups: track processes through /proc, bind CPUs with sched_setaffinity.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node lines below win over what slurmd detects (both nodes share one machine).
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# Start batch jobs at once instead of on the next scheduling tick (default 3 s).
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=5
GresTypes=gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/none
# No database: finished jobs go to a text file that \`sacct -c\` reads.
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
# A node whose slurmd stops answering (testbed/crash-node.sh) is DOWN and its jobs
# NODE_FAIL within ~10-15 s (slurmctld pings every SlurmdTimeout/3) instead of the default
# 300 s; ReturnToService=2 above brings it back by itself once its slurmd registers again
# (testbed/restart-node.sh). 10 s, not 20: each crash test waits for it (the suite's
# serial phase); a live slurmd answers a ping in milliseconds even on a loaded testbed.
SlurmdTimeout=10
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP$share
PartitionName=short Nodes=ALL MaxTime=00:01:00 State=UP$share
# Partition "site" behaves like an AI site: job_submit.lua below rejects what such sites
# reject (tests/test_e2e_site_rules.py); the other partitions are left as they were.
PartitionName=site Nodes=ALL MaxTime=00:10:00 State=UP$share
JobSubmitPlugins=lua
EOF

# Slurm's job_submit_lua plugin (Debian's slurm-wlm-basic-plugins ships job_submit_lua.so,
# linked to liblua5.1) reads job_submit.lua beside slurm.conf. Its rules, on partition
# "site" only, in the words of the sites they imitate (docs/sites.md): GPUs through --gres
# (JSC, CINECA, BSC, IDRIS), a QoS named (BSC), at least 2 CPUs per GPU (BSC asks 20).
cat >"$STATE/job_submit.lua" <<'LUA'
-- Written by testbed/up.sh: site-like rules on partition "site" (tests/test_e2e_site_rules.py).
local NO_VAL16 = 65534

local function count(value)
    if value == nil or value >= NO_VAL16 then return 1 end
    return value
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    if job_desc.partition ~= "site" then
        return slurm.SUCCESS
    end
    local script = job_desc.script or ""
    if string.find(script, "--gpus-per-node", 1, true) then
        slurm.log_user("site rule: request GPUs with --gres=gpu:N on partition site, not --gpus-per-node")
        return slurm.ERROR
    end
    if job_desc.qos == nil or job_desc.qos == "" then
        slurm.log_user("site rule: a job on partition site must name a QoS (--qos)")
        return slurm.ERROR
    end
    local gpus = tonumber(string.match(job_desc.tres_per_node or "", "gpu[^,]-:(%d+)") or "0")
    if gpus > 0 then
        local cpus = count(job_desc.cpus_per_task) * count(job_desc.ntasks_per_node)
        if cpus < 2 * gpus then
            slurm.log_user("site rule: at least 2 CPUs per GPU on partition site")
            return slurm.ERROR
        end
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end
LUA

cat >"$STATE/gres.conf" <<EOF
# Fake GPUs (character devices like /dev/null), written by testbed/up.sh.
AutoDetect=off
NodeName=node1 Name=gpu File=$STATE/dev/node1-gpu[0-1]
NodeName=node2 Name=gpu File=$STATE/dev/node2-gpu[0-1]
EOF
chmod 0644 "$CONF" "$STATE/gres.conf" "$STATE/job_submit.lua"
export SLURM_CONF="$CONF"

# ---------------------------------------------------------------------------------
# 7. Start the daemons (start and start_slurmd come from common.sh, which
#    restart-node.sh shares: a node restarted after a crash runs exactly as here).
# ---------------------------------------------------------------------------------
# shellcheck source=testbed/common.sh
source "$HERE/common.sh"

# Print the end of every log, to show why the cluster did not come up.
show_logs() {
    local f
    for f in "$STATE"/log/*; do
        [[ -s "$f" ]] || continue
        printf '\n===== %s (last 25 lines) =====\n' "$f"
        tail -n 25 "$f"
    done
}

# wait_for WHAT SECONDS COMMAND...: poll COMMAND until it succeeds.
wait_for() {
    local what="$1" limit="$2" deadline
    shift 2
    deadline=$((SECONDS + limit))
    until "$@"; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${limit}s waiting for $what"
            show_logs
            exit 1
        fi
        sleep 0.1
    done
}

if munge_ok; then
    log "reusing the munged already running (not started by this script)"
else
    install -d -o munge -g munge -m 0755 /run/munge
    # munged must run as the munge user; setpriv execs it directly (runuser would fork).
    start munged setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F
    wait_for munged 15 munge_ok
fi

printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$STATE/resolv.conf"
start slurmctld slurmctld -D -i -f "$CONF"
ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
wait_for slurmctld 30 ctld_up

for node in "${NODES[@]}"; do
    start_slurmd "$node" "$layout"
done

# Ready when both nodes are idle. Fail early if a daemon died, with its log.
nodes_idle() {
    local name pid
    for name in munged slurmctld slurmd-node1 slurmd-node2; do
        [[ -f "$STATE/run/testbed-$name.pid" ]] || continue
        pid="$(cat "$STATE/run/testbed-$name.pid")"
        if ! kill -0 "$pid" 2>/dev/null; then
            log "$name (pid $pid) died during start-up"
            show_logs
            exit 1
        fi
    done
    [[ "$(timeout 5 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | tr '\n' ' ')" \
        == "node1 node2 " ]]
}
wait_for "both nodes to be idle (sinfo -h -N -t idle -o %N)" "$TIMEOUT" nodes_idle

# shellcheck source=testbed/login.sh
source "$HERE/login.sh"
wait_for "sshd on 127.0.0.1:$SSH_PORT" 15 sshd_up

log "cluster up in $((SECONDS - T0))s ($layout layout, $cpus CPUs and ${real_mem} MB per node, 2 fake GPUs per node)"
log "run jobs as: runuser -u $TB_USER -- env SLURM_CONF=$CONF sbatch ... (shared folder $STATE/work)"
log "laptop: runuser -u $LAPTOP_USER -- env PATH=$STATE/laptop-bin <venv>/bin/hpclaunch --remote testbed-login ..."
log "stop with: TESTBED_STATE=$STATE bash $HERE/down.sh"
echo "SLURM_CONF=$CONF" >&3
