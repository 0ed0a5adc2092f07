# SPDX-License-Identifier: MIT
# The sockperf acceptance run, shared by apps_sockperf.sh (blocking server)
# and apps_sockperf_mux.sh (event-loop server). Source it after apps_lib.sh.

# sockperf_run MODE MUX TEST: one server/client pair. MUX is "blocking"
# (`sockperf server --tcp`, sockperf's default blocking mode) or the server's
# -F (epoll, poll, select; it then takes a feed file naming the listener);
# TEST is ping-pong or throughput. The client is the ordinary blocking one.
# Ping-pong uses 64-byte messages; throughput 64-byte messages with an
# event-loop server and sockperf's default (14 B) with the blocking one.
sockperf_run() {
	local mode=$1 mux=$2 test=$3 port srv cli rc=0 conns rxmax log out label
	local -a extra=() server=()
	log="$FS_TMP/$mode-$mux-$test"
	label="$mode $mux $test"
	[ "$mux" = blocking ] && label="$mode $test"
	apps_env "$mode"
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return; }
	if [ "$mux" = blocking ]; then
		server=(--tcp -i 127.0.0.1 -p "$port")
		[ "$test" = ping-pong ] && extra=(-m 64)
	else
		echo "T:127.0.0.1:$port" >"$log.feed"
		server=(-f "$log.feed" -F "$mux")
		extra=(-m 64)
	fi

	fs_bg srv timeout -s INT -k 5 60 "${APP_ENV[@]}" \
		sockperf server "${server[@]}" >"$log-server.out" 2>"$log-server.err"
	apps_wait_server "$label" "$port" "$srv" "$log" || return
	fs_bg cli timeout -s INT -k 5 $((DURATION + 30)) "${APP_ENV[@]}" \
		sockperf "$test" --tcp -i 127.0.0.1 -p "$port" -t "$DURATION" "${extra[@]}" \
		>"$log-client.out" 2>"$log-client.err"
	apps_sample_while "$cli" "$port"
	conns=$SS_CONNS rxmax=$SS_RXMAX
	fs_wait_pid "$cli" $((DURATION + 40)) || rc=$?
	apps_stop "$srv"

	out=$(sed 's/\x1b\[[0-9;]*m//g' "$log-client.out" "$log-client.err")
	if [ "$rc" -ne 0 ]; then
		fs_fail "$label: sockperf client exit status $rc"
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
		fs_log "$label: avg ${avg:-?} usec, p50 ${p50:-?}, p99 ${p99:-?} (one-way), ${msgs:-?} messages received; ss during the run: $conns connection(s), max bytes_received $rxmax"
		if [ -z "$avg" ] || [ -z "$msgs" ] || ! awk -v a="$avg" 'BEGIN { exit !(a > 0 && a < 100000) }' ||
			[ "$msgs" -lt 1000 ]; then
			fs_fail "$label: implausible result (avg '${avg:-}' usec, '${msgs:-}' messages)"
			return
		fi
		fs_pass "$label: $msgs round trips, avg $avg usec"
		moved=$((msgs * 64 * 2)) # both directions
	else
		local total size mbps rate
		total=$(sed -n 's/.*Total of \([0-9][0-9]*\) messages sent.*/\1/p' <<<"$out" | tail -1)
		size=$(sed -n 's/.*using msg-size=\([0-9][0-9]*\).*/\1/p' <<<"$out" | head -1)
		mbps=$(sed -n 's/.*BandWidth is \([0-9.][0-9.]*\) MBps.*/\1/p' <<<"$out" | tail -1)
		rate=$(sed -n 's/.*Message Rate is \([0-9][0-9]*\) \[msg\/sec\].*/\1/p' <<<"$out" | tail -1)
		size=${size:-14}
		fs_log "$label: ${total:-?} messages of $size B, ${rate:-?} msg/s, ${mbps:-?} MB/s; ss during the run: $conns connection(s), max bytes_received $rxmax"
		if [ -z "$total" ] || [ -z "$mbps" ] || [ "$total" -lt 1000 ] ||
			! awk -v m="$mbps" 'BEGIN { exit !(m > 0) }'; then
			fs_fail "$label: implausible result ('${total:-}' messages, '${mbps:-}' MB/s)"
			return
		fi
		fs_pass "$label: $total messages, $mbps MB/s"
		moved=$((total * size))
	fi
	apps_check_path "$mode" "${label#"$mode "}" "$log-server.err" "$log-client.err" "$conns" "$rxmax" "$moved"
}
