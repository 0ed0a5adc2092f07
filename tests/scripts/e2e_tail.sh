#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The end of a large response (issue 26) with fs_tail: a server's event
# loop writes 4 MiB in nonblocking writes and closes (close(), or
# syscall(SYS_close) as libuv does) while the end waits for a slow reader's
# credit, the process living on or ending at once; a reader that takes a
# short read after EPOLLRDHUP as the end (haproxy); a request followed by
# the client's SHUT_WR, and an upload to a server that shut its own writing
# side down first; a server that answers without reading, closes and ends
# before its client took its HELLO-ACK (answer_exit; answer_exit_lateack
# with the client's FABSOCK_TEST_ACK_DELAY_MS=300, so that the server is
# always gone first: its client must count peers_ended_at_join=1). Every scenario (`fs_tail list`) runs in mode "kernel"
# and with both ends under the preload ("fabsock"), with the same
# expectations: both sides exit 0 and print `PASS <scenario>` (the bytes
# checked against the pattern, then EOF). In fabsock mode each process's
# stats line must show offloaded equal to its `connections=N`, no reset
# (`resets=0`) and no message dropped (`msgs_dropped=0`), and the TCP
# segments on the port must have carried only the handshakes (fs_tcp_proof).
# FS_MODES (default "kernel fabsock") and FS_SCENARIOS narrow the runs;
# FS_TAIL_ROUNDS (1) repeats the whole list. The kernel half runs beside
# the fabsock half, as a second instance of this script (lib.sh,
# fs_kernel_beside_start; FS_KERNEL_BESIDE=0: one after the other): it runs
# none of fabsock's code and its scenarios mostly sleep in the slow
# reader's pauses; its output follows at the end.
. "$(dirname "$0")/lib.sh"
fs_need_nft

FS_MODES=${FS_MODES:-kernel fabsock}
TAIL_PROG=$FS_PROGS/fs_tail
ROUNDS=${FS_TAIL_ROUNDS:-1}
CLIENT_LIMIT_S=70
SERVER_LIMIT_S=15

check_side() { # LABEL SIDE SCENARIO MODE RC DIR
	local label=$1 side=$2 scenario=$3 mode=$4 rc=$5 dir=$6 connections offloaded counter v
	if [ "$rc" -ne 0 ] || ! grep -qx "PASS $scenario" "$dir/$side.out" || grep -q '^FAIL' "$dir/$side.out"; then
		fs_fail "$label: $side exit $rc: $(grep -h '^FAIL' "$dir/$side.out" | head -n 3 | tr '\n' ' ')"
		grep -v ': stats:' "$dir/$side.err" | tail -n 5 >&2 || true
		return 0
	fi
	[ "$mode" = fabsock ] || return 0
	connections=$(sed -n 's/^connections=//p' "$dir/$side.out")
	offloaded=$(fs_stat "$dir/$side.err" offloaded)
	if [ -z "$offloaded" ]; then
		fs_fail "$label: $side printed no 'fabsock[PID]: warn: stats: offloaded=N' line"
	elif [ "$offloaded" != "$connections" ]; then
		fs_fail "$label: $side stats offloaded=$offloaded, expected $connections (its connections)"
		fs_why_tcp "$side" "$dir/$side.err"
	fi
	for counter in resets msgs_dropped; do
		v=$(fs_stat "$dir/$side.err" "$counter")
		[ "${v:-0}" = 0 ] || fs_fail "$label: $side stats $counter=$v, expected 0"
	done
	return 0
}

run_scenario() { # MODE SCENARIO
	local mode=$1 scenario=$2 label="$2-$1" dir=$FS_TMP/$2-$1 port server_pid client_pid
	local server_rc=0 client_rc=0 fails_before=$FS_FAILS
	local -a prefix=() client_prefix=()
	[ "$mode" = fabsock ] && prefix=(fs_pre)
	client_prefix=("${prefix[@]}")
	[ "$mode" = fabsock ] && [ "${scenario%_lateack}" != "$scenario" ] &&
		client_prefix=(fs_pre env FABSOCK_TEST_ACK_DELAY_MS=300)
	mkdir -p "$dir"
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return 0; }
	fs_bg server_pid "${prefix[@]}" "$TAIL_PROG" server "$port" "$scenario" >"$dir/server.out" 2>"$dir/server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$label: the server did not listen on port $port within 10 s"
		cat "$dir/server.out" "$dir/server.err" >&2 || true
		fs_wait_pid "$server_pid" 1 || true
		return 0
	fi
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	fs_bg client_pid "${client_prefix[@]}" "$TAIL_PROG" client 127.0.0.1 "$port" "$scenario" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$client_pid" "$CLIENT_LIMIT_S" || client_rc=$?
	fs_wait_pid "$server_pid" "$SERVER_LIMIT_S" || server_rc=$?
	check_side "$label" server "$scenario" "$mode" "$server_rc" "$dir"
	check_side "$label" client "$scenario" "$mode" "$client_rc" "$dir"
	# The late ACK must have found the server gone: the path under test.
	if [ "${client_prefix[*]}" != "${prefix[*]}" ] &&
		[ "$(fs_stat "$dir/client.err" peers_ended_at_join)" != 1 ]; then
		fs_fail "$label: client stats peers_ended_at_join=$(fs_stat "$dir/client.err" peers_ended_at_join), expected 1 (the server ended before the client took its ACK)"
	fi
	fs_tcp_proof "$label" "$mode" "$(sed -n 's/^connections=//p' "$dir/server.out")"
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label"
	return 0
}

[ -x "$TAIL_PROG" ] || { fs_fail "$TAIL_PROG is not built"; fs_done; exit 1; }
scenarios=${FS_SCENARIOS:-$("$TAIL_PROG" list | tr '\n' ' ')}
fs_kernel_beside_start
for round in $(seq 1 "$ROUNDS"); do
	for mode in $FS_MODES; do
		if [ "$mode" = fabsock ] && [ ! -f "$FABSOCK_LIB" ]; then
			fs_fail "fabsock mode: $FABSOCK_LIB does not exist"
			continue
		fi
		for scenario in $scenarios; do
			run_scenario "$mode" "$scenario"
		done
	done
	[ "$ROUNDS" = 1 ] || fs_log "round $round of $ROUNDS: $FS_FAILS failures so far"
done
fs_kernel_beside_wait $((ROUNDS * 300))
fs_done
