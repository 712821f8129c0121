#!/usr/bin/env bash
# A real SLURM cluster of N nodes on this one machine, to try `harness slurm` (and to test it) without a
# cluster: one slurmctld and N `slurmd -N n<i>` daemons on 127.0.0.1, authenticated by munge, from Debian's
# packages (slurm-wlm, munge), as root.
#
#   scripts/slurm-cluster up [N]    install what is missing, start N nodes (default 4), wait until they are idle
#   scripts/slurm-cluster status    the nodes and the queue (sinfo, squeue); exit 1 when the cluster is not up
#   scripts/slurm-cluster down      cancel every job, stop every daemon and every job process; nothing is left
#
# `up` is idempotent: with the cluster already up with N nodes it does nothing; with another N it starts again.
# Nodes n1..nN each declare the machine's CPUs (they share them: a node here is a name, not a machine), all in
# one partition `harness`. Their names resolve to 127.0.0.1 (lines this script adds to /etc/hosts, marked, and
# removes on `down`): a job's first node is its rendezvous host, as on a real cluster.
#
# Files: /etc/slurm/slurm.conf (written only where it is absent or is this script's: a real cluster's
# configuration is never overwritten) and HARNESS_SLURM_DIR (default /var/lib/harness-slurm): state, spool and
# pid files, and the daemons' logs (log/slurmctld.log, log/slurmd-n<i>.log: read them when a job does not start).
#
# Why these settings (each one was needed on a single machine): proctrack/linuxproc and task/none (no cgroup
# plugin: a container or VM seldom delegates cgroups to slurmd), a pid file and a spool folder per node (`%n`;
# with one pid file each new slurmd ends the last), one port per slurmd, select/cons_tres with CR_Core (memory
# is not a consumable here, so `#SBATCH --mem=0` asks for "all of the node's" and gets it).
set -euo pipefail

STATE="${HARNESS_SLURM_DIR:-/var/lib/harness-slurm}"
CONF=/etc/slurm/slurm.conf
MARK="# Written by speedrun-harness scripts/slurm-cluster: remove this line to keep the file from it."
HOSTS_MARK="# speedrun-harness slurm-cluster"
PORT0=17000          # slurmd of n<i> listens on PORT0 + i
CTLD_PORT=6817
PARTITION=harness

say() { echo "slurm-cluster: $*" >&2; }
STARTING=0
die() {
  say "$*"
  if [ "$STARTING" = 1 ]; then  # an `up` that fails leaves nothing it started running
    say "stopping what this up started"
    stop_daemons
    remove_hosts
  fi
  exit 1
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "needs root (it installs packages, writes $CONF and /etc/hosts, starts daemons): run it with sudo"
}

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurm-wlm)
  command -v munged >/dev/null || missing+=(munge)
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get here: install SLURM and munge with this system's package manager"
  say "installing ${missing[*]} from Debian's packages"
  apt-get update -qq 9>&-
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 9>&-  # a postinst daemon keeps no lock
}

alive() {  # alive PIDFILE: the pid in it runs, and is the daemon the file is named for (never a reused pid)
  local pid name
  [ -s "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  name=$(basename "$1" .pid)
  name=${name%%-*}  # slurmd-n3 -> slurmd
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]
}

start_munge() {
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  if [ ! -s /etc/munge/munge.key ]; then
    say "making a munge key"
    if command -v mungekey >/dev/null; then mungekey --create --force >/dev/null; else
      dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
  fi
  chmod 0400 /etc/munge/munge.key
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    # As root, on a machine without the munge user's folders set up: --force accepts root-owned files.
    munged --force --pid-file="$STATE/munged.pid" --socket=/run/munge/munge.socket.2 \
      --log-file="$STATE/log/munged.log" 2>>"$STATE/log/munged.log" 9>&- || die "munged did not start: $STATE/log/munged.log"
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
    die "munge does not answer: $STATE/log/munged.log"
  fi
}

write_conf() {  # write_conf N
  local n=$1 cpus host
  cpus=$(nproc --all)
  host=$(hostname -s)
  if [ -e "$CONF" ] && ! grep -qxF "$MARK" "$CONF"; then
    die "$CONF exists and is not this script's: this machine has a SLURM configuration of its own (a real cluster?); move it away to use scripts/slurm-cluster"
  fi
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/log"
  cat >"$CONF.new" <<EOF
$MARK
# A cluster of $n node(s) on one machine ($host), for trying and testing \`harness slurm\`.
ClusterName=harness
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
MinJobAge=600
MaxArraySize=1001
NodeName=n[1-$n] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((PORT0 + 1))-$((PORT0 + n))] CPUs=$cpus State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
EOF
  mv "$CONF.new" "$CONF"
}

write_hosts() {  # write_hosts N: n1..nN on 127.0.0.1, in one marked line
  local n=$1 names=""
  for i in $(seq "$n"); do names+=" n$i"; done
  remove_hosts
  echo "127.0.0.1$names $HOSTS_MARK" >>/etc/hosts
}

remove_hosts() {
  if grep -qF "$HOSTS_MARK" /etc/hosts 2>/dev/null; then
    # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace it.
    local kept
    kept=$(grep -vF "$HOSTS_MARK" /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts
  fi
}

nodes_up() {  # the number of nodes the controller knows, or nothing when it does not answer
  sinfo -h -N -o '%N' 2>/dev/null | sort -u | wc -l
}

idle_nodes() {
  sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l
}

configured_nodes() {
  if ! { [ -e "$CONF" ] && grep -qxF "$MARK" "$CONF"; }; then echo 0; return; fi
  sed -n 's/^NodeName=n\[1-\([0-9]*\)\].*/\1/p' "$CONF"
}

cluster_up() {  # every daemon of an N-node cluster runs and the controller answers
  local n=$1
  alive "$STATE/slurmctld.pid" || return 1
  for i in $(seq "$n"); do alive "$STATE/slurmd-n$i.pid" || return 1; done
  [ "$(configured_nodes)" = "$n" ] && scontrol ping >/dev/null 2>&1
}

stop_daemons() {
  local pidfile
  for pidfile in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
    [ -e "$pidfile" ] || continue
    if alive "$pidfile"; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
  for _ in $(seq 100); do
    local any=0
    for pidfile in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
      [ -e "$pidfile" ] && alive "$pidfile" && any=1
    done
    [ $any -eq 0 ] && break
    sleep 0.1
  done
  for pidfile in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
    [ -e "$pidfile" ] || continue
    if alive "$pidfile"; then kill -9 "$(cat "$pidfile")" 2>/dev/null || true; fi
    rm -f "$pidfile"
  done
  # A slurmstepd (and the job processes under it) outlives its slurmd: end them too, whole trees.
  kill_steps
}

ours() {  # the configuration is this script's: the SLURM processes here are the test cluster's
  [ -e "$CONF" ] && grep -qxF "$MARK" "$CONF"
}

kill_steps() {
  ours || return 0  # on a machine with a SLURM of its own, its users' job steps are never touched
  local pids
  pids=$(pgrep -x slurmstepd || true)
  [ -z "$pids" ] && return 0
  local all="$pids" frontier="$pids" children
  while [ -n "$frontier" ]; do
    children=$(for p in $frontier; do pgrep -P "$p" || true; done)
    all="$all $children"
    frontier=$children
  done
  # shellcheck disable=SC2086
  kill -9 $all 2>/dev/null || true
}

up() {
  local n=${1:-4}
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]] || [ "$n" -gt 64 ]; then die "N must be a node count from 1 to 64 (got '$n')"; fi
  need_root
  mkdir -p "$STATE/log"
  exec 9>"$STATE/lock"
  flock 9  # two `up`s at once (two test workers) start one cluster
  install_packages
  if cluster_up "$n"; then
    say "up: $n node(s) already ($(idle_nodes) idle)"
    return 0
  fi
  if alive "$STATE/slurmctld.pid" || compgen -G "$STATE/slurmd-*.pid" >/dev/null; then
    say "restarting: the cluster that runs is not one of $n node(s)"
    scancel --full --quiet --user=root 2>/dev/null || true
    stop_daemons
  fi
  STARTING=1
  start_munge
  write_conf "$n"
  write_hosts "$n"
  # The controller's state is kept from one `up` to the next: its job ids go on from where they were, so run ids
  # (<array job>_<task>) never repeat in a records folder; -i reads past what no longer fits (other nodes).
  mkdir -p "$STATE/ctld"
  for i in $(seq "$n"); do mkdir -p "$STATE/spool/n$i"; done
  # 9>&-: a daemon that kept the lock's descriptor would hold the lock for ever
  slurmctld -i 9>&- || die "slurmctld did not start: $STATE/log/slurmctld.log"
  for i in $(seq "$n"); do
    slurmd -N "n$i" 9>&- || die "slurmd -N n$i did not start: $STATE/log/slurmd-n$i.log"
  done
  for _ in $(seq 300); do
    if [ "$(idle_nodes)" = "$n" ]; then
      STARTING=0
      say "up: $n node(s) idle in partition '$PARTITION' (sinfo, squeue, sbatch work now; logs in $STATE/log)"
      return 0
    fi
    sleep 0.2
  done
  sinfo -N >&2 || true
  die "the nodes did not become idle within 60 s: read $STATE/log/slurmctld.log and $STATE/log/slurmd-n*.log"
}

down() {
  need_root
  if [ -e "$CONF" ] && ! ours; then
    die "$CONF is not this script's: this machine runs a SLURM of its own, which down never stops"
  fi
  mkdir -p "$STATE"
  exec 9>"$STATE/lock"
  flock 9
  if alive "$STATE/slurmctld.pid"; then
    scancel --full --quiet --user=root 2>/dev/null || true
    # give the steps' processes their SIGTERM and KillWait before the daemons go
    for _ in $(seq 100); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  stop_daemons
  if alive "$STATE/munged.pid"; then
    kill "$(cat "$STATE/munged.pid")" 2>/dev/null || true
    for _ in $(seq 50); do alive "$STATE/munged.pid" || break; sleep 0.1; done
  fi
  rm -f "$STATE/munged.pid"
  remove_hosts
  local left
  # zombies are not running: this machine's pid 1 may reap the daemons' exits only later
  left=$(ps -eo stat=,pid=,comm= | awk '$1 !~ /^Z/ && ($3 == "slurmctld" || $3 == "slurmd" || $3 == "slurmstepd") {print $2, $3}')
  [ -z "$left" ] || die "down: some SLURM processes still run: $(echo "$left" | tr '\n' ' ')"
  say "down: no slurmctld, slurmd, slurmstepd or job process left"
}

status() {
  local n
  n=$(configured_nodes)
  if [ "$n" != 0 ] && cluster_up "$n"; then
    sinfo
    squeue
    return 0
  fi
  say "not up (scripts/slurm-cluster up [N] starts it)"
  return 1
}

case "${1:-}" in
  up) up "${2:-4}" ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/slurm-cluster up [N] | status | down" >&2; exit 2 ;;
esac
