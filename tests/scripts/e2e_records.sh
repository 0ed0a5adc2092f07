#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Listener records (core/records.h, issue 27 "say no early"): a connection
# to this host that will not be offloaded opens nothing.
#   plain:    a server without fabsock. The fabsock client finds no record
#             for the port and stays on TCP at once: fallback_no_record per
#             connection, no probe sent, libfabric never loaded; on the wire
#             no HELLO and exactly the payload bytes the same client sends
#             without fabsock (nftables counter, fs_tcp_count_*).
#   fabsock:  a fabsock server publishes its record: offloaded as before,
#             TCP carries nothing but the handshakes; the record is there
#             while the server listens and gone after it exits.
#   refusing: a fabsock server that cannot use shm (FABSOCK_SHM=0) says so
#             in its record: its clients stay on TCP without a probe.
#   planted:  the per-user directory is another user's, a symlink (to a
#             private directory of ours), or open to others: never used
#             (records_refused), nothing written through it, and the
#             connections offload as without records (they probe).
#   sigkill:  a listener killed with SIGKILL leaves its record; the next
#             publisher's sweep removes it (records_swept).
#   forked:   a listener whose process forks a worker and exits (the
#             nginx/apache shape, the worker holds the socket): the sweep
#             keeps its record (the kernel still lists the socket), and a
#             client offloads with the worker.
#   cached:   one client process, five connections to one port: two to a
#             plain server (no record: the second answer comes from the
#             client's per-port cache, records_cached), then a fabsock
#             server takes the port and publishes: the cached "no record"
#             must not outlive that (the directory changed), so the third
#             connection offloads, and the later ones offload with the
#             record from the cache once its file is unchanged. Every
#             echo is checked by sha256.
# Every stream's bytes are checked end to end by fs_stream (or a checksum).
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || fs_skip "needs root (nftables counter, planted directories of another user)"
fs_need_nft
PROG=$FS_PROGS/fs_stream
REC=$FS_TMP/rec
mkdir -p "$REC"
export FABSOCK_RECORDS_DIR=$REC
STREAMS=2
BYTES=1M
me=$(id -u)

# start_server VAR DIR [env...]: an fs_stream server (with the preload
# unless PLAIN=1), one run of STREAMS streams; VAR gets its port.
start_server() {
	local __var=$1 dir=$2 srv_pid srv_port
	shift 2
	mkdir -p "$dir"
	if [ "${PLAIN:-0}" = 1 ]; then
		fs_bg srv_pid env "$@" "$PROG" server --port 0 --ready-file "$dir/ready" --streams "$STREAMS" \
			--bytes "$BYTES" >"$dir/server.out" 2>"$dir/server.err"
	else
		fs_bg srv_pid env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$@" "$PROG" server --port 0 \
			--ready-file "$dir/ready" --streams "$STREAMS" --bytes "$BYTES" >"$dir/server.out" 2>"$dir/server.err"
	fi
	for _ in $(seq 1 100); do [ -s "$dir/ready" ] && break; fs_sleep 0.05; done
	srv_port=$(cat "$dir/ready" 2>/dev/null || true)
	SERVER_PID=$srv_pid
	printf -v "$__var" '%s' "$srv_port"
}

# run_client DIR PORT [env...]: an fs_stream client (with the preload unless
# PLAIN=1); waits for it and the server. Returns non-zero (and fails) if
# either did not end with "result ok".
run_client() {
	local dir=$1 port=$2 cli_pid crc=0 src=0
	shift 2
	if [ "${PLAIN:-0}" = 1 ]; then
		fs_bg cli_pid env "$@" "$PROG" client 127.0.0.1 "$port" --streams "$STREAMS" --bytes "$BYTES" \
			>"$dir/client.out" 2>"$dir/client.err"
	else
		fs_bg cli_pid env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$@" "$PROG" client 127.0.0.1 "$port" \
			--streams "$STREAMS" --bytes "$BYTES" >"$dir/client.out" 2>"$dir/client.err"
	fi
	fs_wait_pid "$cli_pid" 60 || crc=$?
	fs_wait_pid "$SERVER_PID" 20 || src=$?
	fs_pair_ok "$dir" "$(basename "$dir")" "$src" "$crc" || return 1
}

# ---- plain: the baseline (no fabsock anywhere), then the fabsock client ----
d=$FS_TMP/baseline
PLAIN=1 start_server port "$d"
fs_tcp_count_start "$port"
if PLAIN=1 run_client "$d" "$port"; then
	read -r _ _ base_pl base_hs _ < <(fs_tcp_count_read)
fi
fs_tcp_count_stop
# what the server's kernel sockets received (TCP_INFO, each byte once:
# the nftables count includes a segment sent again on a loaded machine)
rx_sum() { sed -nE 's/^conn .* tcp_bytes_received=([0-9]+).*/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }'; }
base_rx=$(rx_sum "$d/server.out")
fs_log "baseline: the server's sockets received $base_rx bytes; TCP carried ${base_pl:-?} payload bytes, ${base_hs:-?} handshake segments"

d=$FS_TMP/plain
PLAIN=1 start_server port "$d"
fs_tcp_count_start "$port"
if run_client "$d" "$port"; then
	read -r _ _ pl hs _ < <(fs_tcp_count_read)
	fs_expect_stats "$d/client.err" "plain server: the client opened nothing" \
		fallback_no_record=$STREAMS probes_sent=0 offloaded=0 fabric_loads=0 fallback_hello_nak=0
	rx=$(rx_sum "$d/server.out")
	if [ "$rx" = "$base_rx" ] && [ "$rx" -gt 0 ] && [ "${hs:-x}" = 0 ] &&
		[ "${pl:-0}" -ge $((STREAMS * 1048576)) ]; then # (the counter saw the data: it is on the right port)
		fs_pass "plain server: its sockets received exactly the application's $rx bytes (as without fabsock), no HELLO on the wire ($pl payload bytes counted)"
	else
		fs_fail "plain server: its sockets received $rx bytes (without fabsock: $base_rx), ${hs:-?} handshake segments, ${pl:-?} payload bytes on the wire"
	fi
fi
fs_tcp_count_stop

# ---- fabsock: the record is there, the connections offload ----------------
d=$FS_TMP/fabsock
start_server port "$d"
if [ -f "$REC/fabsock-u$me/port-$port" ]; then
	fs_pass "fabsock server: its record $REC/fabsock-u$me/port-$port is there while it listens"
else
	fs_fail "fabsock server: no record for port $port in $REC/fabsock-u$me ($(ls "$REC/fabsock-u$me" 2>&1 | tr '\n' ' '))"
fi
fs_tcp_count_start "$port"
if run_client "$d" "$port"; then
	fs_tcp_proof "fabsock server" fabsock "$STREAMS"
	fs_expect_stats "$d/client.err" "fabsock server: client" offloaded=$STREAMS fallback_no_record=0
	fs_expect_stats "$d/server.err" "fabsock server: server" offloaded=$STREAMS records_published=1
	if [ -e "$REC/fabsock-u$me/port-$port" ]; then
		fs_fail "fabsock server: its record is still there after it exited"
	else
		fs_pass "fabsock server: its record went with it"
	fi
else
	fs_tcp_count_stop
fi

# ---- refusing: the server cannot use shm -----------------------------------
d=$FS_TMP/refusing
start_server port "$d" FABSOCK_SHM=0
if run_client "$d" "$port"; then
	fs_expect_stats "$d/client.err" "refusing record: the client opened nothing" \
		fallback_no_record=$STREAMS probes_sent=0 offloaded=0 fabric_loads=0
	fs_expect_stats "$d/server.err" "refusing record: the server saw plain clients" \
		fallback_peer_plain=$STREAMS offloaded=0
fi

# ---- planted: a directory that is not ours is never used -------------------
plant() { # NAME: makes $FS_TMP/NAME/fabsock-u$me in the way NAME says
	local base=$FS_TMP/$1
	mkdir -p "$base"
	case $1 in
	other_user) mkdir -m 700 "$base/fabsock-u$me" && chown nobody "$base/fabsock-u$me" ;;
	symlink) mkdir -m 700 "$FS_TMP/target" && ln -s "$FS_TMP/target" "$base/fabsock-u$me" ;;
	open_mode) mkdir -m 755 "$base/fabsock-u$me" ;;
	esac
}
for kind in other_user symlink open_mode; do
	plant "$kind"
	d=$FS_TMP/planted_$kind
	start_server port "$d" FABSOCK_RECORDS_DIR="$FS_TMP/$kind"
	if run_client "$d" "$port" FABSOCK_RECORDS_DIR="$FS_TMP/$kind"; then
		fs_expect_stats "$d/client.err" "planted $kind: the client probed as without records" \
			offloaded=$STREAMS records_refused=1 fallback_no_record=0
		fs_expect_stats "$d/server.err" "planted $kind: the server published nothing" \
			offloaded=$STREAMS records_refused=1 records_published=0
		left=$(find "$FS_TMP/$kind/" "$FS_TMP/target" -mindepth 1 -name 'port-*' 2>/dev/null | wc -l || true)
		[ "$left" = 0 ] || fs_fail "planted $kind: $left record files written through it"
	fi
done

# ---- sigkill: the sweep clears a dead listener's record --------------------
d=$FS_TMP/killed
start_server kport "$d"
kpid=$SERVER_PID
if [ -f "$REC/fabsock-u$me/port-$kport" ]; then
	kill -9 "$kpid"
	wait "$kpid" 2>/dev/null || true
	[ -f "$REC/fabsock-u$me/port-$kport" ] || fs_fail "sigkill: the record went with a SIGKILL (nothing ran to remove it)"
	sleep 2.2 # a record younger than 2 s is not swept (its listen() may be under way)
	d=$FS_TMP/sweeper
	start_server port "$d"
	if run_client "$d" "$port"; then
		if [ -e "$REC/fabsock-u$me/port-$kport" ]; then
			fs_fail "sigkill: the killed listener's record (port $kport) is still there after a sweep"
		else
			fs_expect_stats "$d/server.err" "sigkill: the next publisher swept the killed listener's record" \
				records_swept=1 offloaded=$STREAMS
		fi
	fi
else
	fs_fail "sigkill: the server published no record"
fi

# ---- forked: a worker holds the listener its parent published --------------
d=$FS_TMP/forked
mkdir -p "$d"
cat >"$d/server.py" <<'EOF'
import os, socket, sys, hashlib
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
port = ls.getsockname()[1]
if os.fork() == 0:
    c, _ = ls.accept()
    h = hashlib.sha256()
    while True:
        b = c.recv(65536)
        if not b:
            break
        h.update(b)
        c.sendall(b)
    c.close()
    print("worker", h.hexdigest(), flush=True)
    os._exit(0)
# the parent hands over and is gone, as a daemonising master would be
open(sys.argv[1] + ".tmp", "w").write(str(port))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
os._exit(0)
EOF
cat >"$d/client.py" <<'EOF'
import socket, sys, hashlib, os
data = os.urandom(1 << 20)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(data)
s.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
print("client", hashlib.sha256(data).hexdigest(), "ok" if bytes(got) == data else "MISMATCH", flush=True)
EOF
LD_PRELOAD=$FABSOCK_LIB FABSOCK_STATS=1 python3 "$d/server.py" "$d/ready" >"$d/server.out" 2>"$d/server.err" &
FS_PIDS+=("$!")
wait "$!" || true # the parent leaves at once; its worker goes on
for _ in $(seq 1 100); do [ -s "$d/ready" ] && break; fs_sleep 0.05; done
fport=$(cat "$d/ready" 2>/dev/null || true)
if [ -z "$fport" ]; then
	fs_fail "forked: the server did not start"
else
	sleep 2.2
	d2=$FS_TMP/forked_sweeper
	start_server port "$d2"
	run_client "$d2" "$port" || true
	if [ -f "$REC/fabsock-u$me/port-$fport" ]; then
		fs_pass "forked: the sweep kept the record of a listener its worker holds"
	else
		fs_fail "forked: the record of port $fport (held by the worker) is gone"
	fi
	fs_tcp_count_start "$fport"
	LD_PRELOAD=$FABSOCK_LIB FABSOCK_STATS=1 timeout 60 python3 "$d/client.py" "$fport" >"$d/client.out" 2>"$d/client.err"
	for _ in $(seq 1 100); do grep -q '^worker' "$d/server.out" && break; fs_sleep 0.05; done
	sum=$(sed -n 's/^client \([0-9a-f]*\) ok$/\1/p' "$d/client.out")
	if [ -n "$sum" ] && grep -qx "worker $sum" "$d/server.out"; then
		fs_tcp_proof "forked" fabsock 1
		fs_expect_stats "$d/client.err" "forked: the client offloaded with the worker" offloaded=1 fallback_no_record=0
	else
		fs_tcp_count_stop
		fs_fail "forked: echo failed: $(cat "$d/client.out" "$d/server.out" | tr '\n' ' ')"
	fi
fi

# ---- cached: the client's per-port answer follows the records --------------
d=$FS_TMP/cached
mkdir -p "$d"
fs_py_echo_server "$d/server.py"
cat >"$d/client.py" <<'EOF'
import hashlib, os, socket, sys, time
port, phase_file, go_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def echo(n):
    data = os.urandom(65536)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    ok = hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    print("conn %d %s" % (n, "ok" if ok else "bad: %d bytes" % len(got)), flush=True)
echo(1)
time.sleep(0.1)
echo(2)
open(phase_file, "w").close()
for _ in range(400):
    if os.path.exists(go_file):
        break
    time.sleep(0.05)
echo(3)
time.sleep(0.1)
echo(4)
time.sleep(0.1)
echo(5)
EOF
# the directory is there, its stamps older than the cache's margin
mkdir -p -m 700 "$REC/fabsock-u$me"
sleep 0.2
fs_bg cache_srv python3 "$d/server.py" 0 >"$d/server1.out"
cport=$(fs_listen_port "$d/server1.out" "$cache_srv")
fs_bg cache_cli env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 timeout 60 python3 "$d/client.py" "$cport" \
	"$d/phase" "$d/go" >"$d/client.out" 2>"$d/client.err"
for _ in $(seq 1 200); do [ -e "$d/phase" ] && break; sleep 0.05; done
kill "$cache_srv" 2>/dev/null || true
fs_wait_pid "$cache_srv" 10 || true
fs_bg cache_srv env LD_PRELOAD="$FABSOCK_LIB" python3 "$d/server.py" "$cport" >"$d/server2.out"
[ -n "$(fs_listen_port "$d/server2.out" "$cache_srv")" ] || fs_fail "cached: the fabsock server did not listen on $cport again"
for _ in $(seq 1 100); do [ -s "$REC/fabsock-u$me/port-$cport" ] && break; sleep 0.05; done
[ -s "$REC/fabsock-u$me/port-$cport" ] || fs_fail "cached: the fabsock server published no record for port $cport"
touch "$d/go"
crc=0
fs_wait_pid "$cache_cli" 60 || crc=$?
kill "$cache_srv" 2>/dev/null || true
fs_wait_pid "$cache_srv" 10 || true
if [ "$crc" -eq 0 ] && [ "$(grep -c '^conn [1-5] ok$' "$d/client.out")" = 5 ]; then
	fs_pass "cached: five echoes of 64 KiB, sha256 equal"
	fs_expect_stats "$d/client.err" "cached: no record twice, then the new record three times" \
		fallback_no_record=2 offloaded=3
	# the second look of each phase at least comes from the cache (the
	# server's first accept writes its slot once: the fourth look may read
	# the file again, the fifth then finds it unchanged)
	cached=$(fs_stat "$d/client.err" records_cached)
	if [ "${cached:-0}" -ge 2 ] && [ "${cached:-0}" -le 3 ]; then
		fs_pass "cached: $cached of 5 answers from the per-port cache"
	else
		fs_fail "cached: ${cached:-no} answers from the per-port cache (expected 2 or 3)"
	fi
else
	fs_fail "cached: client exit $crc: $(tr '\n' ' ' <"$d/client.out")"
	grep -v 'stats:' "$d/client.err" | head -n 5 >&2 || true
fi
fs_done
