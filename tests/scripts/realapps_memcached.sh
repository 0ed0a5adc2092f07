#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: memcached 1.6 as Debian ships it (one process, libevent
# worker threads, epoll, nonblocking sockets), started as root with
# `-u nobody` (it drops to nobody), TCP only (-U 0: fabsock's probe uses the
# UDP port of the same number), on a free port of 127.0.0.1. Clients run as
# nobody, the server's user. First on the kernel, then with memcached and
# every client under the preload (realapps_lib.sh):
#   - memccapable (libmemcached's protocol conformance test, ASCII and
#     binary): every test must pass;
#   - a value round trip of our own (python3, one connection): values of
#     100 B, 100 KB and 900 KB, random bytes, set then get, sha256 equal;
#   - memcslap (Debian's memslap) -c 8 set, then get: bounded runs, must
#     complete; ops/s are the figure;
#   - the TCP connections carried no payload in fabsock mode beyond the
#     HELLOs while memcached moved MBs (nftables counter);
#   - memcached is alive after the load, leaves on SIGTERM with status 0 (its
#     stats line says it offloaded the clients' connections), no core files.

. "$(dirname "$0")/realapps_lib.sh"

ra_need memcached memccapable memcslap nft sha256sum setpriv gdb file
PY=/usr/bin/python3
[ -x "$PY" ] || fs_skip "no $PY"
id nobody >/dev/null 2>&1 || fs_skip "no nobody user"

SLAP_N=${RA_SLAP_N:-4000} # memcslap operations per thread (8 threads)

# The round-trip client: sets each FILE as key rt:<i> then gets it back into
# FILE.back; one connection, plain memcached ASCII protocol.
cat >"$RA_DIR/mc_roundtrip.py" <<'EOF'
import socket, sys
port, files = int(sys.argv[1]), sys.argv[2:]
s = socket.create_connection(("127.0.0.1", port), timeout=20)
buf = b""
moved = 0 # bytes sent and received on this connection, printed last
def send(b):
    global moved
    s.sendall(b)
    moved += len(b)
def line():
    global buf, moved
    while b"\r\n" not in buf:
        d = s.recv(65536)
        moved += len(d)
        if not d:
            sys.exit("connection closed while waiting for a line")
        buf += d
    l, buf = buf.split(b"\r\n", 1)
    return l
def exact(n):
    global buf, moved
    while len(buf) < n:
        d = s.recv(1 << 20)
        moved += len(d)
        if not d:
            sys.exit("connection closed inside a value")
        buf += d
    v, buf = buf[:n], buf[n:]
    return v
for i, f in enumerate(files):
    v = open(f, "rb").read()
    send(b"set rt:%d 0 0 %d\r\n" % (i, len(v)) + v + b"\r\n")
    r = line()
    if r != b"STORED":
        sys.exit("set rt:%d (%d bytes): %r" % (i, len(v), r[:80]))
for i, f in enumerate(files):
    send(b"get rt:%d\r\n" % i)
    h = line().split()
    if len(h) != 4 or h[0] != b"VALUE":
        sys.exit("get rt:%d: %r" % (i, b" ".join(h)[:80]))
    v = exact(int(h[3]))
    if exact(2) != b"\r\n" or line() != b"END":
        sys.exit("get rt:%d: bad framing after the value" % i)
    open(f + ".back", "wb").write(v)
send(b"stats\r\n")
st = {}
while True:
    l = line()
    if l == b"END":
        break
    p = l.split()
    st[p[1].decode()] = p[2].decode()
send(b"quit\r\n")
s.close()
print("bytes_read=%s bytes_written=%s total_connections=%s moved=%d" % (st.get("bytes_read"), st.get("bytes_written"), st.get("total_connections"), moved))
EOF
chmod 644 "$RA_DIR/mc_roundtrip.py"
for sz in 100 102400 921600; do
	head -c "$sz" /dev/urandom >"$RA_DIR/value.$sz"
done
chmod 644 "$RA_DIR"/value.*

declare -A FIG

# mc_roundtrip MODE: sets and gets back the three values (checked); RT_STATS
# gets the server's "bytes_read=.. bytes_written=.. total_connections=.." after it.
mc_roundtrip() {
	local mode=$1 out rc=0 sz bad=0
	ra_env "$mode" "client-rt"
	rm -f "$RA_DIR"/value.*.back
	out=$(ra_as nobody timeout -k 2 30 "${RA_ENV[@]}" "$PY" "$RA_DIR/mc_roundtrip.py" "$PORT" \
		"$RA_DIR/value.100" "$RA_DIR/value.102400" "$RA_DIR/value.921600" 2>"$RA_DIR/rt.$mode.err") || rc=$?
	for sz in 100 102400 921600; do
		if ! cmp -s "$RA_DIR/value.$sz" "$RA_DIR/value.$sz.back"; then
			bad=1
		fi
	done
	if [ "$rc" -ne 0 ] || [ "$bad" -ne 0 ]; then
		fs_fail "$RA_CASE $mode: value round trip: exit status $rc, values equal: $([ "$bad" = 0 ] && echo yes || echo no): $(grep -v ': stats:' "$RA_DIR/rt.$mode.err" | tail -n 1)"
	else
		fs_pass "$RA_CASE $mode: values of 100 B, 100 KB and 900 KB set and read back, sha256 equal"
	fi
	RT_STATS=$out
}

# mc_stats: prints the server's "bytes_read=.. bytes_written=.. ..." through
# a connection of a plain client (no preload: it settles as TCP at once),
# taken outside the nftables count.
mc_stats() {
	ra_as nobody timeout -k 2 10 env -u LD_PRELOAD "$PY" "$RA_DIR/mc_roundtrip.py" "$PORT" 2>/dev/null || true
}

# mc_slap MODE TEST: one bounded memcslap run (8 threads); FIG gets ops/s.
mc_slap() {
	local mode=$1 t=$2 out rc=0 keys secs ops
	out=$RA_DIR/slap-$t.$mode.out
	ra_env "$mode" "memcslap"
	SECONDS=0
	ra_as nobody timeout -k 2 20 "${RA_ENV[@]}" memcslap -s "127.0.0.1:$PORT" -t "$t" -c 8 -e "$SLAP_N" \
		>"$out" 2>"$out.err" || rc=$?
	read -r keys secs < <(sed -nE "s/^Time to $t +([0-9]+) keys by +8 threads: +([0-9.]+) seconds.*/\1 \2/p" "$out") || true
	ops=$(awk -v k="${keys:-0}" -v s="${secs:-0}" 'BEGIN { if (s > 0) printf "%.0f", k / s; else print 0 }')
	FIG["$t $mode"]=$ops
	# set stores 8 x SLAP_N keys; get counts the keys found: all of them
	# after the set run's load (memcached -m 256 evicts none of them)
	if [ "$rc" -ne 0 ] || [ -z "$keys" ] || [ "$keys" -ne $((8 * SLAP_N)) ]; then
		fs_fail "$RA_CASE $mode: memcslap -t $t -c 8 -e $SLAP_N: exit status $rc after ${SECONDS}s, ${keys:-no} keys in ${secs:-?} s"
		# memcslap's own errors (which key, which call), then fabsock's
		# log of the clients (warnings, and its stats at exit: a stalled
		# connection shows in what was waited for and rung)
		grep -v ': stats:' "$out.err" | head -n 8 | sed 's/^/    /' >&2 || true
		tail -n 2 "$out" | sed 's/^/    /' >&2 || true
		[ "$mode" = kernel ] || tail -n 12 "$RA_DIR/memcslap.$mode.log" 2>/dev/null | cut -c1-2000 | sed 's/^/    /' >&2 || true
		return 1
	fi
	fs_pass "$RA_CASE $mode: memcslap -t $t -c 8: $keys keys in $secs s, $ops ops/s"
}

mc_case() {
	local mode=$1 srv moved r1 w1 r2 w2 sq capable_rc=0 npass nfail
	PORT=$(fs_free_port) || { fs_fail "$mode: no free port"; return; }
	ra_env "$mode" memcached
	fs_bg srv setsid "${RA_ENV[@]}" memcached -u nobody -l 127.0.0.1 -p "$PORT" -U 0 -m 256 -c 1024 \
		>"$RA_DIR/memcached.$mode.out" 2>"$RA_DIR/memcached.$mode.err"
	if ! ra_wait_listen "$PORT" "$srv"; then
		fs_fail "$RA_CASE $mode: memcached did not listen on $PORT ($RA_LISTEN_WHY)"
		tail -n 5 "$RA_DIR/memcached.$mode.err" | sed 's/^/    /' >&2 || true
		return
	fi

	# Protocol conformance, every test.
	ra_env "$mode" memccapable
	SECONDS=0
	ra_as nobody timeout -k 2 40 "${RA_ENV[@]}" memccapable -h 127.0.0.1 -p "$PORT" -t 5 \
		>"$RA_DIR/capable.$mode.out" 2>&1 || capable_rc=$?
	npass=$(grep -c '\[pass\]' "$RA_DIR/capable.$mode.out" || true)
	nfail=$(grep -vE '\[pass\]|\[skip\]|^All tests passed|: stats:' "$RA_DIR/capable.$mode.out" | grep -c . || true)
	if [ "$capable_rc" -eq 0 ] && grep -q '^All tests passed' "$RA_DIR/capable.$mode.out"; then
		fs_pass "$RA_CASE $mode: memccapable: all $npass tests passed (${SECONDS}s)"
	else
		fs_fail "$RA_CASE $mode: memccapable: exit status $capable_rc after ${SECONDS}s, $npass passed, other lines:"
		grep -vE '\[pass\]|: stats:' "$RA_DIR/capable.$mode.out" | head -n 6 | sed 's/^/    /' >&2 || true
	fi

	# What memcached moved from here on, and what went over TCP.
	read -r r1 w1 < <(mc_stats | sed -nE 's/^bytes_read=([0-9]+) bytes_written=([0-9]+).*/\1 \2/p') || true
	fs_tcp_count_start "$PORT"
	mc_roundtrip "$mode"
	mc_slap "$mode" set && :
	mc_slap "$mode" get && :
	mc_roundtrip "$mode"
	# The plain stats query itself goes over TCP, inside the count: the
	# bytes it sent and received (its moved=N) are allowed, exactly.
	RT_STATS=$(mc_stats)
	read -r r2 w2 sq < <(sed -nE 's/^bytes_read=([0-9]+) bytes_written=([0-9]+).* moved=([0-9]+)$/\1 \2 \3/p' <<<"$RT_STATS") || true
	moved=$(( ${r2:-0} + ${w2:-0} - ${r1:-0} - ${w1:-0} ))
	fs_log "$mode: memcached moved $moved bytes while counted (its stats: $RT_STATS)"
	# memccapable's one connection per test is not counted; memcslap's 2 x
	# 8 threads, the round trips' 2
	ra_tcp_payload_check "$mode" "$moved" 18 "${sq:-0}" "the plain stats query's own bytes"
	fs_tcp_count_stop

	ra_alive "$mode" "$srv" memcached || true
	ra_stop "$mode" "$srv" SIGTERM memcached 20 "$RA_DIR/memcached.$mode.err" || true
	sleep 0.3
	ra_cores_report "$mode"

	if [ "$mode" = fabsock ]; then
		# memccapable opens one connection per test, memcslap one per thread.
		ra_offloaded memcached "$mode" 16 2 "the two plain stats queries"
		ra_offloaded memccapable "$mode" 1
		ra_offloaded memcslap "$mode" 16
		ra_offloaded client-rt "$mode" 2 # one connection per round trip, two of them
		for c in memcached memccapable memcslap client-rt; do
			ra_log_clean "$c" "$mode" || true
		done
		grep -hv ': stats:' "$RA_DIR"/{memcached,memccapable,memcslap,client-rt}."$mode".log 2>/dev/null |
			sed -E 's/^fabsock\[[0-9]+\]/fabsock[N]/; s/fd [0-9]+/fd N/' | sort | uniq -c | sort -rn | head -n 6 |
			sed 's/^/    note: /' >&2 || true
	fi
}

for mode in $FS_MODES; do
	mc_case "$mode"
done
ra_figure "memcslap set -c 8" "ops/s" "${FIG["set kernel"]:-0}" "${FIG["set fabsock"]:-0}"
ra_figure "memcslap get -c 8" "ops/s" "${FIG["get kernel"]:-0}" "${FIG["get fabsock"]:-0}"
ra_done
