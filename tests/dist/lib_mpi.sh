# Helpers for the multi-process tests (POSIX sh), sourced after tests/cli/lib.sh by
# tests/dist/test_*.sh: the launcher, a skip when it is absent, and a run on N ranks.
#
# Environment: KILN_MPIRUN, the mpirun of the MPI kiln links (empty: none). A script whose
# comparisons need numpy sets MPI_NEEDS_NUMPY=1 before sourcing this file.

MPIRUN=${KILN_MPIRUN:-}

# need_mpi: skip (77), saying why, without mpirun (or numpy when asked); the cli fixture.
need_mpi() {
    if [ -z "$MPIRUN" ] || ! command -v "$MPIRUN" >/dev/null 2>&1; then
        echo "SKIP: no mpirun (apt-get install openmpi-bin libopenmpi-dev, then reconfigure)"
        exit 77
    fi
    if [ "${MPI_NEEDS_NUMPY:-0}" = 1 ] && ! /usr/bin/python3 -c "import numpy" 2>/dev/null; then
        echo "SKIP: the comparison needs numpy (apt-get install python3-numpy)"
        exit 77
    fi
    need_fixture
}

MPIFLAGS=""
if [ -n "$MPIRUN" ] && "$MPIRUN" --version 2>/dev/null | grep -Eq "Open MPI|OpenRTE"; then
    # as root, and more ranks than cores
    MPIFLAGS="--oversubscribe --allow-run-as-root"
fi

# mpi NP ARGS...: kiln ARGS on NP ranks; status in RC, output in $W/stdout and $W/stderr.
mpi() {
    _np=$1
    shift
    LAST="mpirun -np $_np kiln $*"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$MPIRUN" $MPIFLAGS -np "$_np" "$KILN" "$@" \
        </dev/null >"$W/stdout" 2>"$W/stderr"
    RC=$?
    printf '[exit %s]\n' "$RC" >>"$W/log"
    cat "$W/stderr" >>"$W/log"
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then
        bad "mpirun -np $_np kiln finished within $CMD_TIMEOUT s (it hung)"
    fi
}
