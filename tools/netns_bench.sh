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
#
# --two-rails RATE (issue 28, "Every NIC"): a second veth pair joins the
# namespaces (10.253.X.1/.2), each link's sending side is held to RATE by a
# token bucket (tc tbf, both directions; e.g. 1gbit), and the columns are
# one and eight streams: the kernel (one TCP connection per stream, every
# one on the link its destination's route takes), fabsock on one rail, and
# fabsock with FABSOCK_RAILS=2 and each side's two addresses in
# FABSOCK_RAIL_ADDRS (streams spread over both links, and one stream's
# messages striped over both: wire 12, FABSOCK_STRIPE_MIN), with the bytes
# each link carried in the first round (the kernel's interface counters).
# Where the links, not the CPU, are the limit, two rails carry up to twice
# one, for one stream as for eight (--two-rails none: no limit, the CPU's
# case).
# fabsock runs there with FABSOCK_HISTORY_SHORT=0 (each stream offloads).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
lib=$here/../build/libfabsock.so
lib_b=
provider=tcp
rounds=3
seconds=4
two_rails=
while [ $# -gt 0 ]; do
	case $1 in
	--two-rails) two_rails=$2; shift 2 ;;
	--lib) lib=$2; shift 2 ;;
	--lib-b) lib_b=$2; shift 2 ;;
	--provider) provider=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--seconds) seconds=$2; shift 2 ;;
	*) echo "usage: $0 [--lib PATH] [--lib-b PATH] [--provider P] [--rounds N] [--seconds S] [--two-rails RATE]" >&2; exit 2 ;;
	esac
done
[[ $rounds =~ ^[1-9][0-9]?$ && $seconds =~ ^[1-9][0-9]?$ ]] || { echo "rounds 1-99, seconds 1-99" >&2; exit 2; }
[[ $provider =~ ^[a-z0-9_]+$ ]] || { echo "bad provider name" >&2; exit 2; }
[[ -z $two_rails || $two_rails == none || $two_rails =~ ^[1-9][0-9]{0,3}[kmg]bit$ ]] || { echo "--two-rails: a rate such as 1gbit or 500mbit, or none" >&2; exit 2; }
[ -f "$lib" ] || { echo "no library at $lib (build first, or --lib)" >&2; exit 2; }
for tool in ip iperf3 fi_pingpong python3; do
	command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 2; }
done

ns_a=fsb-$$-a ns_b=fsb-$$-b veth_a=fsb$$a veth_b=fsb$$b veth2_a=fsc$$a veth2_b=fsc$$b
subnet=10.252.$(($$ % 250 + 1))
subnet2=10.253.$(($$ % 250 + 1))
tmp=$(mktemp -d /tmp/fabsock-netns-bench.XXXXXX)
cleanup() {
	local pid
	for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
	ip netns del "$ns_a" 2>/dev/null || true
	ip netns del "$ns_b" 2>/dev/null || true
	ip link del "$veth_a" 2>/dev/null || true
	ip link del "$veth2_a" 2>/dev/null || true
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
if [ -n "$two_rails" ]; then
	ip link add "$veth2_a" type veth peer name "$veth2_b"
	ip link set "$veth2_a" netns "$ns_a"
	ip link set "$veth2_b" netns "$ns_b"
	ip -n "$ns_a" addr add "$subnet2.1/24" dev "$veth2_a"
	ip -n "$ns_b" addr add "$subnet2.2/24" dev "$veth2_b"
	ip -n "$ns_a" link set "$veth2_a" up
	ip -n "$ns_b" link set "$veth2_b" up
	# A stream's two ends may sit on different links (each side picks its
	# own rail): reverse-path filtering would drop such packets.
	for ns in "$ns_a" "$ns_b"; do
		ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
	done
	for dev in "$ns_a $veth_a" "$ns_b $veth_b" "$ns_a $veth2_a" "$ns_b $veth2_b"; do
		set -- $dev
		ip netns exec "$1" sysctl -qw "net.ipv4.conf.$2.rp_filter=0"
		[ "$two_rails" = none ] || tc -n "$1" qdisc add dev "$2" root tbf rate "$two_rails" burst 512kb latency 100ms
	done
fi
port=$((20000 + $$ % 20000))
# bytes the server's side of each link received and sent so far
link_bytes() {
	local dev total=0
	for dev in "$@"; do
		total=$((total + $(ip netns exec "$ns_a" cat "/sys/class/net/$dev/statistics/rx_bytes") + $(ip netns exec "$ns_a" cat "/sys/class/net/$dev/statistics/tx_bytes")))
	done
	echo "$total"
}

# iperf3 LIB|kernel STREAMS -> Gbit/s received (the receiver's sum), or 0
# when the run failed (its output is kept in $tmp/fail-*).
iperf() {
	local which=$1 streams=$2 rails=${3:-1} pre=() pre_a=() pre_b=() server rc=0
	[ "$which" = kernel ] || pre=(LD_PRELOAD="$which" FABSOCK_PROVIDER="$provider" FABSOCK_STATS=1)
	# two rails: the history off, as a user would switch it for a bulk
	# transfer; a stream of eight at 1gbit carries under its 64 MiB in a
	# few seconds and counts short, so the next run's went to TCP at once
	[ -n "$two_rails" ] && [ "$which" != kernel ] && pre+=(FABSOCK_HISTORY_SHORT=0)
	if [ "$rails" = 2 ]; then
		pre_a=(FABSOCK_RAILS=2 "FABSOCK_RAIL_ADDRS=$subnet.1,$subnet2.1")
		pre_b=(FABSOCK_RAILS=2 "FABSOCK_RAIL_ADDRS=$subnet.2,$subnet2.2")
	fi
	ip netns exec "$ns_a" env "${pre[@]}" "${pre_a[@]}" timeout $((seconds + 30)) iperf3 -s -1 -p "$port" \
		>"$tmp/server.out" 2>&1 &
	server=$!
	for _ in $(seq 1 100); do
		ip netns exec "$ns_a" ss -Htln "sport = :$port" | grep -q . && break
		sleep 0.05
	done
	ip netns exec "$ns_b" env "${pre[@]}" "${pre_b[@]}" timeout $((seconds + 30)) iperf3 -c "$subnet.1" -p "$port" \
		-t "$seconds" -P "$streams" -J >"$tmp/client.json" 2>"$tmp/client.err" || rc=$?
	[ -n "${NB_DEBUG:-}" ] && cp "$tmp/client.err" "$NB_DEBUG/client-$streams-$rails.err" && cp "$tmp/server.out" "$NB_DEBUG/server-$streams-$rails.out"
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
declare -A split=()
columns="kernel-1 kernel-4 raw-128K raw-1M fabsock-1 fabsock-4"
[ -n "$lib_b" ] && columns="$columns b-1 b-4"
links="one veth pair"
if [ -n "$two_rails" ]; then
	columns="kernel-1 kernel-8 fabsock-1 fabsock-8 rails2-1 rails2-8"
	links="two veth pairs of $two_rails each"
fi
echo "netns bench: provider $provider, $links, $rounds round(s) of ${seconds} s; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
	line="round $round:"
	for column in $columns; do
		[ -n "$two_rails" ] && before1=$(link_bytes "$veth_a") before2=$(link_bytes "$veth2_a")
		case $column in
		kernel-*) value=$(iperf kernel "${column#kernel-}") ;;
		raw-128K) value=$(pingpong 131072 2000) ;;
		raw-1M) value=$(pingpong 1048576 300) ;;
		fabsock-*) value=$(iperf "$lib" "${column#fabsock-}") ;;
		rails2-*) value=$(iperf "$lib" "${column#rails2-}" 2) ;;
		b-*) value=$(iperf "$lib_b" "${column#b-}") ;;
		esac
		if [ -n "$two_rails" ] && [ "$round" = 1 ]; then
			split[$column]="link 1 $((($(link_bytes "$veth_a") - before1) >> 20)) MiB, link 2 $((($(link_bytes "$veth2_a") - before2) >> 20)) MiB; server $(grep -o 'offloaded=[0-9]*\|nic_rails=[0-9]*' "$tmp/server.out" | tr '\n' ' ' || true)"
		fi
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
if [ -n "$two_rails" ]; then
	for column in $columns; do
		echo "round 1, $column: ${split[$column]}"
	done
	echo "two rails / one, one stream:      $(ratio "${med[rails2-1]}" "${med[fabsock-1]}") (striped; links the limit: up to 2)"
	echo "two rails, one stream / kernel:   $(ratio "${med[rails2-1]}" "${med[kernel-1]}")"
	echo "two rails / one, eight streams:   $(ratio "${med[rails2-8]}" "${med[fabsock-8]}") (links the limit: up to 2)"
	echo "two rails, eight streams / kernel: $(ratio "${med[rails2-8]}" "${med[kernel-8]}")"
	exit 0
fi
echo "fabsock one stream / raw 128 KiB: $(ratio "${med[fabsock-1]}" "${med[raw-128K]}") (target >= 0.8)"
echo "fabsock one stream / raw 1 MiB:   $(ratio "${med[fabsock-1]}" "${med[raw-1M]}")"
echo "fabsock four / one stream:        $(ratio "${med[fabsock-4]}" "${med[fabsock-1]}") (target >= 1)"
echo "fabsock one stream / kernel:      $(ratio "${med[fabsock-1]}" "${med[kernel-1]}")"
if [ -n "$lib_b" ]; then
	echo "A/B one stream (lib / lib-b):     $(ratio "${med[fabsock-1]}" "${med[b-1]}")"
	echo "A/B four streams (lib / lib-b):   $(ratio "${med[fabsock-4]}" "${med[b-4]}")"
fi
