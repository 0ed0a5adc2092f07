#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A server that daemonizes the way packaged servers do (nginx with its
# default `daemon on`, memcached -d, redis with daemonize yes, slapd): the
# process that made the listener forks and exits, and what is left serves
# from an epoll loop with nonblocking sockets (python's selectors). Shapes:
#   one      the daemon's first child serves;
#   workers  that child forks two workers that serve, and only waits
#            (nginx's master and workers).
# Nobody was left whose service thread answers the listener's probes: the
# serving processes drained them in their waits, and each plain request
# paid the settling that wait does. Now one of the processes that hold the
# listener takes it over (listeners_adopted, summed over the daemon's
# processes: exactly 1): its service thread answers the probes, and the
# others find an answerer alive.
# In each shape:
#   plain    a client without the preload (COUNT connections one after the
#            other, a random line each, the server's sha256 of it back):
#            every connection's first receive takes the bytes straight from
#            the kernel and settles it as TCP (server_first_read_direct and
#            fallback_peer_plain both COUNT, summed), as for a server whose
#            listener's maker lives;
#   fabsock  a client under the preload, same user: every connection is
#            offloaded (both ends' offloaded counts are COUNT), and the
#            kernel's counters show no payload on TCP (fs_tcp_proof).
# Bytes end to end (sha256 of each line), no process crashed, every process
# of the daemon exits at SIGTERM having served its share (2 x COUNT in all).
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || fs_skip "needs root (nftables counter)"
fs_need_nft

COUNT=${FS_DAEMON_COUNT:-40}

cat >"$FS_TMP/daemon.py" <<'EOF'
import hashlib, os, selectors, signal, socket, sys
workers, portfile = int(sys.argv[1]), sys.argv[2]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0))
l.listen(64)
port = l.getsockname()[1]
if os.fork():
    os._exit(0)                 # the maker of the listener goes: a daemon
os.setsid()
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)

def serve():
    l.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(l, selectors.EVENT_READ, None)
    bufs, done = {}, 0
    while not stop:
        for key, _ in sel.select(0.05):
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
    # a file each: two workers' lines in one shared file could mix
    with open("%s.served.%d" % (portfile, os.getpid()), "w") as f:
        f.write("served %d\n" % done)

kids = []
for _ in range(workers):        # nginx's shape: a master that only waits
    pid = os.fork()
    if pid == 0:
        serve()
        sys.exit(0)
    kids.append(pid)
with open(portfile + ".tmp", "w") as f:
    f.write("%d %d\n" % (port, os.getpid()))
os.rename(portfile + ".tmp", portfile)
if not kids:
    serve()
else:
    while not stop:
        signal.pause()
    for pid in kids:
        os.kill(pid, signal.SIGTERM)
    for pid in kids:
        os.waitpid(pid, 0)
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

# daemon_case NAME WORKERS: the daemon in shape NAME, a plain client and a
# fabsock client of COUNT connections each, then SIGTERM to what is left.
daemon_case() {
	local name=$1 workers=$2 dir=$FS_TMP/$1 rc=0 crc i port dpid mode served kv want got bad=
	mkdir -p "$dir"
	env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/daemon.py" "$workers" "$dir/port" \
		>"$dir/daemon.out" 2>"$dir/daemon.err" </dev/null || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$name: the daemon's parent exited $rc"
	for ((i = 0; i < 200; i++)); do
		[ -s "$dir/port" ] && break
		fs_sleep 0.05
	done
	read -r port dpid <"$dir/port" || { fs_fail "$name: the daemon wrote no port"; return; }
	FS_PIDS+=("$dpid")
	for mode in plain fab; do
		crc=0
		if [ "$mode" = plain ]; then
			timeout -k 2 60 python3 "$FS_TMP/client.py" "$port" "$COUNT" >"$dir/$mode.out" 2>"$dir/$mode.err" || crc=$?
		else
			# the kernel's own count: no payload byte on TCP (each line
			# is 2-5 KB, the answers 65 B: no allowance to hide them)
			fs_tcp_count_start "$port" || fs_fail "$name: cannot start the TCP counter"
			timeout -k 2 60 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/client.py" "$port" \
				"$COUNT" >"$dir/$mode.out" 2>"$dir/$mode.err" || crc=$?
			fs_tcp_proof "$name: fabsock client" fabsock "$COUNT"
		fi
		if [ "$crc" -eq 0 ] && grep -qx 'result ok' "$dir/$mode.out"; then
			fs_pass "$name: $mode client: $COUNT connections, every answer right"
		else
			fs_fail "$name: $mode client: exit $crc: $(head -c 300 "$dir/$mode.out" "$dir/$mode.err" | tr '\n' ' ')"
		fi
	done
	fs_expect_stats "$dir/fab.err" "$name: fabsock client" offloaded="$COUNT" kernel=0
	kill -TERM "$dpid" 2>/dev/null || true
	# the daemon is not our child: waited for by its pid (its workers end
	# before it: it waits for them)
	for ((i = 0; i < 200; i++)); do
		kill -0 "$dpid" 2>/dev/null || break
		fs_sleep 0.05
	done
	if kill -0 "$dpid" 2>/dev/null; then
		fs_fail "$name: the daemon still runs 10 s after SIGTERM: killed"
		kill -9 "$dpid" 2>/dev/null || true
	fi
	served=$(cat "$dir"/port.served.* 2>/dev/null | sed -n 's/^served //p' | awk '{s += $1} END {print s + 0}')
	if [ "$served" -eq $((2 * COUNT)) ]; then
		fs_pass "$name: the daemon served $((2 * COUNT)) connections and exited"
	else
		fs_fail "$name: the daemon served $served of $((2 * COUNT)): $(cat "$dir"/port.served.* 2>/dev/null | tr '\n' ' ') $(head -c 300 "$dir/daemon.out" "$dir/daemon.err" | tr '\n' ' ')"
	fi
	if grep -qE 'Traceback|Segmentation|Aborted|AddressSanitizer|runtime error' "$dir"/*.err; then
		fs_fail "$name: a process crashed or raised: $(grep -hE 'Traceback|Segmentation|Aborted|Sanitizer|runtime error' "$dir"/*.err | head -n 3 | tr '\n' ' ')"
	fi
	# summed over the daemon's processes (the maker exited before any
	# connection came)
	for kv in offloaded="$COUNT" fallback_peer_plain="$COUNT" server_first_read_direct="$COUNT" listeners_adopted=1; do
		want=${kv#*=} got=$(fs_stat_sum "$dir/daemon.err" "${kv%%=*}")
		[ "$got" = "$want" ] || bad+=" ${kv%%=*}=$got (expected $want)"
	done
	if [ -n "$bad" ]; then
		fs_fail "$name: daemon stats:$bad"
	else
		fs_pass "$name: daemon stats: offloaded, fallback_peer_plain, server_first_read_direct $COUNT each; one listener taken over"
	fi
}

daemon_case one 0
daemon_case workers 2
fs_done
