#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Bad input against a fabsock listener. A preloaded echo server
# (`fs_rawpeer serve`, FABSOCK_HELLO_TIMEOUT_MS=300) is abused by fs_rawpeer
# speaking the probe/HELLO formats by hand without the preload: UDP garbage,
# spoofed probes, a probe flood, non-HELLO bytes / truncated / bad-CRC /
# oversized HELLOs after a YES, a HELLO with a garbage fabric address, one
# naming a foreign file in /dev/shm (4 KiB of random bytes, ours), a HELLO
# without a probe. Every case must pass, the server must stay alive, and a
# well-behaved preloaded client must then still get 8 MiB echoed byte-exact,
# offloaded. Then a flood of random, truncated and forged datagrams at the
# server's doorbell port, after which the server must be alive, bounded in
# memory, and a real client must offload byte-exactly again. Finally the
# server exits on SIGTERM and its stats line must count the abuse:
# probes_bad >= 1 and fallback_bad_hello >= 1.
#
# Run as root (as CI does), the attacker is another local user: the server
# runs as root, the raw peer and the doorbell flood as nobody.
#
# fs_stream's server cannot be the target: it checks its own 32-byte framing
# and fails on foreign bytes, so fs_rawpeer carries a plain echo server.
. "$(dirname "$0")/lib.sh"

RAW=$FS_PROGS/fs_rawpeer
[ -x "$RAW" ] || fs_skip "$RAW not built"
fs_attacker "$RAW"
if [ "$ATTACKER_RAW" != "$RAW" ]; then
	fs_log "attacker: nobody; server: root"
else
	fs_log "attacker and server: uid $(id -u) (not root: no other user to attack as)"
fi
HELLO_TIMEOUT_MS=300
CASES="probe_flood udp_garbage spoofed garbage_after_yes truncated_hello bad_crc_hello
       oversized_hello bad_address_hello foreign_region_hello hello_without_probe"


PORT=$(fs_free_port) || fs_skip "no free port"
SRV_OUT=$FS_TMP/server.out
SRV_ERR=$FS_TMP/server.err
fs_bg SRV env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_HELLO_TIMEOUT_MS=$HELLO_TIMEOUT_MS \
	"$RAW" serve --port "$PORT" --ready-file "$FS_TMP/ready" >"$SRV_OUT" 2>"$SRV_ERR"
for _ in $(seq 1 200); do
	[ -s "$FS_TMP/ready" ] && break
	kill -0 "$SRV" 2>/dev/null || break
	fs_sleep 0.05
done
if [ ! -s "$FS_TMP/ready" ]; then
	cat "$SRV_ERR" >&2 || true
	fs_fail "echo server did not start"
	fs_done
fi
fs_wait_listen "$PORT"
# A fabsock listener owns the UDP twin of its port from listen() on.
udp_twin=$(ss -Huan "sport = :$PORT") # captured: grep -q in a pipe can SIGPIPE ss under pipefail
if [ -n "$udp_twin" ]; then
	fs_pass "listener bound UDP port $PORT for probes"
else
	fs_fail "listener did not bind UDP port $PORT (no probe listener)"
fi

for case in $CASES; do
	rc=0
	"${ATTACKER[@]}" timeout 120 "$ATTACKER_RAW" 127.0.0.1 "$PORT" "$case" --hello-timeout-ms "$HELLO_TIMEOUT_MS" \
		>"$FS_TMP/$case.out" 2>&1 || rc=$?
	sed "s/^/    /" "$FS_TMP/$case.out" >&2
	if [ "$rc" -eq 0 ] && grep -q "^PASS $case" "$FS_TMP/$case.out"; then
		fs_pass "$case"
	else
		fs_fail "$case (exit $rc)"
	fi
	if ! kill -0 "$SRV" 2>/dev/null; then
		fs_fail "server died during $case"
		break
	fi
done

# After all of that a well-behaved preloaded client still works, offloaded.
if kill -0 "$SRV" 2>/dev/null; then
	rc=0
	timeout 120 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 \
		"$RAW" 127.0.0.1 "$PORT" good_client --bytes 8M >"$FS_TMP/good.out" 2>"$FS_TMP/good.err" || rc=$?
	sed "s/^/    /" "$FS_TMP/good.out" "$FS_TMP/good.err" >&2
	if [ "$rc" -eq 0 ] && grep -q "^PASS good_client" "$FS_TMP/good.out"; then
		fs_pass "good client: 8 MiB echoed byte-exact after the abuse"
	else
		fs_fail "good client after the abuse (exit $rc)"
	fi
	off=$(fs_stat "$FS_TMP/good.err" offloaded)
	if [ "${off:-0}" -ge 1 ]; then
		fs_pass "good client offloaded ($off)"
	else
		fs_fail "good client not offloaded (offloaded=${off:-no stats line}): $(grep -o 'stats:.*' "$FS_TMP/good.err" || true)"
	fi
fi

# The doorbell (one UDP port per process, opened by the first HELLO):
# BELL_FLOOD datagrams of random bytes, of a right header with a random
# type, count and length, of well-formed ARMs with random stream ids and
# tokens, and of RINGs. The server stays alive, its memory does not grow
# past BELL_RSS_MAX_KIB, and a real client again gets 8 MiB echoed
# byte-exact, offloaded.
BELL_FLOOD=20000
BELL_RSS_MAX_KIB=32768
bell_port=""
if kill -0 "$SRV" 2>/dev/null; then
	bell_port=$(ss -Huanp | awk -v pid="pid=$SRV," -v probe=":$PORT" \
		'index($0, pid) && $4 !~ probe"$" { n = split($4, a, ":"); print a[n]; exit }')
fi
if [ -z "$bell_port" ]; then
	fs_fail "doorbell flood: cannot find the server's doorbell port (ss -uanp)"
else
	version=$(sed -n 's/^#define FS_WIRE_VERSION \([0-9]*\).*/\1/p' "$(dirname "$0")/../../core/wire.h")
	rss0=$(awk '/^VmRSS:/ { print $2 }' "/proc/$SRV/status")
	"${ATTACKER[@]}" timeout 60 python3 - "$bell_port" "$BELL_FLOOD" "$version" <<'PY'
import os, random, socket, struct, sys
port, count, version = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
random.seed(7)
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for i in range(count):
    kind = i % 4
    if kind == 0:
        d = os.urandom(random.randint(0, 1100))
    elif kind == 1:
        n = random.randint(0, 80)
        d = b"FSBB" + bytes([version, random.randint(0, 3)]) + struct.pack(">H", n) + os.urandom(random.randint(0, n * 16 + 20))
    elif kind == 2:
        n = random.randint(1, 64)
        d = b"FSBB" + bytes([version, 1]) + struct.pack(">H", n) + os.urandom(n * 16)
    else:  # a RING naming a random stream
        d = b"FSBB" + bytes([version, 2]) + b"\0\1" + os.urandom(16)
    try:
        s.sendto(d, ("::1", port))
    except OSError:
        try:
            s.sendto(d, ("::ffff:127.0.0.1", port))
        except OSError:
            pass
PY
	sleep 0.5
	if kill -0 "$SRV" 2>/dev/null; then
		rss1=$(awk '/^VmRSS:/ { print $2 }' "/proc/$SRV/status")
		if [ $((rss1 - rss0)) -le "$BELL_RSS_MAX_KIB" ]; then
			fs_pass "doorbell flood ($BELL_FLOOD datagrams at port $bell_port): alive, VmRSS $rss0 -> $rss1 KiB"
		else
			fs_fail "doorbell flood: VmRSS grew $rss0 -> $rss1 KiB (limit +$BELL_RSS_MAX_KIB)"
		fi
		rc=0
		timeout 120 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 \
			"$RAW" 127.0.0.1 "$PORT" good_client --bytes 8M >"$FS_TMP/good2.out" 2>"$FS_TMP/good2.err" || rc=$?
		off=$(fs_stat "$FS_TMP/good2.err" offloaded)
		if [ "$rc" -eq 0 ] && grep -q "^PASS good_client" "$FS_TMP/good2.out" && [ "${off:-0}" -ge 1 ]; then
			fs_pass "good client after the doorbell flood: 8 MiB byte-exact, offloaded ($off)"
		else
			fs_fail "good client after the doorbell flood: exit $rc, offloaded=${off:-no stats line}"
			sed "s/^/    /" "$FS_TMP/good2.out" "$FS_TMP/good2.err" >&2
		fi
	else
		fs_fail "server died during the doorbell flood"
	fi
fi

if kill -0 "$SRV" 2>/dev/null; then
	fs_pass "server alive after every case"
	kill -TERM "$SRV"
	rc=0
	fs_wait_pid "$SRV" 20 || rc=$?
	if [ "$rc" -eq 0 ]; then
		fs_pass "server exited cleanly on SIGTERM"
	else
		fs_fail "server exit status $rc on SIGTERM"
	fi
else
	rc=0
	wait "$SRV" || rc=$?
	fs_fail "server died (exit status $rc)"
fi
sed "s/^/    server: /" "$SRV_ERR" >&2 || true

bad=$(fs_stat "$SRV_ERR" probes_bad)
bad_hello=$(fs_stat "$SRV_ERR" fallback_bad_hello)
if [ -z "$bad" ]; then
	fs_fail "no stats line from the server"
else
	if [ "$bad" -ge 1 ]; then
		fs_pass "server probes_bad=$bad"
	else
		fs_fail "server probes_bad=$bad, expected >= 1"
	fi
	if [ "${bad_hello:-0}" -ge 1 ]; then
		fs_pass "server fallback_bad_hello=$bad_hello"
	else
		fs_fail "server fallback_bad_hello=${bad_hello:-?}, expected >= 1"
	fi
	# the flood reached the doorbell, which refused it: what does not
	# decode counts (about half the flood; ARMs and RINGs naming no stream
	# of its own are ignored uncounted, as a closed stream's late ARM is)
	dropped=$(fs_stat "$SRV_ERR" msgs_dropped)
	if [ "${dropped:-0}" -ge $((BELL_FLOOD / 4)) ]; then
		fs_pass "server msgs_dropped=$dropped (the doorbell flood arrived and was refused)"
	else
		fs_fail "server msgs_dropped=${dropped:-?}: the doorbell flood of $BELL_FLOOD never arrived, or was taken"
	fi
fi
fs_done
