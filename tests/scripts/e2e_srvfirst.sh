#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Servers that speak first (issue 27, target 7; docs/design.md "Connection
# history", the intent notes). A fabsock client notes before its connect()
# that it will probe; a server of its user about to write first waits for
# that probe (up to FABSOCK_PROBE_TIMEOUT_MS) and writes at once to a local
# client that noted nothing. fs_stream --banner (the server sends a banner
# line first, then STREAMS streams move BYTES each way, every byte checked),
# a private record directory:
#   late:    the client's probe comes 100 ms after its connect()
#            (FABSOCK_TEST_PROBE_DELAY_MS), far past the 5 ms
#            FIRST_SEND_WAIT_MS: the server waited for the noted probe
#            (server_first_intent_waits), both ends offloaded, no payload on
#            TCP (fs_tcp_proof).
#   loaded:  LOADED_RUNS (6; FS_SRVFIRST_RUNS=20 for the issue's 20) runs in a row beside 3 busy loops at nice 0:
#            every run offloaded on both ends, no payload on TCP.
#   plain:   fs_stream without the preload: the server wrote its banner
#            without a wait (server_first_plain_local per stream, no
#            FIRST_SEND_WAIT_MS: server_first_unseen_waits 0), all on TCP.
#   forged:  a program without the preload writes an intent note for its own
#            socket before it connects to a preloaded banner server (python,
#            the history file's layout): as the server's user, it makes the
#            server wait for a probe that never comes, once and bounded
#            (server_first_intent_missed 1; the banner still arrives); as
#            nobody, in nobody's file (the only one it can write), it changes
#            nothing: the server writes at once to a client of another user
#            (no wait of either kind). Needs root for the nobody half.
#   nonblock: a banner server whose sender does not block (python under the
#            preload): `et`, an O_NONBLOCK socket in an edge-triggered epoll
#            set (EPOLLOUT|EPOLLET), sending after each event until EAGAIN;
#            `dontwait`, a blocking socket, send(MSG_DONTWAIT) and poll()
#            for POLLOUT. The client's probe comes 500 ms after its
#            connect(): no send call may take 150 ms (the kernel's
#            nonblocking send never waits; fabsock's waited for the probe),
#            an EAGAIN must be followed by an event within 5 s (a lost edge
#            hangs an ET loop), the 1 MiB must arrive byte-exact (sha256),
#            both ends offloaded, no payload on TCP. And `et tcp`: the
#            server waits 300 ms only and the probe comes after 1 s: the end
#            of the wait (TCP) must bring the ET waiter its event.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || fs_skip "needs root (nftables counter, setpriv to nobody)"
fs_need_nft
command -v python3 >/dev/null || fs_skip "python3 is missing"
PROG=$FS_PROGS/fs_stream
chmod 755 "$FS_TMP" # nobody runs the forger from here
export FABSOCK_RECORDS_DIR=$FS_TMP/rec
mkdir -p "$FABSOCK_RECORDS_DIR"
chmod 1777 "$FABSOCK_RECORDS_DIR" # nobody's own directory goes here too
STREAMS=2
BYTES=256K
LOADED_RUNS=${FS_SRVFIRST_RUNS:-6}

# pair DIR SERVER_PRELOAD(1|0) CLIENT_PRELOAD(1|0) [client env...]: one
# banner server and its client on a new port, counted by nftables; both must
# end "result ok". Leaves PORT, and the count running.
pair() {
	local dir=$1 spre=$2 cpre=$3 spid cpid crc=0 src=0
	local -a senv=(env -u LD_PRELOAD) cenv=(env -u LD_PRELOAD)
	shift 3
	mkdir -p "$dir"
	[ "$spre" = 0 ] || senv=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info)
	[ "$cpre" = 0 ] || cenv=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	PORT=$(fs_free_port)
	fs_tcp_count_start "$PORT"
	fs_bg spid "${senv[@]}" "$PROG" server --port "$PORT" --ready-file "$dir/ready" --streams "$STREAMS" \
		--bytes "$BYTES" --bidir --banner >"$dir/server.out" 2>"$dir/server.err"
	for _ in $(seq 1 200); do [ -s "$dir/ready" ] && break; fs_sleep 0.05; done
	fs_bg cpid "${cenv[@]}" "$@" "$PROG" client 127.0.0.1 "$PORT" --streams "$STREAMS" --bytes "$BYTES" --bidir \
		--banner >"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cpid" 60 || crc=$?
	fs_wait_pid "$spid" 20 || src=$?
	fs_pair_ok "$dir" "${dir##*/}" "$src" "$crc" || return 1
}

# ---- late: a probe 100 ms after connect(), waited for -------------------------
d=$FS_TMP/late
if pair "$d" 1 1 FABSOCK_TEST_PROBE_DELAY_MS=100; then
	fs_expect_stats "$d/server.err" "late: the server waited for the noted probe and offloaded" \
		server_first_intent_waits=$STREAMS server_first_intent_missed=0 offloaded=$STREAMS fallback_server_first=0
	fs_expect_stats "$d/client.err" "late: the client offloaded" offloaded=$STREAMS
fi
fs_tcp_proof late fabsock "$STREAMS"

# ---- loaded: LOADED_RUNS runs in a row beside busy loops --------------------------------
busy=()
for _ in 1 2 3; do
	fs_bg b timeout -k 1 600 bash -c 'while :; do :; done' # bounded; killed below
	busy+=("$b")
done
fs_log "loaded: 3 busy loops at nice 0, load average $(cut -d' ' -f1-3 /proc/loadavg)"
ok=0 waits=0
for n in $(seq 1 "$LOADED_RUNS"); do
	d=$FS_TMP/loaded$n
	if pair "$d" 1 1; then
		so=$(fs_stat "$d/server.err" offloaded) co=$(fs_stat "$d/client.err" offloaded)
		w=$(fs_stat "$d/server.err" server_first_intent_waits)
		waits=$((waits + ${w:-0}))
		read -r _ _ pl hs _ odd _ < <(fs_tcp_count_read)
		if [ "${so:-0}" = "$STREAMS" ] && [ "${co:-0}" = "$STREAMS" ] && [ "$pl" = 0 ] && [ "$odd" = 0 ]; then
			ok=$((ok + 1))
		else
			fs_fail "loaded run $n: server offloaded=${so:-none} client offloaded=${co:-none}, TCP payload $pl bytes ($odd odd segments); server: $(fs_stats_fallbacks "$d/server.err")"
		fi
	fi
	fs_tcp_count_stop
done
for b in "${busy[@]}"; do kill "$b" 2>/dev/null || true; done
[ "$ok" = "$LOADED_RUNS" ] &&
	fs_pass "loaded: $ok of $LOADED_RUNS runs offloaded on both ends with no TCP payload ($waits waits for a noted probe); load average $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- plain: no preload in the client, no wait in the server --------------------
d=$FS_TMP/plain
if pair "$d" 1 0; then
	fs_expect_stats "$d/server.err" "plain: the server wrote its banner at once to a plain local client" \
		server_first_plain_local=$STREAMS server_first_unseen_waits=0 server_first_intent_waits=0 \
		fallback_server_first=$STREAMS offloaded=0
fi
read -r _ _ pl _ < <(fs_tcp_count_read)
fs_tcp_count_stop
[ "${pl:-0}" -ge $((2 * STREAMS * 262144)) ] || fs_fail "plain: TCP carried $pl payload bytes, less than the streams moved"

# ---- nonblock: a sender that must not wait for the late probe -----------------
cat >"$FS_TMP/nbserver.py" <<'EOF'
import hashlib, os, select, socket, sys, time
port, mode, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
data = b'BANNER nonblock\n' + os.urandom(size)
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', port))
l.listen(4)
print('listening', flush=True)
c, _ = l.accept()
if mode == 'et':
    c.setblocking(False)
    w = select.epoll()
    w.register(c.fileno(), select.EPOLLOUT | select.EPOLLET)
    wait = lambda: w.poll(5)
    send = lambda b: c.send(b)
else:
    w = select.poll()
    w.register(c.fileno(), select.POLLOUT)
    wait = lambda: w.poll(5000)
    send = lambda b: c.send(b, socket.MSG_DONTWAIT)
off = eagain = 0
worst = 0.0
end = time.monotonic() + 30
if not wait():
    print('FAIL: not writable after accept', flush=True)
    sys.exit(1)
while off < len(data):
    t = time.monotonic()
    try:
        n = send(data[off:off + 65536])
    except BlockingIOError:
        n = 0
    worst = max(worst, time.monotonic() - t)
    if n > 0:
        off += n
        continue
    eagain += 1
    if time.monotonic() > end or not wait():
        print('FAIL: no writability reported within 5 s of an EAGAIN at byte %d' % off, flush=True)
        sys.exit(1)
c.setblocking(True)
c.shutdown(socket.SHUT_WR)
while c.recv(65536):
    pass
print('sent %s %d worst_ms %.1f eagain %d' % (hashlib.sha256(data).hexdigest(), len(data), worst * 1000, eagain), flush=True)
EOF
cat >"$FS_TMP/nbclient.py" <<'EOF'
import hashlib, socket, sys
c = socket.create_connection(('127.0.0.1', int(sys.argv[1])))
got = bytearray()
while True:
    b = c.recv(65536)
    if not b:
        break
    got += b
c.close()
print('got %s %d' % (hashlib.sha256(bytes(got)).hexdigest(), len(got)), flush=True)
EOF
nonblock() { # MODE [tcp: the server waits 300 ms only, the probe comes after 1 s]
	local mode=$1 end=${2:-fabric} dir=$FS_TMP/nonblock-$1-${2:-fabric} spid cpid rc=0 src=0 sent= slen= worst= eagain= got= glen=
	local wait_ms=3000 late_ms=500
	[ "$end" = fabric ] || { wait_ms=300 late_ms=1000; }
	mode=$mode-$end
	mkdir -p "$dir"
	PORT=$(fs_free_port)
	fs_tcp_count_start "$PORT"
	fs_bg spid timeout -k 2 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info \
		FABSOCK_PROBE_TIMEOUT_MS=$wait_ms python3 "$FS_TMP/nbserver.py" "$PORT" "${mode%-*}" $((1 << 20)) \
		>"$dir/server.out" 2>"$dir/server.err"
	if ! fs_wait_line "$dir/server.out" listening "$spid"; then
		fs_fail "nonblock-$mode: the server did not listen: $(tail -n 2 "$dir/server.err" | tr '\n' ' ')"
		fs_tcp_count_stop
		return
	fi
	fs_bg cpid timeout -k 2 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_TEST_PROBE_DELAY_MS=$late_ms \
		FABSOCK_PROBE_TIMEOUT_MS=$wait_ms python3 "$FS_TMP/nbclient.py" "$PORT" >"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cpid" 60 || rc=$?
	fs_wait_pid "$spid" 20 || src=$?
	if [ "$end" = fabric ]; then
		fs_tcp_proof "nonblock-$mode" fabsock 1
	else
		fs_tcp_count_stop
	fi
	read -r _ sent slen _ worst _ eagain < <(grep '^sent ' "$dir/server.out") || true
	read -r _ got glen <"$dir/client.out" || true
	if [ "$rc" != 0 ] || [ "$src" != 0 ]; then
		fs_fail "nonblock-$mode: client exit $rc, server exit $src: $(grep -h FAIL "$dir/server.out" | head -n 1)"
	elif [ -z "$sent" ] || [ "$sent" != "$got" ] || [ "$slen" != "$glen" ]; then
		fs_fail "nonblock-$mode: sent ${sent:0:16} ($slen bytes), the client got ${got:0:16} (${glen:-?} bytes)"
	elif [ "${worst%.*}" -ge 150 ]; then
		fs_fail "nonblock-$mode: a nonblocking send took $worst ms (the client's probe was $late_ms ms late: it waited for it)"
	elif [ "$end" = fabric ]; then
		fs_expect_stats "$dir/server.err" \
			"nonblock-$mode: no send waited (the longest $worst ms, $eagain EAGAIN), $slen bytes exact, offloaded" \
			server_first_intent_waits=1 offloaded=1 fallback_server_first=0
		fs_expect_stats "$dir/client.err" "nonblock-$mode: the client offloaded" offloaded=1
	else
		fs_expect_stats "$dir/server.err" \
			"nonblock-$mode: no send waited (the longest $worst ms, $eagain EAGAIN), the wait's end reported writable, $slen bytes exact over TCP" \
			server_first_intent_waits=1 server_first_intent_missed=1 offloaded=0
	fi
}
nonblock et
nonblock dontwait
nonblock et tcp

# ---- forged: intent notes written by a program without fabsock -----------------
# forge.py HISTORY PORT: notes its socket's inode as an intent in HISTORY
# (made as a new history-v2 if missing), connects to 127.0.0.1:PORT, reads
# the banner line, closes; prints the seconds the banner took.
cat >"$FS_TMP/forge.py" <<'EOF'
import mmap, os, socket, struct, sys, time
path, port = sys.argv[1], int(sys.argv[2])
size = 16 + 16 * 128 + 64 * 512
os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
if os.fstat(fd).st_size == 0:
    os.ftruncate(fd, size)
    os.pwrite(fd, struct.pack('<II', 0x49485346, 2), 0)
m = mmap.mmap(fd, size)
s = socket.socket()
ino = os.fstat(s.fileno()).st_ino
struct.pack_into('<QQ', m, 16, ino | (1 << 63), time.clock_gettime_ns(time.CLOCK_BOOTTIME))
t0 = time.monotonic()
s.connect(('127.0.0.1', port))
line = b''
while not line.endswith(b'\n'):
    b = s.recv(1)
    if not b:
        break
    line += b
print('%.3f %s' % (time.monotonic() - t0, line.decode(errors='replace').strip()))
s.close()
EOF
chmod 644 "$FS_TMP/forge.py"
# a banner server under the preload, one connection (python: accept, banner,
# read to the end)
cat >"$FS_TMP/banner.py" <<'EOF'
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', int(sys.argv[1])))
l.listen(4)
c, _ = l.accept()
c.sendall(b'BANNER fabsock-forged\n')
while c.recv(4096):
	pass
c.close()
EOF
forged() { # LABEL USER(-: root) HISTORY_UID
	local label=$1 user=$2 huid=$3 spid rc=0 out dir=$FS_TMP/$1
	local -a as=()
	mkdir -p "$dir"
	[ "$user" = - ] || as=(setpriv --reuid="$user" --regid="$(id -gn "$user")" --init-groups --)
	PORT=$(fs_free_port)
	fs_bg spid env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info python3 "$FS_TMP/banner.py" "$PORT" \
		>"$dir/server.out" 2>"$dir/server.err"
	fs_wait_listen "$PORT" || { fs_fail "$label: the banner server did not listen"; return; }
	out=$(timeout 20 "${as[@]}" env -u LD_PRELOAD python3 "$FS_TMP/forge.py" \
		"$FABSOCK_RECORDS_DIR/fabsock-u$huid/history-v2" "$PORT" 2>"$dir/client.err") || rc=$?
	fs_wait_pid "$spid" 20 || rc=$?
	if [ "$rc" != 0 ] || [ "${out#* }" != "BANNER fabsock-forged" ]; then
		fs_fail "$label: exit $rc, client read '${out#* }' ($(head -n 2 "$dir/client.err" | tr '\n' ' '))"
		return
	fi
	fs_log "$label: the banner came after ${out%% *} s"
	echo "$out" >"$dir/banner-time"
}
forged forged_same_user - 0
[ -s "$FS_TMP/forged_same_user/banner-time" ] &&
	fs_expect_stats "$FS_TMP/forged_same_user/server.err" \
		"forged by the server's own user: one bounded wait for a probe that did not come, then TCP" \
		server_first_intent_waits=1 server_first_intent_missed=1 fallback_server_first=1 offloaded=0
if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
	forged forged_nobody nobody "$(id -u nobody)"
	[ -s "$FS_TMP/forged_nobody/banner-time" ] &&
		fs_expect_stats "$FS_TMP/forged_nobody/server.err" \
			"forged by another user (nobody, in its own file): no wait, the banner at once" \
			server_first_intent_waits=0 server_first_unseen_waits=0 fallback_server_first=1 offloaded=0
	grep -q 'spoke first to a client of another user' "$FS_TMP/forged_nobody/server.err" 2>/dev/null ||
		fs_fail "forged_nobody: the server did not log writing at once to a client of another user"
else
	fs_fail "forged_nobody: no user nobody or no setpriv"
fi
fs_done
