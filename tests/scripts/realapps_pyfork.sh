#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: Python's socketserver.ForkingTCPServer, the standard library's
# "a child per connection" server: the parent accepts and forks, the child
# serves the connection and leaves through os._exit() (no atexit handlers,
# no stdio flush), as socketserver does after shutdown(SHUT_WR) and close().
# The handler echoes everything until EOF. Six clients (separate python3
# processes) at once each send 8 MiB of random bytes from a writer thread,
# then shut their write side down, while reading the echo until EOF.
#   - every client receives exactly the 8 MiB it sent (sha256), exits 0;
#   - the server (parent) is alive after, and leaves through exit() on
#     SIGINT (its stats line);
#   - fabsock mode: the six clients offloaded 6 streams (their stats lines),
#     the server's children said "offloaded (server)" six times (info log:
#     they leave through _exit(), which prints no stats line), no stream was
#     reset and no fabsock warning reports lost bytes; the TCP connections
#     on the port carried only the handshakes (nftables byte counter).
# Kernel mode first, then fabsock. Aggregate echo MB/s is the figure.

. "$(dirname "$0")/realapps_lib.sh"

PY=/usr/bin/python3
[ -x "$PY" ] || fs_skip "python3 is not installed (apt-get install python3)"
ra_need nft timeout

NCLI=6
MIB=8
CLIENT_LIMIT=60
: "${RA_FABSOCK_LOG:=info}" # the children's "offloaded (server)" lines

cat >"$FS_TMP/echo_server.py" <<'EOF'
import socketserver, sys

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            s.sendall(b)

class Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True
    max_children = 64

srv = Server(("127.0.0.1", 0), Echo)
print("listening port=%d" % srv.server_address[1], flush=True)
try:
    srv.serve_forever()
except KeyboardInterrupt:
    pass
srv.server_close()
EOF

cat >"$FS_TMP/echo_client.py" <<'EOF'
import hashlib, os, socket, sys, threading, time

host, port, nbytes, ident = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
data = os.urandom(nbytes)
want = hashlib.sha256(data).hexdigest()
s = socket.create_connection((host, port))
err = []

def writer():
    try:
        view = memoryview(data)
        for off in range(0, len(view), 65536):
            s.sendall(view[off:off + 65536])
        s.shutdown(socket.SHUT_WR)
    except Exception as e:
        err.append("send: %r" % e)

t0 = time.time()
w = threading.Thread(target=writer)
w.start()
h = hashlib.sha256()
got = 0
try:
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        h.update(b)
        got += len(b)
except Exception as e:
    err.append("recv after %d bytes: %r" % (got, e))
w.join()
dt = time.time() - t0
s.close()
if err or got != nbytes or h.hexdigest() != want:
    print("FAIL client %s: got %d of %d bytes, sha256 %s; %s" %
          (ident, got, nbytes, "equal" if h.hexdigest() == want else "differs", "; ".join(err)), flush=True)
    sys.exit(1)
print("PASS client %s: %d bytes echoed in %.3f s" % (ident, got, dt), flush=True)
EOF

declare -A FIG_RATE

py_run() {
	local mode=$1 srv port i rc ok=0 t0 t1 n
	local -a cli=()
	LOG=$FS_TMP/$mode
	ra_env "$mode" server
	fs_bg srv timeout -s INT -k 5 110 "${RA_ENV[@]}" "$PY" "$FS_TMP/echo_server.py" >"$LOG-server.out" 2>"$LOG-server.err"
	port=$(fs_listen_port "$LOG-server.out" "$srv")
	if [ -z "$port" ] || ! ra_wait_listen "$port" "$srv"; then
		fs_fail "$RA_CASE $mode: the server did not listen"
		sed 's/^/    /' "$LOG-server.err" >&2 || true
		return
	fi
	fs_tcp_count_start "$port" || fs_fail "$RA_CASE $mode: nft counter not set up"

	ra_env "$mode" client
	t0=$(date +%s.%N)
	for i in $(seq 1 "$NCLI"); do
		fs_bg "cli[$i]" timeout -k 5 "$CLIENT_LIMIT" "${RA_ENV[@]}" "$PY" "$FS_TMP/echo_client.py" \
			127.0.0.1 "$port" $((MIB << 20)) "$i" >"$LOG-client$i.out" 2>"$LOG-client$i.err"
	done
	for i in $(seq 1 "$NCLI"); do
		rc=0
		fs_wait_pid "${cli[$i]}" $((CLIENT_LIMIT + 10)) || rc=$?
		if [ "$rc" -eq 0 ] && grep -q '^PASS' "$LOG-client$i.out"; then
			ok=$((ok + 1))
		else
			fs_fail "$RA_CASE $mode: client $i exited $rc$([ "$rc" = 124 ] && echo ' (timeout)'): $(cat "$LOG-client$i.out" | head -n 2 | tr '\n' ' ')"
			ra_tail 4 "$LOG-client$i.err"
		fi
	done
	t1=$(date +%s.%N)
	if [ "$ok" -eq "$NCLI" ]; then
		FIG_RATE[$mode]=$(awk -v s=$((2 * NCLI * MIB << 20)) -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", s / (b - a) / 1e6 }')
		fs_pass "$RA_CASE $mode: all $NCLI clients got their $MIB MiB back byte-exact (${FIG_RATE[$mode]} MB/s both ways together)"
	fi
	ra_tcp_payload_check "$mode" $((2 * NCLI * MIB << 20)) "$NCLI"
	fs_tcp_count_stop

	ra_alive "$mode" "$srv" "the server" "the clients" ||
		tail -n 2 "$LOG-server.err" | sed 's/^/    /' >&2 || true
	# SIGINT to python itself: timeout would pass it on to its whole
	# process group, the server twice (a KeyboardInterrupt inside
	# server_close() or at exit: a traceback, in kernel mode too).
	kill -INT "$(pgrep -P "$srv" | head -n 1)" 2>/dev/null || kill -INT "$srv" 2>/dev/null || true
	fs_wait_pid "$srv" 15 >/dev/null 2>&1 || true
	if grep -q 'Traceback' "$LOG-server.err"; then
		fs_fail "$RA_CASE $mode: the server printed tracebacks:"
		awk '/^Traceback/ { t = 1; next } t && /^[^ ]/ { print; t = 0 }' "$LOG-server.err" | sort | uniq -c | sed 's/^/    /' >&2 || true
	fi

	if [ "$mode" = fabsock ]; then
		cat "$LOG"-client*.err >>"$RA_DIR/client.fabsock.log" 2>/dev/null || true
		cat "$LOG-server.err" >>"$RA_DIR/server.fabsock.log" 2>/dev/null || true
		grep -hv ': stats:' "$RA_DIR/client.fabsock.log" "$RA_DIR/server.fabsock.log" 2>/dev/null | grep 'fabsock\[' |
			sed -E 's/^fabsock\[[0-9]+\]: //; s/fd [0-9]+: //; s/stream [0-9]+( -> [0-9]+)?/stream N/g; s/after [0-9]+ bytes/after N bytes/' |
			sort | uniq -c | sed 's/^/    note: /' >&2 || true
		ra_offloaded client fabsock "$NCLI"
		n=$(grep -c 'offloaded (server)' "$RA_DIR/server.fabsock.log" || true)
		if [ "$n" -ge "$NCLI" ]; then
			fs_pass "$RA_CASE fabsock: the server's children offloaded $n streams (info log)"
		else
			fs_fail "$RA_CASE fabsock: the server's children offloaded $n streams (info log), expected $NCLI"
		fi
		n=$(ra_sum client fabsock resets)
		[ "$n" = 0 ] || fs_fail "$RA_CASE fabsock: the clients counted $n reset streams"
		for i in client server; do
			ra_all_offloaded "$i" fabsock
			ra_log_clean "$i" fabsock || true
		done
	fi
}

for mode in $FS_MODES; do
	py_run "$mode"
done

ra_figure "ForkingTCPServer echo, $NCLI x $MIB MiB" MB/s "${FIG_RATE[kernel]:-0}" "${FIG_RATE[fabsock]:-0}"
ra_done
