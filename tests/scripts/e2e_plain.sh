#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Plain listeners (docs/design.md, "Plain listeners"; core/plain.h): a
# listener whose last FABSOCK_PLAIN_AFTER connections from this host stayed
# on TCP stops tracking the later ones, and a client that probes turns it
# back. Every case checks that both programs exit 0 with "result ok" (never
# by a signal) and that the sha256 of what each side sent equals that of
# what the other read.
# (a) plain clients (no preload) of a fabsock server, fs_shortconn, 300
#     connections of a 100 B request and a 4 KiB answer: blocking, the
#     server writing first, and both ends in edge-triggered epoll sets
#     (nginx's shape). With FABSOCK_PLAIN_AFTER=16 the server tracked the
#     first 16 (kernel=16) and accepted the other 284
#     untracked (plain_accepted=284), turned plain once.
# (b) a probing client after plain ones: a python3 echo server under the
#     preload, serving one connection after another; 100 plain connections
#     turn its listener plain, then a fabsock client makes 40 (its history
#     off, so each probes), every echo checked byte for byte: the first one is refused (its probe came while its
#     connection was untracked: plain_probes_refused) or tracked (a "yes"
#     was out at the accept: plain_tracked_yes); either way the listener
#     tracks again, and the client's later connections offload (at least
#     30 of the 40 in both the client's and the server's counts).
# (c) a python3 echo server that serves one connection after another and
#     forks a child for its 50th (a plain client's, untracked by then): the
#     parent's close of the connection its child holds must not lower the
#     port's count (plain_kept >= 1) and ends the plain mode for good
#     (plain_off=1); then a fabsock client's 20 echoes are byte-exact and
#     at least 15 of its connections offload.
# (d) a server that forks for each connection (ForkingTCPServer): its
#     connections, handed to children, say nothing of their clients in the
#     parent, so it never turns plain (postgres's shape: a client's first
#     probe after 64 connections was refused), and all 20 of a fabsock
#     client's connections offload.
. "$(dirname "$0")/lib.sh"

SC=$FS_PROGS/fs_shortconn
COUNT=300 REQ=100 ANSWER=4096 AFTER=16
LIMIT_S=120
SRV_ENV="FABSOCK_PLAIN_AFTER=$AFTER"


# FILE: a python3 client, `python3 FILE PORT N`: N connections one after
# the other, each sends 1.6-3.2 KB (a digest of its number repeated), shuts
# its write half and reads the echo to its end; "result ok" when every echo
# is exact.
echo_client() {
	cat >"$1" <<'EOF'
import hashlib, os, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    data = hashlib.sha256(b"%d" % i).digest() * (50 + i % 50)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
    c.close()
    if got != data:
        print("result FAIL connection %d: %d bytes back of %d, equal %s" % (i, len(got), len(data), got == data[:len(got)]))
        sys.exit(1)
print("result ok")
EOF
}

# run_clients LABEL PORT PLAIN_N FAB_N: the echo client without the preload
# makes PLAIN_N connections, then the one under it FAB_N, one after the
# other (DIR/plain.*, DIR/fab.*), each process's exit and echoes checked.
run_clients() {
	local label=$1 port=$2 cpid rc
	rc=0
	fs_bg cpid python3 "$DIR/client.py" "$port" "$3" >"$DIR/plain.out" 2>"$DIR/plain.err"
	fs_wait_pid "$cpid" "$LIMIT_S" || rc=$?
	fs_check_exit "$label" "plain client" "$rc" "$DIR/plain.out" "$DIR/plain.err"
	rc=0
	fs_bg cpid fs_pre python3 "$DIR/client.py" "$port" "$4" >"$DIR/fab.out" 2>"$DIR/fab.err"
	fs_wait_pid "$cpid" "$LIMIT_S" || rc=$?
	fs_check_exit "$label" "fabsock client" "$rc" "$DIR/fab.out" "$DIR/fab.err"
}

# (a)
case_plain() { # LABEL FLAGS
	local label=$1 flags=$2 port spid cpid src=0 crc=0 fails_before=$FS_FAILS
	DIR=$FS_TMP/$label
	mkdir -p "$DIR"
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return 0; }
	# shellcheck disable=SC2086
	fs_bg spid fs_pre env $SRV_ENV "$SC" server "$port" "$COUNT" "$REQ" "$ANSWER" "$DIR" $flags \
		>"$DIR/server.out" 2>"$DIR/server.err"
	fs_wait_listen "$port" || { fs_fail "$label: the server did not listen"; return 0; }
	# shellcheck disable=SC2086
	fs_bg cpid "$SC" client "$port" "$COUNT" "$REQ" "$ANSWER" "$DIR" $flags >"$DIR/client.out" 2>"$DIR/client.err"
	fs_wait_pid "$cpid" "$LIMIT_S" || crc=$?
	fs_wait_pid "$spid" "$LIMIT_S" || src=$?
	fs_check_exit "$label" server "$src" "$DIR/server.out" "$DIR/server.err"
	fs_check_exit "$label" client "$crc" "$DIR/client.out" "$DIR/client.err"
	fs_check_files "$label" "$DIR"
	fs_expect_stats "$DIR/server.err" "$label: server" plain_listeners=1 plain_accepted=$((COUNT - AFTER)) \
		kernel=$AFTER plain_tracked_yes=0 plain_probes_refused=0 offloaded=0
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: $((COUNT - AFTER)) of $COUNT connections untracked, bytes exact"
	return 0
}

# (b)
case_probing() {
	local label=probing port spid src=0 fails_before=$FS_FAILS plain_n=100 fab_n=40 got refused yes acc
	DIR=$FS_TMP/$label
	mkdir -p "$DIR"
	fs_py_echo_server "$DIR/server.py"
	echo_client "$DIR/client.py"
	# one server, one connection after the other: the plain client's,
	# then the fabsock client's
	fs_bg spid fs_pre env $SRV_ENV python3 "$DIR/server.py" 0 $((plain_n + fab_n)) >"$DIR/server.out" 2>"$DIR/server.err"
	port=$(fs_listen_port "$DIR/server.out" "$spid")
	[ -n "$port" ] || { fs_fail "$label: the server did not listen"; return 0; }
	run_clients "$label" "$port" "$plain_n" "$fab_n"
	fs_wait_pid "$spid" "$LIMIT_S" || src=$?
	[ "$src" -eq 0 ] || fs_fail "$label: server exit $src"
	fs_expect_stats "$DIR/server.err" "$label: server" plain_listeners=1
	# (the fabsock client's first connection too, when its probe came
	# after the accept and was refused)
	acc=$(fs_stat "$DIR/server.err" plain_accepted)
	[ "${acc:-0}" -ge $((plain_n - AFTER)) ] && [ "${acc:-0}" -le $((plain_n - AFTER + 1)) ] ||
		fs_fail "$label: plain_accepted=${acc:-none}, want $((plain_n - AFTER)) or one more"
	got=$(fs_stat "$DIR/fab.err" offloaded)
	[ "${got:-0}" -ge 30 ] || fs_fail "$label: the fabsock client offloaded ${got:-none} of $fab_n connections (want >= 30): $(fs_stats_fallbacks "$DIR/fab.err")"
	[ "$(fs_stat "$DIR/server.err" offloaded)" = "${got:-x}" ] ||
		fs_fail "$label: the server offloaded $(fs_stat "$DIR/server.err" offloaded), the client $got"
	refused=$(fs_stat "$DIR/server.err" plain_probes_refused) yes=$(fs_stat "$DIR/server.err" plain_tracked_yes)
	[ $((${refused:-0} + ${yes:-0})) -ge 1 ] ||
		fs_fail "$label: no probe met the plain listener (plain_probes_refused=${refused:-none} plain_tracked_yes=${yes:-none})"
	[ "$FS_FAILS" -eq "$fails_before" ] &&
		fs_pass "$label: plain after $AFTER, a probing client refused $refused / tracked $yes, then $got of $fab_n offloaded, echoes exact"
	return 0
}

# (c)
case_fork() {
	local label=fork port spid rc=0 fails_before=$FS_FAILS kept off got plain_n=60 fab_n=20 fork_at=50
	DIR=$FS_TMP/$label
	mkdir -p "$DIR"
	cat >"$DIR/server.py" <<'EOF'
import os, socket, sys
total, fork_at = int(sys.argv[1]), int(sys.argv[2])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0))
l.listen(8)
print("listening port=%d" % l.getsockname()[1], flush=True)
def echo(c):
    while True:
        b = c.recv(65536)
        if not b:
            return
        c.sendall(b)
for n in range(1, total + 1):
    c, _ = l.accept()
    if n != fork_at:
        echo(c)
        c.close()
        continue
    pid = os.fork()
    if pid == 0:
        echo(c)
        c.close()
        os._exit(0)
    c.close()
    os.waitpid(pid, 0)
EOF
	echo_client "$DIR/client.py"
	fs_bg spid fs_pre env $SRV_ENV python3 "$DIR/server.py" $((plain_n + fab_n)) "$fork_at" \
		>"$DIR/server.out" 2>"$DIR/server.err"
	port=$(fs_listen_port "$DIR/server.out" "$spid")
	[ -n "$port" ] || { fs_fail "$label: the server did not listen"; return 0; }
	run_clients "$label" "$port" "$plain_n" "$fab_n"
	fs_wait_pid "$spid" "$LIMIT_S" || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$label: server exit $rc"
	# (the child's stats line is in the same file: sums)
	kept=$(fs_stat_sum "$DIR/server.err" plain_kept) off=$(fs_stat_sum "$DIR/server.err" plain_off)
	[ "$(fs_stat_sum "$DIR/server.err" plain_listeners)" = 1 ] ||
		fs_fail "$label: plain_listeners=$(fs_stat_sum "$DIR/server.err" plain_listeners), want 1"
	[ "${off:-0}" = 1 ] || fs_fail "$label: plain_off=${off:-none}, want 1 (the fork ends the plain mode)"
	[ "${kept:-0}" -ge 1 ] || fs_fail "$label: no untracked connection was kept counted after the fork (plain_kept=${kept:-none})"
	got=$(fs_stat "$DIR/fab.err" offloaded)
	[ "${got:-0}" -ge 15 ] || fs_fail "$label: the fabsock client offloaded ${got:-none} of $fab_n (want >= 15): $(fs_stats_fallbacks "$DIR/fab.err")"
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: the connection a child held kept counted ($kept), plain mode ended, $got of $fab_n offloaded, echoes exact"
	return 0
}

# (d)
case_forking() {
	local label=forking spid port rc=0 fails_before=$FS_FAILS got
	DIR=$FS_TMP/$label
	mkdir -p "$DIR"
	cat >"$DIR/server.py" <<'EOF'
import signal, socketserver, sys
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
class H(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            b = self.request.recv(65536)
            if not b:
                return
            self.request.sendall(b)
class S(socketserver.ForkingTCPServer):
    allow_reuse_address = True
s = S(("127.0.0.1", 0), H)
print("listening port=%d" % s.server_address[1], flush=True)
s.serve_forever()
EOF
	echo_client "$DIR/client.py"
	fs_bg spid fs_pre env $SRV_ENV python3 "$DIR/server.py" >"$DIR/server.out" 2>"$DIR/server.err"
	port=$(fs_listen_port "$DIR/server.out" "$spid")
	[ -n "$port" ] || { fs_fail "$label: the server did not listen"; return 0; }
	run_clients "$label" "$port" 60 20
	kill -TERM "$spid" 2>/dev/null
	fs_wait_pid "$spid" 10 || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$label: server exit $rc"
	fs_expect_stats "$DIR/server.err" "$label: server" plain_listeners=0 plain_accepted=0 plain_probes_refused=0
	got=$(fs_stat "$DIR/fab.err" offloaded)
	[ "$got" = 20 ] || fs_fail "$label: the fabsock client offloaded ${got:-none} of 20: $(fs_stats_fallbacks "$DIR/fab.err")"
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label: a server that forks for each connection never turned plain; 20 of 20 offloaded"
	return 0
}

case_plain plain-blocking ""
case_plain plain-first first
case_plain plain-epoll ep
case_probing
case_fork
case_forking
fs_done
