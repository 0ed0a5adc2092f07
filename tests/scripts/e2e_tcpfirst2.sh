#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# TCP first's waitless handshake (FABSOCK_TCP_FIRST=1, FABSOCK_TCP_FIRST_WAITLESS
# default 1; docs/design.md "TCP first: the switch to the fabric", "The
# waitless handshake"). Every case checks that both programs exit 0 with
# "result ok" (never by a signal) and that the sha256 of what each side
# sent equals that of what the other read.
# (a) short connections: fs_shortconn, 200 connections of a 100 B request
#     and a 4 KiB answer, blocking client, nonblocking client (poll), and a
#     server that writes first; both ends TCP_FIRST. The client wrote 200
#     waitless HELLOs and took 200 ACKs, the server served 200; neither
#     loaded libfabric (fabric_loads=0), sent a probe (probes_sent=0) or
#     offloaded anything. The nft counter: TCP carried every byte, payload
#     and the two header records together within a retransmission of
#     200 x (100 + 4096 + 2 x 70).
#     And one way: the client writes its request and closes without
#     reading (the ACK comes after its close: the socket is closed in the
#     background once the ACK is taken, so its FIN follows the ACK), its
#     process living on until the server is done; the server must read
#     each request and then the end of stream (not a reset).
# (b) a long stream: fs_tcpfirst, 6 MB each way at once in mixed sizes,
#     blocking (with peeks), epoll-lt and epoll-et readers, the server
#     writing first. It starts on TCP as (a) and, the switch after a
#     waitless handshake not being built (OPEN/OPENED), stays there: each
#     kernel received exactly the peer's bytes, its one header record (70)
#     and the FIN (TCP_INFO bytes_received), no rail in either process.
# (c) plain ends: a client without the preload against a TCP_FIRST server
#     (nothing stripped: the server served none), a TCP_FIRST client against
#     a server without the preload (no record: no HELLO written,
#     fallback_no_record), and a TCP_FIRST client against a fabsock server
#     without TCP_FIRST (its record does not say it strips one: no waitless
#     HELLO; the client probes and offloads as before), and a TCP_FIRST
#     server whose own FABSOCK_TCP_FIRST_WAITLESS is 0 (the client's
#     setting: the server still strips the HELLO its record promises to).
# (d) a client of another user (nobody, no preload) whose first message is
#     a well-formed waitless HELLO followed by 100 bytes: the TCP_FIRST
#     server (root) reads all 170 bytes as data (tcp_first_hello_unproved=1,
#     tcp_first_waitless_served=0), and nobody receives no ACK.
# (e) exec before the ACK: a client writes its request and exec()s a program
#     that reads the answer from the inherited socket: the new program
#     takes the ACK off the head (tcp_first_waitless_acked=1 in it) and
#     reads exactly the server's bytes.
# FS_TCPFIRST2_ROUNDS (1) repeats the whole list.
. "$(dirname "$0")/lib.sh"
fs_need_nft

SC=$FS_PROGS/fs_shortconn
TF=$FS_PROGS/fs_tcpfirst
ROUNDS=${FS_TCPFIRST2_ROUNDS:-1}
COUNT=200 REQ=100 ANSWER=4096 HS=70
TF_BYTES=6000000
LIMIT_S=120
TF_ENV="FABSOCK_TCP_FIRST=1"


# run_pair LABEL PROG SERVER_PRE CLIENT_PRE SERVER_ENV CLIENT_ENV SERVER_ARGS CLIENT_ARGS [PAIRS]
# (PRE: fs_pre or empty; ARGS after PORT; PAIRS: fs_check_files'); sets DIR
run_pair() {
	local label=$1 prog=$2 spre=$3 cpre=$4 senv=$5 cenv=$6 sargs=$7 cargs=$8 pairs=${9:-} port spid cpid src=0 crc=0
	DIR=$FS_TMP/$label
	mkdir -p "$DIR"
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return 1; }
	# shellcheck disable=SC2086
	fs_bg spid $spre env $senv "$prog" server "$port" $sargs >"$DIR/server.out" 2>"$DIR/server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$label: the server did not listen on port $port"
		fs_wait_pid "$spid" 1 || true
		tail -n 5 "$DIR/server.out" "$DIR/server.err" >&2 || true
		return 1
	fi
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	# shellcheck disable=SC2086
	fs_bg cpid $cpre env $cenv "$prog" client "$port" $cargs >"$DIR/client.out" 2>"$DIR/client.err"
	fs_wait_pid "$cpid" "$LIMIT_S" || crc=$?
	fs_wait_pid "$spid" "$LIMIT_S" || src=$?
	fs_check_exit "$label" server "$src" "$DIR/server.out" "$DIR/server.err"
	fs_check_exit "$label" client "$crc" "$DIR/client.out" "$DIR/client.err"
	fs_check_files "$label" "$DIR" "$pairs"
	return 0
}

# (a)
case_short() { # LABEL SERVER_FLAGS CLIENT_FLAGS
	local label=$1 fails_before=$FS_FAILS want
	run_pair "$label" "$SC" fs_pre fs_pre "$TF_ENV" "$TF_ENV" "$COUNT $REQ $ANSWER $FS_TMP/$label $2" \
		"$COUNT $REQ $ANSWER $FS_TMP/$label $3" || return 0
	fs_tcp_proof "$label" kernel "$COUNT"
	fs_expect_stats "$DIR/client.err" "$label: client" tcp_first_waitless_sent=$COUNT tcp_first_waitless_acked=$COUNT \
		tcp_first_waitless_plain=0 fabric_loads=0 probes_sent=0 offloaded=0 resets=0
	fs_expect_stats "$DIR/server.err" "$label: server" tcp_first_waitless_served=$COUNT tcp_first_hello_unproved=0 \
		fabric_loads=0 offloaded=0 resets=0
	want=$((COUNT * (REQ + ANSWER + 2 * HS)))
	# (a segment the kernel sent again passes the hook twice: at most one
	# 64 KiB one more, on a loaded machine)
	if [ $((FS_TCP_PAYLOAD + FS_TCP_HS_BYTES)) -lt "$want" ] ||
		[ $((FS_TCP_PAYLOAD + FS_TCP_HS_BYTES)) -gt $((want + 65536)) ]; then
		fs_fail "$label: TCP carried $FS_TCP_PAYLOAD payload and $FS_TCP_HS_BYTES header-record bytes, not the $want of the requests, answers, HELLOs and ACKs"
	fi
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: $COUNT connections on TCP, no rail, no probe"
	return 0
}

case_oneway() {
	local label=oneway fails_before=$FS_FAILS
	DIR=$FS_TMP/$label
	run_pair "$label" "$SC" fs_pre fs_pre "$TF_ENV" "$TF_ENV" "$COUNT $REQ $ANSWER $FS_TMP/$label oneway" \
		"$COUNT $REQ $ANSWER $FS_TMP/$label oneway waitdone" "client.sent:server.recv" || return 0
	fs_tcp_proof "$label" kernel "$COUNT"
	fs_expect_stats "$DIR/client.err" "$label: client" tcp_first_waitless_sent=$COUNT fabric_loads=0 probes_sent=0 \
		offloaded=0 resets=0
	fs_expect_stats "$DIR/server.err" "$label: server" tcp_first_waitless_served=$COUNT tcp_first_hello_unproved=0 \
		fabric_loads=0 offloaded=0 resets=0
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: $COUNT requests and ends, no reset"
	return 0
}

# (b)
case_long() { # MODE
	local label=long-$1 fails_before=$FS_FAILS side got
	run_pair "$label" "$TF" fs_pre fs_pre "$TF_ENV" "$TF_ENV" "$1 $FS_TMP/$label $TF_BYTES" \
		"$1 $FS_TMP/$label $TF_BYTES" || return 0
	fs_tcp_proof "$label" kernel 1
	for side in server client; do
		[ "$side" = server ] && fs_expect_stats "$DIR/$side.err" "$label: $side" tcp_first_waitless_served=1 \
			fabric_loads=0 offloaded=0 resets=0
		[ "$side" = client ] && fs_expect_stats "$DIR/$side.err" "$label: $side" tcp_first_waitless_sent=1 \
			tcp_first_waitless_acked=1 fabric_loads=0 probes_sent=0 offloaded=0 resets=0
		got=$(sed -n 's/.*bytes_received=\([0-9]*\).*/\1/p' "$DIR/$side.out")
		# the peer's bytes, its header record, its FIN: nothing else
		if [ -z "$got" ] || [ $((got - TF_BYTES)) -lt "$HS" ] || [ $((got - TF_BYTES)) -gt $((HS + 1)) ]; then
			fs_fail "$label: the $side's kernel received ${got:-?} bytes on TCP, not $TF_BYTES, one header record ($HS) and the FIN"
		fi
	done
	[ "${FS_TCP_PAYLOAD:-0}" -ge $((2 * TF_BYTES)) ] ||
		fs_fail "$label: TCP carried ${FS_TCP_PAYLOAD:-0} payload bytes, fewer than the $((2 * TF_BYTES)) written"
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: 2 x $TF_BYTES bytes on TCP after a waitless handshake"
	return 0
}

# (c)
case_plain() {
	local label fails_before
	label=plain-client fails_before=$FS_FAILS
	if run_pair "$label" "$SC" fs_pre "" "$TF_ENV" "" "$COUNT $REQ $ANSWER $FS_TMP/$label" \
		"$COUNT $REQ $ANSWER $FS_TMP/$label"; then
		fs_tcp_proof "$label" kernel "$COUNT"
		fs_expect_stats "$DIR/server.err" "$label: server" tcp_first_waitless_served=0 tcp_first_hello_unproved=0 \
			offloaded=0 fabric_loads=0
		[ "$FS_TCP_HS_BYTES" = 0 ] || fs_fail "$label: $FS_TCP_HS_BYTES bytes of header records on TCP"
		[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: a plain client's bytes intact, nothing added"
	fi
	label=plain-server fails_before=$FS_FAILS
	if run_pair "$label" "$SC" "" fs_pre "" "$TF_ENV" "$COUNT $REQ $ANSWER $FS_TMP/$label" \
		"$COUNT $REQ $ANSWER $FS_TMP/$label"; then
		fs_tcp_proof "$label" kernel "$COUNT"
		fs_expect_stats "$DIR/client.err" "$label: client" tcp_first_waitless_sent=0 fallback_no_record=$COUNT \
			probes_sent=0 fabric_loads=0
		[ "$FS_TCP_HS_BYTES" = 0 ] || fs_fail "$label: $FS_TCP_HS_BYTES bytes of header records on TCP"
		[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: nothing written to a plain server"
	fi
	label=old-server fails_before=$FS_FAILS
	if run_pair "$label" "$SC" fs_pre fs_pre "" "$TF_ENV" "20 $REQ $ANSWER $FS_TMP/$label" \
		"20 $REQ $ANSWER $FS_TMP/$label"; then
		fs_tcp_proof "$label" kernel 20
		fs_expect_stats "$DIR/client.err" "$label: client" tcp_first_waitless_sent=0 offloaded=20
		fs_expect_stats "$DIR/server.err" "$label: server" tcp_first_waitless_served=0 offloaded=20
		[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: a server without TCP_FIRST gets today's handshake"
	fi
	label=server-waitless-off fails_before=$FS_FAILS
	if run_pair "$label" "$SC" fs_pre fs_pre "$TF_ENV FABSOCK_TCP_FIRST_WAITLESS=0" "$TF_ENV" \
		"20 $REQ $ANSWER $FS_TMP/$label" "20 $REQ $ANSWER $FS_TMP/$label"; then
		fs_tcp_proof "$label" kernel 20
		fs_expect_stats "$DIR/client.err" "$label: client" tcp_first_waitless_sent=20 tcp_first_waitless_acked=20
		fs_expect_stats "$DIR/server.err" "$label: server" tcp_first_waitless_served=20
		[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: a TCP-first server strips it whatever its own setting"
	fi
}

# (d)
case_other_user() {
	local label=other-user fails_before=$FS_FAILS port spid cpid src=0 crc=0 dir
	dir=$FS_TMP/$label
	mkdir -p "$dir"
	chmod 755 "$FS_TMP" "$dir"
	cat >"$dir/server.py" <<'PY'
import hashlib, socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(4)
c, _ = l.accept()
data = b""
while True:
    b = c.recv(1)
    if not b:
        break
    data += b
c.sendall(("%d %s\n" % (len(data), hashlib.sha256(data).hexdigest())).encode())
c.close()
print("server: result ok")
PY
	cat >"$dir/client.py" <<'PY'
import hashlib, socket, struct, sys, zlib
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
# a well-formed waitless HELLO (core/wire.h, version 12): magic, version,
# status, length, token, nonce 0, stream 0, window 0, chunk 0, host id,
# provider shm, pull shift 0, one rail, reserved 0, bell port 0, flags
# TCP_FIRST, fd, then the one rail's address length 0
h = struct.pack(">IBBHQQIII16sBBBBHHIH", 0x46534248, 12, 0, 70, 0x1122334455667788, 0, 0, 0, 0,
                b"\0" * 16, 1, 0, 1, 0, 0, 1, s.fileno(), 0)
h += struct.pack(">I", zlib.crc32(h) & 0xffffffff)
assert len(h) == 70
msg = h + bytes(range(100))
s.sendall(msg)
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    got += b
want = ("%d %s\n" % (len(msg), hashlib.sha256(msg).hexdigest())).encode()
print("client: result ok" if got == want else "client: result FAIL got %r want %r" % (got, want))
PY
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return 0; }
	fs_bg spid fs_pre env $TF_ENV /usr/bin/python3 "$dir/server.py" "$port" >"$dir/server.out" 2>"$dir/server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$label: the server did not listen"
		fs_wait_pid "$spid" 1 || true
		return 0
	fi
	fs_bg cpid setpriv --reuid nobody --regid nogroup --clear-groups /usr/bin/python3 "$dir/client.py" "$port" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cpid" 60 || crc=$?
	fs_wait_pid "$spid" 60 || src=$?
	fs_check_exit "$label" server "$src" "$dir/server.out" "$dir/server.err"
	fs_check_exit "$label" client "$crc" "$dir/client.out" "$dir/client.err"
	fs_expect_stats "$dir/server.err" "$label: server" tcp_first_hello_unproved=1 tcp_first_waitless_served=0
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: another user's HELLO-shaped message read as data"
	return 0
}

# (e)
case_exec() {
	local label=exec fails_before=$FS_FAILS port spid cpid src=0 crc=0 dir
	dir=$FS_TMP/$label
	mkdir -p "$dir"
	cat >"$dir/server.py" <<'PY'
import hashlib, socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(4)
c, _ = l.accept()
req = b""
while len(req) < 100:
    b = c.recv(100 - len(req))
    if not b:
        break
    req += b
ans = hashlib.sha256(req).hexdigest().encode() + bytes(i % 251 for i in range(4000))
c.sendall(ans)
open(sys.argv[2], "wb").write(ans)
c.close()
print("server: result ok" if len(req) == 100 else "server: result FAIL short request")
PY
	cat >"$dir/client.py" <<'PY'
import os, socket, sys
if sys.argv[1] == "child":
    fd = int(sys.argv[2])
    got = b""
    while True:
        b = os.read(fd, 4096)
        if not b:
            break
        got += b
    open(sys.argv[3], "wb").write(got)
    print("client: result ok")
    sys.exit(0)
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
s.sendall(bytes(range(100)))
s.set_inheritable(True)
os.execv(sys.executable, [sys.executable, sys.argv[0], "child", str(s.fileno()), sys.argv[3]])
PY
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return 0; }
	fs_bg spid fs_pre env $TF_ENV /usr/bin/python3 "$dir/server.py" "$port" "$dir/server.sent" \
		>"$dir/server.out" 2>"$dir/server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$label: the server did not listen"
		fs_wait_pid "$spid" 1 || true
		return 0
	fi
	fs_bg cpid fs_pre env $TF_ENV /usr/bin/python3 "$dir/client.py" parent "$port" "$dir/client.recv" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cpid" 60 || crc=$?
	fs_wait_pid "$spid" 60 || src=$?
	fs_check_exit "$label" server "$src" "$dir/server.out" "$dir/server.err"
	fs_check_exit "$label" client "$crc" "$dir/client.out" "$dir/client.err"
	fs_check_files "$label" "$dir" "server.sent:client.recv"
	fs_expect_stats "$dir/client.err" "$label: the exec'd client" tcp_first_waitless_acked=1
	fs_expect_stats "$dir/server.err" "$label: server" tcp_first_waitless_served=1
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: the new program took the ACK, then the answer"
	return 0
}

[ -x "$SC" ] && [ -x "$TF" ] || { fs_fail "$SC or $TF is not built"; fs_done; exit 1; }
[ -f "$FABSOCK_LIB" ] || { fs_fail "$FABSOCK_LIB does not exist"; fs_done; exit 1; }
for round in $(seq 1 "$ROUNDS"); do
	for half in $FS_MODES; do
		if [ "$half" = kernel ]; then
			run_pair kernel-short "$SC" "" "" "" "" "$COUNT $REQ $ANSWER $FS_TMP/kernel-short" \
				"$COUNT $REQ $ANSWER $FS_TMP/kernel-short" && fs_tcp_proof kernel-short kernel "$COUNT" &&
				fs_pass "kernel-short"
			continue
		fi
		case_short short-block "" ""
		case_short short-nb "" nb
		case_short short-server-first first first
		case_oneway
		for mode in block epoll-lt epoll-et; do
			case_long "$mode"
		done
		case_plain
		case_exec
		if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
			case_other_user
		else
			fs_log "other-user: skipped (needs root and setpriv)"
		fi
	done
done
fs_done
