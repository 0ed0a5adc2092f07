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
# offloaded. Finally the server exits on SIGTERM and its stats line must count
# the abuse: probes_bad >= 1 and fallback_bad_hello >= 1.
#
# fs_stream's server cannot be the target: it checks its own 32-byte framing
# and fails on foreign bytes, so fs_rawpeer carries a plain echo server.
. "$(dirname "$0")/lib.sh"

RAW=$FS_PROGS/fs_rawpeer
[ -x "$RAW" ] || fs_skip "$RAW not built"
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
	sleep 0.05
done
if [ ! -s "$FS_TMP/ready" ]; then
	cat "$SRV_ERR" >&2 || true
	fs_fail "echo server did not start"
	fs_done
fi
fs_wait_listen "$PORT"
# A fabsock listener owns the UDP twin of its port from listen() on.
if ss -Huan "sport = :$PORT" | grep -q .; then
	fs_pass "listener bound UDP port $PORT for probes"
else
	fs_fail "listener did not bind UDP port $PORT (no probe listener)"
fi

for case in $CASES; do
	rc=0
	env -u LD_PRELOAD timeout 120 "$RAW" 127.0.0.1 "$PORT" "$case" --hello-timeout-ms "$HELLO_TIMEOUT_MS" \
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
fi
fs_done
