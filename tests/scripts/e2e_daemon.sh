#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A server that daemonizes the way packaged servers do (nginx with its
# default `daemon on`, memcached -d, redis with daemonize yes, slapd): the
# process that made the listener forks and exits, and its child serves
# from an epoll loop with nonblocking sockets (python's selectors). Nobody
# is left whose service thread answers the listener's probes for everyone
# (fs_listener_answered is false in the child): the child drains them
# itself.
#   plain    a client without the preload (COUNT connections one after the
#            other, a random line each, the server's sha256 of it back):
#            every connection's first receive must take the bytes straight
#            from the kernel and settle it as TCP (server_first_read_direct
#            and fallback_peer_plain both COUNT), as for a server whose
#            listener's maker lives: before, each paid a probe drain, a
#            poll, an epoll_ctl and an extra epoll_wait per request (an
#            nginx worker of a daemonized nginx: 18 system calls per
#            Connection: close request where a foreground one made 16).
#   fabsock  a client under the preload, same user: every connection is
#            still offloaded (the child answers the probes), both ends'
#            offloaded counts are COUNT, and the fabsock client's lines
#            come back right.
# Bytes end to end (sha256 of each line), no process killed by a signal,
# the daemon exits by itself after its 2 x COUNT connections.
. "$(dirname "$0")/lib.sh"

COUNT=${FS_DAEMON_COUNT:-40}

cat >"$FS_TMP/daemon.py" <<'EOF'
import hashlib, os, selectors, socket, sys
count, portfile = int(sys.argv[1]), sys.argv[2]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0))
l.listen(64)
port = l.getsockname()[1]
if os.fork():
    os._exit(0)                 # the maker of the listener goes: a daemon
os.setsid()
l.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(l, selectors.EVENT_READ, None)
with open(portfile + ".tmp", "w") as f:
    f.write("%d %d\n" % (port, os.getpid()))
os.rename(portfile + ".tmp", portfile)
bufs, done = {}, 0
while done < count:
    for key, _ in sel.select(20):
        if key.data is None:
            try:
                c, _ = l.accept()
            except BlockingIOError:
                continue
            c.setblocking(False)
            bufs[c] = b""
            sel.register(c, selectors.EVENT_READ, c)
            continue
        c = key.data
        try:
            b = c.recv(65536)
        except BlockingIOError:
            continue
        bufs[c] += b
        if b and not bufs[c].endswith(b"\n"):
            continue
        sel.unregister(c)
        if b:
            c.setblocking(True)
            c.sendall(hashlib.sha256(bufs[c]).hexdigest().encode() + b"\n")
        c.close()
        del bufs[c]
        done += 1
print("served %d" % done, flush=True)
EOF

cat >"$FS_TMP/client.py" <<'EOF'
import hashlib, os, socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
for i in range(count):
    line = os.urandom(1000 + 37 * i).hex().encode() + b"\n"
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(line)
    got = b""
    while not got.endswith(b"\n"):
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    if got != hashlib.sha256(line).hexdigest().encode() + b"\n":
        print("connection %d: wrong answer %r" % (i, got[:80]), flush=True)
        sys.exit(1)
print("result ok", flush=True)
EOF

PORTFILE=$FS_TMP/port
rc=0
env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/daemon.py" $((2 * COUNT)) "$PORTFILE" \
	>"$FS_TMP/daemon.out" 2>"$FS_TMP/daemon.err" </dev/null || rc=$?
[ "$rc" -eq 0 ] || fs_fail "the daemon's parent exited $rc"
for ((i = 0; i < 200; i++)); do [ -s "$PORTFILE" ] && break; fs_sleep 0.05; done
read -r PORT DPID <"$PORTFILE" || { fs_fail "the daemon wrote no port"; fs_done; exit 1; }
FS_PIDS+=("$DPID")

crc=0
timeout -k 2 60 python3 "$FS_TMP/client.py" "$PORT" "$COUNT" >"$FS_TMP/plain.out" 2>"$FS_TMP/plain.err" || crc=$?
if [ "$crc" -eq 0 ] && grep -qx 'result ok' "$FS_TMP/plain.out"; then
	fs_pass "plain client: $COUNT connections, every answer right"
else
	fs_fail "plain client: exit $crc: $(head -c 300 "$FS_TMP/plain.out" "$FS_TMP/plain.err" | tr '\n' ' ')"
fi
crc=0
timeout -k 2 60 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/client.py" "$PORT" "$COUNT" \
	>"$FS_TMP/fab.out" 2>"$FS_TMP/fab.err" || crc=$?
if [ "$crc" -eq 0 ] && grep -qx 'result ok' "$FS_TMP/fab.out"; then
	fs_pass "fabsock client: $COUNT connections, every answer right"
else
	fs_fail "fabsock client: exit $crc: $(head -c 300 "$FS_TMP/fab.out" "$FS_TMP/fab.err" | tr '\n' ' ')"
fi
fs_expect_stats "$FS_TMP/fab.err" "fabsock client" offloaded="$COUNT" kernel=0

# the daemon is not our child: wait for it by its pid
for ((i = 0; i < 400; i++)); do kill -0 "$DPID" 2>/dev/null || break; fs_sleep 0.05; done
if kill -0 "$DPID" 2>/dev/null; then
	fs_fail "the daemon still runs after its $((2 * COUNT)) connections: killed"
	kill -9 "$DPID" 2>/dev/null || true
elif grep -qx "served $((2 * COUNT))" "$FS_TMP/daemon.out"; then
	fs_pass "the daemon served $((2 * COUNT)) connections and exited"
else
	fs_fail "the daemon did not say it served $((2 * COUNT)): $(head -c 300 "$FS_TMP/daemon.out" "$FS_TMP/daemon.err" | tr '\n' ' ')"
fi
if grep -qE 'Traceback|Segmentation|Aborted|AddressSanitizer|runtime error' "$FS_TMP"/*.err; then
	fs_fail "a process crashed or raised: $(grep -hE 'Traceback|Segmentation|Aborted|Sanitizer|runtime error' "$FS_TMP"/*.err | head -n 3 | tr '\n' ' ')"
fi
# the child's stats line (the parent exited before any connection: none)
fs_expect_stats "$FS_TMP/daemon.err" "daemon" offloaded="$COUNT" fallback_peer_plain="$COUNT" \
	server_first_read_direct="$COUNT"
fs_done
