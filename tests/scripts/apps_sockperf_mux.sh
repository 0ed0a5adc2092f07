#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: the real sockperf (Debian's package) with its SERVER in
# event-loop mode: `sockperf server -f FEED -F epoll|poll|select` (the feed
# file names the TCP listener, T:127.0.0.1:PORT), against the ordinary
# blocking client, ping-pong (64-byte messages) and throughput, first on the
# kernel and then with both ends under the preload. In fabsock mode the run
# must succeed with plausible numbers AND be shown to have used the fabric:
#   - both processes print "stats: offloaded=N" at exit with N >= 1;
#   - `ss -tin` sampled on the test port while the client runs shows every
#     TCP connection received < 64 KiB while sockperf moved MiBs.
# The same sampling in kernel mode must show MiBs on the connection, which
# proves the check can fail.

. "$(dirname "$0")/lib.sh"

command -v sockperf >/dev/null 2>&1 || fs_skip "sockperf is not installed (apt-get install sockperf)"
APP_NAME=sockperf
MIN_MOVED=$((1 << 20))
. "$(dirname "$0")/apps_lib.sh"

# apps_run MODE MUX TEST: one server/client pair; MUX is the server's -F
# (epoll, poll, select), TEST is ping-pong or throughput.
apps_run() {
	local mode=$1 mux=$2 test=$3 port srv cli rc=0 conns rxmax log out feed
	local -a extra=(-m 64)
	log="$FS_TMP/$mode-$mux-$test"
	apps_env "$mode"
	port=$(fs_free_port) || { fs_fail "$mode $mux $test: no free port"; return; }
	feed="$log.feed"
	echo "T:127.0.0.1:$port" >"$feed"

	fs_bg srv timeout -s INT -k 5 60 "${APP_ENV[@]}" \
		sockperf server -f "$feed" -F "$mux" >"$log-server.out" 2>"$log-server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$mode $mux $test: sockperf server did not listen"
		sed 's/^/    /' "$log-server.err" >&2 || true
		apps_stop "$srv"
		return
	fi
	fs_bg cli timeout -s INT -k 5 $((DURATION + 30)) "${APP_ENV[@]}" \
		sockperf "$test" --tcp -i 127.0.0.1 -p "$port" -t "$DURATION" "${extra[@]}" \
		>"$log-client.out" 2>"$log-client.err"
	apps_sample_while "$cli" "$port"
	conns=$SS_CONNS rxmax=$SS_RXMAX
	fs_wait_pid "$cli" $((DURATION + 40)) || rc=$?
	apps_stop "$srv"

	out=$(sed 's/\x1b\[[0-9;]*m//g' "$log-client.out" "$log-client.err")
	if [ "$rc" -ne 0 ]; then
		fs_fail "$mode $mux $test: sockperf client exit status $rc"
		printf '%s\n' "$out" | tail -n 8 | sed 's/^/    /' >&2
		grep -h . "$log-server.err" | tail -n 5 | sed 's/^/    server: /' >&2 || true
		return
	fi

	local moved
	if [ "$test" = ping-pong ]; then
		local avg p50 p99 msgs
		avg=$(sed -n 's/.*avg-latency=\([0-9.][0-9.]*\).*/\1/p' <<<"$out" | tail -1)
		p50=$(sed -n 's/.*percentile 50\.000 = *\([0-9.][0-9.]*\).*/\1/p' <<<"$out" | tail -1)
		p99=$(sed -n 's/.*percentile 99\.000 = *\([0-9.][0-9.]*\).*/\1/p' <<<"$out" | tail -1)
		msgs=$(sed -n 's/.*\[Total Run\].*ReceivedMessages=\([0-9][0-9]*\).*/\1/p' <<<"$out" | tail -1)
		fs_log "$mode $mux ping-pong: avg ${avg:-?} usec, p50 ${p50:-?}, p99 ${p99:-?} (one-way), ${msgs:-?} messages received; ss during the run: $conns connection(s), max bytes_received $rxmax"
		if [ -z "$avg" ] || [ -z "$msgs" ] || ! awk -v a="$avg" 'BEGIN { exit !(a > 0 && a < 100000) }' ||
			[ "$msgs" -lt 1000 ]; then
			fs_fail "$mode $mux ping-pong: implausible result (avg '${avg:-}' usec, '${msgs:-}' messages)"
			return
		fi
		fs_pass "$mode $mux ping-pong: $msgs round trips, avg $avg usec"
		moved=$((msgs * 64 * 2)) # both directions
	else
		local total size mbps rate
		total=$(sed -n 's/.*Total of \([0-9][0-9]*\) messages sent.*/\1/p' <<<"$out" | tail -1)
		size=$(sed -n 's/.*using msg-size=\([0-9][0-9]*\).*/\1/p' <<<"$out" | head -1)
		mbps=$(sed -n 's/.*BandWidth is \([0-9.][0-9.]*\) MBps.*/\1/p' <<<"$out" | tail -1)
		rate=$(sed -n 's/.*Message Rate is \([0-9][0-9]*\) \[msg\/sec\].*/\1/p' <<<"$out" | tail -1)
		size=${size:-14}
		fs_log "$mode $mux throughput: ${total:-?} messages of $size B, ${rate:-?} msg/s, ${mbps:-?} MB/s; ss during the run: $conns connection(s), max bytes_received $rxmax"
		if [ -z "$total" ] || [ -z "$mbps" ] || [ "$total" -lt 1000 ] ||
			! awk -v m="$mbps" 'BEGIN { exit !(m > 0) }'; then
			fs_fail "$mode $mux throughput: implausible result ('${total:-}' messages, '${mbps:-}' MB/s)"
			return
		fi
		fs_pass "$mode $mux throughput: $total messages, $mbps MB/s"
		moved=$((total * size))
	fi
	apps_check_path "$mode" "$mux $test" "$log-server.err" "$log-client.err" "$conns" "$rxmax" "$moved"
}

DURATION=2
for mode in kernel fabsock; do
	for mux in epoll poll select; do
		for test in ping-pong throughput; do
			apps_run "$mode" "$mux" "$test"
		done
	done
done
fs_done
