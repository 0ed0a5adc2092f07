#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: the real iperf3 (Debian's package), server (-1: one test, then
# it exits through exit()) and client on loopback, four variants: one stream,
# -R (server sends), -P 4 and --bidir, first on the kernel and then with both
# ends under the preload. The client's -J report gives the bytes and the
# bandwidth. iperf3 is an event-loop program (select) with a control
# connection that carries a few KiB of JSON besides the data connections. In
# fabsock mode the run must succeed AND be shown to have used the fabric:
#   - `ss -tin` sampled on the test port while the client runs shows every
#     TCP connection (control included: its JSON stays far below the limit)
#     received < 64 KiB while iperf3 moved hundreds of MiB;
#   - the processes' "stats: offloaded=N" lines say N >= 1 (the client's
#     N >= streams + 1 is noted when lower);
#   - at least half the bytes were pulled straight into the reader's buffer
#     (pull_direct_bytes; FABSOCK_PULL_MIN).
# The same sampling in kernel mode must show the data on TCP, which proves
# the check can fail: the -P 1 run (every variant with FS_APPS_KERNEL_ALL=1;
# apps_lib.sh).

. "$(dirname "$0")/lib.sh"

command -v iperf3 >/dev/null 2>&1 || fs_skip "iperf3 is not installed (apt-get install iperf3)"
command -v python3 >/dev/null 2>&1 || fs_skip "python3 is needed to read iperf3's JSON"
APP_NAME=iperf3
MIN_MOVED=$((256 << 20))
. "$(dirname "$0")/apps_lib.sh"
# 2 s per run, not apps_lib's 3: what is checked (bytes far above MIN_MOVED,
# the ss sampling of every connection, the stats) holds the same from the
# first second on; 1 s less per run.
DURATION=2

# Prints "BYTES GBPS STREAMS" from an iperf3 -J client report (received side,
# both directions for --bidir), or "ERR message".
iperf3_json() {
	python3 - "$1" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("ERR unreadable JSON:", str(e)[:80]); sys.exit(0)
if d.get("error"):
    print("ERR", d["error"]); sys.exit(0)
end = d.get("end", {})
b = bps = 0
for key in ("sum_received", "sum_received_bidir_reverse"):
    s = end.get(key)
    if s:
        b += s.get("bytes", 0); bps += s.get("bits_per_second", 0)
print("%d %.2f %d" % (b, bps / 1e9, len(end.get("streams", []))))
EOF
}

# apps_run MODE NAME CLIENT-OPTIONS...
apps_run() {
	local mode=$1 what="iperf3 $2" port srv cli rc=0 conns rxmax log
	shift 2
	log="$FS_TMP/$mode-${what// /_}"
	apps_env "$mode"
	port=$(fs_free_port) || { fs_fail "$mode $what: no free port"; return; }

	fs_bg srv timeout -s INT -k 5 $((DURATION + 40)) "${APP_ENV[@]}" \
		iperf3 -s -1 -B 127.0.0.1 -p "$port" >"$log-server.out" 2>"$log-server.err"
	apps_wait_server "$mode $what" "$port" "$srv" "$log" || return
	fs_bg cli timeout -s INT -k 5 $((DURATION + 20)) "${APP_ENV[@]}" \
		iperf3 -c 127.0.0.1 -p "$port" -t "$DURATION" -J "$@" \
		>"$log-client.out" 2>"$log-client.err"
	apps_sample_while "$cli" "$port"
	conns=$SS_CONNS rxmax=$SS_RXMAX
	fs_wait_pid "$cli" $((DURATION + 30)) || rc=$?
	# -1: the server exits by itself after the test; SIGINT if it did not.
	for _ in $(seq 1 100); do kill -0 "$srv" 2>/dev/null || break; fs_sleep 0.05; done
	apps_stop "$srv"

	local bytes gbps nstreams
	read -r bytes gbps nstreams < <(iperf3_json "$log-client.out")
	if [ "$rc" -ne 0 ] || [ "$bytes" = ERR ]; then
		fs_fail "$mode $what: iperf3 client exit status $rc${bytes:+ ($bytes $gbps $nstreams)}"
		grep -hv ': stats:' "$log-client.err" | tail -n 5 | sed 's/^/    client: /' >&2 || true
		grep -hv ': stats:' "$log-server.out" "$log-server.err" | tail -n 5 | sed 's/^/    server: /' >&2 || true
		return
	fi
	fs_log "$mode $what: $nstreams stream(s), $bytes bytes received, $gbps Gbit/s; ss during the run: $conns connection(s), max bytes_received $rxmax"
	if ! awk -v g="$gbps" 'BEGIN { exit !(g > 0.01) }'; then
		fs_fail "$mode $what: implausible result ($bytes bytes, $gbps Gbit/s)"
		return
	fi
	fs_pass "$mode $what: $gbps Gbit/s"
	apps_check_path "$mode" "$what" "$log-server.err" "$log-client.err" "$conns" "$rxmax" "$bytes"
	if [ "$mode" = fabsock ]; then
		local c pulled
		# Payloads of 64 KiB against 128 KiB reads: nearly every byte must
		# be pulled straight into iperf3's buffer (one copy fewer).
		pulled=$(($(fs_stat_sum "$log-server.err" pull_direct_bytes) + $(fs_stat_sum "$log-client.err" pull_direct_bytes)))
		if [ "$pulled" -ge $((bytes / 2)) ]; then
			fs_pass "fabsock $what: $pulled bytes pulled straight into the reader's buffer"
		else
			fs_fail "fabsock $what: only $pulled of $bytes bytes pulled straight into the reader's buffer"
		fi
		c=$(apps_offloaded "$log-client.err")
		if [ -n "$c" ] && [ "$c" -lt $((nstreams + 1)) ]; then
			fs_log "note: $what offloaded $c of $((nstreams + 1)) client connections (control + data)"
		fi
	fi
}

for mode in kernel fabsock; do
	apps_run "$mode" "-P 1"
	# the kernel's -R, -P 4 and --bidir: figures only (apps_kernel_all)
	[ "$mode" = kernel ] && ! apps_kernel_all && continue
	apps_run "$mode" "-R" -R
	apps_run "$mode" "-P 4" -P 4
	apps_run "$mode" "--bidir" --bidir
done
fs_done
