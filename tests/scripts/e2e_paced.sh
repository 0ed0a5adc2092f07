#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Processes that wait on their peers more than they compute (pgbench's
# hundreds of PostgreSQL backends): SERVERS fs_scale echo servers (epoll)
# and CLIENTS paced clients, each with one connection to every server,
# doing ROUNDS rounds of a 64-byte request and its echo per connection
# with GAP_US of sleep between rounds. Every wait outlasts its spin, so
# both ends turn sleepy: their messages carry the ARM (bell_arms_inline)
# and every wake-up is a doorbell ring. Each client first opens one
# warm-up connection to every server (every process's rail opens, 200-350
# ms under ASan when nine start together) and says "warm"; once all are
# warm, they start. Checked: every echo byte-exact, every connection
# offloaded on both ends with the bytes over the fabric and none over TCP
# (nftables, fs_tcp_proof), ARMs carried and rings received on both ends,
# no round trip over 200 ms (lost=0: a lost ring costs an armed sleeper its
# 250 ms safety slice), each connection's first echo (which finishes its
# handshake) included, and no more than MAX_SLOW over 100 ms (scheduling
# hiccups). One more client runs the same rounds in THREADS threads, each
# with its own connections, waiting for every echo in poll() (pgbench -j's
# shape): its threads sleep on their own streams while the others wait too
# (deep_beside, docs/design.md "Several waiting threads"), under the same
# bounds.
. "$(dirname "$0")/lib.sh"

PROG=$FS_PROGS/fs_scale
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
fs_need_nft
SERVERS=6 CLIENTS=4 ROUNDS=150 GAP_US=2000 MAX_SLOW=2 THREADS=2

dir=$FS_TMP/paced
mkdir -p "$dir"
spids=() ports=()
for s in $(seq 1 "$SERVERS"); do
	fs_bg p env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PROG" server >"$dir/s$s.out" 2>"$dir/s$s.err"
	spids+=("$p")
	port=$(fs_listen_port "$dir/s$s.out" "$p")
	[ -n "$port" ] || { fs_fail "server $s did not listen"; fs_done; exit 1; }
	ports+=("$port")
done
list=$(IFS=,; echo "${ports[*]}")
fs_tcp_count_start "${ports[@]}" || fs_fail "nft counter not set up"
cpids=()
for c in $(seq 1 "$CLIENTS"); do
	# the last client: SERVERS connections too, SERVERS / THREADS per thread
	args=("$SERVERS")
	[ "$c" != "$CLIENTS" ] || args=($((SERVERS / THREADS)))
	args+=("$ROUNDS" "$GAP_US" "$dir/go")
	[ "$c" != "$CLIENTS" ] || args+=("$THREADS")
	fs_bg p env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PROG" paced "$list" "${args[@]}" \
		>"$dir/c$c.out" 2>"$dir/c$c.err"
	cpids+=("$p")
done
for c in $(seq 1 "$CLIENTS"); do
	fs_wait_line "$dir/c$c.out" '^warm$' "${cpids[$((c - 1))]}" 60 || fs_fail "client $c did not warm up"
done
touch "$dir/go"
slow=0 lost=0
for c in $(seq 1 "$CLIENTS"); do
	rc=0
	fs_wait_pid "${cpids[$((c - 1))]}" 120 || rc=$?
	[ "$rc" = 0 ] && grep -q '^PASS paced$' "$dir/c$c.out" ||
		fs_fail "client $c exit $rc: $(grep -h '^FAIL' "$dir/c$c.out" | head -n 2 | tr '\n' ' ')"
	grep -h '^paced ' "$dir/c$c.out" >&2 || true
	slow=$((slow + $(sed -n 's/^paced .* slow=\([0-9]*\).*/\1/p' "$dir/c$c.out" | head -n 1)))
	lost=$((lost + $(sed -n 's/^paced .* lost=\([0-9]*\).*/\1/p' "$dir/c$c.out" | head -n 1)))
	grep -h '^lost? ' "$dir/c$c.out" | head -n 3 >&2 || true
	off=$(fs_stat "$dir/c$c.err" offloaded)
	# its warm-up and timed connection to every server
	[ "${off:-0}" = $((2 * SERVERS)) ] || fs_fail "client $c offloaded ${off:-0} of $((2 * SERVERS)) ($(fs_stats_fallbacks "$dir/c$c.err"))"
done
beside=$(fs_stat "$dir/c$CLIENTS.err" deep_beside)
fs_log "client $CLIENTS ($THREADS threads in poll): deep_beside=${beside:-0}"
[ "${beside:-0}" -ge 1 ] || fs_fail "client $CLIENTS: its threads never slept on their own streams (deep_beside=${beside:-0})"
[ "$lost" = 0 ] || fs_fail "$lost round trips took over 200 ms: a lost doorbell ring"
[ "$slow" -le "$MAX_SLOW" ] || fs_fail "$slow round trips took over 100 ms (a lost doorbell ring?)"
# every timed and warm-up connection: a HELLO and an ACK, no payload byte
fs_tcp_proof "paced" fabsock $((2 * CLIENTS * SERVERS))
for p in "${spids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for s in $(seq 1 "$SERVERS"); do
	rc=0
	fs_wait_pid "${spids[$((s - 1))]}" 60 || rc=$?
	[ "$rc" = 0 ] || fs_fail "server $s exit $rc"
	off=$(fs_stat "$dir/s$s.err" offloaded) rx=$(fs_stat "$dir/s$s.err" fabric_rx_bytes)
	[ "${off:-0}" = $((2 * CLIENTS)) ] || fs_fail "server $s offloaded ${off:-0} of $((2 * CLIENTS)) ($(fs_stats_fallbacks "$dir/s$s.err"))"
	[ "${rx:-0}" -ge $((CLIENTS * ROUNDS * 64)) ] ||
		fs_fail "server $s: ${rx:-0} bytes over the fabric, expected >= $((CLIENTS * ROUNDS * 64))"
done
cat "$dir"/s*.err >"$dir/servers.err"
cat "$dir"/c*.err >"$dir/clients.err"
for side in servers clients; do
	inl=$(fs_stat_sum "$dir/$side.err" bell_arms_inline) rung=$(fs_stat_sum "$dir/$side.err" bell_rings_received)
	arms=$(fs_stat_sum "$dir/$side.err" bell_arms)
	fs_log "$side: bell_arms=$arms bell_arms_inline=$inl bell_rings_received=$rung"
	[ "${inl:-0}" -ge 1 ] || fs_fail "$side: no ARM carried by a message (bell_arms_inline=${inl:-0})"
	[ "${rung:-0}" -ge 1 ] || fs_fail "$side: no doorbell ring received"
done
[ "$FS_FAILS" = 0 ] &&
	fs_pass "$CLIENTS paced clients ($THREADS threads in the last) x $SERVERS servers, $ROUNDS rounds: byte-exact, offloaded, none over TCP, woken by rings, $slow slow, none lost"
fs_done
