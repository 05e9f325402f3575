#!/bin/sh
# A real network, simulated: N "hosts" (network namespaces) on one switch (a bridge), each
# host's link shaped to RATE, and Open MPI ranks run one per host over TCP.
#
#   netsim.sh up N RATE           make hosts kiln0..kiln{N-1} (N = 2..8), RATE as tc
#                                 takes it (10gbit, 1gbit, 100mbit) or "none" (unshaped)
#   netsim.sh down                remove every host and the switch (safe to repeat)
#   netsim.sh status              what is up, and the shapers' counters
#   netsim.sh run N -- CMD...     mpirun with rank r's CMD inside host kiln<r> (the network
#                                 must be up); mpirun's status is the script's
#   netsim.sh with N RATE -- CMD... up, run, down: the network is removed however CMD ends
#                                 (EXIT, INT, TERM and HUP are trapped)
#   netsim.sh mpirun-args         print the environment and mpirun flags `run` uses
#
# $NETSIM_MPIRUN_EXTRA: more mpirun flags for `run` and `with` (split on spaces), e.g.
# "--mca mpi_yield_when_idle 1" (bench/bench_net.py passes its own this way).
# $NETSIM_RANKS_PER_HOST=K (default 1): K consecutive ranks in each host, N x K in all; they
# share the host's one shaped link, and kiln groups them as one machine
# (KILN_COMM_NODE_RANKS=K: its collectives through their shared memory inside the host, MPI
# between hosts) unless KILN_COMM_SHM=0 is set.
#
# Topology: a bridge "kilnbr" in the root namespace holds 10.77.0.254/24; host r is the
# namespace "kiln<r>" whose interface "kv0" (10.77.0.<r+1>/24) is one end of a veth pair,
# the other end "kilnh<r>" a port of the bridge. Every path between two hosts crosses two
# shapers, as it would cross two links of a switched network: the sender's uplink (tbf on
# kv0, the host's egress) and the receiver's downlink (tbf on kilnh<r>, the switch port's
# egress). A host therefore sends at RATE and receives at RATE at the same time (full
# duplex), which is what ring collectives use.
#
# The shaper: tbf rate RATE, burst = RATE x 1 ms (at least 64 KiB: veth hands tbf GSO
# packets of up to 64 KiB, and a packet larger than the burst is cut into MTU segments first,
# which costs CPU), queue limit = 8 MiB + the burst. At 10 Gbit/s that is a 1.25 MB burst,
# at 1 Gbit/s 125 KB. The queue holds what one TCP socket may leave in the qdisc
# (tcp_limit_output_bytes, 4 MiB on this kernel) twice over: with a queue of RATE x 5 ms
# the shaper dropped whole 64 KiB GSO packets, and the retransmissions made messages of
# 128 KiB to 4 MiB up to 2.6 times too slow and erratic (see docs/network.md). The burst lets up to 1 ms of traffic leave at memory speed after an
# idle millisecond: small messages are not slowed to the link's serialisation time (4 KB
# takes 3.3 us at 10 Gbit/s; a trip through veth costs more than that).
#
# Open MPI: the MPI library inside the ranks must never use shared memory (vader) or UCX
# (which would pick shared memory too): pml ob1 with the TCP BTL only, on 10.77.0.0/24. The
# out-of-band channel and PMIx (the ranks' connection to mpirun, which stays in the root
# namespace) reach mpirun over the bridge's 10.77.0.254: PMIx's server listens on loopback
# unless told otherwise (PMIX_MCA_ptl_tcp_if_include), and a rank in another namespace has
# its own loopback, so without it MPI_Init fails with "OPAL ERROR: Unreachable".
set -eu

PREFIX=kiln
BRIDGE=kilnbr
SUBNET=10.77.0
STATE=/run/kiln-netsim

die() {
    echo "netsim.sh: $*" >&2
    exit 2
}

usage() {
    sed -n '4,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

need_tools() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, veth, tc)"
    for t in ip tc; do
        command -v "$t" >/dev/null 2>&1 || die "'$t' is missing (apt-get install iproute2)"
    done
}

check_n() {
    case $1 in
    [2-8]) ;;
    *) die "N must be 2..8, not '$1'" ;;
    esac
}

# rate_bytes RATE: bytes per second of a tc rate (10gbit, 1gbit, 100mbit, 500kbit).
rate_bytes() {
    awk -v r="$1" 'BEGIN {
        n = r + 0; u = tolower(substr(r, length(n "") + 1)); m = 0
        if (u == "gbit") m = 1e9 / 8; else if (u == "mbit") m = 1e6 / 8
        else if (u == "kbit") m = 1e3 / 8; else if (u == "bit") m = 1 / 8
        if (n <= 0 || m == 0) exit 1
        printf "%.0f\n", n * m }' || die "RATE must look like 10gbit, 1gbit or 100mbit, not '$1'"
}

shape() { # shape NETNS_OR_EMPTY DEV RATE
    _bps=$(rate_bytes "$3")
    _burst=$((_bps / 1000))
    [ "$_burst" -ge 65536 ] || _burst=65536
    _limit=$((8 * 1048576 + _burst))
    if [ -n "$1" ]; then
        ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$_burst" limit "$_limit"
    else
        tc qdisc replace dev "$2" root tbf rate "$3" burst "$_burst" limit "$_limit"
    fi
}

do_down() {
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}[0-9]\$" || true); do
        ip netns del "$ns" 2>/dev/null || true # takes kv0 and its peer kilnh<r> with it
    done
    for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
        grep "^${PREFIX}h[0-9]\$" || true); do
        ip link del "$dev" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$STATE"
}

do_up() {
    n=$1 rate=$2
    check_n "$n"
    [ "$rate" = none ] || rate_bytes "$rate" >/dev/null
    do_down
    trap 'echo "netsim.sh: setting up failed; removing what was made" >&2; do_down' EXIT
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.254/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    r=0
    while [ "$r" -lt "$n" ]; do
        ns=$PREFIX$r
        ip netns add "$ns"
        ip link add "${PREFIX}h$r" type veth peer name kv0 netns "$ns"
        ip link set "${PREFIX}h$r" master "$BRIDGE"
        ip link set "${PREFIX}h$r" up
        ip netns exec "$ns" ip addr add "$SUBNET.$((r + 1))/24" dev kv0
        ip netns exec "$ns" ip link set kv0 up
        ip netns exec "$ns" ip link set lo up
        if [ "$rate" != none ]; then
            shape "$ns" kv0 "$rate"
            shape "" "${PREFIX}h$r" "$rate"
        fi
        r=$((r + 1))
    done
    # a bridge port forwards only once it leaves the learning state (at once with STP off,
    # the default): wait for every port to say so before saying the network is up
    r=0
    while [ "$r" -lt "$n" ]; do
        tries=0
        until bridge link show dev "${PREFIX}h$r" 2>/dev/null | grep -q "state forwarding"; do
            tries=$((tries + 1))
            [ "$tries" -lt 50 ] || die "bridge port ${PREFIX}h$r never started forwarding"
            sleep 0.2
        done
        r=$((r + 1))
    done
    mkdir -p "$STATE"
    echo "$n $rate" >"$STATE/up"
    trap - EXIT
    echo "netsim: $n hosts ${PREFIX}0..$PREFIX$((n - 1)) ($SUBNET.1-$n) on bridge $BRIDGE, links $rate"
}

do_status() {
    if [ ! -f "$STATE/up" ]; then
        echo "netsim: down"
        return 0
    fi
    read -r n rate <"$STATE/up"
    echo "netsim: $n hosts, links $rate"
    r=0
    while [ "$r" -lt "$n" ]; do
        echo "== $PREFIX$r kv0 (uplink)"
        ip netns exec "$PREFIX$r" tc -s qdisc show dev kv0 | sed 's/^/   /'
        echo "== ${PREFIX}h$r (downlink)"
        tc -s qdisc show dev "${PREFIX}h$r" | sed 's/^/   /'
        r=$((r + 1))
    done
}

# The flags of mpirun: ob1 with the TCP BTL only (no vader, no UCX, no shared-memory
# one-sided), and every TCP channel of Open MPI and PMIx on the simulated subnet.
mpirun_args() {
    printf '%s\n' --allow-run-as-root --oversubscribe \
        --mca pml ob1 --mca btl self,tcp \
        --mca btl_tcp_if_include "$SUBNET.0/24" \
        --mca oob_tcp_if_include "$SUBNET.0/24"
}

do_run() {
    n=$1
    shift
    check_n "$n"
    [ "${1:-}" = "--" ] || usage
    shift
    [ $# -gt 0 ] || usage
    [ -f "$STATE/up" ] || die "the network is down: netsim.sh up N RATE first"
    read -r up_n _ <"$STATE/up"
    [ "$n" -le "$up_n" ] || die "$n ranks but only $up_n hosts are up"
    per=${NETSIM_RANKS_PER_HOST:-1}
    case $per in
    '' | *[!0-9]* | 0) die "NETSIM_RANKS_PER_HOST=$per: not a count of ranks (1 or more)" ;;
    esac
    # Build: mpirun FLAGS -np K ip netns exec kiln0 CMD : -np K ip netns exec kiln1 CMD ...
    # as positional parameters (CMD's words stay intact, however they are quoted).
    cmd_n=$#
    r=0
    while [ "$r" -lt "$n" ]; do
        [ "$r" -eq 0 ] || set -- "$@" :
        set -- "$@" -np "$per" ip netns exec "$PREFIX$r"
        i=0
        while [ "$i" -lt "$cmd_n" ]; do
            eval "set -- \"\$@\" \"\${$((i + 1))}\""
            i=$((i + 1))
        done
        r=$((r + 1))
    done
    shift "$cmd_n"
    # shellcheck disable=SC2046
    set -- $(mpirun_args) "$@"
    set +e
    # PMIx's server inside mpirun listens on loopback by default, which a rank in another
    # namespace cannot reach: make it listen on the bridge
    export PMIX_MCA_ptl_tcp_if_include="$SUBNET.0/24"
    # the "hosts" are namespaces of one machine: kiln's collectives through shared memory
    # (kiln_comm_alloc_shared) would pass the simulated links by, so they are off, except
    # between the ranks of one host
    if [ "$per" -gt 1 ]; then
        export KILN_COMM_NODE_RANKS="$per"
    else
        export KILN_COMM_SHM=0
    fi
    # shellcheck disable=SC2086  # the extra flags are meant to split on spaces
    if [ "${NETSIM_EXEC:-0}" = 1 ]; then
        exec mpirun ${NETSIM_MPIRUN_EXTRA:-} "$@"
    fi
    mpirun ${NETSIM_MPIRUN_EXTRA:-} "$@"
    return $?
}

[ $# -ge 1 ] || usage
verb=$1
shift
case $verb in
up)
    [ $# -eq 2 ] || usage
    need_tools
    do_up "$1" "$2"
    ;;
down)
    need_tools
    do_down
    echo "netsim: down"
    ;;
status)
    need_tools
    do_status
    ;;
run)
    [ $# -ge 3 ] || usage
    need_tools
    command -v mpirun >/dev/null 2>&1 || die "mpirun is missing (apt-get install openmpi-bin)"
    do_run "$@"
    ;;
with)
    [ $# -ge 4 ] || usage
    need_tools
    command -v mpirun >/dev/null 2>&1 || die "mpirun is missing (apt-get install openmpi-bin)"
    n=$1 rate=$2
    shift 2
    child=""
    # a signal stops mpirun (which stops its ranks) before the network goes
    stop() {
        if [ -n "$child" ]; then
            kill -TERM "$child" 2>/dev/null || true
            wait "$child" 2>/dev/null || true
        fi
        exit "$1"
    }
    trap 'do_down' EXIT
    trap 'stop 130' INT
    trap 'stop 143' TERM
    trap 'stop 129' HUP
    do_up "$n" "$rate"
    trap 'do_down' EXIT # do_up clears its own trap on success
    # mpirun in the background, so that the traps run at once rather than after it ends
    NETSIM_EXEC=1 do_run "$n" "$@" &
    child=$!
    rc=0
    wait "$child" || rc=$?
    child=""
    exit "$rc"
    ;;
mpirun-args)
    [ $# -eq 0 ] || usage
    # shellcheck disable=SC2046,SC2086  # one line of words, for a person to copy
    echo "PMIX_MCA_ptl_tcp_if_include=$SUBNET.0/24 mpirun" $(mpirun_args) ${NETSIM_MPIRUN_EXTRA:-}
    ;;
*) usage ;;
esac
