#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Server shapes under the preload (issue 4): fs_shapes serves NCONN echo
# connections as (fork) a child per accepted connection, (prefork) four
# workers accepting on one shared listening socket, (threads) a thread per
# connection, (epoll) one edge-triggered epoll loop; the client runs them
# four at a time, 1 MiB each, checking every echoed byte. Each shape runs
# under kernel TCP and with both ends preloaded. In fabsock mode the
# `offloaded=N` of the client's stats line must be NCONN, and the stats
# lines of all the server's processes (the parent, children or workers)
# must add up to NCONN, and their fabric_rx_bytes to at least NCONN MiB each
# way: every connection and every byte went over the fabric, in whichever
# process served it; and the TCP connections carried no payload byte, only
# the handshakes (nftables, fs_tcp_proof). Afterwards no /dev/shm region of a finished process of
# this test, and no shared probe table of its ports, may be left.
. "$(dirname "$0")/lib.sh"
fs_need_nft

SHAPES_PROG=$FS_PROGS/fs_shapes
NCONN=${NCONN:-12}
PARALLEL=4

stats_lines() { grep -c 'warn: stats: offloaded=' "$1" || true; }

run_shape() { # MODE SHAPE
	local mode=$1 shape=$2 label="$2-$1" dir=$FS_TMP/$2-$1 server_pid client_pid port
	local server_rc=0 client_rc=0 fails_before=$FS_FAILS
	local -a prefix=(env)
	[ "$mode" = fabsock ] && prefix=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	mkdir -p "$dir"
	fs_bg server_pid "${prefix[@]}" "$SHAPES_PROG" server "$shape" "$NCONN" >"$dir/server.out" 2>"$dir/server.err"
	port=$(fs_listen_port "$dir/server.out" "$server_pid")
	if [ -z "$port" ]; then
		fs_fail "$label: the server did not listen"
		return 0
	fi
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	fs_bg client_pid "${prefix[@]}" "$SHAPES_PROG" client 127.0.0.1 "$port" "$NCONN" "$PARALLEL" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$client_pid" 120 || client_rc=$?
	fs_wait_pid "$server_pid" 30 || server_rc=$?
	fs_tcp_proof "$label" "$mode" "$NCONN"
	if [ "$client_rc" -ne 0 ] || ! grep -q '^PASS client' "$dir/client.out"; then
		fs_fail "$label: client exit $client_rc: $(grep -h '^FAIL' "$dir/client.out" | head -n 3 | tr '\n' ' ')"
		tail -n 5 "$dir/client.err" >&2 || true
	fi
	if [ "$server_rc" -ne 0 ] || ! grep -q "^PASS server $shape" "$dir/server.out"; then
		fs_fail "$label: server exit $server_rc: $(grep -h '^FAIL' "$dir/server.out" | head -n 3 | tr '\n' ' ')"
		tail -n 5 "$dir/server.err" >&2 || true
	fi
	if [ "$mode" = fabsock ]; then
		local client_off server_off client_rx server_rx need=$((NCONN << 20))
		client_off=$(fs_stat_sum "$dir/client.err" offloaded)
		server_off=$(fs_stat_sum "$dir/server.err" offloaded)
		client_rx=$(fs_stat_sum "$dir/client.err" fabric_rx_bytes)
		server_rx=$(fs_stat_sum "$dir/server.err" fabric_rx_bytes)
		[ "$client_off" = "$NCONN" ] ||
			fs_fail "$label: the client's stats say offloaded=$client_off, expected $NCONN ($(fs_stats_fallbacks "$dir/client.err"))"
		[ "$server_off" = "$NCONN" ] ||
			fs_fail "$label: the server's processes' stats ($(stats_lines "$dir/server.err") lines) add up to offloaded=$server_off, expected $NCONN ($(fs_stats_fallbacks "$dir/server.err"))"
		# every echoed byte came over the fabric, both ways
		[ "$server_rx" -ge "$need" ] && [ "$client_rx" -ge "$need" ] ||
			fs_fail "$label: fabric bytes received: server $server_rx, client $client_rx, expected >= $need each"
		fs_log "$label: offloaded client $client_off, server processes $server_off ($(stats_lines "$dir/server.err") stats lines); fabric bytes received server $server_rx, client $client_rx"
	fi
	grep -h '^worker' "$dir/server.out" 2>/dev/null | sed "s/^/    /" >&2 || true
	[ "$FS_FAILS" -eq "$fails_before" ] && fs_pass "$label"
	return 0
}

[ -x "$SHAPES_PROG" ] || { fs_fail "$SHAPES_PROG is not built"; fs_done; exit 1; }
for shape in ${FS_SHAPES:-fork prefork reuseport threads epoll}; do
	for mode in $FS_MODES; do
		run_shape "$mode" "$shape"
	done
done

# Every fabsock process of this test has exited: none may have left its
# shm region behind (fabsock-<pidns>-<pid>-<random>).
leftover=""
for f in /dev/shm/fabsock-*; do
	[ -e "$f" ] || continue
	pid=$(basename "$f" | cut -d- -f3)
	if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && grep -rqs "fabsock\[$pid\]" "$FS_TMP"; then
		leftover="$leftover $f"
	fi
done
# nor a shared probe table of a port one of its listeners used
for f in /dev/shm/fabsock-probe-*; do
	[ -e "$f" ] || continue
	for d in "$FS_TMP"/*-fabsock; do
		port=$(sed -n 's/^listening port=//p' "$d/server.out" 2>/dev/null)
		[ -n "$port" ] && [[ "$f" == *"-$port" ]] && leftover="$leftover $f"
	done
done
if [ -n "$leftover" ]; then
	fs_fail "shm regions left behind by finished test processes:$leftover"
else
	fs_pass "no /dev/shm region left by this test's processes"
fi
fs_done
