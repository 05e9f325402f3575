#!/bin/bash
# kiln's preemption under a real Slurm on this one machine. It installs Debian's slurm-wlm and
# munge when they are missing, starts munged, slurmctld and slurmd under a temporary
# slurm.conf (own ports, key, socket, state and logs under a temporary folder; nothing written
# into /etc), with two partitions on this node: "low" (PriorityTier=1, preemptible with a
# GraceTime, PreemptMode=REQUEUE) and "high" (PriorityTier=2). Then it trains one small model
# three ways:
#   (a) kiln train straight through;
#   (b) a --requeue job in "low" made from scripts/slurm/train_one_node.sbatch, i.e. kiln run
#       -- srun kiln train --checkpoint-dir D --checkpoint-every K;
#   (c) once (b) has written a checkpoint, a job in "high" that takes the whole node: Slurm
#       preempts (b) (SIGTERM to its tasks, GraceTime before SIGKILL), kiln train writes the
#       checkpoint of its last step and exits 3, the job is requeued; when (c) ends, (b) starts
#       again, resumes from D and goes on;
#   (d) then the time-limit path of the template: SIGUSR1 to the batch shell only (what
#       --signal=B:USR1@120 sends; here scancel --batch), passed on by the script, kiln run
#       and srun; kiln train stops again, the script requeues the job, the third start resumes
#       and finishes.
# It checks from Slurm's records (scontrol show job's Restarts, slurmctld's log, the job's
# output) that (b) was preempted with a grace time, got SIGTERM and was requeued, that each
# start resumed from the step the previous one stopped at, and that its final weights equal
# (a)'s byte for byte. It prints the timeline and the time from each signal to the written
# checkpoint. Everything it started is stopped at the end, whatever happens; the packages'
# own scripts start no daemon (a temporary /usr/sbin/policy-rc.d while they install, when
# the machine has none).
#
# Exit: 0 passed, 1 failed (logs printed), 77 skipped (no root, no apt-get, the packages
# cannot be installed, or the daemons cannot run here; the reason is printed).
#
# Environment: KILN_BIN (the kiln binary; required), KILN_SOURCE_DIR (the source tree),
# KILN_SLURM_TIMEOUT (seconds the whole test may take once the packages are in; default 240),
# KILN_SLURM_KEEP=1 (keep the temporary folder; it is kept anyway when a check fails).
set -uo pipefail

KILN=${KILN_BIN:?"set KILN_BIN to the kiln binary"}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=${KILN_SOURCE_DIR:-$(cd "$HERE/../.." && pwd)}
TEMPLATE=$SRC/scripts/slurm/train_one_node.sbatch
LIMIT=${KILN_SLURM_TIMEOUT:-240}
case "$KILN" in
/*) ;;
*) KILN=$(pwd)/$KILN ;;
esac

# shellcheck source=../cli/lib.sh
. "$SRC/tests/cli/lib.sh" # make_text (its check helpers are replaced below)

T0=$(date +%s.%N)
T=""
failures=0
checks=0
TIMELINE=""

say() { printf '%s\n' "$*"; }
skip() {
    say "SKIP: the Slurm preemption test cannot run here because $*"
    exit 77
}
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%6.1f", b - a }'; }
# mark EVENT: one line of the timeline, seconds since the test started.
mark() {
    local line
    line="$(elapsed) s  $*"
    TIMELINE+="$line"$'\n'
    say "[timeline] $line"
}
ok() {
    checks=$((checks + 1))
    say "ok   $1"
}
bad() {
    checks=$((checks + 1))
    failures=$((failures + 1))
    say "FAIL $1"
}
check() { # check WHAT COMMAND...
    local what=$1
    shift
    if "$@"; then ok "$what"; else bad "$what"; fi
}

# ---- packages ----

have_slurm() {
    local b
    for b in munged slurmctld slurmd sbatch scontrol squeue scancel; do
        command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || return 1
    done
}

# install_packages: slurm-wlm and munge from Debian, with no daemon started by the packages'
# scripts (a temporary policy-rc.d when the machine has none).
install_packages() {
    local policy=/usr/sbin/policy-rc.d made_policy=0 rc
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
        # shellcheck disable=SC2064  # the path is fixed now
        trap "rm -f '$policy'; exit 1" INT TERM HUP
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends slurm-wlm munge >"$1" 2>&1 ||
        { apt-get update >>"$1" 2>&1 &&
            apt-get install -y --no-install-recommends slurm-wlm munge >>"$1" 2>&1; }
    rc=$?
    if [ "$made_policy" -eq 1 ]; then
        rm -f "$policy"
        trap - INT TERM HUP
    fi
    return $rc
}

[ "$(uname -s)" = Linux ] || skip "it needs Linux (this is $(uname -s))"
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root and this is uid $(id -u)"
[ -x "$KILN" ] || {
    say "KILN_BIN=$KILN is not an executable"
    exit 1
}
export PATH=$PATH:/usr/sbin:/sbin
if ! have_slurm; then
    command -v apt-get >/dev/null 2>&1 || skip "slurm-wlm and munge are missing and there is no apt-get"
    say "installing slurm-wlm and munge with apt-get"
    aptlog=$(mktemp)
    if ! install_packages "$aptlog"; then
        tail -n 15 "$aptlog"
        rm -f "$aptlog"
        skip "apt-get could not install slurm-wlm and munge (its output is above)"
    fi
    rm -f "$aptlog"
    have_slurm || skip "slurm-wlm and munge were installed but their programs are not on the PATH"
    say "slurm-wlm and munge installed in $(elapsed) s"
fi
T0=$(date +%s.%N) # the time limit and the timeline start once the packages are in
DEADLINE=$(($(date +%s) + LIMIT))

# ---- temporary folder, ports, teardown ----

T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-slurm.XXXXXX") || exit 1
chmod 700 "$T"
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log" "$T/run" "$T/jobs"
CONF=$T/slurm.conf
export SLURM_CONF=$CONF
PIDS=()  # daemons and background commands, stopped at the end in reverse order
KEEP=${KILN_SLURM_KEEP:-0} # 1: keep the temporary folder (it is kept anyway on failure)

# pids_of_our_jobs: processes Slurm started for this test's jobs (slurmstepd, the job's
# shell and its children): their environment names this test's slurm.conf.
pids_of_our_jobs() {
    local e p
    for e in /proc/[0-9]*/environ; do
        p=${e#/proc/}
        p=${p%/environ}
        [ "$p" = "$$" ] && continue
        if { tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qxF "SLURM_CONF=$CONF"; then
            echo "$p"
        fi
    done
}

teardown() {
    local rc=$? p i
    trap - EXIT INT TERM
    if [ -n "$T" ] && [ -f "$CONF" ] && [ -n "$(cat "$T/run/slurmctld.pid" 2>/dev/null)" ]; then
        timeout 5 scancel --quiet --user=root >/dev/null 2>&1
    fi
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill -TERM "${PIDS[i]}" 2>/dev/null
    done
    for _ in $(seq 50); do
        alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    if [ -n "$T" ]; then
        # slurmstepd detaches from slurmd: whatever is left of the jobs is found by its
        # environment
        for p in $(pids_of_our_jobs); do kill -KILL "$p" 2>/dev/null; done
        if [ "$KEEP" -eq 1 ]; then
            say "the test's files are kept in $T"
        else
            rm -rf "$T"
        fi
    fi
    exit "$rc"
}
trap teardown EXIT
trap 'exit 1' INT TERM HUP

dump_logs() {
    local f
    KEEP=1
    say "---- logs"
    for f in "$T"/log/munged.log "$T"/log/slurmctld.log "$T"/log/slurmd.log "$T"/jobs/*.out \
        "$T"/a.log; do
        [ -f "$f" ] || continue
        say "---- $f (last 40 lines)"
        tail -n 40 "$f"
    done
    say "---- squeue"
    timeout 5 squeue -a 2>&1
}

fail_now() {
    bad "$*"
    say "---- timeline"
    printf '%s' "$TIMELINE"
    dump_logs
    exit 1
}

# wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.2 s until it succeeds; fail (with the
# logs) after SECONDS or at the test's deadline.
wait_for() {
    local limit=$(($(date +%s) + $1)) what=$2
    shift 2
    [ $limit -gt "$DEADLINE" ] && limit=$DEADLINE
    while ! "$@"; do
        [ "$(date +%s)" -ge $limit ] && fail_now "timed out waiting for: $what"
        sleep 0.2
    done
}

# port_free PORT: nothing on this machine listens on PORT (TCP, IPv4 or IPv6).
port_free() {
    local hex
    hex=$(printf ':%04X ' "$1")
    ! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" { print $2 " " }' |
        grep -qF "$hex"
}
pick_port() {
    local p i
    for i in $(seq 100); do
        p=$((20000 + (RANDOM % 20000)))
        if port_free "$p" && port_free $((p + 1)); then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# ---- the data and the run straight through, (a) ----

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
make_text "$T/in"
"$KILN" prepare --tokenizer bytes --out "$T/data" "$T/in" >"$T/prepare.log" 2>&1 ||
    fail_now "kiln prepare made the data ($(tail -n 3 "$T/prepare.log"))"
# About 0.2 s a step on one core: the job runs long enough to be preempted in the middle.
STEPS=60
EVERY=10
FLAGS=(--layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 --batch 128
    --threads 1 --data "$T/data/train_000.bin" --steps "$STEPS")
# (a) runs next to the daemons' start and job (b): each has a core of its own
"$KILN" train "${FLAGS[@]}" --save "$T/a.safetensors" >"$T/a.log" 2>&1 &
A_PID=$!
PIDS+=("$A_PID")
mark "(a) kiln train straight through started ($STEPS steps)"

# ---- munged, slurmctld, slurmd ----

HOST=$(hostname -s 2>/dev/null || uname -n)
HOST=${HOST%%.*}
[ -n "$HOST" ] || skip "this machine has no host name"
NODE_LINE=$(slurmd -C 2>/dev/null | head -n 1)
CPUS=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")
MEM=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")
{ [ -n "$CPUS" ] && [ -n "$MEM" ]; } || skip "slurmd -C does not describe this machine ('$NODE_LINE')"
PORT=$(pick_port) || skip "no two free TCP ports were found between 20000 and 40000"

dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge/munge.key"
MUNGE_SOCKET=$T/munge/munge.socket
munged --foreground --force --key-file="$T/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$T/munge/munged.pid" --seed-file="$T/munge/munged.seed" \
    --log-file="$T/log/munged.log" >"$T/log/munged.out" 2>&1 &
PIDS+=($!)

cat >"$CONF" <<EOF
ClusterName=kilntest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also the wait before a requeued job may start again (120 s by default)
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
SlurmctldDebug=debug
SlurmdDebug=info
PlugStackConfig=$T/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$T/log/jobcomp.txt
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# a pending job whose begin time has come is started within a second or two
SchedulerParameters=sched_interval=1,bf_interval=1
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=5
InactiveLimit=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=low Nodes=$HOST Default=YES PriorityTier=1 GraceTime=20 PreemptMode=REQUEUE MaxTime=INFINITE State=UP
PartitionName=high Nodes=$HOST PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
: >"$T/plugstack.conf"

munge_up() { [ -S "$MUNGE_SOCKET" ] && munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; }
for _ in $(seq 50); do
    munge_up && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.1
done
munge_up || { tail -n 5 "$T/log/munged.out" "$T/log/munged.log" 2>/dev/null; skip "munged does not start here (its log is above)"; }
mark "munged up (socket $MUNGE_SOCKET)"

slurmctld -D -i -f "$CONF" >"$T/log/slurmctld.out" 2>&1 &
PIDS+=($!)
CTLD=$!
slurmd -D -f "$CONF" -N "$HOST" >"$T/log/slurmd.out" 2>&1 &
PIDS+=($!)
SLURMD=$!

node_idle() {
    kill -0 "$CTLD" 2>/dev/null && kill -0 "$SLURMD" 2>/dev/null || return 2
    timeout 5 scontrol show node "$HOST" 2>/dev/null | grep -q 'State=IDLE'
}
started=0
for _ in $(seq 150); do
    node_idle
    s=$?
    [ $s -eq 0 ] && started=1 && break
    [ $s -eq 2 ] && break
    sleep 0.2
done
if [ $started -eq 0 ]; then
    for f in slurmctld.out slurmctld.log slurmd.out slurmd.log; do
        [ -f "$T/log/$f" ] && say "---- $f" && tail -n 15 "$T/log/$f"
    done
    skip "slurmctld and slurmd do not bring the node up here (their logs are above)"
fi
mark "slurmctld and slurmd up: node $HOST idle ($CPUS CPUs, ports $PORT-$((PORT + 1)))"

# ---- (b), the low-priority job, and (c), the high-priority one ----

job_field() { # job_field JOB FIELD: one field of scontrol show job
    timeout 5 scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}
job_state() { job_field "$1" JobState; }
job_is() { # job_is JOB STATE...: the job is in one of the STATEs
    local s j=$1
    s=$(job_state "$j")
    shift
    case " $* " in *" $s "*) [ -n "$s" ] ;; *) return 1 ;; esac
}
a_done() { ! kill -0 "$A_PID" 2>/dev/null; }

B_DIR=$T/b
mkdir -p "$B_DIR"
B_OUT=$T/jobs/low.out
B=$(cd "$T" && timeout 20 sbatch --parsable --partition=low --cpus-per-task=1 --requeue \
    --output="$B_OUT" --open-mode=append --job-name=kiln-low \
    --export="ALL,KILN=$KILN,CKPT=$B_DIR/checkpoints" "$TEMPLATE" "${FLAGS[@]}" --checkpoint-every "$EVERY" 2>"$T/log/sbatch_b.err")
[ -n "$B" ] || fail_now "sbatch took the low job ($(cat "$T/log/sbatch_b.err"))"
mark "(b) job $B submitted to partition low"
wait_for 30 "job $B running" job_is "$B" RUNNING
mark "(b) job $B running"

# the first checkpoint written: the job has made progress worth keeping
wait_for 60 "job $B's first checkpoint" test -f "$B_DIR/checkpoints/latest"
first_ckpt=$(cat "$B_DIR/checkpoints/latest")
mark "(b) wrote its first checkpoint, $first_ckpt"

# shellcheck disable=SC2016  # the job's shell expands the --wrap command
C=$(cd "$T" && timeout 20 sbatch --parsable --partition=high --exclusive --job-name=kiln-high \
    --output="$T/jobs/high.out" --wrap 'echo "high job on $(hostname) at $(date +%T.%N)"; sleep 3' \
    2>"$T/log/sbatch_c.err")
[ -n "$C" ] || fail_now "sbatch took the high job ($(cat "$T/log/sbatch_c.err"))"
mark "(c) job $C submitted to partition high with --exclusive"

preempted() { # requeued by Slurm, or on its way there
    case "$(job_state "$B")" in
    PENDING | REQUEUED | REQUEUE_FED | REQUEUE_HOLD | COMPLETING) return 0 ;;
    esac
    [ "$(job_field "$B" Restarts)" -ge 1 ] 2>/dev/null
}
wait_for 30 "job $B preempted" preempted
mark "(b) job $B left RUNNING: $(job_state "$B")"
wait_for 40 "job $C running" job_is "$C" RUNNING COMPLETED
mark "(c) job $C running on the whole node"
wait_for 30 "job $C completed" job_is "$C" COMPLETED
mark "(c) job $C completed"
restarted() { # restarted N: job B started again after its Nth requeue (or already finished)
    local s
    s=$(job_state "$B")
    [ "$(job_field "$B" Restarts)" -ge "$1" ] 2>/dev/null && { [ "$s" = RUNNING ] || [ "$s" = COMPLETED ]; }
}
wait_for 60 "job $B running again" restarted 1
mark "(b) job $B running again (Restarts=$(job_field "$B" Restarts))"

# The time-limit path of the template: Slurm sends --signal=B:USR1 to the batch shell only,
# which passes it on through kiln run and srun to kiln train. scancel --batch sends the same.
ckpt_step() { sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' "$B_DIR/checkpoints/latest" 2>/dev/null; }
first_stop=$(ckpt_step)
past_first_stop() { [ "$(ckpt_step)" -gt "${first_stop:-0}" ] 2>/dev/null; }
wait_for 60 "job $B's checkpoint after step $first_stop" past_first_stop
mark "(b) wrote the checkpoint $(cat "$B_DIR/checkpoints/latest") after resuming"
if [ "$(job_state "$B")" = RUNNING ]; then
    timeout 10 scancel --batch --signal=USR1 "$B"
    mark "SIGUSR1 sent to job $B's batch shell (scancel --batch), as --signal=B:USR1@120 does"
    wait_for 60 "job $B running a third time" restarted 2
    mark "(b) job $B running again (Restarts=$(job_field "$B" Restarts))"
else
    bad "job $B was still running when its third start was to be tested"
fi
wait_for 90 "job $B completed" job_is "$B" COMPLETED FAILED CANCELLED TIMEOUT
mark "(b) job $B $(job_state "$B")"
wait_for 90 "(a) finished" a_done
wait "$A_PID"
A_RC=$?
mark "(a) finished (exit $A_RC)"

# ---- checks ----

say "---- job $B's output (steps left out)"
grep -v '^step ' "$B_OUT"
say "---- scontrol show job $B"
timeout 5 scontrol show job "$B"
say "---- slurmctld on jobs $B and $C"
grep -E "JobId=($B|$C)([^0-9]|$)" "$T/log/slurmctld.log" |
    awk '!/debug/ || /preemption grace time/' | head -n 30

check "(a) ran straight through (exit 0)" test "$A_RC" -eq 0
check "job $B completed" test "$(job_state "$B")" = COMPLETED
restarts=$(job_field "$B" Restarts)
check "Slurm requeued job $B twice and started it again each time (Restarts=$restarts)" \
    test "${restarts:-0}" -eq 2
check "slurmctld preempted job $B for job $C, with a grace time" \
    grep -qE "preemption grace time for JobId=$B to reclaim resources for JobId=$C" "$T/log/slurmctld.log"
check "slurmctld sent job $B SIGTERM" grep -qE "job_signal: 15 of running JobId=$B " "$T/log/slurmctld.log"

# stopped NTH: the step at which kiln train stopped the NTH time ("" when it did not)
stopped() {
    grep -E 'preempted: the checkpoint of step [0-9]+ is in .*, [0-9]+ ms after the signal; exit 3' "$B_OUT" |
        sed -n "$1s/.*the checkpoint of step \([0-9]*\) is in.*/\1/p"
}
stop1=$(stopped 1)
stop2=$(stopped 2)
stop_ms=$(grep -E 'preempted: the checkpoint of step' "$B_OUT" | sed -n '1s/.* \([0-9]*\) ms after the signal.*/\1/p')
usr1_ms=$(grep -E 'preempted: the checkpoint of step' "$B_OUT" | sed -n '2s/.* \([0-9]*\) ms after the signal.*/\1/p')
check "preempted, kiln train got SIGTERM from Slurm, wrote its checkpoint and exited 3" \
    grep -q 'stopping after step [0-9]*: Terminated' "$B_OUT"
check "it stopped in the middle of the run (step ${stop1:-?} of $STEPS)" \
    test "${stop1:-0}" -gt 0 -a "${stop1:-$STEPS}" -lt "$STEPS"
check "the second start resumed from that step's checkpoint" \
    grep -qE "resumed from .*/step_0*${stop1:-x}: step ${stop1:-x} of $STEPS" "$B_OUT"
check "the batch shell passed SIGUSR1 on" grep -q 'the batch script got SIGUSR1' "$B_OUT"
check "kiln train got it, wrote its checkpoint (step ${stop2:-?}) and exited 3" \
    grep -q 'stopping after step [0-9]*: User defined signal 1' "$B_OUT"
check "the third start resumed from that checkpoint" \
    grep -qE "resumed from .*/step_0*${stop2:-x}: step ${stop2:-x} of $STEPS" "$B_OUT"
check "job $B saved its final weights" test -s "$B_DIR/model.safetensors"
check "its final weights equal (a)'s, byte for byte" \
    cmp -s "$B_DIR/model.safetensors" "$T/a.safetensors"

say "---- timeline (seconds after the packages were in)"
printf '%s' "$TIMELINE"
say "preempted by Slurm (SIGTERM to the job's tasks): kiln train stopped after step ${stop1:-?}, its checkpoint written ${stop_ms:-?} ms after the signal"
say "SIGUSR1 through the batch shell, kiln run and srun: stopped after step ${stop2:-?}, checkpoint written ${usr1_ms:-?} ms after the signal"
if [ "$failures" -gt 0 ]; then
    say "$failures of $checks checks failed"
    dump_logs
    exit 1
fi
say "all $checks checks passed"
exit 0
