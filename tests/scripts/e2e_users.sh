#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Peers of different users on one host (issue: servers that drop privileges).
# shm only works between processes of one user, and the user that counts is
# the one in force when the connection negotiates, after a setuid(), on both
# ends. fs_stream moves 4 MiB each way on 2 connections, every byte checked
# against its deterministic stream, with:
#   server nobody (root that drops to nobody after listen(), like nginx's
#   workers or memcached -u: not dumpable, so its peers cannot read its
#   memory) and client nobody: offloaded;
#   server nobody, client root; server root, client nobody: kernel TCP on
#   both ends, counted as fallback_other_user, never a reset or a crash;
#   server root, client root: offloaded.
# Proof of the path: TCP_INFO bytes received by every connection's kernel
# socket (< 4096 when offloaded, >= the payload otherwise). Needs root.
# With listener records (the default, core/records.h) a client of another
# user than the server's finds no record of its own user (or the root one
# the server's setuid marked as served by nobody) and stays on TCP at once:
# fallback_no_record, no probe sent, and the server sees a plain client
# (fallback_peer_plain). With FABSOCK_RECORDS=0 the refusal comes, as
# before records, from the HELLO: fallback_other_user on both ends.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || fs_skip "needs root (setuid to nobody)"
command -v setpriv >/dev/null || fs_skip "setpriv is missing (util-linux)"
# Both the library and the program must be readable by nobody, wherever the
# checkout lives.
chmod 755 "$FS_TMP"
LIB=$(fs_lib_copy "$FS_TMP")
cp "$FS_PROGS/fs_stream" "$FS_TMP/fs_stream"
chmod 755 "$FS_TMP/fs_stream"
PROG=$FS_TMP/fs_stream
BYTES=4M
STREAMS=2

run_pair() { # SERVER_USER CLIENT_USER EXPECT(offload|tcp) RECORDS(1|0) [banner]
	local su=$1 cu=$2 expect=$3 rec=$4 banner=${5:-} label="server $1, client $2, records $4${banner:+, $banner}"
	local dir=$FS_TMP/$1-$2-$4$banner spid cpid port
	local -a sargs=() bargs=()
	mkdir -p "$dir"
	chmod 777 "$dir"
	[ "$su" = root ] || sargs=(--setuid "$su")
	[ -z "$banner" ] || bargs=(--banner)
	fs_bg spid env "LD_PRELOAD=$LIB" FABSOCK_STATS=1 FABSOCK_LOG=info FABSOCK_RECORDS="$rec" "$PROG" server --port 0 --ready-file "$dir/ready" \
		"${sargs[@]}" "${bargs[@]}" --streams "$STREAMS" --bytes "$BYTES" --bidir >"$dir/server.out" 2>"$dir/server.err"
	for _ in $(seq 1 100); do [ -s "$dir/ready" ] && break; fs_sleep 0.05; done
	port=$(cat "$dir/ready" 2>/dev/null || true)
	if [ -z "$port" ]; then
		fs_fail "$label: the server did not start"
		return 0
	fi
	fs_bg cpid setpriv --reuid="$cu" --regid="$(id -gn "$cu")" --init-groups -- env "LD_PRELOAD=$LIB" \
		FABSOCK_STATS=1 FABSOCK_RECORDS="$rec" "$PROG" client 127.0.0.1 "$port" "${bargs[@]}" --streams "$STREAMS" --bytes "$BYTES" --bidir \
		>"$dir/client.out" 2>"$dir/client.err"
	local crc=0 src=0
	fs_wait_pid "$cpid" 60 || crc=$?
	fs_wait_pid "$spid" 10 || src=$?
	fs_pair_ok "$dir" "$label" "$src" "$crc" || return 0
	local side off other rx norec plain probes
	for side in server client; do
		off=$(fs_stat "$dir/$side.err" offloaded)
		other=$(fs_stat "$dir/$side.err" fallback_other_user)
		norec=$(fs_stat "$dir/$side.err" fallback_no_record)
		plain=$(fs_stat "$dir/$side.err" fallback_peer_plain)
		probes=$(fs_stat "$dir/$side.err" probes_sent)
		rx=$(sed -nE 's/^conn .* tcp_bytes_received=([0-9]+).*/\1/p' "$dir/$side.out" | sort -n | tail -n 1)
		if [ "$expect" = offload ]; then
			if [ "${off:-0}" -ne "$STREAMS" ] || [ "${rx:-0}" -ge 4096 ]; then
				fs_fail "$label: $side offloaded=${off:-none}, largest TCP receive $rx bytes (expected $STREAMS offloaded, < 4096)"
				continue
			fi
		elif [ "$rec" = 1 ] && [ -n "$banner" ] && [ "$side" = server ]; then
			# a server that speaks first to a client of another user: no
			# probe can come (the client found no record of its user), so
			# it wrote at once instead of waiting FIRST_SEND_WAIT_MS
			local first quick
			first=$(fs_stat "$dir/$side.err" fallback_server_first)
			quick=$(grep -c 'spoke first to a client of another user' "$dir/$side.err" || true)
			if [ "${off:-0}" -ne 0 ] || [ "${first:--1}" -ne "$STREAMS" ] || [ "$quick" -ne "$STREAMS" ] ||
				[ "${rx:-0}" -lt 4194304 ]; then
				fs_fail "$label: server offloaded=${off:-none} fallback_server_first=${first:-none}, $quick settled without waiting, largest TCP receive $rx (expected 0, $STREAMS, $STREAMS, >= 4 MiB)"
				continue
			fi
			fs_pass "$label: the server spoke first at once to each client of another user ($quick), TCP received $rx bytes"
			continue
		elif [ "$rec" = 1 ]; then
			# said no early: the client sent no probe, the server saw
			# a plain client, nobody reached the HELLO
			local want_norec=0 want_plain=0
			if [ "$side" = client ]; then want_norec=$STREAMS; else want_plain=$STREAMS; fi
			if [ "${off:-0}" -ne 0 ] || [ "${other:-1}" -ne 0 ] || [ "${norec:--1}" -ne "$want_norec" ] ||
				[ "${plain:--1}" -ne "$want_plain" ] || [ "${probes:--1}" -ne 0 ] || [ "${rx:-0}" -lt 4194304 ]; then
				fs_fail "$label: $side offloaded=${off:-none} fallback_other_user=${other:-none} fallback_no_record=${norec:-none} fallback_peer_plain=${plain:-none} probes_sent=${probes:-none}, largest TCP receive $rx (expected 0 0 $want_norec $want_plain 0, >= 4 MiB)"
				continue
			fi
			fs_pass "$label: $side stayed on TCP without a probe (fallback_no_record=$norec fallback_peer_plain=$plain), TCP received $rx bytes"
			continue
		elif [ "${off:-0}" -ne 0 ] || [ "${other:-0}" -ne "$STREAMS" ] || [ "${rx:-0}" -lt 4194304 ]; then
			fs_fail "$label: $side offloaded=${off:-none} fallback_other_user=${other:-none}, largest TCP receive $rx (expected 0, $STREAMS, >= 4 MiB)"
			continue
		fi
		fs_pass "$label: $side offloaded=$off fallback_other_user=$other, TCP received at most $rx bytes per connection"
	done
}

for rec in 1 0; do
	run_pair nobody nobody offload "$rec"
	run_pair nobody root tcp "$rec"
	run_pair root nobody tcp "$rec"
	run_pair root root offload "$rec"
done
run_pair root nobody tcp 1 banner
run_pair nobody root tcp 1 banner
run_pair nobody nobody offload 1 banner
fs_done
