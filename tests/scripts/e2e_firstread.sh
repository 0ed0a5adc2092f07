#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The server's first read of a connection whose client did not probe
# (issue 27, target 5: a connection that stays on TCP costs what TCP
# costs). A fabsock-netbench server (a thread per connection, blocking
# reads; accept() asked for no address) under the preload serves COUNT
# connections of a plain client (connect, 9 bytes, 1 byte back, close; the
# client exits 1 unless every echo is right), traced with strace -c. Per
# connection it may add nothing to the kernel's calls: no getpeername,
# geteuid, fstat, poll, nor a failing recvmsg on the probe twin, nor the
# getpid of close() (the vfork check, now made only by a process that
# called vfork or clone) (each was one per connection before; a few for
# start-up are allowed). Every connection must be counted as a plain
# client (fallback_peer_plain) and none offloaded. Then a fabsock client of
# the same server: every connection offloaded on both ends (the server's
# first read waits in the kernel, the probe's "yes" and the HELLO arrive
# while it does), echoes checked; then one whose provider fails (an empty
# HELLO followed at once by its bytes on TCP): every echo right, none
# offloaded. (A nonblocking first read in an event loop takes the bytes
# itself: e2e_evloop and realapps_nginx run that path.)
# 4. Event loops (fs_shortconn ep: nginx's shape, nonblocking sockets in an
# edge-triggered epoll set, the accepted ones added at once, the client's
# added before connect(), as nginx's upstream connections are): a server
# under the preload with a plain client, and a client under the preload
# whose connections a rule keeps on TCP, may make no epoll_ctl beyond the
# kernel's one ADD per connection (fabsock's tagged entry cost a MOD or a
# DEL more per connection: FABSOCK_EPOLL_OWN); both ends under the preload
# offload every connection, the TCP connections carrying only the
# handshakes, and every byte checked (each side checks what it reads, and
# the sha256 of what one side sent and the other read).
. "$(dirname "$0")/lib.sh"

NETBENCH=${FS_BUILD:-}/tools/fabsock-netbench
[ -x "$NETBENCH" ] || { fs_fail "no $NETBENCH (FS_BUILD must name the build directory)"; fs_done; exit 1; }
command -v strace >/dev/null || fs_skip "strace is missing"
COUNT=200
WARMUP=10 # fabsock-netbench connect makes 10 untimed connections first
TOTAL=$((COUNT + WARMUP))
# the tracked first read is what this studies (a remote client's, the first
# connections of a listener): no plain listeners (e2e_plain has those)
export FABSOCK_PLAIN_AFTER=0

start_server() { # DIR ENV...: starts the server into $srv, its port into $port
	local dir=$1
	shift
	mkdir -p "$dir"
	fs_bg srv "$@" "$NETBENCH" server --port 0 --ready-file "$dir/ready" >"$dir/server.out" 2>"$dir/server.err"
	for _ in $(seq 1 200); do [ -s "$dir/ready" ] && break; fs_sleep 0.05; done
	port=$(cat "$dir/ready" 2>/dev/null || true)
	[ -n "$port" ]
}

stop_server() { # the server, or the one strace runs (strace would only let go of it)
	local child
	child=$(pgrep -P "$srv" 2>/dev/null | head -n 1 || true)
	kill -INT "${child:-$srv}" 2>/dev/null
	fs_wait_pid "$srv" 20 || true
}

client() { # DIR LABEL ENV...
	local dir=$1 label=$2 rc=0
	shift 2
	timeout -k 2 120 "$@" "$NETBENCH" connect 127.0.0.1 "$port" --count "$COUNT" >"$dir/$label.out" \
		2>"$dir/$label.err" || rc=$?
	if [ "$rc" -ne 0 ] || ! grep -q "^connections=$COUNT " "$dir/$label.out"; then
		fs_fail "$label: client exit $rc: $(tail -n 2 "$dir/$label.err" | tr '\n' ' ')"
		return 1
	fi
}

# calls COUNTS NAME: the number of calls of NAME in an strace -c table
calls() { awk -v n="$2" '$NF == n && $1 ~ /^[0-9.]+$/ { print $4; f = 1 } END { if (!f) print 0 }' "$1"; }
errors() { awk -v n="$2" '$NF == n && $1 ~ /^[0-9.]+$/ { print (NF == 6 ? $5 : 0); f = 1 } END { if (!f) print 0 }' "$1"; }

# 1. A plain client: what the server adds per connection.
dir=$FS_TMP/plain
if start_server "$dir" strace -f -c -o "$FS_TMP/plain.strace" env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1; then
	client "$dir" plain env -u LD_PRELOAD
	stop_server "$dir"
	t=$FS_TMP/plain.strace
	bad=
	for name in getpeername geteuid fstat newfstatat poll getpid; do
		n=$(calls "$t" "$name")
		[ "$n" -le 60 ] || bad+=" $name=$n"
	done
	n=$(errors "$t" recvmsg)
	[ "$n" -le 20 ] || bad+=" failing recvmsg=$n"
	if [ -n "$bad" ]; then
		fs_fail "plain client: the server made per-connection calls of its own for $TOTAL connections:$bad"
	else
		fs_pass "plain client: no getpeername, geteuid, fstat, poll, getpid or failing recvmsg per connection ($TOTAL connections)"
	fi
	fs_expect_stats "$dir/server.err" "plain client, server" offloaded=0 fallback_peer_plain=$TOTAL
else
	fs_fail "plain client: the server did not start"
fi

# 2. A fabsock client, and 3. one whose provider fails, of a server whose
# first reads block (netbench) or are nonblocking in epoll (fs_evloop).
dir=$FS_TMP/fabsock
if start_server "$dir" env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1; then
	client "$dir" fabsock env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 &&
		fs_expect_stats "$dir/fabsock.err" "fabsock client" offloaded=$TOTAL kernel=0
	client "$dir" provfail env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_TEST_PROVIDER_FAIL=1 &&
		fs_expect_stats "$dir/provfail.err" "client whose provider fails" offloaded=0
	stop_server "$dir"
	fs_expect_stats "$dir/server.err" "fabsock clients, server" offloaded=$TOTAL
else
	fs_fail "fabsock client: the server did not start"
fi
# 4. Event loops.
SC=${FS_PROGS:-}/fs_shortconn
EPN=200
ep_check() { # LABEL DIR SERVER_RC CLIENT_RC: exits, 'result ok' and the bytes
	local label=$1 dir=$2 side rc a b
	for side in server client; do
		[ "$side" = server ] && rc=$3 || rc=$4
		if [ "$rc" -ne 0 ] || ! grep -q 'result ok' "$dir/$side.out"; then
			fs_fail "$label: $side exit $rc$([ "$rc" -gt 128 ] && echo " (signal $((rc - 128)))"): $(grep -h result "$dir/$side.out" | head -n 1) $(grep -v ': stats:' "$dir/$side.err" | tail -n 2 | tr '\n' ' ')"
			return 1
		fi
	done
	for pair in "client.sent server.recv" "server.sent client.recv"; do
		set -- $pair
		a=$(sha256sum <"$dir/$1" | cut -d' ' -f1) b=$(sha256sum <"$dir/$2" | cut -d' ' -f1)
		[ -s "$dir/$1" ] && [ "$a" = "$b" ] || { fs_fail "$label: $1 and $2 differ (sha256 $a, $b)"; return 1; }
	done
	fs_pass "$label: $EPN connections, every byte right both ways"
}
# ep_run LABEL SERVER-PREFIX... -- CLIENT-PREFIX...: the pair in ep mode; the
# prefixes' @PORT@ becomes the port. Sets EPDIR; returns 1 on failure.
ep_run() {
	local label=$1 port spid cpid src=0 crc=0 w
	local -a spre=() cpre=()
	shift
	EPDIR=$FS_TMP/$label
	mkdir -p "$EPDIR"
	port=$(fs_free_port) || { fs_fail "$label: no free port"; return 1; }
	while [ "$#" -gt 0 ] && [ "$1" != -- ]; do spre+=("${1//@PORT@/$port}"); shift; done
	shift
	for w in "$@"; do cpre+=("${w//@PORT@/$port}"); done
	fs_bg spid "${spre[@]}" "$SC" server "$port" "$EPN" 100 600 "$EPDIR" ep >"$EPDIR/server.out" 2>"$EPDIR/server.err"
	if ! fs_wait_listen "$port"; then
		fs_fail "$label: the server did not listen"
		fs_wait_pid "$spid" 1 || true
		return 1
	fi
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	fs_bg cpid "${cpre[@]}" "$SC" client "$port" "$EPN" 100 600 "$EPDIR" ep >"$EPDIR/client.out" 2>"$EPDIR/client.err"
	fs_wait_pid "$cpid" 90 || crc=$?
	fs_wait_pid "$spid" 90 || src=$?
	ep_check "$label" "$EPDIR" "$src" "$crc"
}
ep_ctl() { # LABEL STRACE-FILE: epoll_ctl calls at most one per connection (and a few)
	local n
	n=$(calls "$2" epoll_ctl)
	if [ "$n" -le $((EPN + 10)) ]; then
		fs_pass "$1: $n epoll_ctl calls for $EPN connections (the kernel's: one ADD each)"
	else
		fs_fail "$1: $n epoll_ctl calls for $EPN connections: fabsock's own beside the kernel's one ADD each"
	fi
}
if [ -x "$SC" ]; then
	if ep_run ep_server strace -f -c -o "$FS_TMP/ep_server.strace" env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 -- \
		env -u LD_PRELOAD; then
		fs_tcp_proof ep_server kernel "$EPN"
		ep_ctl "epoll server, plain client" "$FS_TMP/ep_server.strace"
		fs_expect_stats "$EPDIR/server.err" "epoll server, plain client" offloaded=0 fallback_peer_plain=$EPN
	else
		fs_tcp_count_stop
	fi
	if ep_run ep_client env -u LD_PRELOAD -- strace -f -c -o "$FS_TMP/ep_client.strace" env "LD_PRELOAD=$FABSOCK_LIB" \
		FABSOCK_STATS=1 "FABSOCK_RULES=kernel client 127.0.0.1:@PORT@"; then
		fs_tcp_proof ep_client kernel "$EPN"
		ep_ctl "epoll client (added before connect), a rule keeps it on TCP" "$FS_TMP/ep_client.strace"
		fs_expect_stats "$EPDIR/client.err" "epoll client, rule" offloaded=0 fallback_rule=$EPN
	else
		fs_tcp_count_stop
	fi
	if ep_run ep_both env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 -- env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1; then
		fs_tcp_proof ep_both fabsock "$EPN"
		fs_expect_stats "$EPDIR/server.err" "epoll server, fabsock client" offloaded=$EPN kernel=0
		fs_expect_stats "$EPDIR/client.err" "epoll client, fabsock server" offloaded=$EPN kernel=0
	else
		fs_tcp_count_stop
	fi
else
	fs_fail "no $SC (FS_PROGS must name the test programs)"
fi
fs_done
