#!/bin/sh
# Run a kiln test program under mpirun:  run_mpi.sh NP EXPECT PROGRAM [ARGS...]
#   EXPECT ok         every rank passes: mpirun's status is the test's (77 when skipped)
#   EXPECT dead:CODE  rank 1 dies on purpose: mpirun must end within 30 s, non-zero; with
#                     Open MPI its status is CODE (the dead rank's exit code, 128 + the
#                     signal, or MPI_Abort's code), mpirun names rank 1 and how it ended, and
#                     the survivors never return from their allreduce
# $KILN_MPIRUN names the mpirun (tests.cmake finds it); unset or empty: skipped (77).
set -u
np=$1 expect=$2
shift 2
if [ -z "${KILN_MPIRUN:-}" ] || ! command -v "$KILN_MPIRUN" >/dev/null 2>&1; then
  echo "SKIP: no mpirun (apt-get install openmpi-bin libopenmpi-dev, then reconfigure)"
  exit 77
fi
flags=""
openmpi=0
if "$KILN_MPIRUN" --version 2>/dev/null | grep -Eq "Open MPI|OpenRTE"; then
  openmpi=1
  # Open MPI refuses to start as root without --allow-run-as-root, and more ranks than
  # cores without --oversubscribe; --tag-output prefixes each line with [job,rank].
  flags="--oversubscribe --allow-run-as-root --tag-output"
fi
log=$(mktemp "${TMPDIR:-/tmp}/kiln_mpirun_XXXXXX")
start=$(date +%s)
timeout -k 5 60 "$KILN_MPIRUN" $flags -np "$np" "$@" >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
cat "$log"
echo "run_mpi.sh: mpirun -np $np $*: status $rc after ${elapsed} s"

fail() {
  echo "run_mpi.sh: FAIL: $*"
  rm -f "$log"
  exit 1
}
case $expect in
ok)
  rm -f "$log"
  [ $rc -ne 124 ] || fail "mpirun was still running after 60 s"
  exit $rc
  ;;
dead:*)
  code=${expect#dead:}
  [ $rc -ne 124 ] || fail "mpirun was still running after 60 s: a dead rank hangs the others"
  [ $rc -ne 0 ] || fail "mpirun exited 0 although rank 1 died"
  [ $elapsed -le 30 ] || fail "mpirun took ${elapsed} s to end after rank 1 died"
  if [ $openmpi = 1 ]; then
    [ "$rc" -eq "$code" ] || fail "Open MPI's mpirun should exit $code, the dead rank's status"
    grep -q "waiting in an allreduce" "$log" || fail "no rank was waiting in the allreduce"
    grep -q "allreduce returned" "$log" && fail "a survivor returned from its allreduce"
    if grep -q "kiln: rank 1 of $np:" "$log"; then
      : # kiln_comm_abort: mpirun prints its MPI_ABORT banner only when it wins a race
    elif [ "$code" -gt 128 ]; then
      grep -q "rank 1 .*exited on signal $((code - 128))" "$log" || fail "no word of rank 1's signal"
    else
      grep -Eq "Exit code: +$code" "$log" || fail "no word of rank 1's exit code"
    fi
  fi
  rm -f "$log"
  echo "run_mpi.sh: ok: the job ended, status $rc"
  exit 0
  ;;
*)
  fail "unknown expectation $expect"
  ;;
esac
