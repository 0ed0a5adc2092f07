#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A connection first used a while after connect() (a pool, a proxy's
# upstream, a client that connects ahead of use) against a server process
# that has gone quiet: fs_idle's client waits DELAY_MS between connect()
# and its first byte on each of its CONNS connections, longer than the
# engine's FABSOCK_IDLE_AFTER_MS, so both processes have armed their
# doorbells (core/bell.h) while the new stream's handshake was under way.
# The first round trip on every connection must then take less than
# LIMIT_MS: well under FS_BELL_SLICE_MS (250 ms), the safety slice of a
# sleeper whose ring never came. Then both sides idle again and the
# client's 'q' on every connection must wake the server as fast. Each run
# in recv (a thread per connection) and epoll mode, kernel and fabsock
# side by side; under fabsock every connection offloaded on both ends and
# the server woken by at least one ring.
. "$(dirname "$0")/lib.sh"

IDLE="$FS_PROGS/fs_idle"
[ -x "$IDLE" ] || { fs_fail "$IDLE is not built"; fs_done; exit 1; }

CONNS=3
DELAY_MS=700
IDLE_AFTER_MS=200
LIMIT_MS=100
declare -A RESULT

run() { # MODE IOMODE
	local mode=$1 io=$2 what="$1 $2" log="$FS_TMP/$1-$2" srv cli port rc=0 src=0 first wake
	local -a pre=(env -u LD_PRELOAD)
	[ "$mode" = fabsock ] && pre=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_IDLE_AFTER_MS=$IDLE_AFTER_MS)
	fs_bg srv timeout -k 2 60 "${pre[@]}" "$IDLE" server --ready-file "$log.ready" --mode "$io" --conns "$CONNS" \
		>"$log-server.out" 2>"$log-server.err"
	for _ in $(seq 1 200); do [ -s "$log.ready" ] && break; fs_sleep 0.05; done
	if ! port=$(cat "$log.ready" 2>/dev/null) || [ -z "$port" ]; then
		fs_fail "$what: fs_idle server not ready"
		return 0
	fi
	fs_bg cli timeout -k 2 60 "${pre[@]}" "$IDLE" client 127.0.0.1 "$port" --mode "$io" --conns "$CONNS" \
		--idle-s 1 --delay-ms "$DELAY_MS" >"$log-client.out" 2>"$log-client.err"
	fs_wait_pid "$cli" 60 || rc=$?
	fs_wait_pid "$srv" 15 || src=$?
	if [ "$rc" -ne 0 ] || [ "$src" -ne 0 ] || ! grep -q '^done' "$log-client.out"; then
		fs_fail "$what: client exit $rc, server exit $src"
		grep -hv ': stats:' "$log-client.err" "$log-server.err" | tail -n 6 | sed 's/^/    /' >&2 || true
		return 0
	fi
	first=$(sed -n 's/^first_ms //p' "$log-client.out")
	wake=$(sed -n 's/^wake_ms //p' "$log-client.out")
	RESULT[$mode-$io]="first use ${first:-?} ms, after idle ${wake:-?} ms"
	[ "$mode" = fabsock ] || return 0
	local side so rung
	for side in server client; do
		so=$(fs_stat "$log-$side.err" offloaded)
		[ "${so:-0}" = "$CONNS" ] || fs_fail "$what: $side offloaded=${so:-no stats line}, expected $CONNS"
	done
	rung=$(fs_stat "$log-server.err" bell_rings_received)
	[ "${rung:-0}" -ge 1 ] || fs_fail "$what: the server received no ring (bell_rings_received=${rung:-none})"
	for pair in "first use:$first" "after idle:$wake"; do
		local name=${pair%%:*} ms=${pair#*:}
		if [ -n "$ms" ] && awk -v w="$ms" -v l="$LIMIT_MS" 'BEGIN { exit !(w < l) }'; then
			fs_pass "$what: slowest $name round trip $ms ms (limit $LIMIT_MS)"
		else
			fs_fail "$what: slowest $name round trip ${ms:-missing} ms (limit $LIMIT_MS)"
		fi
	done
}

for io in recv epoll; do
	for mode in $FS_MODES; do
		run "$mode" "$io"
	done
	fs_log "$io, $CONNS connections, ${DELAY_MS} ms before first use: kernel: ${RESULT[kernel-$io]:-n/a} | fabsock: ${RESULT[fabsock-$io]:-n/a}"
done
fs_done
