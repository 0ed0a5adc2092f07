#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: the real qperf (Debian's package), server and client on
# loopback, tests tcp_bw and tcp_lat, first on the kernel and then with both
# ends under the preload. qperf uses two ports: the listen port (-lp), a
# synchronisation connection that carries the parameters and the results,
# and the data port (-ip) on which the socket tests run; the server forks a
# child per client. In fabsock mode the run must succeed with plausible
# numbers AND be shown to have used the fabric:
#   - `ss -tin` sampled on the DATA port while the client runs shows every
#     TCP connection received < 64 KiB while qperf moved hundreds of MiB;
#   - the stats lines (client; the server's forked child) say offloaded >= 1.
# The same sampling in kernel mode must show the data on TCP, which proves
# the check can fail.

. "$(dirname "$0")/lib.sh"

command -v qperf >/dev/null 2>&1 || fs_skip "qperf is not installed (apt-get install qperf)"
APP_NAME=qperf
MIN_MOVED=$((64 << 20))
. "$(dirname "$0")/apps_lib.sh"

DURATION=2

apps_run() {
	local mode=$1 what="qperf tcp_bw+tcp_lat" lport dport srv cli rc=0 conns rxmax log
	log="$FS_TMP/$mode"
	apps_env "$mode"
	lport=$(fs_free_port) && dport=$(fs_free_port) && [ "$lport" != "$dport" ] ||
		{ fs_fail "$mode $what: no free ports"; return; }

	fs_bg srv timeout -s INT -k 5 60 "${APP_ENV[@]}" \
		qperf -lp "$lport" >"$log-server.out" 2>"$log-server.err"
	if ! fs_wait_listen "$lport"; then
		fs_fail "$mode $what: qperf server did not listen"
		sed 's/^/    /' "$log-server.err" >&2 || true
		apps_stop "$srv"
		return
	fi
	# Both connections (sync and data) go to 127.0.0.1.
	fs_bg cli timeout -s INT -k 5 $((2 * DURATION + 30)) "${APP_ENV[@]}" \
		qperf -lp "$lport" -ip "$dport" -t "$DURATION" -uu -vu 127.0.0.1 tcp_bw tcp_lat \
		>"$log-client.out" 2>"$log-client.err"
	apps_sample_while "$cli" "$dport"
	conns=$SS_CONNS rxmax=$SS_RXMAX
	fs_wait_pid "$cli" $((2 * DURATION + 40)) || rc=$?
	apps_stop "$srv"

	if [ "$rc" -ne 0 ]; then
		fs_fail "$mode $what: qperf client exit status $rc"
		tail -n 8 "$log-client.out" "$log-client.err" | sed 's/^/    /' >&2
		grep -hv ': stats:' "$log-server.err" | tail -n 5 | sed 's/^/    server: /' >&2 || true
		return
	fi
	local bw lat moved
	# -uu: bw in bytes/sec, latency in ns.
	bw=$(awk '/^tcp_bw:/ { t = 1 } /^tcp_lat:/ { t = 0 } t && $1 == "bw" { print $3 }' "$log-client.out")
	lat=$(awk '/^tcp_lat:/ { t = 1 } t && $1 == "latency" { print $3 }' "$log-client.out")
	fs_log "$mode $what: bw ${bw:-?} bytes/s, latency ${lat:-?} ns; ss on the data port during the run: $conns connection(s), max bytes_received $rxmax"
	if [ -z "$bw" ] || [ -z "$lat" ] || ! awk -v b="$bw" -v l="$lat" 'BEGIN { exit !(b > 1e6 && l > 0 && l < 1e8) }'; then
		fs_fail "$mode $what: implausible result (bw '${bw:-}', latency '${lat:-}')"
		sed 's/^/    /' "$log-client.out" >&2
		return
	fi
	fs_pass "$mode $what: $(awk -v b="$bw" 'BEGIN { printf "%.0f MB/s", b / 1e6 }'), latency $lat ns"
	moved=$(awk -v b="$bw" -v t="$DURATION" 'BEGIN { printf "%.0f", b * t }')
	apps_check_path "$mode" "$what" "$log-server.err" "$log-client.err" "$conns" "$rxmax" "$moved"
}

for mode in kernel fabsock; do
	apps_run "$mode"
done
fs_done
