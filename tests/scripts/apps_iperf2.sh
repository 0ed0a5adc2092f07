#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: the real iperf version 2 (Debian's `iperf` package), server and
# client on loopback, 128 KiB blocking writes and reads (iperf 2's default
# I/O), one stream and then -P 2, first on the kernel and then with both ends
# under the preload. In fabsock mode the run must succeed with a plausible
# bandwidth AND be shown to have used the fabric:
#   - both processes print "stats: offloaded=N" at exit with N >= 1;
#   - `ss -tin` sampled on the test port while the client runs shows every
#     TCP connection received < 64 KiB while iperf moved MiBs.
# The same sampling in kernel mode must show MiBs on the connections, which
# proves the check can fail.

. "$(dirname "$0")/lib.sh"

command -v iperf >/dev/null 2>&1 || fs_skip "iperf (version 2) is not installed (apt-get install iperf)"
case $(iperf -v 2>&1 </dev/null || true) in
*"iperf version 2"*) ;;
*) fs_skip "'iperf' is not iperf version 2" ;;
esac
command -v ss >/dev/null 2>&1 || fs_skip "ss is not installed (apt-get install iproute2)"
command -v timeout >/dev/null 2>&1 || fs_skip "timeout is missing"
[ -f "$FABSOCK_LIB" ] || fs_skip "no library at $FABSOCK_LIB"

DURATION=3
SS_LIMIT=65536       # fabsock mode: most bytes one TCP connection may receive
MIN_MOVED=$((16 << 20)) # the program must have moved at least this much

# Programs run as: fs_bg PID timeout ... env VARS program. The env(1) applies
# the same settings as fs_pre (lib.sh) but after timeout(1), so only the
# application is preloaded (timeout itself prints no stats line), and the pid
# fs_bg records is timeout's: SIGINT to it reaches the program, which then
# exits through exit() and the library prints its counters; timeout runs in
# its own process group, which apps_cleanup kills if anything is left.
apps_env() {
	case $1 in
	kernel) APP_ENV=(env -u LD_PRELOAD) ;;
	fabsock) APP_ENV=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1) ;;
	esac
}

apps_cleanup() {
	local pid
	for pid in "${FS_PIDS[@]:-}"; do
		[ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null || true
	done
	fs_cleanup
}
trap apps_cleanup EXIT

# Stops a background program politely (SIGINT), by force after 15 s.
apps_stop() {
	local pid=$1 i
	kill -INT "$pid" 2>/dev/null || true
	for i in $(seq 1 300); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null; then
		fs_log "pid $pid ignored SIGINT for 15 s: killed"
		kill -KILL -- "-$pid" 2>/dev/null || true
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

# Prints "CONNECTIONS MAX_BYTES_RECEIVED" for the established TCP connections
# on PORT (either end). ss omits bytes_received when it is 0.
apps_ss_sample() {
	ss -Htin state established "( sport = :$1 or dport = :$1 )" 2>/dev/null | awk '
		/^[^ \t]/ { n++; next }
		match($0, /bytes_received:[0-9]+/) {
			v = substr($0, RSTART + 15, RLENGTH - 15) + 0
			if (v > max) max = v
		}
		END { printf "%d %.0f\n", n, max }'
}

# Samples `ss -tin` on PORT every 0.5 s while PID runs (a single sample
# taken at a fixed time could land before the data starts); sets SS_CONNS and SS_RXMAX to the largest seen.
apps_sample_while() {
	local pid=$1 port=$2 c r
	SS_CONNS=0 SS_RXMAX=0
	for _ in $(seq 1 $(((DURATION + 40) * 2))); do
		sleep 0.5
		kill -0 "$pid" 2>/dev/null || break
		read -r c r < <(apps_ss_sample "$port")
		[ "$c" -gt "$SS_CONNS" ] && SS_CONNS=$c
		[ "$r" -gt "$SS_RXMAX" ] && SS_RXMAX=$r
	done
	return 0
}

# Highest offloaded=N among the stats lines of a log ("" if none).
apps_offloaded() {
	sed -n 's/.*fabsock\[[0-9]*\]: [a-z]*: stats:.*offloaded=\([0-9][0-9]*\).*/\1/p' "$1" |
		sort -n | tail -1
}

# Checks what only holds when the bytes went over the fabric (fabsock) or
# over the kernel (kernel mode): stats lines and the ss sample.
apps_check_path() {
	local mode=$1 what=$2 srv_err=$3 cli_err=$4 conns=$5 rxmax=$6 moved=$7 s c
	if [ "$moved" -lt "$MIN_MOVED" ]; then
		fs_fail "$mode $what: iperf moved only $moved bytes (< $MIN_MOVED), too little to judge the path"
		return
	fi
	if [ "$conns" -lt 1 ]; then
		fs_fail "$mode $what: ss saw no TCP connection on the port during the run"
		return
	fi
	if [ "$mode" = kernel ]; then
		if [ "$rxmax" -ge "$SS_LIMIT" ]; then
			fs_pass "kernel $what: ss during the run shows the bytes on TCP ($rxmax bytes received)"
		else
			fs_fail "kernel $what: ss during the run shows only $rxmax bytes on TCP: the sampling cannot tell fabric from TCP"
		fi
		return
	fi
	if [ "$rxmax" -lt "$SS_LIMIT" ]; then
		fs_pass "fabsock $what: TCP connections received at most $rxmax bytes during the run while iperf moved $moved"
	else
		fs_fail "fabsock $what: a TCP connection received $rxmax bytes during the run (>= $SS_LIMIT): data went over the kernel"
	fi
	s=$(apps_offloaded "$srv_err")
	c=$(apps_offloaded "$cli_err")
	if [ "${s:-0}" -ge 1 ] && [ "${c:-0}" -ge 1 ]; then
		fs_pass "fabsock $what: stats offloaded server=$s client=$c"
	else
		fs_fail "fabsock $what: stats offloaded server=${s:-no stats line} client=${c:-no stats line} (need >= 1 each)"
	fi
}

# apps_run MODE STREAMS: one iperf server/client pair, STREAMS connections.
apps_run() {
	local mode=$1 streams=$2 port srv cli rc=0 conns rxmax log what
	what="iperf -P $streams"
	log="$FS_TMP/$mode-P$streams"
	apps_env "$mode"
	port=$(fs_free_port) || { fs_fail "$mode $what: no free port"; return; }

	fs_bg srv timeout -s INT -k 5 60 "${APP_ENV[@]}" \
		iperf -s -B 127.0.0.1 -p "$port" >"$log-server.out" 2>"$log-server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$mode $what: iperf server did not listen"
		sed 's/^/    /' "$log-server.err" >&2 || true
		apps_stop "$srv"
		return
	fi
	# -y C: one CSV line per stream at the end:
	# time,src,sport,dst,dport,id,interval,bytes,bits_per_second
	fs_bg cli timeout -s INT -k 5 $((DURATION + 30)) "${APP_ENV[@]}" \
		iperf -c 127.0.0.1 -p "$port" -t "$DURATION" -l 128K -P "$streams" -y C \
		>"$log-client.out" 2>"$log-client.err"
	apps_sample_while "$cli" "$port"
	conns=$SS_CONNS rxmax=$SS_RXMAX
	fs_wait_pid "$cli" $((DURATION + 40)) || rc=$?
	apps_stop "$srv"

	if [ "$rc" -ne 0 ]; then
		fs_fail "$mode $what: iperf client exit status $rc"
		tail -n 8 "$log-client.out" "$log-client.err" | sed 's/^/    /' >&2
		grep -h . "$log-server.err" | tail -n 5 | sed 's/^/    server: /' >&2 || true
		return
	fi
	local lines bytes gbps
	# Per-stream lines (a SUM line, id -1, is skipped if this iperf prints one).
	read -r lines bytes gbps < <(awk -F, 'NF >= 9 && $6 != -1 && $8 ~ /^[0-9]+$/ {
			n++; b += $8; bps += $9 }
		END { printf "%d %.0f %.2f\n", n, b, bps / 1e9 }' "$log-client.out")
	fs_log "$mode $what: $lines stream(s), $bytes bytes, $gbps Gbit/s; ss during the run: $conns connection(s), max bytes_received $rxmax"
	if [ "$lines" -ne "$streams" ] || ! awk -v g="$gbps" 'BEGIN { exit !(g > 0.01) }'; then
		fs_fail "$mode $what: implausible result ($lines of $streams stream reports, $gbps Gbit/s)"
		sed 's/^/    /' "$log-client.out" >&2
		return
	fi
	fs_pass "$mode $what: $gbps Gbit/s"
	apps_check_path "$mode" "$what" "$log-server.err" "$log-client.err" "$conns" "$rxmax" "$bytes"
	if [ "$mode" = fabsock ]; then
		local c
		c=$(apps_offloaded "$log-client.err")
		if [ -n "$c" ] && [ "$c" -lt "$streams" ]; then
			fs_log "note: $what offloaded $c of $streams client connections"
		fi
	fi
}

for mode in kernel fabsock; do
	for streams in 1 2; do
		apps_run "$mode" "$streams"
	done
done
fs_done
