#!/bin/bash
# SPDX-License-Identifier: MIT
# What an event-loop server pays while its accepted connections wait for
# their client's first bytes (SERVER_PENDING members of its epoll set): a
# Python selectors/epoll echo server under the preload accepts CONNS
# connections whose client connects and then holds its first bytes for
# HOLD_MS (a pool that connects ahead of use, a proxy's upstream opened
# before the request is ready), then sends BYTES random bytes per
# connection, half-closes, and reads the echo back.
# Only the kernel can settle such a connection (its bytes or FIN; a probe on
# the listener's socket), so the server's epoll_wait must sleep in the kernel
# meanwhile: its main thread may switch context at most SWITCH_LIMIT times
# over a 1 s window of the hold (the bound of such a sleep, 250 ms, makes a
# few; the spin and sleep slices of a wait for an offloaded stream made
# hundreds). With a plain client (the connections stay on TCP:
# fallback_peer_plain, no probe); and with a client under the preload, whose
# probe is answered and whose HELLO wakes the server's kernel wait (every
# connection offloaded on both ends; the hold is then an idle offloaded
# stream's, e2e_idle_cpu's measure, not counted here). Every echo is checked by sha256, the
# first answer after the hold must come within WAKE_LIMIT_MS (a wake-up
# missed until the 250 ms bound shows), both ends exit 0, no signal.

. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
[ -x "$PY" ] || fs_skip "no $PY"
[ -f "$FABSOCK_LIB" ] || fs_skip "no library at $FABSOCK_LIB"

CONNS=4
HOLD_MS=2500
BYTES=200000
SWITCH_LIMIT=40
WAKE_LIMIT_MS=150

cat >"$FS_TMP/server.py" <<'EOF'
import selectors, socket, sys
conns = int(sys.argv[2])
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(64)
open(sys.argv[1] + ".tmp", "w").write("%d\n" % ls.getsockname()[1])
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
sel = selectors.DefaultSelector()  # epoll
sel.register(ls, selectors.EVENT_READ)
done = 0
bufs = {}
while done < conns:
    for key, _ in sel.select(30):
        s = key.fileobj
        if s is ls:
            c, _ = ls.accept()
            c.setblocking(False)
            bufs[c] = b""
            sel.register(c, selectors.EVENT_READ)
            continue
        d = s.recv(65536)
        if d:
            bufs[s] += d
            continue
        sel.unregister(s)
        s.setblocking(True)
        s.sendall(bufs.pop(s))
        s.close()
        done += 1
    else:
        pass
print("served", done)
EOF

cat >"$FS_TMP/client.py" <<'EOF'
import hashlib, os, socket, sys, time
port, conns, hold_ms, nbytes, go = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                    int(sys.argv[4]), sys.argv[5])
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
open(go, "w").write("held\n")
time.sleep(hold_ms / 1000)
bad = 0
first_ms = None
for s in socks:
    data = os.urandom(nbytes)
    t = time.monotonic()
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        d = s.recv(65536)
        if first_ms is None and d:
            first_ms = (time.monotonic() - t) * 1000
        if not d:
            break
        got += d
    if hashlib.sha256(got).digest() != hashlib.sha256(data).digest():
        bad += 1
    s.close()
print("bad %d first_ms %.1f" % (bad, first_ms or -1))
EOF

# switches TID: the voluntary and involuntary context switches of thread TID
switches() {
	awk '/ctxt_switches/ { s += $2 } END { print s + 0 }' "/proc/$1/task/$1/status" 2>/dev/null || echo -1
}

pending_case() {
	local client=$1 what="$1 client" dir=$FS_TMP/$1 srv cli spid port s0 s1 n bad first rc pre=()
	mkdir -p "$dir"
	fs_bg srv env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PY" "$FS_TMP/server.py" "$dir/port" "$CONNS" \
		>"$dir/server.out" 2>"$dir/server.err"
	for _ in $(seq 1 200); do [ -s "$dir/port" ] && break; fs_sleep 0.05; done
	port=$(cat "$dir/port" 2>/dev/null) || { fs_fail "$what: server not ready"; return; }
	[ "$client" = fabsock ] && pre=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1) || pre=(env -u LD_PRELOAD)
	fs_bg cli "${pre[@]}" "$PY" "$FS_TMP/client.py" "$port" "$CONNS" "$HOLD_MS" "$BYTES" "$dir/held" \
		>"$dir/client.out" 2>"$dir/client.err"
	for _ in $(seq 1 200); do [ -s "$dir/held" ] && break; fs_sleep 0.05; done
	[ -s "$dir/held" ] || { fs_fail "$what: the client did not connect"; return; }
	# the server accepted them and waits in epoll_wait: one window of 1 s
	fs_sleep 0.5
	spid=$srv
	s0=$(switches "$spid")
	fs_sleep 1
	s1=$(switches "$spid")
	n=$((s1 - s0))
	if [ "$client" = fabsock ]; then
		# its HELLO came at connect: the server's members are offloaded
		# streams, idle (e2e_idle_cpu's measure), not pending ones
		fs_log "$what: the server's thread switched $n times in 1 s (offloaded and idle)"
	elif [ "$s0" -ge 0 ] && [ "$s1" -ge 0 ] && [ "$n" -le "$SWITCH_LIMIT" ]; then
		fs_pass "$what: the server's thread switched $n times in 1 s of waiting for first bytes (limit $SWITCH_LIMIT)"
	else
		fs_fail "$what: the server's thread switched $n times in 1 s of waiting for first bytes (limit $SWITCH_LIMIT; $s0 -> $s1)"
	fi
	rc=0
	fs_wait_pid "$cli" 60 || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$what: client exit status $rc"
	rc=0
	fs_wait_pid "$srv" 30 || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$what: server exit status $rc"
	read -r _ bad _ first <"$dir/client.out" || { bad=x first=-1; }
	if [ "$bad" = 0 ] && grep -q "served $CONNS" "$dir/server.out"; then
		fs_pass "$what: $CONNS echoes of $BYTES bytes, sha256 equal"
	else
		fs_fail "$what: echoes: ${bad:-?} of $CONNS differ; server: $(cat "$dir/server.out" "$dir/server.err" | tail -n 3 | tr '\n' ' ')"
	fi
	if awk -v f="${first:--1}" -v l="$WAKE_LIMIT_MS" 'BEGIN { exit !(f >= 0 && f < l) }'; then
		fs_pass "$what: the first answer after the hold in $first ms (limit $WAKE_LIMIT_MS)"
	else
		fs_fail "$what: the first answer after the hold in ${first:-none} ms (limit $WAKE_LIMIT_MS)"
	fi
	if [ "$client" = fabsock ]; then
		fs_expect_stats "$dir/server.err" "$what: server" offloaded=$CONNS kernel=0 resets=0
		fs_expect_stats "$dir/client.err" "$what: client" offloaded=$CONNS kernel=0 resets=0
	else
		fs_expect_stats "$dir/server.err" "$what: server" offloaded=0 kernel=$CONNS fallback_peer_plain=$CONNS
	fi
}

pending_case plain
pending_case fabsock
fs_done
