#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A late HELLO: fs_semantics_lifecycle banner (the server speaks first) with the
# client's HELLO delayed by FABSOCK_TEST_HELLO_DELAY_MS=3500, past the
# 3 s the server's first send waits for it. The server commits to TCP and
# sends its banner; the client sees the banner instead of a HELLO-ACK and
# stays on TCP too; the HELLO arrives afterwards and the server must drop
# it, so that the 64 KiB the client then sends arrive exactly (the server
# checks every byte). Both sides must pass, the server must log the drop,
# and neither may count the connection as offloaded.
. "$(dirname "$0")/lib.sh"

PROG=$FS_PROGS/fs_semantics_lifecycle
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
dir=$FS_TMP/banner
mkdir -p "$dir"
fs_bg spid env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info "$PROG" server 0 banner \
	>"$dir/server.out" 2>"$dir/server.err"
port=$(fs_listen_port "$dir/server.out" "$spid")
crc=0
srv=0
env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info FABSOCK_TEST_HELLO_DELAY_MS=3500 \
	timeout 30 "$PROG" client 127.0.0.1 "$port" banner >"$dir/client.out" 2>"$dir/client.err" || crc=$?
fs_wait_pid "$spid" 10 || srv=$?
if [ "$crc" -ne 0 ] || [ "$srv" -ne 0 ] || ! grep -qx 'PASS banner' "$dir/server.out" ||
	! grep -qx 'PASS banner' "$dir/client.out"; then
	fs_fail "banner with a late HELLO: client $crc, server $srv: $(grep -h '^FAIL' "$dir"/*.out | head -n 2 | tr '\n' ' ')"
	grep -h 'fabsock\[' "$dir"/*.err | grep -v stats | tail -n 5 >&2 || true
elif ! grep -q "dropped the client's HELLO" "$dir/server.err"; then
	fs_fail "banner with a late HELLO: the server did not log dropping it"
elif grep -qE 'stats: offloaded=[1-9]' "$dir/server.err" "$dir/client.err"; then
	fs_fail "banner with a late HELLO: a side counted the connection as offloaded"
else
	fs_pass "banner with a late HELLO: the server dropped the HELLO and both sides read exactly their data over TCP"
fi
fs_done
