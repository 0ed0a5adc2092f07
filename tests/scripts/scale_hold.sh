#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Many concurrent connections through one server process (issue 14's
# measure). fs_scale's epoll echo server and one client process that opens
# NCONN connections one after another, echoes SIZE bytes on each (every
# byte checked), and holds them all open; then the script reads both
# processes' VmRSS, lets the client close everything, and stops the server.
# Run under kernel TCP and with both ends preloaded, side by side.
# Checks, both modes: the client passes (every echo byte-exact), the server
# accepted and closed exactly NCONN connections and lives until told to
# stop. fabsock mode: every connection is accounted for in the client's
# stats (offloaded + the fallback counters = NCONN), no probe was answered
# no (the listener's probe table holds such a burst), all NCONN were
# offloaded (shared receives, issue 14), every offloaded stream was freed
# on the server (streams_freed), and the server answers and offloads a fresh
# connection after all of them closed; the TCP connections carried no
# payload byte, only the handshakes (nftables, fs_tcp_proof). Printed, not
# required: the setup
# time and the RSS per idle connection on each end above the kernel's.
. "$(dirname "$0")/lib.sh"

PROG=$FS_PROGS/fs_scale
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
fs_need_nft
NCONN=${FS_SCALE_CONNS:-10000}
SIZE=${FS_SCALE_SIZE:-2048}
ulimit -n $((NCONN + 1024)) 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -gt "$NCONN" ] || fs_skip "cannot raise the open-file limit above $NCONN"

rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

declare -A OFF PERCONN_C PERCONN_S SETUP SLOPE_C SLOPE_S FIXED_C FIXED_S
run() { # MODE
	local mode=$1 dir=$FS_TMP/$1 srv cli port rc=0 src=0 s0 s1 line fails=$FS_FAILS
	local -a pre=(env -u LD_PRELOAD)
	[ "$mode" = fabsock ] && pre=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	mkdir -p "$dir"
	fs_bg srv "${pre[@]}" "$PROG" server >"$dir/server.out" 2>"$dir/server.err"
	port=$(fs_listen_port "$dir/server.out" "$srv")
	[ -n "$port" ] || { fs_fail "$mode: the server did not listen"; return 0; }
	s0=$(rss "$srv")
	fs_tcp_count_start "$port" || fs_fail "$mode: nft counter not set up"
	fs_bg cli timeout -k 2 600 "${pre[@]}" "$PROG" client "$port" "$NCONN" "$SIZE" "$dir/go" \
		>"$dir/client.out" 2>"$dir/client.err"
	# a tenth of the way: the server's memory there too (the slope from
	# there to all of them is what a connection costs)
	local m=0 cpart=0 spart=0
	if [ "$NCONN" -ge 100 ]; then
		if ! fs_wait_line "$dir/client.out" '^part ' "$cli" 540; then
			fs_fail "$mode: the client did not reach a tenth of $NCONN connections: $(grep -h '^FAIL' "$dir/client.out" | head -n 2 | tr '\n' ' ')"
			touch "$dir/go.part" "$dir/go"
			return 0
		fi
		sleep 0.5
		spart=$(rss "$srv")
		m=$(sed -n 's/^part \([0-9]*\) .*/\1/p' "$dir/client.out")
		cpart=$(sed -n 's/^part .*rss_kib=\([0-9]*\).*/\1/p' "$dir/client.out")
		touch "$dir/go.part"
	fi
	if ! fs_wait_line "$dir/client.out" '^held ' "$cli" 540; then
		fs_fail "$mode: the client did not hold $NCONN connections: $(grep -h '^FAIL' "$dir/client.out" | head -n 2 | tr '\n' ' ') $(tail -n 2 "$dir/client.err" | tr '\n' ' ')"
		touch "$dir/go"
		return 0
	fi
	sleep 0.5
	s1=$(rss "$srv")
	line=$(grep '^held ' "$dir/client.out")
	touch "$dir/go"
	fs_wait_pid "$cli" 120 || rc=$?
	[ "$rc" = 0 ] && grep -q "^PASS client $NCONN" "$dir/client.out" ||
		fs_fail "$mode: client exit $rc: $(grep -h '^FAIL' "$dir/client.out" | head -n 3 | tr '\n' ' ')"
	if [ "$mode" = fabsock ] && kill -0 "$srv" 2>/dev/null; then
		# after every connection closed, a fresh one is served and offloaded
		timeout -k 2 60 "${pre[@]}" "$PROG" client "$port" 1 "$SIZE" "$dir/go" \
			>"$dir/last.out" 2>"$dir/last.err" || fs_fail "$mode: a fresh connection afterwards failed"
		[ "$(fs_stat "$dir/last.err" offloaded)" = 1 ] ||
			fs_fail "$mode: a fresh connection after the $NCONN closed was not offloaded ($(fs_stats_fallbacks "$dir/last.err"))"
	fi
	sleep ${FS_SCALE_SETTLE:-1} # the last streams' FINs reach the server's engine, which frees them
	kill -TERM "$srv" 2>/dev/null || true
	fs_wait_pid "$srv" 60 || src=$?
	[ "$src" = 0 ] || fs_fail "$mode: server exit $src"
	local want=$NCONN
	[ "$mode" = fabsock ] && want=$((NCONN + 1))
	fs_tcp_proof "$mode: $want connections" "$mode" "$want"
	grep -q "^accepted=$want closed=$want\$" "$dir/server.out" ||
		fs_fail "$mode: server says $(grep '^accepted=' "$dir/server.out" || echo nothing), expected accepted=$want closed=$want"
	local c0 c1
	c0=$(sed 's/.*rss_before_kib=\([0-9]*\).*/\1/' <<<"$line")
	c1=$(sed 's/.*rss_held_kib=\([0-9]*\).*/\1/' <<<"$line")
	SETUP[$mode]=$(sed 's/.*setup_ms=\([0-9]*\).*/\1/' <<<"$line")
	PERCONN_C[$mode]=$(awk -v a="$c0" -v b="$c1" -v n="$NCONN" 'BEGIN { printf "%.2f", (b - a) / n }')
	PERCONN_S[$mode]=$(awk -v a="$s0" -v b="$s1" -v n="$NCONN" 'BEGIN { printf "%.2f", (b - a) / n }')
	if [ "$m" -gt 0 ] && [ "$m" -lt "$NCONN" ]; then
		# slope between a tenth and all of them; the rest is fixed
		SLOPE_C[$mode]=$(awk -v a="$cpart" -v b="$c1" -v n=$((NCONN - m)) 'BEGIN { printf "%.2f", (b - a) / n }')
		SLOPE_S[$mode]=$(awk -v a="$spart" -v b="$s1" -v n=$((NCONN - m)) 'BEGIN { printf "%.2f", (b - a) / n }')
		FIXED_C[$mode]=$(awk -v r0="$c0" -v r="$cpart" -v m="$m" -v k="${SLOPE_C[$mode]}" 'BEGIN { printf "%.0f", r - r0 - m * k }')
		FIXED_S[$mode]=$(awk -v r0="$s0" -v r="$spart" -v m="$m" -v k="${SLOPE_S[$mode]}" 'BEGIN { printf "%.0f", r - r0 - m * k }')
	fi
	if [ "$mode" = fabsock ]; then
		local off sum
		off=$(fs_stat "$dir/client.err" offloaded)
		sum=$(grep -h 'warn: stats:' "$dir/client.err" | tail -n 1 | tr ' ' '\n' |
			grep -E '^(offloaded|fallback_[a-z_]+)=' | awk -F= '{ s += $2 } END { print s + 0 }')
		OFF[$mode]=${off:-0}
		[ "$sum" = "$NCONN" ] ||
			fs_fail "$mode: the client's stats account for $sum of $NCONN connections (offloaded=${off:-none} $(fs_stats_fallbacks "$dir/client.err"))"
		# the listener's probe table holds a burst of this many
		[ "$(fs_stat "$dir/client.err" fallback_probe_no)" = 0 ] ||
			fs_fail "$mode: $(fs_stat "$dir/client.err" fallback_probe_no) probes answered no (the listener's probe table was full)"
		# shared receives (issue 14): every one of them on the fabric
		[ "${off:-0}" = "$NCONN" ] ||
			fs_fail "$mode: $off of $NCONN connections offloaded ($(fs_stats_fallbacks "$dir/client.err"))"
		# and every stream freed again on the server, which outlives them
		# (its count includes the fresh connection afterwards; the client
		# exits right after its closes, with streams still finishing)
		local soff sfreed
		soff=$(fs_stat "$dir/server.err" offloaded)
		sfreed=$(fs_stat "$dir/server.err" streams_freed)
		# the echoed bytes went over the fabric, not the kernel connection
		local srx
		srx=$(fs_stat "$dir/server.err" fabric_rx_bytes)
		[ "${srx:-0}" -ge $((NCONN * SIZE)) ] ||
			fs_fail "$mode: the server received ${srx:-0} payload bytes over the fabric, expected >= $((NCONN * SIZE))"
		[ -n "$soff" ] && [ "$soff" = "$sfreed" ] && [ "$soff" -ge "$NCONN" ] ||
			fs_fail "$mode: server offloaded ${soff:-?} streams and freed ${sfreed:-?}; its log: $(grep -v ': stats:' "$dir/server.err" | sed 's/stream [0-9]*/stream N/' | sort | uniq -c | sort -rn | head -n 3 | tr '\n' ' ')"
		fs_log "$mode: offloaded $off of $NCONN; the rest: $(fs_stats_fallbacks "$dir/client.err")"
	else
		OFF[$mode]=0
	fi
	[ "$FS_FAILS" = "$fails" ] && fs_pass "$mode: $NCONN connections held and echoed byte-exact"
	return 0
}

for mode in $FS_MODES; do
	run "$mode"
done
printf '%-44s | %10s | %10s\n' "$NCONN connections, one server process" kernel fabsock >&2
printf '%-44s | %10s | %10s\n' "offloaded" - "${OFF[fabsock]:-?}" >&2
printf '%-44s | %10s | %10s\n' "setup, one after another (ms)" "${SETUP[kernel]:-?}" "${SETUP[fabsock]:-?}" >&2
printf '%-44s | %10s | %10s\n' "RSS per idle connection, client (KiB)" "${PERCONN_C[kernel]:-?}" "${PERCONN_C[fabsock]:-?}" >&2
printf '%-44s | %10s | %10s\n' "RSS per idle connection, server (KiB)" "${PERCONN_S[kernel]:-?}" "${PERCONN_S[fabsock]:-?}" >&2
printf '%-44s | %10s | %10s\n' "  slope from N/10 to N, client (KiB)" "${SLOPE_C[kernel]:-?}" "${SLOPE_C[fabsock]:-?}" >&2
printf '%-44s | %10s | %10s\n' "  slope from N/10 to N, server (KiB)" "${SLOPE_S[kernel]:-?}" "${SLOPE_S[fabsock]:-?}" >&2
printf '%-44s | %10s | %10s\n' "fixed overhead, client (KiB)" "${FIXED_C[kernel]:-?}" "${FIXED_C[fabsock]:-?}" >&2
printf '%-44s | %10s | %10s\n' "fixed overhead, server (KiB)" "${FIXED_S[kernel]:-?}" "${FIXED_S[fabsock]:-?}" >&2
fs_log "issue 14 target for memory (reported, not required): <= 2 KiB per idle connection above the kernel on each end"
fs_done
