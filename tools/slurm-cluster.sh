#!/usr/bin/env bash
# A real two-node SLURM cluster (Debian's SLURM 22.05) on this one machine, for trying attnlab's SLURM paths
# (`launcher=slurm`, a user's own sbatch script, requeue after USR1) and for the tests that run them.
#
#   tools/slurm-cluster.sh start [--accounting|--no-accounting] [--user-signal]  # as root: install, (re)start
#   tools/slurm-cluster.sh status                                 # exit 0 when both nodes can run jobs
#   tools/slurm-cluster.sh stop                                   # cancel the jobs, stop every daemon
#   tools/slurm-cluster.sh install [--accounting|--no-accounting] # only the Debian packages (CI)
#
# Two nodes, n1 and n2, are two slurmd processes on this host (`slurmd -N n1`, `slurmd -N n2`), reached at
# 127.0.0.1 on their own ports; their names resolve through a line of /etc/hosts (torch's rendezvous uses the first
# node's name as MASTER_ADDR). As strict as a real site: each node declares the machine's own CPUs, and a task is
# bound to the CPUs its step was given (TaskPlugin=task/affinity: a process sees only those in
# os.sched_getaffinity); where this machine lets us make cgroup v1 memory cgroups, memory is a consumable resource
# and each job is held to what it asked for (--mem; its CPUs' share of the node's when it asked for none) by SLURM's
# task/cgroup (ConstrainRAMSpace=yes in cgroup.conf), its processes killed past it, as at a site that enforces
# memory. Partitions: `debug` (default, both nodes, 1 day) and `short` (10 minutes), never preempted; `low` and `high` for preemption by priority
# (PreemptType=preempt/partition_prio): a job on `low` is requeued (PreemptMode=REQUEUE) when a job on `high` needs
# its CPUs, after SIGCONT and SIGTERM and a grace time of 30 s (GraceTime) before SIGKILL; with --user-signal
# (PreemptParameters=send_user_signal) it gets its --signal signal (USR1) instead of SIGTERM.
# With accounting (the default), slurmdbd keeps the jobs in a MariaDB database, so `sacct` shows them; without,
# `sacct` has nothing to read, as on a small cluster without slurmdbd. A requeued job may start again after about
# 10 s (SLURM's default is 2 minutes).
#
# Exit status: 0 done; 1 the cluster did not come up (its logs are named); 3 it cannot run here (not root, no
# apt-get, packages that cannot be installed, a slurm.conf that this script did not write).
set -euo pipefail

CLUSTER=attnlab
NODES=(n1 n2)
NODE_PORTS=(6821 6822)
CTLD_PORT=6817
DBD_PORT=6819
HOST=$(hostname -s)
CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # the CPUs this host gives us (nproc follows OMP_*)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
CGROUP_CONF=$CONF_DIR/cgroup.conf
CGROUP_MEMORY=/sys/fs/cgroup/memory
DBD_CONF=$CONF_DIR/slurmdbd.conf
MARK="# written by attnlab's tools/slurm-cluster.sh"
HOSTS_LINE="127.0.0.1 ${NODES[*]}  # attnlab slurm-cluster"
STATE=/var/lib/slurm
RUN=/run/slurm
LOGS=/var/log/slurm
DB_RUN=/run/mysqld
DB_NAME=slurm_acct_db
LOCK=/run/lock/attnlab-slurm-cluster.lock
BASE_PACKAGES=(munge slurmctld slurmd slurm-client)
ACCOUNTING_PACKAGES=(slurmdbd mariadb-server)
BASE_PROGRAMS=(munged munge unmunge slurmctld slurmd sbatch srun squeue sinfo scontrol scancel)
ACCOUNTING_PROGRAMS=(slurmdbd sacct sacctmgr mariadbd mariadb mariadb-admin)

say() { echo "slurm-cluster: $*"; }
die() { local code=$1; shift; echo "slurm-cluster: error: $*" >&2; exit "$code"; }

usage() {
  echo "usage: $0 start [--accounting|--no-accounting] [--user-signal] | stop | status |" \
    "install [--accounting|--no-accounting]" >&2
  exit 2
}

need_root() {
  [ "$(id -u)" = 0 ] || die 3 "$1 needs root (it installs Debian packages and starts system daemons); run it as root"
}

lock() {  # one start/stop at a time; the daemons are started with fd 9 closed, or they would hold it forever
  mkdir -p "$(dirname "$LOCK")"
  exec 9>"$LOCK"
  flock -w 120 9 || die 1 "another tools/slurm-cluster.sh holds $LOCK"
}

missing_packages() {
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
  done
}

have_programs() {
  local program
  for program in "$@"; do
    command -v "$program" >/dev/null 2>&1 || return 1
  done
}

install_packages() {  # accounting: 1|0; a SLURM installed some other way (its programs all there) will do too
  local packages=("${BASE_PACKAGES[@]}") programs=("${BASE_PROGRAMS[@]}") missing
  if [ "$1" = 1 ]; then
    packages+=("${ACCOUNTING_PACKAGES[@]}")
    programs+=("${ACCOUNTING_PROGRAMS[@]}")
  fi
  mapfile -t missing < <(missing_packages "${packages[@]}")
  [ "${#missing[@]}" = 0 ] && return 0
  have_programs "${programs[@]}" && return 0
  command -v apt-get >/dev/null 2>&1 \
    || die 3 "the packages ${missing[*]} are missing and there is no apt-get to install them"
  say "installing ${missing[*]} (apt-get)"
  # the packages' own service scripts must not start daemons with their default configuration
  local own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  local rc=0 log
  log=$(mktemp)
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >"$log" 2>&1 || rc=$?
  [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  if [ "$rc" != 0 ]; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    die 3 "apt-get could not install ${missing[*]}"
  fi
  rm -f "$log"
}

# ---- processes, by their pid files

pid_of() {  # pid file, program name: the pid when that program runs with it
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && echo "$pid"
}

alive() {  # a process that has not ended (a zombie has: its parent, often init, reaps it in its own time)
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

stop_pid() {  # pid file, program name, label
  local pid i
  pid=$(pid_of "$1" "$2") || { rm -f "$1"; return 0; }
  say "stopping $3 (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 100); do
    alive "$pid" || break
    sleep 0.1
  done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}

wait_for() {  # seconds, description, command...: poll the command every 0.2 s
  local seconds=$1 what=$2 i
  shift 2
  for i in $(seq $((seconds * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# ---- configuration

own_file_or_none() {  # a configuration file that is absent or was written by this script
  [ ! -e "$1" ] || grep -qF "$MARK" "$1" \
    || die 3 "$1 exists and was not written by this script (a real SLURM installation?); move it away to use this one"
}

write_slurm_conf() {  # accounting: 1|0, user signal: 1|0
  own_file_or_none "$CONF"
  mkdir -p "$CONF_DIR"
  local storage gather preempt_params="" tasks=task/affinity select=CR_CPU memory="" sampler=linux
  [ "${2:-0}" = 1 ] && preempt_params="PreemptParameters=send_user_signal"
  if write_cgroup_conf; then  # memory a consumable resource: a job gets what it asks for, else its CPUs' share
    tasks=task/affinity,task/cgroup select=CR_CPU_Memory memory="DefMemPerCPU=$((MEM_MB / CPUS))" sampler=cgroup
  fi
  if [ "$1" = 1 ]; then
    storage="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=$DBD_PORT"
    gather="JobAcctGatherType=jobacct_gather/$sampler
JobAcctGatherFrequency=5"
  else
    storage="AccountingStorageType=accounting_storage/none"
    gather="JobAcctGatherType=jobacct_gather/none"
  fi
  cat >"$CONF.new" <<EOF
$MARK: two nodes on this host ($0 stop removes what it started)
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
# a requeued job may start again after cred_expire + 1 s (SLURM's default: 120 s)
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=$tasks
SelectType=select/cons_tres
SelectTypeParameters=$select
$memory
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$preempt_params
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobRequeue=1
ReturnToService=2
EnforcePartLimits=ALL
KillWait=30
MinJobAge=60
InactiveLimit=0
Waittime=0
SlurmdTimeout=60
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
$storage
$gather
JobCompType=jobcomp/none
NodeName=${NODES[0]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=${NODE_PORTS[0]} CPUs=$CPUS RealMemory=$MEM_MB
NodeName=${NODES[1]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=${NODE_PORTS[1]} CPUs=$CPUS RealMemory=$MEM_MB
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=1-00:00:00 State=UP PreemptMode=OFF
PartitionName=short Nodes=${NODES[0]},${NODES[1]} Default=NO MaxTime=00:10:00 State=UP PreemptMode=OFF
PartitionName=low Nodes=${NODES[0]},${NODES[1]} Default=NO MaxTime=1-00:00:00 State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=30
PartitionName=high Nodes=${NODES[0]},${NODES[1]} Default=NO MaxTime=1-00:00:00 State=UP PriorityTier=2 PreemptMode=OFF
EOF
  mv "$CONF.new" "$CONF"
  chmod 644 "$CONF"
}

memory_cgroups() {  # this machine lets us make memory cgroups (cgroup v1's memory controller, writable)
  local probe="$CGROUP_MEMORY/attnlab-slurm-probe.$$"
  [ -d "$CGROUP_MEMORY" ] && mkdir "$probe" 2>/dev/null || return 1
  rmdir "$probe"
}

write_cgroup_conf() {  # as a strict site: each job held to the memory it asked for (or its node's); 1 when not here
  own_file_or_none "$CGROUP_CONF"
  if ! memory_cgroups; then
    rm -f "$CGROUP_CONF"
    say "no writable cgroup v1 memory controller here: jobs are not held to their memory (task/affinity alone)"
    return 1
  fi
  cat >"$CGROUP_CONF.new" <<EOF
$MARK
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
ConstrainCores=no
ConstrainDevices=no
EOF
  chmod 644 "$CGROUP_CONF.new"
  mv "$CGROUP_CONF.new" "$CGROUP_CONF"
}

write_dbd_conf() {
  own_file_or_none "$DBD_CONF"
  cat >"$DBD_CONF.new" <<EOF
$MARK
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=slurm
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StorageLoc=$DB_NAME
EOF
  chown slurm:slurm "$DBD_CONF.new"
  chmod 600 "$DBD_CONF.new"
  mv "$DBD_CONF.new" "$DBD_CONF"
}

add_hosts_line() {
  grep -qF "$HOSTS_LINE" /etc/hosts && return 0
  say "naming the nodes in /etc/hosts ($HOSTS_LINE)"
  printf '%s\n' "$HOSTS_LINE" >>/etc/hosts
}

remove_hosts_line() {
  grep -qF "$HOSTS_LINE" /etc/hosts || return 0
  local kept
  kept=$(grep -vF "$HOSTS_LINE" /etc/hosts)
  printf '%s\n' "$kept" >/etc/hosts  # rewritten in place: /etc/hosts may be a mount point
  say "removed the nodes' line from /etc/hosts"
}

# ---- daemons

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating the munge key /etc/munge/munge.key"
    install -d -o munge -g munge -m 700 /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
  if munge_works; then
    say "munged runs"
    return 0
  fi
  say "starting munged (user munge)"
  runuser -u munge -- /usr/sbin/munged --force </dev/null >/dev/null 2>&1 9>&- \
    || die 1 "munged did not start: see /var/log/munge/munged.log"
  wait_for 10 munged munge_works || die 1 "munged does not answer: see /var/log/munge/munged.log"
}

db_ping() { mariadb-admin --protocol=socket --socket="$DB_RUN/mysqld.sock" ping >/dev/null 2>&1; }

start_mariadb() {
  install -d -o mysql -g mysql -m 755 "$DB_RUN"
  install -d -o mysql -g adm -m 2750 /var/log/mysql
  if [ ! -d /var/lib/mysql/mysql ]; then
    say "creating the MariaDB data folder /var/lib/mysql"
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql --skip-test-db >/var/log/mysql/install.log 2>&1 \
      || die 1 "mariadb-install-db failed: see /var/log/mysql/install.log"
  fi
  if ! db_ping; then
    say "starting MariaDB (socket only, no network)"
    setsid /usr/sbin/mariadbd --user=mysql --datadir=/var/lib/mysql --skip-networking \
      --socket="$DB_RUN/mysqld.sock" --pid-file="$DB_RUN/mysqld.pid" --log-error=/var/log/mysql/error.log \
      </dev/null >/dev/null 2>&1 9>&- &
    wait_for 60 MariaDB db_ping || die 1 "MariaDB did not start: see /var/log/mysql/error.log"
  fi
  # slurmdbd (user slurm) logs in through the socket as the system user slurm: no password anywhere
  mariadb --protocol=socket --socket="$DB_RUN/mysqld.sock" -u root <<EOF \
    || die 1 "could not create the database user slurm"
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED VIA unix_socket;
CREATE DATABASE IF NOT EXISTS $DB_NAME;
GRANT ALL ON $DB_NAME.* TO 'slurm'@'localhost';
EOF
}

sacctmgr_works() { sacctmgr -n -P show cluster format=cluster; }

start_slurmdbd() {
  install -d -o slurm -g slurm -m 755 "$RUN" "$LOGS"  # its pid file, or stop would not find it
  write_dbd_conf
  say "starting slurmdbd"
  slurmdbd </dev/null >/dev/null 2>&1 9>&- || die 1 "slurmdbd did not start: see $LOGS/slurmdbd.log"
  wait_for 60 slurmdbd sacctmgr_works || die 1 "slurmdbd does not answer: see $LOGS/slurmdbd.log"
  if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
    say "adding the cluster $CLUSTER to the accounting database"
    sacctmgr -i add cluster "$CLUSTER" >/dev/null || die 1 "sacctmgr could not add the cluster $CLUSTER"
  fi
}

nodes_ready() {  # both nodes can run jobs (idle, mixed, allocated, completing)
  local states
  states=$(sinfo -h -N -p debug -o "%N %t" 2>/dev/null | sort -u) || return 1
  local node
  for node in "${NODES[@]}"; do
    echo "$states" | grep -Eq "^$node (idle|mix|alloc|comp)$" || return 1
  done
}

nodes_idle() {
  local states node
  states=$(sinfo -h -N -p debug -o "%N %t" 2>/dev/null | sort -u) || return 1
  for node in "${NODES[@]}"; do
    echo "$states" | grep -Eq "^$node idle$" || return 1
  done
}

# `slurmd -N <node>`'s environment (NAME=value words): the node's own topology where it has one (node_topology)
node_env() {
  local topology="$STATE/topology-$1.xml"
  [ -s "$topology" ] && echo "HWLOC_XMLFILE=$topology HWLOC_THISSYSTEM=1"
  return 0
}

# the first node's view of the machine (hwloc's XML, written by its slurmd as it starts) with its processing units
# in the reverse order: SLURM's CPU i of this node is the machine's CPU (n-1-i)
node_topology() {
  local whole="$STATE/slurmd-${NODES[0]}/hwloc_topo_whole.xml" topology="$STATE/topology-$1.xml"
  rm -f "$topology"
  [ -s "$whole" ] || return 0
  python3 - "$whole" "$topology" <<'PY' || rm -f "$topology"
import re
import sys

pu = re.compile(r'(<object type="PU" os_index=")(\d+)(")')
text = open(sys.argv[1]).read()
order = iter([m[2] for m in pu.finditer(text)][::-1])
open(sys.argv[2], "w").write(pu.sub(lambda m: m[1] + next(order) + m[3], text))
PY
}

start_slurm() {
  install -d -o slurm -g slurm -m 755 "$RUN" "$LOGS" "$STATE" "$STATE/slurmctld"
  local node
  for node in "${NODES[@]}"; do
    install -d -o root -g root -m 755 "$STATE/slurmd-$node"
  done
  say "starting slurmctld"
  slurmctld </dev/null >/dev/null 2>&1 9>&- || die 1 "slurmctld did not start: see $LOGS/slurmctld.log"
  wait_for 30 slurmctld scontrol ping || die 1 "slurmctld does not answer: see $LOGS/slurmctld.log"
  local i
  for i in "${!NODES[@]}"; do
    node=${NODES[$i]}
    say "starting slurmd -N $node"
    # the nodes after the first see the machine's CPUs in the reverse order (a topology of their own, read through
    # hwloc's HWLOC_XMLFILE), so that one task per node lands on another core of this host, as on two machines
    [ "$i" -gt 0 ] && node_topology "$node"
    env $(node_env "$node") slurmd -N "$node" </dev/null >/dev/null 2>&1 9>&- \
      || die 1 "slurmd -N $node did not start: see $LOGS/slurmd-$node.log"
    [ "$i" -gt 0 ] || wait_for 10 "the machine's topology" test -s "$STATE/slurmd-$node/hwloc_topo_whole.xml" || true
  done
  if ! wait_for 10 nodes nodes_idle; then
    # a node drained or down from an earlier run: back to service
    scontrol update NodeName="$(IFS=,; echo "${NODES[*]}")" State=RESUME >/dev/null 2>&1 || true
    wait_for 20 nodes nodes_idle \
      || die 1 "the nodes are not idle: $(sinfo -h -N -o '%N %t %E' | sort -u | tr '\n' ';') see $LOGS/slurmd-*.log"
  fi
}

no_jobs() { [ -z "$(squeue -h -o %A 2>/dev/null)" ]; }

cancel_jobs() {
  local jobs
  jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ') || return 0
  [ -n "${jobs// /}" ] || return 0
  say "cancelling jobs $jobs"
  # shellcheck disable=SC2086
  scancel $jobs 2>/dev/null || true
  wait_for 20 "jobs to end" no_jobs || true
}

stop_all() {
  if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null; then
    cancel_jobs
  fi
  local node pid
  for node in "${NODES[@]}"; do
    stop_pid "$RUN/slurmd-$node.pid" slurmd "slurmd -N $node"
  done
  # the step daemons of jobs that did not end
  for pid in $(grep -lx slurmstepd /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  stop_pid "$RUN/slurmctld.pid" slurmctld slurmctld
  stop_pid "$RUN/slurmdbd.pid" slurmdbd slurmdbd
  stop_pid "$DB_RUN/mysqld.pid" mariadbd MariaDB
  stop_pid /run/munge/munged.pid munged munged
}

# ---- commands

accounting_of() {  # --accounting|--no-accounting|"" -> 1|0
  case "${1:-}" in
    ""|--accounting) echo 1 ;;
    --no-accounting) echo 0 ;;
    *) usage ;;
  esac
}

cmd_install() {
  need_root install
  local accounting
  accounting=$(accounting_of "${1:-}")
  lock
  install_packages "$accounting"
  say "packages installed"
}

cmd_start() {
  need_root start
  local accounting=1 user_signal=0 start arg
  for arg in "$@"; do
    case "$arg" in
      --accounting) accounting=1 ;;
      --no-accounting) accounting=0 ;;
      --user-signal) user_signal=1 ;;
      *) usage ;;
    esac
  done
  if [ "$user_signal" = 1 ]; then  # PreemptParameters=send_user_signal came with SLURM 23.02
    local version
    version=$(slurmctld -V 2>/dev/null | awk '{print $2}')
    [ "$(printf '%s\n23.02\n' "$version" | sort -V | head -n 1)" = 23.02 ] \
      || die 3 "--user-signal needs SLURM 23.02 or later (PreemptParameters=send_user_signal); this is $version"
  fi
  start=$(date +%s.%N)
  lock
  # the daemons, and the jobs they start, at the machine's normal priority whoever starts the cluster: `make test`
  # runs its workers at a lower one, so that the cluster's jobs get their CPUs first, as on nodes of their own
  renice -n 0 -p $$ >/dev/null 2>&1 || true
  install_packages "$accounting"
  id slurm >/dev/null 2>&1 || die 3 "the packages did not create the user slurm"
  own_file_or_none "$CONF"
  stop_all
  add_hosts_line
  start_munge
  write_slurm_conf "$accounting" "$user_signal"
  if [ "$accounting" = 1 ]; then
    start_mariadb
    start_slurmdbd
  fi
  start_slurm
  local took
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  local held=""
  [ -f "$CGROUP_CONF" ] && held=", jobs held to their memory"
  say "up in $took s: cluster $CLUSTER, nodes ${NODES[*]} idle ($CPUS CPUs each, tasks bound to theirs$held)," \
    "partitions debug (default), short, low (preempted by high: $([ "$user_signal" = 1 ] && echo USR1 || echo \
    SIGTERM), 30 s grace);" "accounting $([ "$accounting" = 1 ] && echo on || echo off)"
}

cmd_stop() {
  need_root stop
  lock
  stop_all
  remove_hosts_line
  say "stopped"
}

cmd_status() {
  if ! command -v sinfo >/dev/null 2>&1; then
    say "down: SLURM is not installed"
    exit 1
  fi
  if ! scontrol ping >/dev/null 2>&1; then
    say "down: no slurmctld answers"
    exit 1
  fi
  local storage accounting=off user_signal=off
  storage=$(scontrol show config 2>/dev/null | awk -F' = ' '/^AccountingStorageType/ {print $2}')
  [ "$storage" = accounting_storage/slurmdbd ] && accounting=on
  scontrol show config 2>/dev/null | grep -q '^PreemptParameters *= *send_user_signal' && user_signal=on
  local nodes
  nodes=$(sinfo -h -N -p debug -o "%N %t" 2>/dev/null | sort -u | tr '\n' ',' | sed 's/,$//; s/,/, /g')
  if nodes_ready; then
    say "up: nodes $nodes; accounting $accounting; preemption signal $([ "$user_signal" = on ] && echo USR1 || \
      echo SIGTERM)"
  else
    say "not ready: nodes ${nodes:-none}; accounting $accounting"
    exit 1
  fi
}

case "${1:-}" in
  start) shift; [ $# -le 2 ] || usage; cmd_start "$@" ;;
  stop) [ $# = 1 ] || usage; cmd_stop ;;
  status) [ $# = 1 ] || usage; cmd_status ;;
  install) shift; [ $# -le 1 ] || usage; cmd_install "$@" ;;
  *) usage ;;
esac
