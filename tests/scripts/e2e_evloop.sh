#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Event-loop semantics with fs_evloop: nonblocking sockets, nonblocking
# connect and accept, epoll (level-triggered, EPOLLET, EPOLLONESHOT, RDHUP,
# several and nested sets, closing a registered fd), poll/select timeouts,
# EINTR and the sigmask variants, epoll_pwait2. Every scenario (see
# `fs_evloop list`) runs once in mode "kernel" and once with both ends under
# the preload ("fabsock"), with the same expectations. A run starts the
# server on a free port, waits until it listens, starts the client, and
# passes when both exit 0 (each bounded in time), each prints `PASS
# <scenario>` and no FAIL line; in fabsock mode each process's exit stats
# line (`fabsock[PID]: warn: stats: offloaded=N ...`) must also show N equal
# to the `connections=N` it reports - except in nb_connect_refused, which
# makes no connection (its stats are only logged) - and the TCP segments on
# the server's port (nftables) must have carried no more than the
# handshakes (lib.sh, fs_tcp_proof). The kernel half runs beside the
# fabsock half, as a second instance of this script (lib.sh,
# fs_kernel_beside_start; FS_KERNEL_BESIDE=0: one after the other; its
# summary follows this one's), and each half runs half of its scenarios in
# a further instance beside (fs_split_beside; FS_SPLIT=0: not). A mode
# stops starting scenarios after 240 s (each left out counts as a
# failure), so the script stays under ~4 minutes per mode even when
# processes hang until their bounds. FS_MODES (default "kernel fabsock") picks the modes; FS_SCENARIOS
# narrows the scenario list. A summary table ends the output.
. "$(dirname "$0")/lib.sh"
fs_need_nft

FS_MODES=${FS_MODES:-kernel fabsock}
EVLOOP_PROG=$FS_PROGS/fs_evloop
# Scenarios that open no connection: the offloaded count is not checked.
NO_CONNECTION_SCENARIOS=" nb_connect_refused "
# scenarios whose connections stay on kernel TCP under fabsock too (their
# clients by a rule): offloaded=0 expected, and TCP carries their bytes
TCP_SCENARIOS=" close_forked added_before_connect "
CLIENT_LIMIT_S=50
SERVER_LIMIT_S=15
MODE_BUDGET_S=240
SUMMARY=()

mode_wanted() { [[ " $FS_MODES " == *" $1 "* ]]; }

# read_side DIR SIDE SCENARIO: what one process printed, read in the shell
# (a sed or grep per field was a process each, 2 cores, 38 scenarios, 3
# builds): SIDE_PASS (1: its `PASS SCENARIO` line), SIDE_FAILS (its FAIL
# lines), SIDE_CONNECTIONS, SIDE_CHILDREN (`child-pid` lines), SIDE_INFO
# (`info` lines), and SIDE_STATS, its last fabsock stats line (one sed).
read_side() {
	local line
	SIDE_PASS=0 SIDE_FAILS=() SIDE_CONNECTIONS= SIDE_CHILDREN=() SIDE_INFO=()
	if [ -f "$1/$2.out" ]; then
		while IFS= read -r line || [ -n "$line" ]; do
			case $line in
			"PASS $3") SIDE_PASS=1 ;;
			FAIL*) SIDE_FAILS+=("$line") ;;
			connections=*) SIDE_CONNECTIONS=${line#connections=} ;;
			"child-pid "*) SIDE_CHILDREN+=("${line#child-pid }") ;;
			info*) SIDE_INFO+=("$line") ;;
			esac
		done <"$1/$2.out"
	fi
	SIDE_STATS=$(sed -n '/^.*: stats: /h; ${x; s/^.*: stats: / /p}' "$1/$2.err" 2>/dev/null || true)
}
# side_stat NAME: counter NAME of SIDE_STATS (fs_stat's answer, no process).
side_stat() {
	local re=" $1=([0-9]+)"
	[[ $SIDE_STATS =~ $re ]] && echo "${BASH_REMATCH[1]}" || true
}

# Judges one process of a scenario from its exit code and output; leaves
# `connections=C offloaded=N` of it, for the summary (N is - without a
# stats line), in SIDE_SUMMARY.
check_side() { # LABEL SIDE SCENARIO MODE RC DIR
	local label=$1 side=$2 scenario=$3 mode=$4 rc=$5 dir=$6 connections offloaded
	read_side "$dir" "$side" "$scenario"
	connections=$SIDE_CONNECTIONS
	offloaded=$(side_stat offloaded)
	SIDE_SUMMARY="connections=${connections:-?} offloaded=${offloaded:--}"
	if [ "$rc" -ne 0 ] || [ "$SIDE_PASS" != 1 ] || [ "${#SIDE_FAILS[@]}" != 0 ]; then
		fs_fail "$label: $side exit $rc: $(printf '%s ' "${SIDE_FAILS[@]:0:3}")"
		tail -n 5 "$dir/$side.err" >&2 || true
		return 0
	fi
	[ "$mode" = fabsock ] || return 0
	if [[ "$NO_CONNECTION_SCENARIOS" == *" $scenario "* ]]; then
		fs_log "$label: $side connections=${connections:-?} offloaded=${offloaded:-none} (not checked)"
	elif [ -z "$offloaded" ]; then
		fs_fail "$label: $side printed no 'fabsock[PID]: warn: stats: offloaded=N' line"
	elif [ "${FS_EVLOOP_REQUIRE_OFFLOAD:-1}" = 0 ] || [[ "$TCP_SCENARIOS" == *" $scenario "* ]]; then
		# FS_EVLOOP_REQUIRE_OFFLOAD=0: a build whose event-loop sockets
		# must stay on TCP (e.g. bisecting): check that none was offloaded.
		if [ "$offloaded" != 0 ]; then
			fs_fail "$label: $side stats offloaded=$offloaded, expected 0 while event loops stay on TCP"
		fi
	elif [ "$offloaded" != "$connections" ]; then
		fs_fail "$label: $side stats offloaded=$offloaded, expected $connections (its connections)"
		fs_why_tcp "$side" "$dir/$side.err"
	fi
	# epoll's safety scan found no member ready whose stream had not told
	# of its change (core/epoll_wait.c: every change goes through the
	# ready list)
	local unsignalled
	unsignalled=$(side_stat epoll_unsignalled)
	[ "${unsignalled:-0}" = 0 ] || fs_fail "$label: $side stats epoll_unsignalled=$unsignalled, expected 0"
	# the waiter slept in the one kernel call of a set with no member
	# (EPOLL_BARE) and was woken by the member another thread added
	if [ "$mode" = fabsock ] && [ "$scenario" = member_added_while_bare ] && [ "$side" = client ]; then
		local woken
		woken=$(side_stat epoll_bare_woken)
		[ "${woken:-0}" -ge 1 ] || fs_fail "$label: client stats epoll_bare_woken=${woken:-none}, expected >= 1"
	fi
	# the server's epoll_wait with its plain client's accepted socket in
	# it, before the first read, waited in one kernel call (EPOLL_BARE:
	# every member waits for its client's first bytes)
	# (not under the sanitizers: a pending member's probes are drained
	# once it has waited FS_DRAIN_AFTER_NS, 2 ms, which TSan's 5-15x slower
	# server passes before its first epoll_wait; the library of d3ebe5c
	# failed it so on the AMD EPYC VM as the present one does, 2 runs of
	# 2; ASan's server did once in four CI rehearsals there)
	if [ "$mode" = fabsock ] && [ "$scenario" = close_forked ] && [ "$side" = server ] &&
		[ "${FABSOCK_EPOLL_BARE:-1}" != 0 ] && [ -z "${TSAN_OPTIONS:-}${ASAN_OPTIONS:-}" ]; then
		local pending
		pending=$(side_stat epoll_bare_pending)
		[ "${pending:-0}" -ge 1 ] || fs_fail "$label: server stats epoll_bare_pending=${pending:-none}, expected >= 1"
	fi
	# the client's socket, in its epoll set before connect() sent it to
	# TCP, was let go of at the first wait, which was one kernel call
	# (EPOLL_BARE, counted as pending: the set had that member), not
	# fabsock's rounds; the later ones, with no member left, are too
	if [ "$mode" = fabsock ] && [ "$scenario" = added_before_connect ] && [ "$side" = client ] &&
		[ "${FABSOCK_EPOLL_BARE:-1}" != 0 ]; then
		local bare
		bare=$(side_stat epoll_bare_pending)
		[ "${bare:-0}" -ge 1 ] || fs_fail "$label: client stats epoll_bare_pending=${bare:-none}, expected >= 1 (its first wait)"
	fi
	# its first read did not look for the connection's probe record: no
	# record of the listener's said yes (fs_listener_yes_none)
	if [ "$mode" = fabsock ] && [ "$scenario" = close_forked ] && [ "$side" = server ]; then
		local skipped
		skipped=$(side_stat probe_lookups_skipped)
		[ "${skipped:-0}" -ge 1 ] || fs_fail "$label: server stats probe_lookups_skipped=${skipped:-none}, expected >= 1"
		# nor wrote one as TCP (none to forget at its close)
		skipped=$(side_stat probe_claims_skipped)
		[ "${skipped:-0}" -ge 1 ] || fs_fail "$label: server stats probe_claims_skipped=${skipped:-none}, expected >= 1"
	fi
	# the server's epoll_wait with a pending member whose probe comes late
	# (no service thread answers here): when it waited in one kernel call
	# (it does unless the wait began past the time the probes are due its
	# help, FS_DRAIN_AFTER_NS after the accept), it woke from it then and
	# answered the probe in its rounds (the scenario checks the offload)
	if [ "$mode" = fabsock ] && [ "$scenario" = probes_by_epoll ] && [ "$side" = server ]; then
		local bp bc
		bp=$(side_stat epoll_bare_pending)
		bc=$(side_stat epoll_bare_cut)
		fs_log "$label: server epoll_bare_pending=${bp:-none} epoll_bare_cut=${bc:-none}"
		[ "${bp:-0}" = 0 ] || [ "${bc:-0}" -ge 1 ] ||
			fs_fail "$label: server stats epoll_bare_pending=$bp epoll_bare_cut=${bc:-none}, expected a cut wait"
	fi
	return 0
}

run_scenario() { # MODE SCENARIO
	local mode=$1 scenario=$2 label="$2-$1" dir=$FS_TMP/$2-$1 port server_pid client_pid
	local server_rc=0 client_rc=0 fails_before=$FS_FAILS start_ns verdict
	local -a prefix=()
	# nb_send_full, epollout_after_drain and accept4_flags have the server
	# write first: it waits FIRST_SEND_WAIT_MS for the client's probe, and
	# on a loaded machine (sanitizers, two cores) 5 ms is not always enough;
	# these scenarios test the event loop on offloaded sockets, not that race
	[ "$mode" = fabsock ] && prefix=(fs_pre env FABSOCK_FIRST_SEND_WAIT_MS=500)
	# the probe must arrive after the server closed its listening socket
	[ "$mode" = fabsock ] && [ "$scenario" = listener_closed_first ] && prefix+=(FABSOCK_TEST_PROBE_DELAY_MS=150)
	# the service thread answers no probe, and the probe comes after the
	# accept: the server's poll or epoll_wait must answer it
	case "$mode:$scenario" in fabsock:probes_by_*)
		prefix+=(FABSOCK_TEST_SERVICE_PROBES=0 FABSOCK_TEST_PROBE_DELAY_MS=100) ;;
	esac
	# the writer's process ends before its reader reads: its linger (1 s)
	# runs out before the server's 2.5 s wait
	[ "$mode" = fabsock ] && [ "$scenario" = late_reader_exit_big ] && prefix+=(FABSOCK_LINGER_SEC=1)
	# its first wait sleeps deeply (every stream armed after 100 ms of
	# quiet) with a spin as short as a sleepy engine's, and must ask the
	# kernel when the epoll instance itself wakes it
	[ "$mode" = fabsock ] && [ "$scenario" = mixed_set ] && prefix+=(FABSOCK_IDLE_AFTER_MS=100 FABSOCK_SPIN_US=5)
	# the client stays on TCP (no probe): the server's socket settles plain
	[ "$mode" = fabsock ] && [ "$scenario" = close_forked ] && prefix+=("FABSOCK_RULES=kernel client 127.0.0.1")
	# so does this one, decided at its connect(), after its epoll_ctl
	[ "$mode" = fabsock ] && [ "$scenario" = added_before_connect ] && prefix+=("FABSOCK_RULES=kernel client 127.0.0.1")
	mkdir -p "$dir"
	start_ns=${EPOCHREALTIME/./}

	if ! port=$(fs_free_port); then
		fs_fail "$label: no free port"
		SUMMARY+=("$(printf '%-8s %-22s FAIL (no free port)' "$mode" "$scenario")")
		return 0
	fi
	fs_bg server_pid "${prefix[@]}" "$EVLOOP_PROG" server "$port" "$scenario" >"$dir/server.out" 2>"$dir/server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$label: the server did not listen on port $port within 10 s"
		cat "$dir/server.out" "$dir/server.err" >&2 || true
		fs_wait_pid "$server_pid" 1 || true
		SUMMARY+=("$(printf '%-8s %-22s FAIL (server did not listen)' "$mode" "$scenario")")
		return 0
	fi
	if [ "$scenario" = accept4_flags ]; then
		# no connection may be pending before the server's EAGAIN checks
		fs_wait_line "$dir/server.out" '^accept-checked' "$server_pid" || true
	fi
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	fs_bg client_pid "${prefix[@]}" "$EVLOOP_PROG" client 127.0.0.1 "$port" "$scenario" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$client_pid" "$CLIENT_LIMIT_S" || client_rc=$?
	fs_wait_pid "$server_pid" "$SERVER_LIMIT_S" || server_rc=$?
	local server_connections server_summary info=()
	check_side "$label" server "$scenario" "$mode" "$server_rc" "$dir"
	server_connections=$SIDE_CONNECTIONS server_summary=$SIDE_SUMMARY info=("${SIDE_INFO[@]}")
	check_side "$label" client "$scenario" "$mode" "$client_rc" "$dir"
	info+=("${SIDE_INFO[@]}")
	# a killed child's leftovers (its shm region) go with the test's own
	FS_PIDS+=("${SIDE_CHILDREN[@]}")
	if [[ "$TCP_SCENARIOS" == *" $scenario "* ]]; then
		fs_tcp_proof "$label" kernel "$server_connections" # (on TCP by design)
	else
		fs_tcp_proof "$label" "$mode" "$server_connections"
	fi
	# every re-add after the first round took the parked member back, no
	# kernel epoll_ctl (core/epoll.c)
	# the writer's queue got its credit from a CLOSING, not from the reader
	if [ "$mode" = fabsock ] && [ "$scenario" = late_reader_exit_big ]; then
		local taken
		taken=$(fs_stat "$dir/server.err" closing_taken)
		[ "${taken:-0}" -ge 1 ] || fs_fail "$label: server stats closing_taken=${taken:-none}, expected >= 1"
	fi
	if [ "$mode" = fabsock ] && [ "$scenario" = readd ]; then
		local readds
		readds=$(fs_stat "$dir/client.err" epoll_readds)
		[ "${readds:-0}" -ge 300 ] || fs_fail "$label: client stats epoll_readds=${readds:-none}, expected >= 300"
	fi
	[ "${#info[@]}" = 0 ] || printf '    %s\n' "${info[@]}" >&2
	verdict=FAIL
	[ "$FS_FAILS" -eq "$fails_before" ] && { fs_pass "$label"; verdict=ok; }
	local line
	printf -v line '%-8s %-22s %-4s %6d ms  server %s  client %s' "$mode" "$scenario" "$verdict" \
		$(((${EPOCHREALTIME/./} - start_ns) / 1000)) "$server_summary" "$SIDE_SUMMARY"
	SUMMARY+=("$line")
	return 0
}

[ -x "$EVLOOP_PROG" ] || { fs_fail "$EVLOOP_PROG is not built"; fs_done; exit 1; }
scenarios=${FS_SCENARIOS:-$("$EVLOOP_PROG" list | tr '\n' ' ')}
# the kernel half shares nothing with the fabsock half (lib.sh), and each
# half shares its scenarios with a second instance beside (fs_split_beside:
# most of a scenario's time is its programs' sleeps)
fs_kernel_beside_start
fs_split_beside $scenarios
scenarios=$FS_SPLIT_MINE
for mode in kernel fabsock; do
	mode_wanted "$mode" || continue
	if [ "$mode" = fabsock ] && [ ! -f "$FABSOCK_LIB" ]; then
		fs_fail "fabsock mode: $FABSOCK_LIB does not exist"
		continue
	fi
	mode_start=$SECONDS
	for scenario in $scenarios; do
		if [ $((SECONDS - mode_start)) -ge "$MODE_BUDGET_S" ]; then
			fs_fail "$scenario-$mode: not run, mode $mode used its ${MODE_BUDGET_S} s budget"
			SUMMARY+=("$(printf '%-8s %-22s FAIL (not run: mode budget used)' "$mode" "$scenario")")
			continue
		fi
		run_scenario "$mode" "$scenario"
	done
	fs_log "mode $mode took $((SECONDS - mode_start)) s"
done
echo "summary (mode, scenario, verdict, time, connections and offloaded count per side):"
printf '  %s\n' "${SUMMARY[@]}"
fs_kernel_beside_wait $((MODE_BUDGET_S + 120))
fs_done
