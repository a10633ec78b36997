# Sourced by testbed/up.sh (not run on its own): the cluster's login node over SSH, for
# `hpclaunch --remote` (issue 14). A real OpenSSH server (Debian's openssh-server) on
# 127.0.0.1, key authentication only, lets hpcuser in:
#   port 2222: a login node like LUMI's (Slurm's commands on PATH, SLURM_CONF set);
#   port 2223: the same machine with a PATH that has no Slurm (a "remote without Slurm").
# The laptop is another ordinary user, hpclaptop, with its own key and ~/.ssh/config:
#   testbed-login    -> hpcuser@127.0.0.1:2222
#   testbed-noslurm  -> hpcuser@127.0.0.1:2223
#   testbed-badkey   -> hpcuser@127.0.0.1:2222 with a key it does not accept
# and a folder of links to the tools a laptop has ($STATE/laptop-bin: ssh, rsync, git;
# no Slurm command, no SLURM_CONF). The caller sets STATE, CONF, TB_USER and MARK and
# has sourced common.sh (start).
# shellcheck shell=bash

LAPTOP_USER=hpclaptop
SSH_DIR="$STATE/ssh"
SSH_PORT=2222
SSH_PORT_NOSLURM=2223

install -d -m 0755 "$SSH_DIR" "$STATE/laptop-bin" "$STATE/noslurm-bin"
[[ -s "$SSH_DIR/host_ed25519" ]] || ssh-keygen -q -t ed25519 -N '' -f "$SSH_DIR/host_ed25519"

# sshd refuses a locked account ("!" in /etc/shadow, what useradd leaves): "*" has no
# password either, and is not locked.
usermod -p '*' "$TB_USER"
if ! id -u "$LAPTOP_USER" >/dev/null 2>&1; then
    log "creating user $LAPTOP_USER (the laptop)"
    useradd -m -s /bin/bash "$LAPTOP_USER"
fi
laptop_home="$(getent passwd "$LAPTOP_USER" | cut -d: -f6)"
login_home="$(getent passwd "$TB_USER" | cut -d: -f6)"
install -d -o "$LAPTOP_USER" -g "$LAPTOP_USER" -m 0700 "$laptop_home/.ssh"
install -d -o "$TB_USER" -g "$TB_USER" -m 0700 "$login_home/.ssh"
for key in id_ed25519 id_unknown; do  # id_unknown: a key the login node never heard of
    if [[ ! -s "$laptop_home/.ssh/$key" ]]; then
        runuser -u "$LAPTOP_USER" -- ssh-keygen -q -t ed25519 -N '' -f "$laptop_home/.ssh/$key"
    fi
done
install -o "$TB_USER" -g "$TB_USER" -m 0600 "$laptop_home/.ssh/id_ed25519.pub" \
    "$login_home/.ssh/authorized_keys"
host_key="$(cut -d' ' -f1-2 "$SSH_DIR/host_ed25519.pub")"
printf '[127.0.0.1]:%s %s\n' "$SSH_PORT" "$host_key" "$SSH_PORT_NOSLURM" "$host_key" \
    >"$laptop_home/.ssh/known_hosts"
cat >"$laptop_home/.ssh/config" <<CONF
# Written by hpclaunch's testbed/up.sh: the testbed's login node.
Host testbed-login
    HostName 127.0.0.1
    Port $SSH_PORT
    User $TB_USER
    IdentityFile ~/.ssh/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking yes
Host testbed-badkey
    HostName 127.0.0.1
    Port $SSH_PORT
    User $TB_USER
    IdentityFile ~/.ssh/id_unknown
    IdentitiesOnly yes
    StrictHostKeyChecking yes
Host testbed-noslurm
    HostName 127.0.0.1
    Port $SSH_PORT_NOSLURM
    User $TB_USER
    IdentityFile ~/.ssh/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking yes
CONF
chown "$LAPTOP_USER:$LAPTOP_USER" "$laptop_home/.ssh/known_hosts" "$laptop_home/.ssh/config"
chmod 0600 "$laptop_home/.ssh/config"

# The laptop's PATH: what hpclaunch needs there, and no Slurm.
link_tools() {
    local folder="$1" tool
    shift
    rm -f "$folder"/*
    for tool in "$@"; do
        # The system's own tools: root's PATH may lead to folders other users cannot enter.
        ln -s "$(PATH=/usr/bin:/bin type -P "$tool")" "$folder/$tool"
    done
}
link_tools "$STATE/laptop-bin" ssh rsync git sh env cat ls
link_tools "$STATE/noslurm-bin" python3 rsync sh env cat ls mkdir rm true

cat >"$SSH_DIR/sshd_config" <<CONF
# Written by hpclaunch's testbed/up.sh: the login node for the testbed's user.
Port $SSH_PORT
Port $SSH_PORT_NOSLURM
ListenAddress 127.0.0.1
HostKey $SSH_DIR/host_ed25519
PidFile $STATE/run/sshd-own.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
UsePAM no
AllowUsers $TB_USER
AuthorizedKeysFile .ssh/authorized_keys
MaxSessions 64
MaxStartups 64:30:128
SetEnv SLURM_CONF=$CONF
Match LocalPort $SSH_PORT_NOSLURM
    SetEnv PATH=$STATE/noslurm-bin
CONF
install -d -m 0755 /run/sshd
if ss -Hltn "sport = :$SSH_PORT" | grep -q .; then
    log "port $SSH_PORT is already in use (an sshd of an earlier testbed? see: ss -ltnp 'sport = :$SSH_PORT')"
    exit 1
fi
start sshd /usr/sbin/sshd -D -f "$SSH_DIR/sshd_config" -E "$STATE/log/sshd.log"
sshd_up() { ss -Hltn "sport = :$SSH_PORT" | grep -q .; }
