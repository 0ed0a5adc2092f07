#!/bin/bash
# SPDX-License-Identifier: MIT
# What idle offloaded connections cost: fs_idle server and client hold 8
# connections open after a 16-byte exchange each and then sit idle, either
# with one thread per connection blocked in recv() or with one thread in
# epoll_wait(). Each process's CPU time (utime + stime from /proc/PID/stat)
# is measured over 10 s of the idle phase, on the kernel and with both
# under the preload (where the stats lines must show the 8 connections
# offloaded on both ends, or the measurement says nothing about the fabric),
# the four pairs idle side by side, each measured in its own idle phase.
# Each process must stay below IDLE_LIMIT_PCT (1 %, the target) of one core.
# Under fabsock the doorbell (core/bell.h) must have been used: every
# connection armed on both ends, and a ring received by both ends for the
# 'q' exchange that ends the idle phase, which must take less than
# WAKE_LIMIT_MS: well under the 250 ms safety slice of an armed sleeper, so
# a ring that never arrived shows.

. "$(dirname "$0")/lib.sh"

IDLE="$FS_PROGS/fs_idle"
[ -x "$IDLE" ] || fs_skip "no $IDLE (tests/progs/fs_idle.c not built)"
[ -f "$FABSOCK_LIB" ] || fs_skip "no library at $FABSOCK_LIB"

CONNS=8
WINDOW=10          # seconds measured
IDLE_S=$((WINDOW + 6)) # 1 s to settle, the window, and room for a loaded machine
IDLE_LIMIT_PCT=1
WAKE_LIMIT_MS=100
TICKS=$(getconf CLK_TCK)

# CPU ticks (utime + stime) of PID; the comm field may hold spaces.
cpu_ticks() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo -1; return; }
	stat=${stat##*) }
	# fields after "pid (comm) ": state is 1st, utime 12th, stime 13th
	awk '{ print $12 + $13 }' <<<"$stat"
}

declare -A RESULT


# The pairs (kernel and fabsock, recv and epoll) sit idle side by side: an
# idle process's CPU time is its own, and the four idle phases one after
# the other took 4 x 15 s. Each pair is measured in its own idle phase, as
# when they ran alone (a measurer in the background, from 1 s after the
# client is idle, over WINDOW), and fails when its window closed after its
# idle phase could have ended (the figure would include the 'q' exchange).
declare -A SRV CLI SPID CPID MEASURER IDLE_END_MS
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# measure SPID CPID FILE: writes "S0 C0 S1 C1 END_MS" into FILE.
measure() {
	local s0 c0 s1 c1
	sleep 1 # let the hello exchange and any lingering work settle
	s0=$(cpu_ticks "$1") c0=$(cpu_ticks "$2")
	sleep "$WINDOW"
	s1=$(cpu_ticks "$1") c1=$(cpu_ticks "$2")
	echo "$s0 $c0 $s1 $c1 $(now_ms)" >"$3"
}

# idle_start MODE IOMODE: starts the pair, and its measurer once it is idle.
idle_start() {
	local mode=$1 io=$2 what="$1 $2" key="$1-$2" srv cli port log pre=()
	log="$FS_TMP/$mode-$io"
	pre=(env -u LD_PRELOAD)
	[ "$mode" = fabsock ] && pre=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	rm -f "$log.ready"

	fs_bg srv timeout -k 2 $((IDLE_S + 30)) "${pre[@]}" "$IDLE" server --ready-file "$log.ready" \
		--mode "$io" --conns "$CONNS" >"$log-server.out" 2>"$log-server.err"
	for _ in $(seq 1 200); do [ -s "$log.ready" ] && break; fs_sleep 0.05; done
	if ! port=$(cat "$log.ready" 2>/dev/null) || [ -z "$port" ]; then
		fs_fail "$what: fs_idle server not ready"
		return
	fi
	# The client prints "idle" and then sleeps IDLE_S before its 'q': it
	# printed after the last look that did not find the line (before_ms),
	# so its idle phase ends after before_ms + IDLE_S.
	local before_ms t
	before_ms=$(now_ms)
	fs_bg cli timeout -k 2 $((IDLE_S + 30)) "${pre[@]}" "$IDLE" client 127.0.0.1 "$port" \
		--mode "$io" --conns "$CONNS" --idle-s "$IDLE_S" >"$log-client.out" 2>"$log-client.err"
	for _ in $(seq 1 200); do
		t=$(now_ms)
		grep -q idle "$log-client.out" 2>/dev/null && break
		before_ms=$t
		fs_sleep 0.05
	done
	IDLE_END_MS[$key]=$((before_ms + IDLE_S * 1000))
	if ! grep -q idle "$log-client.out"; then
		fs_fail "$what: the client did not reach the idle phase in 10 s"
		cat "$log-client.err" "$log-server.err" | sed 's/^/    /' >&2
		return
	fi
	# fs_bg ran timeout(1): the program is its child.
	local spid cpid measurer
	spid=$(pgrep -P "$srv" -x fs_idle | head -1)
	cpid=$(pgrep -P "$cli" -x fs_idle | head -1)
	if [ -z "$spid" ] || [ -z "$cpid" ]; then
		fs_fail "$what: cannot find the fs_idle processes"
		return
	fi
	fs_bg measurer measure "$spid" "$cpid" "$log.ticks"
	SRV[$key]=$srv CLI[$key]=$cli MEASURER[$key]=$measurer CPID[$key]=$cpid
}

# idle_judge MODE IOMODE: waits for the pair's end; sets RESULT[MODE-IOMODE].
idle_judge() {
	local mode=$1 io=$2 what="$1 $2" key="$1-$2" log rc=0 src=0 s0 c0 s1 c1 end_ms
	log="$FS_TMP/$mode-$io"
	[ -n "${CLI[$key]:-}" ] || return 0 # its start failed (and said so)
	fs_wait_pid "${MEASURER[$key]}" $((WINDOW + 20)) || true
	read -r s0 c0 s1 c1 end_ms <"$log.ticks" || { s0=-1 c0=-1 s1=-1 c1=-1 end_ms=0; }
	if [ "$end_ms" -ge "${IDLE_END_MS[$key]}" ]; then
		fs_fail "$what: the window closed $((end_ms - IDLE_END_MS[$key] + 1)) ms after the pair's idle phase could have ended"
	fi
	# the window has closed: the client ends its idle phase now (fs_idle,
	# SIGUSR1) rather than after the rest of IDLE_S, which is room for a
	# late window on a loaded machine and measured nothing
	kill -USR1 "${CPID[$key]}" 2>/dev/null || true
	fs_wait_pid "${CLI[$key]}" $((IDLE_S + 20)) || rc=$?
	fs_wait_pid "${SRV[$key]}" 15 || src=$?
	if [ "$rc" -ne 0 ] || [ "$src" -ne 0 ] || [ "$s0" -lt 0 ] || [ "$s1" -lt 0 ] || [ "$c1" -lt 0 ]; then
		fs_fail "$what: client exit $rc, server exit $src (or a process ended during the idle window)"
		grep -hv ': stats:' "$log-client.err" "$log-server.err" | tail -n 6 | sed 's/^/    /' >&2 || true
		return
	fi
	local sp cp
	sp=$(awk -v d=$((s1 - s0)) -v t="$TICKS" -v w="$WINDOW" 'BEGIN { printf "%.2f", 100 * d / t / w }')
	cp=$(awk -v d=$((c1 - c0)) -v t="$TICKS" -v w="$WINDOW" 'BEGIN { printf "%.2f", 100 * d / t / w }')
	local wake
	wake=$(sed -n 's/^wake_ms //p' "$log-client.out")
	RESULT[$mode-$io]="server $sp% client $cp%, first message after idle ${wake:-?} ms"
	fs_log "$what: idle cpu over ${WINDOW}s with $CONNS connections: server $sp% client $cp% of one core"
	if [ "$mode" = fabsock ]; then
		local so co
		so=$(fs_stat "$log-server.err" offloaded)
		co=$(fs_stat "$log-client.err" offloaded)
		if [ "${so:-0}" -ge "$CONNS" ] && [ "${co:-0}" -ge "$CONNS" ]; then
			fs_pass "$what: all $CONNS connections offloaded on both ends (server $so, client $co)"
		else
			fs_fail "$what: offloaded server=${so:-no stats line} client=${co:-no stats line} (need $CONNS each)"
		fi
		# Both ends armed every connection. The client's 'q' rang the
		# sleeping server; the client itself may see the echo by polling
		# (it has just been active) and exit before its own ring is read.
		local side file arms rung need
		for side in server client; do
			file="$log-$side.err"
			arms=$(fs_stat "$file" bell_arms)
			if [ "$side" = server ]; then need=bell_rings_received; else need=bell_rings_sent; fi
			rung=$(fs_stat "$file" "$need")
			if [ "${arms:-0}" -ge "$CONNS" ] && [ "${rung:-0}" -ge 1 ]; then
				fs_pass "$what: $side armed its $CONNS connections ($arms arms), $need=$rung"
			else
				fs_fail "$what: $side doorbell: bell_arms=${arms:-none} (need $CONNS) $need=${rung:-none} (need 1)"
			fi
		done
		if [ -n "$wake" ] && awk -v w="$wake" -v l="$WAKE_LIMIT_MS" 'BEGIN { exit !(w < l) }'; then
			fs_pass "$what: the first message after the idle phase took $wake ms (limit $WAKE_LIMIT_MS)"
		else
			fs_fail "$what: the first message after the idle phase took ${wake:-no wake_ms line} ms (limit $WAKE_LIMIT_MS)"
		fi
	fi
	if awk -v s="$sp" -v c="$cp" -v l="$IDLE_LIMIT_PCT" 'BEGIN { exit !(s < l && c < l) }'; then
		fs_pass "$what: idle CPU below $IDLE_LIMIT_PCT% (server $sp%, client $cp%)"
	else
		fs_fail "$what: idle CPU server $sp% client $cp% (limit $IDLE_LIMIT_PCT% of one core each; target 1%)"
	fi
}

for io in recv epoll; do
	for mode in $FS_MODES; do
		idle_start "$mode" "$io"
	done
done
for io in recv epoll; do
	for mode in $FS_MODES; do
		idle_judge "$mode" "$io"
	done
done
for io in recv epoll; do
	fs_log "idle cpu ($io, $CONNS connections): kernel: ${RESULT[kernel-$io]:-n/a} | fabsock: ${RESULT[fabsock-$io]:-n/a}"
done
fs_done
