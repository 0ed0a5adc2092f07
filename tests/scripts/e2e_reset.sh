#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A stream fabsock cannot carry on ends as the kernel's reset does (issue
# 26), with fs_reset, both ends under the preload on the real shm provider:
# - join_reset / join_reset_epoll: the client's join of the server's stream
#   after its HELLO-ACK fails (FABSOCK_TEST_JOIN_FAIL, each errno a join
#   can fail with: ENOSPC 28, EPERM 1, EPROTO 71, EIO 5 for a provider
#   error, EADDRNOTAVAIL 99 for an address vector insert). The server, on
#   the fabric, believes the connection offloaded. Before the fix the client
#   fell back to TCP and read a clean end of stream (or waited for ever for
#   an answer that had gone over the fabric). Both ends must read
#   ECONNRESET (fs_reset checks the errnos, the bytes before, EPIPE and
#   SIGPIPE after); the client must count resets_at_join=1, the server
#   offloaded=1 and resets=1; TCP must have carried no payload (the
#   client's request was dropped with the stream, not sent over TCP).
# - send_fail: both ends offloaded, the client's 4th data message fails on
#   the rail (FABSOCK_TEST_SEND_FAIL=4, as a provider's error completion):
#   its sends fail with ECONNRESET, and the server must read an intact
#   prefix of the upload and then ECONNRESET while the client still holds
#   the connection (before, the server learnt nothing until the client
#   closed). Both count resets=1.
# - recvonly_fork: a receive-only stream (its server ended before the client
#   took its HELLO-ACK: FABSOCK_TEST_ACK_DELAY_MS=300) read by a child the
#   client forked: the answer, then the end of stream, or a reset; never a
#   short clean end. The client must count peers_ended_at_join=1.
#   recvonly_exec and recvonly_fork_exec: the same stream, handed to a
#   program the client (or a child it forked) execs: it cannot go back to
#   TCP, and the new program must read a reset, not a clean end.
# Each run also fails on a process that died by a signal (its exit status).
# FS_RESET_ROUNDS (1) repeats the list; FS_RESET_CODES narrows the errnos.
# No kernel half: the faults are fabsock's own.
. "$(dirname "$0")/lib.sh"
fs_need_nft

RESET_PROG=$FS_PROGS/fs_reset
ROUNDS=${FS_RESET_ROUNDS:-1}
CODES=${FS_RESET_CODES:-28 1 71 5 99}
LIMIT_S=60

check_side() { # LABEL SIDE SCENARIO RC DIR NAME=VALUE...
	local label=$1 side=$2 scenario=$3 rc=$4 dir=$5 kv name want got
	shift 5
	if [ "$rc" -ne 0 ] || ! grep -qx "PASS $scenario" "$dir/$side.out" || grep -q '^FAIL' "$dir/$side.out"; then
		fs_fail "$label: $side exit $rc$( [ "$rc" -gt 128 ] && echo " (signal $((rc - 128)))"): $(grep -h '^FAIL' "$dir/$side.out" | head -n 3 | tr '\n' ' ')"
		grep -v ': stats:' "$dir/$side.err" | tail -n 5 >&2 || true
		return 0
	fi
	for kv in "$@"; do
		name=${kv%%=*} want=${kv#*=}
		got=$(fs_stat "$dir/$side.err" "$name")
		[ "${got:-0}" = "$want" ] || fs_fail "$label: $side stats $name=${got:-none}, expected $want"
	done
	return 0
}

run_one() { # SCENARIO CODE
	local scenario=$1 code=$2 label dir port server_pid client_pid server_rc=0 client_rc=0 fails_before=$FS_FAILS
	local -a client_env
	if [ "${scenario#recvonly}" != "$scenario" ]; then
		label=$scenario client_env=(FABSOCK_TEST_ACK_DELAY_MS=300)
	elif [ "$scenario" = send_fail ]; then
		label=$scenario client_env=(FABSOCK_TEST_SEND_FAIL=4)
	else
		label=$scenario-errno$code client_env=(FABSOCK_TEST_JOIN_FAIL="$code")
	fi
	dir=$FS_TMP/$label
	mkdir -p "$dir"
	export FS_RESET_FLAG=$dir/reset-read
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return 0; }
	fs_bg server_pid fs_pre "$RESET_PROG" server "$port" "$scenario" >"$dir/server.out" 2>"$dir/server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$label: the server did not listen on port $port within 10 s"
		fs_wait_pid "$server_pid" 1 || true
		return 0
	fi
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	fs_bg client_pid fs_pre env "${client_env[@]}" "$RESET_PROG" client 127.0.0.1 "$port" "$scenario" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$client_pid" "$LIMIT_S" || client_rc=$?
	fs_wait_pid "$server_pid" "$LIMIT_S" || server_rc=$?
	if [ "${scenario#recvonly}" != "$scenario" ]; then
		check_side "$label" server "$scenario" "$server_rc" "$dir" offloaded=1
		check_side "$label" client "$scenario" "$client_rc" "$dir" msgs_dropped=0
		# (summed: a forked child prints its own line; a process that
		# execs prints none, but says why it resets)
		if [ "$scenario" = recvonly_exec ]; then
			grep -q ': warn: stream [0-9]*: cannot go back to TCP as its socket leaves this program' "$dir/client.err" ||
				fs_fail "$label: the client did not log the reset before its exec (the path under test did not run)"
		elif [ "$(fs_stat_sum "$dir/client.err" peers_ended_at_join)" != 1 ]; then
			fs_fail "$label: client stats peers_ended_at_join=$(fs_stat_sum "$dir/client.err" peers_ended_at_join), expected 1 (the path under test did not run)"
		fi
	else
		if [ "$scenario" = send_fail ]; then
			check_side "$label" server "$scenario" "$server_rc" "$dir" offloaded=1 resets=1
			check_side "$label" client "$scenario" "$client_rc" "$dir" offloaded=1 resets=1
		else
			check_side "$label" server "$scenario" "$server_rc" "$dir" offloaded=1 resets=1
			check_side "$label" client "$scenario" "$client_rc" "$dir" offloaded=0 resets_at_join=1
		fi
	fi
	fs_tcp_proof "$label" fabsock "$(sed -n 's/^connections=//p' "$dir/server.out")"
	if [ "$FS_FAILS" -eq "$fails_before" ]; then
		fs_pass "$label ($(grep -h '^info' "$dir/client.out" "$dir/server.out" | tr '\n' ' '))"
	fi
	return 0
}

[ -x "$RESET_PROG" ] || { fs_fail "$RESET_PROG is not built"; fs_done; exit 1; }
[ -f "$FABSOCK_LIB" ] || { fs_fail "$FABSOCK_LIB does not exist"; fs_done; exit 1; }
for round in $(seq 1 "$ROUNDS"); do
	for code in $CODES; do
		run_one join_reset "$code"
	done
	for code in $CODES; do
		run_one join_reset_epoll "$code"
	done
	for scenario in send_fail recvonly_fork recvonly_exec recvonly_fork_exec; do
		run_one "$scenario" 0
	done
	[ "$ROUNDS" = 1 ] || fs_log "round $round of $ROUNDS: $FS_FAILS failures so far"
done
fs_done
