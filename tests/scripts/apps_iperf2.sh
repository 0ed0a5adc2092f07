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
# proves the check can fail: one stream (-P 2 too with FS_APPS_KERNEL_ALL=1;
# apps_lib.sh).

. "$(dirname "$0")/lib.sh"

command -v iperf >/dev/null 2>&1 || fs_skip "iperf (version 2) is not installed (apt-get install iperf)"
case $(iperf -v 2>&1 </dev/null || true) in
*"iperf version 2"*) ;;
*) fs_skip "'iperf' is not iperf version 2" ;;
esac
APP_NAME=iperf
MIN_MOVED=$((16 << 20))
. "$(dirname "$0")/apps_lib.sh"
# 2 s per run, not apps_lib's 3: what is checked (bytes far above MIN_MOVED,
# the ss sampling of every connection, the stats) holds the same from the
# first second on; 1 s less per run.
DURATION=2

# apps_run MODE STREAMS: one iperf server/client pair, STREAMS connections.
apps_run() {
	local mode=$1 streams=$2 port srv cli rc=0 conns rxmax log what
	what="iperf -P $streams"
	log="$FS_TMP/$mode-P$streams"
	apps_env "$mode"
	port=$(fs_free_port) || { fs_fail "$mode $what: no free port"; return; }

	fs_bg srv timeout -s INT -k 5 60 "${APP_ENV[@]}" \
		iperf -s -B 127.0.0.1 -p "$port" >"$log-server.out" 2>"$log-server.err"
	apps_wait_server "$mode $what" "$port" "$srv" "$log" || return
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
		# the kernel's -P 2: a figure only (apps_kernel_all)
		[ "$mode" = kernel ] && [ "$streams" = 2 ] && ! apps_kernel_all && continue
		apps_run "$mode" "$streams"
	done
done
fs_done
