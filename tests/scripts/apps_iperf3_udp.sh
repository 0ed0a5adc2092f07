#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance (issue 26): one iperf3 server (no -1: it makes a new listener
# for every test) under the preload runs a TCP test, then a UDP test (-u),
# then TCP again, each client under the preload. The UDP test binds a UDP
# socket to the server's port number, where the listener's probe twin was:
# the twin must give way (it used to fail the test with "unable to start
# stream listener: Address already in use"), and bind again when the test
# is over so that the next TCP test offloads. Checks: every client exits 0
# with a plausible JSON report; the UDP test's server received datagrams;
# each TCP test's payload did not go over kernel TCP (an nftables counter on
# the port, fs_tcp_proof: at most the handshakes of its 2 connections).
. "$(dirname "$0")/lib.sh"

command -v iperf3 >/dev/null 2>&1 || fs_skip "iperf3 is not installed (apt-get install iperf3)"
command -v python3 >/dev/null 2>&1 || fs_skip "python3 is needed to read iperf3's JSON"
fs_need_nft
DURATION=2

# Prints "BYTES" received from an iperf3 -J client report, or "ERR message".
iperf3_bytes() {
	python3 - "$1" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("ERR unreadable JSON:", str(e)[:80]); sys.exit(0)
if d.get("error"):
    print("ERR", d["error"]); sys.exit(0)
end = d.get("end", {})
s = end.get("sum_received") or end.get("sum") or {}
print(int(s.get("bytes", 0)))
EOF
}

PORT=$(fs_free_port) || fs_skip "no free port"
fs_bg SRV fs_pre timeout -s INT -k 5 120 iperf3 -s -B 127.0.0.1 -p "$PORT" >"$FS_TMP/server.out" 2>"$FS_TMP/server.err"
fs_wait_listen "$PORT" || { fs_fail "iperf3 -s did not listen"; fs_done; exit 1; }

n=0
for test in tcp udp tcp; do
	n=$((n + 1))
	opts=()
	[ "$test" = udp ] && opts=(-u -b 200M)
	[ "$test" = tcp ] && fs_tcp_count_start "$PORT"
	rc=0
	timeout -s INT -k 5 $((DURATION + 30)) env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 \
		iperf3 -c 127.0.0.1 -p "$PORT" -t "$DURATION" -J "${opts[@]}" >"$FS_TMP/client$n.out" \
		2>"$FS_TMP/client$n.err" || rc=$?
	bytes=$(iperf3_bytes "$FS_TMP/client$n.out")
	if [ "$rc" != 0 ] || [ "${bytes%% *}" = ERR ] || [ "${bytes:-0}" -le 0 ]; then
		fs_fail "test $n ($test): client exit $rc, $bytes"
		tail -n 5 "$FS_TMP/server.out" | sed 's/^/    server: /' >&2
		[ "$test" = tcp ] && fs_tcp_count_stop
		continue
	fi
	fs_pass "test $n ($test): $bytes bytes received"
	if [ "$test" = tcp ]; then
		before=$FS_FAILS
		fs_tcp_proof "test $n (tcp)" fabsock 2
		if [ "$FS_FAILS" = "$before" ]; then
			fs_pass "test $n (tcp): offloaded (its payload left kernel TCP)"
		else
			fs_why_tcp client "$FS_TMP/client$n.err"
		fi
	fi
done
if grep -q "Address already in use" "$FS_TMP/server.out" "$FS_TMP/server.err"; then
	fs_fail "the server could not bind its UDP port: $(grep -h 'Address already in use' "$FS_TMP"/server.* | head -n 1)"
fi
kill -INT "$SRV" 2>/dev/null || true
fs_wait_pid "$SRV" 20 || true
yielded=$(fs_stat_sum "$FS_TMP/server.err" twins_yielded)
fs_log "server: twins_yielded=$yielded"
[ "${yielded:-0}" -ge 1 ] || fs_fail "the server's twin never gave way (twins_yielded=${yielded:-none}): the UDP test proved nothing"
fs_done
