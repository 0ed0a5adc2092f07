#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# More peer processes than one endpoint holds (issue 14). shm takes 256
# peer processes per endpoint; past that a process opens another endpoint
# (its own region and address) instead of leaving the stream on TCP.
# FABSOCK_TEST_AV_MAX lowers the limit so that a handful of processes reach
# it (scale_peers runs the real 256 with 300 processes). fs_scale echoes
# 2 KiB on each connection and checks every byte; connections are held open
# together, so the peers are concurrent.
#  server: one server with AV_MAX 2 and 7 client processes: 4 endpoints (3
#    extra), all 7 offloaded, the bytes over the fabric.
#  client: one client with AV_MAX 2, 5 server processes, 10 connections
#    round robin: extra endpoints opened, all 10 offloaded.
#  limit: one client with AV_MAX 1 and 17 servers, one connection each:
#    16 endpoints (the most) offloaded, the 17th stays on TCP with an empty
#    HELLO (fallback_provider), and every connection still echoes byte-exact
#    (none reset).
. "$(dirname "$0")/lib.sh"

PROG=$FS_PROGS/fs_scale
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
SIZE=2048

# start_servers N DIR [ENV...]: N fs_scale servers; sets SRV_PIDS, PORTS (a,b,c)
start_servers() {
	local n=$1 dir=$2 i p
	shift 2
	SRV_PIDS=() PORTS=""
	for i in $(seq 1 "$n"); do
		fs_bg p env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$@" "$PROG" server >"$dir/s$i.out" 2>"$dir/s$i.err"
		SRV_PIDS+=("$p")
	done
	for i in $(seq 1 "$n"); do
		p=$(fs_listen_port "$dir/s$i.out" "${SRV_PIDS[$((i - 1))]}")
		[ -n "$p" ] || { fs_fail "server $i did not listen"; return 1; }
		PORTS="$PORTS${PORTS:+,}$p"
	done
}

stop_servers() {
	local p rc
	for p in "${SRV_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${SRV_PIDS[@]}"; do
		rc=0
		fs_wait_pid "$p" 30 || rc=$?
		[ "$rc" = 0 ] || fs_fail "a server exited $rc"
	done
}

# --- one server, more client processes than its endpoint holds -----------
dir=$FS_TMP/server
mkdir -p "$dir"
if start_servers 1 "$dir" FABSOCK_TEST_AV_MAX=2 FABSOCK_LOG=info; then
	cpids=()
	for i in 1 2 3 4 5 6 7; do
		fs_bg p env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PROG" client "$PORTS" 1 "$SIZE" "$dir/go" \
			>"$dir/c$i.out" 2>"$dir/c$i.err"
		cpids+=("$p")
	done
	for i in 1 2 3 4 5 6 7; do fs_wait_line "$dir/c$i.out" '^held ' "${cpids[$((i - 1))]}" 60 || true; done
	touch "$dir/go" # every client holds its connection until now: 7 peers at once
	for i in 1 2 3 4 5 6 7; do
		rc=0
		fs_wait_pid "${cpids[$((i - 1))]}" 60 || rc=$?
		[ "$rc" = 0 ] && grep -q '^PASS client 1$' "$dir/c$i.out" ||
			fs_fail "server case: client $i exit $rc: $(grep -h '^FAIL' "$dir/c$i.out" | head -n 2 | tr '\n' ' ')"
		[ "$(fs_stat "$dir/c$i.err" offloaded)" = 1 ] ||
			fs_fail "server case: client $i was not offloaded ($(fs_stats_fallbacks "$dir/c$i.err"))"
	done
	sleep 0.5
	stop_servers
	extra=$(fs_stat "$dir/s1.err" endpoints_extra) off=$(fs_stat "$dir/s1.err" offloaded)
	rx=$(fs_stat "$dir/s1.err" fabric_rx_bytes)
	[ "${extra:-0}" = 3 ] || fs_fail "server case: the server opened ${extra:-no} extra endpoints, expected 3 (7 peers, 2 each)"
	[ "${off:-0}" = 7 ] || fs_fail "server case: the server offloaded ${off:-0} of 7 ($(fs_stats_fallbacks "$dir/s1.err"))"
	[ "${rx:-0}" -ge $((7 * SIZE)) ] || fs_fail "server case: ${rx:-0} bytes came over the fabric, expected >= $((7 * SIZE))"
	[ "$(grep -c 'opened endpoint' "$dir/s1.err")" = 3 ] || fs_fail "server case: no 'opened endpoint' log lines"
	[ "$FS_FAILS" = 0 ] && fs_pass "server case: 7 client processes on 4 endpoints of 2 peers, all offloaded, bytes over the fabric"
fi

# one_client CASE SERVERS AV_MAX CONNS: SERVERS fs_scale servers, one client
# process with FABSOCK_TEST_AV_MAX=AV_MAX opening CONNS connections round
# robin over them (all held at once). Leaves the client's stats in
# $dir/c.err, and fails CASE unless the client passed (every echo
# byte-exact, no connection reset) and its offloaded streams' bytes went
# over the fabric.
one_client() {
	local name=$1 servers=$2 avmax=$3 conns=$4 rc=0 off tx
	dir=$FS_TMP/$name
	mkdir -p "$dir"
	start_servers "$servers" "$dir" || return 1
	touch "$dir/go"
	timeout -k 2 120 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_TEST_AV_MAX="$avmax" "$PROG" client \
		"$PORTS" "$conns" "$SIZE" "$dir/go" >"$dir/c.out" 2>"$dir/c.err" || rc=$?
	[ "$rc" = 0 ] && grep -q "^PASS client $conns\$" "$dir/c.out" ||
		fs_fail "$name case: client exit $rc (a connection reset?): $(grep -h '^FAIL' "$dir/c.out" | head -n 2 | tr '\n' ' ')"
	sleep 0.5
	stop_servers
	off=$(fs_stat "$dir/c.err" offloaded) tx=$(fs_stat "$dir/c.err" fabric_tx_bytes)
	[ "${tx:-0}" -ge $((${off:-0} * SIZE)) ] ||
		fs_fail "$name case: ${tx:-0} bytes went over the fabric for ${off:-0} offloaded connections of $SIZE bytes"
}

# --- one client, more server processes than its endpoint holds -----------
fails=$FS_FAILS
if one_client client 5 2 10; then
	extra=$(fs_stat "$dir/c.err" endpoints_extra) off=$(fs_stat "$dir/c.err" offloaded)
	[ "${extra:-0}" -ge 2 ] || fs_fail "client case: the client opened ${extra:-no} extra endpoints, expected >= 2 (5 peers, 2 each)"
	[ "${off:-0}" = 10 ] || fs_fail "client case: the client offloaded ${off:-0} of 10 ($(fs_stats_fallbacks "$dir/c.err"))"
	soff=$(cat "$dir"/s*.err | fs_stat_sum /dev/stdin offloaded)
	[ "$soff" = 10 ] || fs_fail "client case: the servers offloaded $soff of 10"
	[ "$FS_FAILS" = "$fails" ] && fs_pass "client case: one client, 5 server processes, $extra extra endpoints, 10 of 10 offloaded"
fi

# --- the most endpoints: the next peer stays on TCP, nothing resets ------
fails=$FS_FAILS
if one_client limit 17 1 17; then
	extra=$(fs_stat "$dir/c.err" endpoints_extra) off=$(fs_stat "$dir/c.err" offloaded)
	fb=$(fs_stat "$dir/c.err" fallback_provider)
	[ "${extra:-0}" = 15 ] || fs_fail "limit case: ${extra:-no} extra endpoints, expected 15 (16 in all)"
	[ "${off:-0}" = 16 ] && [ "${fb:-0}" = 1 ] ||
		fs_fail "limit case: offloaded ${off:-0} (want 16), on TCP: $(fs_stats_fallbacks "$dir/c.err") (want fallback_provider=1)"
	[ "$FS_FAILS" = "$fails" ] && fs_pass "limit case: 16 endpoints of 1 peer offloaded, the 17th connection on TCP, all 17 byte-exact"
fi

fs_done
