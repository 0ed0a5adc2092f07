#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# exec() with fabsock sockets open (issue 4; core/inherit.h):
#  - listener: fs_shapes exec-server listens and execs itself with the
#    listening socket; the new program serves 8 echo connections. Under
#    fabsock all 8 must be offloaded (the new program's stats line) and
#    checked byte for byte; under kernel TCP the same must just work.
#  - inetd: fs_shapes inetd accepts, forks, and the child execs `cat` with
#    the connection as stdin and stdout; a 1 MiB echo must come back exact.
#    Under fabsock the exec'ing child passes its listener's probe table
#    along (core/inherit.h), so cat's fabsock finds the client's "yes" and
#    the connection is offloaded: the client's stats show it, and the echo
#    came back over the fabric. (cat closes stderr before it exits, so its
#    own stats line is not written.)
#  - offloaded connection across exec (fabsock only): a client with an
#    offloaded connection writes 64 KiB and execs itself before reading the
#    echo; the connection goes back to TCP at exec (core/handback.h), and
#    the new program reads that echo and echoes 1 MiB more, every byte
#    checked, then sees EOF after its shutdown. The server (echo until EOF)
#    must have served it, and the client must have handed the stream back.
#    The new program must not find in its environment any variable fabsock
#    set for libfabric when the rail opened (core/fabric.c
#    fs_fabric_env_names), and must find the user's own
#    FI_SHM_DISABLE_CMA=no exactly as given.
. "$(dirname "$0")/lib.sh"

PROG=$FS_PROGS/fs_shapes
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }


for mode in $FS_MODES; do
	prefix=(env)
	[ "$mode" = fabsock ] && prefix=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info)

	# listener across exec
	dir=$FS_TMP/listener-$mode
	mkdir -p "$dir"
	fs_bg spid "${prefix[@]}" "$PROG" exec-server threads 8 >"$dir/server.out" 2>"$dir/server.err"
	port=$(fs_listen_port "$dir/server.out" "$spid")
	crc=0
	srv=0
	"${prefix[@]}" timeout 60 "$PROG" client 127.0.0.1 "$port" 8 4 >"$dir/client.out" 2>"$dir/client.err" || crc=$?
	fs_wait_pid "$spid" 20 || srv=$?
	if [ "$crc" -ne 0 ] || [ "$srv" -ne 0 ] || ! grep -q '^PASS server threads' "$dir/server.out"; then
		fs_fail "listener-$mode: client $crc, server $srv: $(grep -h '^FAIL' "$dir"/*.out | head -n 3 | tr '\n' ' ')"
	elif [ "$mode" = fabsock ] && [ "$(fs_stat "$dir/server.err" offloaded)" != 8 ]; then
		fs_fail "listener-$mode: the exec'd server offloaded $(fs_stat "$dir/server.err" offloaded) of 8"
		grep -h 'stays on kernel' "$dir/server.err" "$dir/client.err" | head -n 5 >&2 || true
	elif [ "$mode" = fabsock ] && [ "$(fs_stat "$dir/server.err" fabric_rx_bytes)" -lt $((8 << 20)) ]; then
		fs_fail "listener-$mode: the exec'd server received $(fs_stat "$dir/server.err" fabric_rx_bytes) bytes over the fabric, expected >= 8 MiB"
	else
		fs_pass "listener-$mode: 8 echo connections served by the program exec'd with the listener"
	fi

	# inetd: connection on fds 0 and 1 of an exec'd cat
	dir=$FS_TMP/inetd-$mode
	mkdir -p "$dir"
	fs_bg spid "${prefix[@]}" "$PROG" inetd cat >"$dir/server.out" 2>"$dir/server.err"
	port=$(fs_listen_port "$dir/server.out" "$spid")
	crc=0
	srv=0
	"${prefix[@]}" timeout 60 "$PROG" client 127.0.0.1 "$port" 1 1 >"$dir/client.out" 2>"$dir/client.err" || crc=$?
	fs_wait_pid "$spid" 20 || srv=$?
	if [ "$crc" -ne 0 ] || [ "$srv" -ne 0 ]; then
		fs_fail "inetd-$mode: client $crc, server $srv: $(grep -h '^FAIL' "$dir"/*.out | head -n 3 | tr '\n' ' ')"
		tail -n 3 "$dir/server.err" >&2 || true
	elif [ "$mode" = fabsock ] && [ "$(fs_stat "$dir/client.err" offloaded)" != 1 ]; then
		fs_fail "inetd-$mode: the connection cat was exec'd with was not offloaded ($(fs_stats_fallbacks "$dir/client.err"))"
	elif [ "$mode" = fabsock ] && [ "$(fs_stat "$dir/client.err" fabric_rx_bytes)" -lt $((1 << 20)) ]; then
		fs_fail "inetd-$mode: the echo came back with $(fs_stat "$dir/client.err" fabric_rx_bytes) bytes over the fabric, expected >= 1 MiB"
	else
		fs_pass "inetd-$mode: 1 MiB echoed exactly by cat exec'd on the accepted connection"
	fi
done

# an offloaded connection across exec
dir=$FS_TMP/offloaded-exec
mkdir -p "$dir"
fs_bg spid env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PROG" server threads 1 >"$dir/server.out" 2>"$dir/server.err"
port=$(fs_listen_port "$dir/server.out" "$spid")
start=$(date +%s%N)
crc=0
srv=0
env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_LOG=info FI_SHM_DISABLE_CMA=no timeout 40 "$PROG" exec-client 127.0.0.1 "$port" \
	>"$dir/client.out" 2>"$dir/client.err" || crc=$?
end=$(date +%s%N)
fs_wait_pid "$spid" 10 || srv=$?
ms=$(((end - start) / 1000000))
if [ "$crc" -ne 0 ] || [ "$srv" -ne 0 ] || ! grep -q '^PASS after-exec' "$dir/client.out" ||
	! grep -q '^served=1' "$dir/server.out"; then
	fs_fail "offloaded-exec: client exit $crc, server exit $srv: $(grep -h '^FAIL' "$dir"/*.out | head -n 3 | tr '\n' ' ')"
	tail -n 5 "$dir/client.err" >&2 || true
elif ! grep -q 'handing back to TCP (initiator)' "$dir/client.err" || ! grep -q 'back on TCP' "$dir/client.err"; then
	fs_fail "offloaded-exec: the client did not hand its stream back to TCP before exec"
elif [ "$(fs_stat "$dir/server.err" handbacks)" != 1 ]; then
	fs_fail "offloaded-exec: server stats handbacks=$(fs_stat "$dir/server.err" handbacks), expected 1"
elif [ "$(grep '^env ' "$dir/client.out" | tr '\n' ' ')" != "env FI_SHM_DISABLE_CMA=no " ]; then
	fs_fail "offloaded-exec: the exec'd program's libfabric variables: '$(grep '^env ' "$dir/client.out" | tr '\n' ' ')', expected only the user's FI_SHM_DISABLE_CMA=no"
else
	fs_pass "offloaded-exec: $(sed -n 's/^after exec: //p' "$dir/client.out") on the connection inherited across exec (${ms} ms)"
fi
fs_done
