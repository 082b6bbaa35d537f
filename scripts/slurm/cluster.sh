#!/usr/bin/env bash
# A throwaway Slurm cluster on this host, for tests and `scripts/demo.sh --slurm` (docs/SPEC.md §13).
#
# Usage: scripts/slurm/cluster.sh start DIR [--nodes N]   (N = 1 or 2, default 1)
#        scripts/slurm/cluster.sh stop DIR
#        scripts/slurm/cluster.sh env DIR                  (prints `export SLURM_CONF=…`)
#
# `start` writes everything under DIR (a munge key and socket of its own, slurm.conf, spool and
# state directories, logs), then starts munged, slurmctld and one slurmd per node in a pid
# namespace of their own (`unshare --pid --fork --mount-proc`), so that a stray signal reaches
# only the cluster and `stop` is one SIGTERM to that namespace's PID 1 (SIGKILL after 10 s). It
# returns once every node is idle (deadline 60 s; on failure it prints the logs' tails and stops
# what it started). Nothing is read from or written to /etc/slurm or /etc/munge: clients find the
# cluster through SLURM_CONF=DIR/slurm.conf. Needs root and Debian's munge, slurmctld, slurmd and
# slurm-client (scripts/install-deps.sh installs them).
#
# The configuration suits a host like CI's (hybrid cgroups, no systemd as PID 1):
# ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, and jobcomp/filetxt for a finished
# job's state (there is no slurmdbd, so no sacct). Nodes are n1 (and n2), each a slurmd on
# 127.0.0.1 with a port of its own; the partition `main` holds them all.
set -euo pipefail

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

[ $# -ge 2 ] || die "usage: cluster.sh start|stop|env DIR [--nodes N]"
cmd=$1
dir=$2
shift 2
nodes=1
while [ $# -gt 0 ]; do
    case "$1" in
        --nodes)
            nodes=${2:-}
            shift 2
            ;;
        *) die "unknown argument '$1'" ;;
    esac
done
case "$nodes" in 1 | 2) ;; *) die "--nodes must be 1 or 2 (got '$nodes')" ;; esac

# A TCP port nobody uses now, below the kernel's ephemeral range (ip_local_port_range): a port
# the kernel picked there is free only until an outgoing connection takes it, and tests that
# flood a listener with connections cycle through the whole range (slurmctld then failed to
# bind: "Address already in use"). A race with another starter is possible but unlikely, and
# slurmctld then fails to bind, which `start` reports.
free_port() {
    python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(1000):
    port = random.randrange(10000, max(low, 10001))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port below the ephemeral range")
'
}

logs_tail() {
    local f
    for f in "$dir"/log/*.log; do
        [ -f "$f" ] || continue
        echo "--- $f" >&2
        tail -n 15 "$f" >&2
    done
}

stop_cluster() {
    local pid_file=$dir/ns.pid pid i
    [ -f "$pid_file" ] || return 0
    pid=$(cat "$pid_file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
}

case "$cmd" in
    env)
        echo "export SLURM_CONF=$dir/slurm.conf"
        exit 0
        ;;
    stop)
        stop_cluster
        exit 0
        ;;
    start) ;;
    *) die "unknown command '$cmd' (start, stop, env)" ;;
esac

[ "$(id -u)" = 0 ] || die "start needs root"
for prog in munged slurmctld slurmd sinfo; do
    command -v "$prog" >/dev/null || die "$prog is missing (scripts/install-deps.sh installs Slurm and munge)"
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
[ ! -f "$dir/ns.pid" ] || die "a cluster already runs from $dir (cluster.sh stop $dir)"
mkdir -p "$dir/munge" "$dir/log" "$dir/ctld" "$dir/spool"
chmod 0711 "$dir/munge" # munged refuses a socket directory that others cannot search
for n in $(seq 1 "$nodes"); do mkdir -p "$dir/spool/n$n"; done

# A key of this cluster's own (1 KiB of random bytes; munged wants 0400/0600, owned by its user).
key=$dir/munge/munge.key
[ -f "$key" ] || head -c 1024 /dev/urandom >"$key"
chmod 0600 "$key"

host=$(hostname)
ctld_port=$(free_port)
conf=$dir/slurm.conf
{
    echo "# Written by scripts/slurm/cluster.sh; a throwaway cluster."
    echo "ClusterName=smithfs"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$ctld_port"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$dir/munge/munge.socket"
    echo "StateSaveLocation=$dir/ctld"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SwitchType=switch/none"
    echo "MpiDefault=none"
    echo "MailProg=/bin/true"
    echo "ReturnToService=2"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=$dir/log/jobcomp.txt"
    echo "MinJobAge=300"
    echo "KillWait=2"
    echo "SlurmdTimeout=30"
    echo "InactiveLimit=0"
    for n in $(seq 1 "$nodes"); do
        echo "NodeName=n$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$(free_port) CPUs=$(nproc) State=UNKNOWN"
    done
    echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} >"$conf"

# The supervisor: PID 1 of the new pid namespace. When it gets SIGTERM it exits, and the kernel
# kills every other process of the namespace with it.
supervisor=$dir/supervisor.sh
cat >"$supervisor" <<EOF
#!/usr/bin/env bash
trap 'exit 0' TERM INT
export SLURM_CONF=$conf
munged -F --force --key-file=$key --socket=$dir/munge/munge.socket \\
    --pid-file=$dir/munge/munged.pid --log-file=$dir/log/munged.log \\
    --seed-file=$dir/munge/munge.seed &
for i in \$(seq 1 100); do [ -S $dir/munge/munge.socket ] && break; sleep 0.05; done
slurmctld -D -f $conf &
for n in \$(seq 1 $nodes); do slurmd -D -f $conf -N n\$n & done
while :; do sleep 3600 & wait \$!; done
EOF
chmod 0755 "$supervisor"

setsid unshare --pid --fork --mount-proc --propagation private "$supervisor" \
    </dev/null >"$dir/log/supervisor.log" 2>&1 &
# `unshare --fork` waits for its child; its pid is what we signal (it passes SIGTERM on... it does
# not), so record the namespace's PID 1 instead: the supervisor, unshare's only child.
unshare_pid=$!
ns_pid=""
for i in $(seq 1 100); do
    ns_pid=$(pgrep -P "$unshare_pid" -f "$supervisor" || true)
    [ -n "$ns_pid" ] && break
    sleep 0.05
done
[ -n "$ns_pid" ] || {
    kill -KILL "$unshare_pid" 2>/dev/null || true
    die "the supervisor did not start (log: $dir/log/supervisor.log)"
}
echo "$ns_pid" >"$dir/ns.pid"

export SLURM_CONF=$conf
deadline=$((SECONDS + 60))
while :; do
    # sinfo fails (after its own ~10 s of retries) while slurmctld is not answering yet, as on a
    # loaded host where several clusters start at once: that is "not up yet", not the end of
    # this script (under `set -e` and `pipefail` it was, silently).
    idle=$({ sinfo -h -N -o '%N %t' 2>/dev/null || true; } | awk '$2 == "idle"' | wc -l)
    [ "$idle" -ge "$nodes" ] && break
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$ns_pid" 2>/dev/null; then
        echo "cluster.sh: the cluster did not come up within 60 s; logs:" >&2
        logs_tail
        stop_cluster
        exit 1
    fi
    sleep 0.2
done
echo "export SLURM_CONF=$conf"
