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
. "$(dirname "$0")/lib.sh"

NETBENCH=${FS_BUILD:-}/tools/fabsock-netbench
[ -x "$NETBENCH" ] || { fs_fail "no $NETBENCH (FS_BUILD must name the build directory)"; fs_done; exit 1; }
command -v strace >/dev/null || fs_skip "strace is missing"
COUNT=200
WARMUP=10 # fabsock-netbench connect makes 10 untimed connections first
TOTAL=$((COUNT + WARMUP))

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
fs_done
