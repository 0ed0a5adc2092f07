#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A client port used again while the listener still holds the record of the
# earlier connection from it. A forking server whose child leaves with
# _exit() (as PostgreSQL's backends do) never closes its connection through
# fabsock, so the listener's probe record of it stays settled for its
# lifetime (15 s). A client with hundreds of connections reuses ports within
# that time (pgbench -c 300's second run: 8 of 300 stayed on TCP). Here a
# client binds the same local port for 5 connections in a row (loopback
# reuses the port at once: tcp_tw_reuse). Each connection must be offloaded
# (the probe of the new one is answered yes: the kernel names another
# socket for the 4-tuple, so the record was an earlier connection's), and
# every echo is byte-exact, on the kernel and under fabsock.
. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null || fs_skip "python3 is missing"
N=5
cat >"$FS_TMP/forksrv.py" <<'EOF'
import os, socket, sys, signal
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0))
ls.listen(64)
print("listening port=%d" % ls.getsockname()[1], flush=True)
while True:
    c, _ = ls.accept()
    if os.fork() == 0:
        ls.close()
        req = b""
        while len(req) < 9:
            d = c.recv(9 - len(req))
            if not d:
                os._exit(1)
            req += d
        c.sendall(req[8:9])
        c.recv(1)      # the client's close
        os._exit(0)    # no close(): the record stays settled
    c.close()
EOF
cat >"$FS_TMP/reuse.py" <<'EOF'
import socket, struct, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
lport, ok = 0, 0
for i in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", lport))
    lport = s.getsockname()[1]  # the first connection's port, for all
    s.connect(("127.0.0.1", port))
    b = bytes([(i * 37 + 5) & 0xff])
    s.sendall(struct.pack("!II", 1, 1) + b)
    ok += s.recv(1) == b
    s.close()
    time.sleep(0.05)
print("echoed %d of %d from port %d" % (ok, n, lport))
EOF

for mode in $FS_MODES; do
	dir=$FS_TMP/$mode
	mkdir -p "$dir"
	pre=(env -u LD_PRELOAD)
	[ "$mode" = fabsock ] && pre=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	fs_bg srv "${pre[@]}" python3 "$FS_TMP/forksrv.py" >"$dir/server.out" 2>"$dir/server.err"
	port=$(fs_listen_port "$dir/server.out" "$srv")
	[ -n "$port" ] || { fs_fail "$mode: the server did not listen"; continue; }
	rc=0
	timeout -k 2 60 "${pre[@]}" python3 "$FS_TMP/reuse.py" "$port" "$N" >"$dir/client.out" 2>"$dir/client.err" || rc=$?
	kill "$srv" 2>/dev/null || true
	fs_wait_pid "$srv" 10 >/dev/null || true
	if [ "$rc" != 0 ] || ! grep -q "^echoed $N of $N" "$dir/client.out"; then
		fs_fail "$mode: client exit $rc: $(cat "$dir/client.out") $(tail -n 3 "$dir/client.err" | tr '\n' ' ')"
		continue
	fi
	if [ "$mode" = fabsock ]; then
		off=$(fs_stat "$dir/client.err" offloaded) no=$(fs_stat "$dir/client.err" fallback_probe_no)
		tx=$(fs_stat "$dir/client.err" fabric_tx_bytes)
		if [ "${off:-0}" != "$N" ] || [ "${no:-0}" != 0 ] || [ "${tx:-0}" -lt $((N * 9)) ]; then
			fs_fail "fabsock: $N connections from one port: offloaded=${off:-?} fallback_probe_no=${no:-?} fabric_tx_bytes=${tx:-?} ($(fs_stats_fallbacks "$dir/client.err"))"
			continue
		fi
	fi
	fs_pass "$mode: $(cat "$dir/client.out")$([ "$mode" = fabsock ] && echo ", all offloaded")"
done
fs_done
