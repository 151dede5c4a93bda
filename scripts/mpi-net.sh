#!/usr/bin/env bash
# Two "machines" on one: network namespaces tg-a and tg-b joined by a veth link, shaped with tc
# to RATE (e.g. 1gbit, 10gbit; `none` leaves the link as fast as the kernel copies), and a
# command run over two ranks, one in each, through Open MPI's TCP transport on that link
# (rank 0's mpirun in tg-a starts rank 1 in tg-b through `ip netns exec` instead of ssh).
# Needs root (ip netns, tc) and Open MPI. The namespaces are removed on exit.
#
#   scripts/mpi-net.sh RATE COMMAND...
#   scripts/mpi-net.sh 10gbit target/release/tinygpt bench --all-reduce --config modern
set -euo pipefail
rate=$1
shift
agent=$(mktemp /tmp/tg-netns-agent.XXXXXX)
cleanup() {
    ip netns del tg-a 2>/dev/null || true
    ip netns del tg-b 2>/dev/null || true
    rm -f "$agent"
}
# Namespaces left by a run that was killed.
ip netns del tg-a 2>/dev/null || true
ip netns del tg-b 2>/dev/null || true
trap cleanup EXIT

ip netns add tg-a
ip netns add tg-b
ip link add tg-va type veth peer name tg-vb
ip link set tg-va netns tg-a
ip link set tg-vb netns tg-b
ip -n tg-a addr add 10.77.0.1/24 dev tg-va
ip -n tg-b addr add 10.77.0.2/24 dev tg-vb
for ns in tg-a tg-b; do
    ip -n "$ns" link set lo up
done
ip -n tg-a link set tg-va up
ip -n tg-b link set tg-vb up
if [ "$rate" != none ]; then
    # A token bucket on each side's egress: RATE each way, as a full-duplex link. The burst
    # holds a millisecond at RATE (at least 64 KiB: TSO sends 64 KiB segments).
    bits=$(numfmt --from=si "$(echo "${rate%bit}" | tr a-z A-Z)")
    burst=$(( bits / 8 / 1000 > 65536 ? bits / 8 / 1000 : 65536 ))
    tc -n tg-a qdisc add dev tg-va root tbf rate "$rate" burst "$burst" latency 10ms
    tc -n tg-b qdisc add dev tg-vb root tbf rate "$rate" burst "$burst" latency 10ms
fi

# Open MPI's remote launcher: `AGENT HOST COMMAND`, run in the namespace holding HOST.
cat > "$agent" <<'EOF'
#!/bin/sh
host=$1
shift
case "$host" in
    10.77.0.1) ns=tg-a ;;
    10.77.0.2) ns=tg-b ;;
    *) echo "unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" /bin/sh -c "$*"
EOF
chmod +x "$agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ip netns exec tg-a mpirun --host 10.77.0.1:1,10.77.0.2:1 -np 2 --bind-to none \
    --mca plm_rsh_agent "$agent" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
    --mca oob_tcp_if_include 10.77.0.0/24 \
    -x PATH -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
    "$@"
