#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A connection per request, many in a row (issue 13, item 7: a backend
# behind a proxy reported "the shm receive queue (1024 entries) is full"
# after ~340 connections with only 8 open at once: closed streams kept
# their receives). One fabsock-netbench server under the preload; CLIENTS
# preloaded client processes at once, each making COUNT sequential
# connections (connect, 9 bytes out, 1 byte back, close; the byte differs
# from one connection to the next and the client exits 1 unless the echo
# is it), so at most
# CLIENTS are open at a time and CLIENTS x (COUNT + 10) pass through the
# server, many times what its endpoint's receive queue could hold if a
# closed stream kept its receives. Every connection must be offloaded on
# both ends (stats: offloaded equals the count, kernel 0), no process may
# fail, the server must answer a last client afterwards, and nothing may
# log a full receive queue. Kernel TCP runs the same load first, for the
# figures side by side.
. "$(dirname "$0")/lib.sh"

NETBENCH=${FS_BUILD:-}/tools/fabsock-netbench
[ -x "$NETBENCH" ] || { fs_fail "no $NETBENCH (FS_BUILD must name the build directory)"; fs_done; exit 1; }
CLIENTS=8
COUNT=400
WARMUP=10 # fabsock-netbench connect makes 10 untimed connections first

run() { # MODE
	local mode=$1 dir=$FS_TMP/$1 srv port i rc total=0 fails=$FS_FAILS
	local -a pre=(env -u LD_PRELOAD) pids=()
	[ "$mode" = fabsock ] && pre=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	mkdir -p "$dir"
	fs_bg srv "${pre[@]}" "$NETBENCH" server --port 0 --ready-file "$dir/ready" >"$dir/server.out" 2>"$dir/server.err"
	for _ in $(seq 1 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
	port=$(cat "$dir/ready" 2>/dev/null || true)
	[ -n "$port" ] || { fs_fail "$mode: the server did not start"; return 0; }
	for i in $(seq 1 "$CLIENTS"); do
		fs_bg "pid_$i" timeout -k 2 120 "${pre[@]}" "$NETBENCH" connect 127.0.0.1 "$port" --count "$COUNT" \
			>"$dir/client$i.out" 2>"$dir/client$i.err"
		pids+=("$(eval echo "\$pid_$i")")
	done
	for i in $(seq 1 "$CLIENTS"); do
		rc=0
		fs_wait_pid "${pids[$((i - 1))]}" 150 || rc=$?
		if [ "$rc" -ne 0 ] || ! grep -q "^connections=$COUNT " "$dir/client$i.out"; then
			fs_fail "$mode: client $i exit $rc: $(tail -n 2 "$dir/client$i.err" | tr '\n' ' ')"
		fi
	done
	# the server still answers afterwards
	rc=0
	timeout 30 "${pre[@]}" "$NETBENCH" connect 127.0.0.1 "$port" --count 1 >"$dir/last.out" 2>"$dir/last.err" || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$mode: the server no longer answers a new client (exit $rc)"
	kill -TERM "$srv" 2>/dev/null || true
	rc=0
	fs_wait_pid "$srv" 30 || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$mode: server exit $rc"
	rate=$(awk -F'per_sec=' '/^connections=/ { split($2, a, " "); s += a[1] } END { printf "%.0f", s }' "$dir"/client*.out)
	RATE[$mode]=$rate
	if [ "$mode" = fabsock ]; then
		local off kern want=$((COUNT + WARMUP))
		for i in $(seq 1 "$CLIENTS"); do
			off=$(fs_stat "$dir/client$i.err" offloaded)
			kern=$(fs_stat "$dir/client$i.err" kernel)
			[ "${off:-x}" = "$want" ] && [ "${kern:-x}" = 0 ] ||
				fs_fail "$mode: client $i offloaded=${off:-none} kernel=${kern:-none}, expected $want and 0 ($(fs_stats_fallbacks "$dir/client$i.err"))"
		done
		want=$((CLIENTS * (COUNT + WARMUP) + WARMUP + 1))
		off=$(fs_stat "$dir/server.err" offloaded)
		kern=$(fs_stat "$dir/server.err" kernel)
		[ "${off:-x}" = "$want" ] && [ "${kern:-x}" = 0 ] ||
			fs_fail "$mode: server offloaded=${off:-none} kernel=${kern:-none}, expected $want and 0 ($(fs_stats_fallbacks "$dir/server.err"))"
		if grep -qi 'queue.*full\|full.*queue' "$dir"/*.err; then
			fs_fail "$mode: a receive queue filled up: $(grep -hi 'full' "$dir"/*.err | head -n 1)"
		fi
	fi
	[ "$FS_FAILS" = "$fails" ] && fs_pass "$mode: $CLIENTS clients x $COUNT connections in a row, ${rate} conn/s in all"
	return 0
}

declare -A RATE
for mode in kernel fabsock; do
	run "$mode"
done
fs_log "connection per request, $CLIENTS clients x $COUNT: kernel ${RATE[kernel]:-?} conn/s, fabsock ${RATE[fabsock]:-?} conn/s"
fs_done
