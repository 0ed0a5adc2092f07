#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Bandwidth between two hosts, stood in for by two network namespaces joined
# by one veth pair (made here, private addresses 10.252.X.1/.2, removed at
# exit): kernel TCP, raw libfabric (fi_pingpong, tagged RDM, the same
# provider) and fabsock with its default settings, side by side in one
# sitting, rounds alternating so that the load of the machine falls on each
# alike. iperf3 one stream and -P 4; fi_pingpong at 128 KiB (fabsock's chunk)
# and 1 MiB. Prints the median of each and the ratios the issue asks for
# (one fabsock stream against raw libfabric at the chunk size, four streams
# against one), with the load average before and after.
#
#   tools/netns_bench.sh [--lib PATH] [--lib-b PATH] [--provider tcp] [--rounds N] [--seconds S]
#
# --lib-b adds a second library (an older build) as a column of its own, for
# an A/B in the same sitting. Needs root (ip netns), iperf3 and fi_pingpong.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
lib=$here/../build/libfabsock.so
lib_b=
provider=tcp
rounds=3
seconds=4
while [ $# -gt 0 ]; do
	case $1 in
	--lib) lib=$2; shift 2 ;;
	--lib-b) lib_b=$2; shift 2 ;;
	--provider) provider=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--seconds) seconds=$2; shift 2 ;;
	*) echo "usage: $0 [--lib PATH] [--lib-b PATH] [--provider P] [--rounds N] [--seconds S]" >&2; exit 2 ;;
	esac
done
[[ $rounds =~ ^[1-9][0-9]?$ && $seconds =~ ^[1-9][0-9]?$ ]] || { echo "rounds 1-99, seconds 1-99" >&2; exit 2; }
[[ $provider =~ ^[a-z0-9_]+$ ]] || { echo "bad provider name" >&2; exit 2; }
[ -f "$lib" ] || { echo "no library at $lib (build first, or --lib)" >&2; exit 2; }
for tool in ip iperf3 fi_pingpong python3; do
	command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 2; }
done

ns_a=fsb-$$-a ns_b=fsb-$$-b veth_a=fsb$$a veth_b=fsb$$b
subnet=10.252.$(($$ % 250 + 1))
tmp=$(mktemp -d /tmp/fabsock-netns-bench.XXXXXX)
cleanup() {
	local pid
	for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
	ip netns del "$ns_a" 2>/dev/null || true
	ip netns del "$ns_b" 2>/dev/null || true
	ip link del "$veth_a" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns_a"
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$subnet.1/24" dev "$veth_a"
ip -n "$ns_b" addr add "$subnet.2/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up
port=$((20000 + $$ % 20000))

# iperf3 LIB|kernel STREAMS -> Gbit/s received (the receiver's sum), or 0
# when the run failed (its output is kept in $tmp/fail-*).
iperf() {
	local which=$1 streams=$2 pre=() server rc=0
	[ "$which" = kernel ] || pre=(LD_PRELOAD="$which" FABSOCK_PROVIDER="$provider")
	ip netns exec "$ns_a" env "${pre[@]}" timeout $((seconds + 30)) iperf3 -s -1 -p "$port" \
		>"$tmp/server.out" 2>&1 &
	server=$!
	for _ in $(seq 1 100); do
		ip netns exec "$ns_a" ss -Htln "sport = :$port" | grep -q . && break
		sleep 0.05
	done
	ip netns exec "$ns_b" env "${pre[@]}" timeout $((seconds + 30)) iperf3 -c "$subnet.1" -p "$port" \
		-t "$seconds" -P "$streams" -J >"$tmp/client.json" 2>"$tmp/client.err" || rc=$?
	wait "$server" || true
	python3 -c 'import json, sys
print("%.2f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' \
		"$tmp/client.json" 2>/dev/null && [ "$rc" = 0 ] && return 0
	cp "$tmp/client.json" "$tmp/fail-$streams-$RANDOM.json" 2>/dev/null || true
	echo 0
}

# fi_pingpong SIZE ITERATIONS -> Gbit/s (its MB/sec column x 8 / 1000)
pingpong() {
	local size=$1 iterations=$2 server
	ip netns exec "$ns_a" timeout 60 fi_pingpong -p "$provider" -e rdm -m tagged -S "$size" -I "$iterations" \
		>/dev/null 2>&1 &
	server=$!
	sleep 0.5
	ip netns exec "$ns_b" timeout 60 fi_pingpong -p "$provider" -e rdm -m tagged -S "$size" -I "$iterations" \
		"$subnet.1" 2>/dev/null | awk 'NR == 2 { printf "%.2f\n", $6 * 8 / 1000; found = 1 } END { if (!found) print 0 }'
	wait "$server" || true
}

declare -A runs=()
columns="kernel-1 kernel-4 raw-128K raw-1M fabsock-1 fabsock-4"
[ -n "$lib_b" ] && columns="$columns b-1 b-4"
echo "netns bench: provider $provider, one veth pair, $rounds round(s) of ${seconds} s; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
	line="round $round:"
	for column in $columns; do
		case $column in
		kernel-*) value=$(iperf kernel "${column#kernel-}") ;;
		raw-128K) value=$(pingpong 131072 2000) ;;
		raw-1M) value=$(pingpong 1048576 300) ;;
		fabsock-*) value=$(iperf "$lib" "${column#fabsock-}") ;;
		b-*) value=$(iperf "$lib_b" "${column#b-}") ;;
		esac
		runs[$column]="${runs[$column]:-} $value"
		line="$line $column $value"
	done
	echo "$line"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '%-10s %s\n' "column" "median Gbit/s"
declare -A med=()
for column in $columns; do
	med[$column]=$(echo "${runs[$column]}" | median)
	printf '%-10s %s\n' "$column" "${med[$column]}"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo "fabsock one stream / raw 128 KiB: $(ratio "${med[fabsock-1]}" "${med[raw-128K]}") (target >= 0.8)"
echo "fabsock one stream / raw 1 MiB:   $(ratio "${med[fabsock-1]}" "${med[raw-1M]}")"
echo "fabsock four / one stream:        $(ratio "${med[fabsock-4]}" "${med[fabsock-1]}") (target >= 1)"
echo "fabsock one stream / kernel:      $(ratio "${med[fabsock-1]}" "${med[kernel-1]}")"
if [ -n "$lib_b" ]; then
	echo "A/B one stream (lib / lib-b):     $(ratio "${med[fabsock-1]}" "${med[b-1]}")"
	echo "A/B four streams (lib / lib-b):   $(ratio "${med[fabsock-4]}" "${med[b-4]}")"
fi
