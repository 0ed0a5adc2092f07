#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: nginx 1.22 as Debian ships it: the master runs as root,
# `user nobody nogroup;` workers (worker_processes 2), sendfile on, epoll,
# with a private prefix, config, logs and temp dirs under FS_TMP (never
# /etc/nginx), listening on a free port of 127.0.0.1. It serves a 600-byte
# file and a 4 MB random file. Each mode (kernel: no preload; fabsock: nginx
# and every client under the library) runs two nginx instances, one per
# client user, so that each instance's stats lines (written when its
# processes exit) belong to one kind of client:
#   - clients as nobody (the workers' user: shm works, must be offloaded):
#     wrk -c 4 for 3 s on the small file (keep-alive; nginx closes a
#     connection after 1000 requests, wrk reconnects), then curl of the
#     4 MB file several times, sha256 compared; the TCP connections on the
#     port carry no payload in fabsock mode beyond the HELLOs (nftables);
#   - the same clients as root (another user than the workers: must stay on
#     kernel TCP, counted as a fallback on both ends, no error, no crash);
#   - checks: wrk's own error counters and the access log (every request
#     200 with the exact body size, or 499 for at most one request per
#     connection abandoned when wrk's time is up; the number of connections
#     from $connection), curl's status, size and sha256, nginx's error log
#     reports no worker "exited on signal", the master is alive after the
#     load and leaves through a graceful stop (SIGQUIT) with status 0, no
#     core files, the offload counters of server and clients.
# Figures: wrk requests/s and curl MB/s, kernel vs fabsock, per client user
# (a ratio check only with RA_MIN_RATIO set: realapps_lib.sh).

. "$(dirname "$0")/realapps_nginx_lib.sh"

CURL_RUNS=${RA_CURL_RUNS:-5}

declare -A FIG

# wrk_run MODE USER TAG DIR PORT: wrk on the small file as USER for
# WRK_SECS s; checks wrk's counters and the access log (nginx's view);
# records req/s in FIG, the bytes in WRK_BYTES, connections in WRK_CONNS_SEEN.
wrk_run() {
	local mode=$1 user=$2 tag=$3 dir=$4 port=$5 bad
	ra_env "$mode" "wrk-$tag"
	: >"$dir/access.log"
	wrk_load "$user" "http://127.0.0.1:$port/small.txt" "$RA_DIR/wrk-$tag.$mode.out"
	FIG["wrk $user $mode"]=$WRK_RPS
	sleep 0.2 # the access log of the last requests
	access_count "$dir/access.log"
	# abandoned when wrk's time was up (a 499, or a 200 with no body as its
	# connection's last request: access_count): at most one per connection;
	# anything else is an error, any other short 200 too
	bad=$AL_BAD
	[ "$AL_499" -le "$WRK_CONNS" ] || bad=$((bad + AL_499))
	WRK_CONNS_SEEN=$AL_CONNS
	if [ "$WRK_RC" -ne 0 ] || [ -z "$WRK_SUMMARY" ] || [ "${WRK_REQ:-0}" -eq 0 ] || [ "$WRK_NERR" -ne 0 ] ||
		[ "$bad" -ne 0 ] || [ "$AL_LINES" -lt "$WRK_REQ" ] || [ "$WRK_BYTES" -lt $((WRK_REQ * SMALL_SIZE)) ]; then
		fs_fail "$RA_CASE $mode: wrk $user: exit status $WRK_RC, ${WRK_REQ:-?} requests, $WRK_BYTES bytes, errors $WRK_ERRS; access log: $AL_LINES requests on $AL_CONNS connections, $bad not 200/$SMALL_SIZE bytes"
		awk -v sz="$SMALL_SIZE" '$3 != 200 || $4 != sz' "$dir/access.log" | head -n 3 | sed 's/^/    access.log: /' >&2 || true
		grep -v ': stats:' "$RA_DIR/wrk-$tag.$mode.out.err" | tail -n 5 | sed 's/^/    stderr: /' >&2 || true
		return 1
	fi
	fs_pass "$RA_CASE $mode: wrk $user: $WRK_REQ requests, 0 errors, $WRK_RPS req/s; access log: $((AL_LINES - AL_499)) x 200/$SMALL_SIZE bytes$([ "$AL_499" -eq 0 ] || echo " and $AL_499 abandoned at wrk's end") on $AL_CONNS connections"
}

# curl_runs MODE USER TAG PORT: CURL_RUNS downloads of the 4 MB file as
# USER, each checked by sha256; records MB/s in FIG and the bytes in
# CURL_BYTES.
curl_runs() {
	local mode=$1 user=$2 tag=$3 port=$4 i out bad=0 speeds="" tconns=""
	CURL_BYTES=0
	ra_env "$mode" "curl-$tag"
	for i in $(seq 1 "$CURL_RUNS"); do
		out=$RA_DIR/curl-$tag.$mode.$i
		SECONDS=0
		ra_curl_get "$user" 20 "http://127.0.0.1:$port/big.bin" "$out" 25
		tconns="$tconns ${CURL_TCONN:-?}"
		CURL_BYTES=$((CURL_BYTES + ${CURL_SIZE:-0}))
		if [ "$CURL_RC" -ne 0 ] || [ "${CURL_CODE:-}" != 200 ] || [ "$CURL_SUM" != "$BIG_SUM" ]; then
			fs_fail "$RA_CASE $mode: curl run $i ($user): exit status $CURL_RC after ${SECONDS}s, HTTP ${CURL_CODE:-none}, ${CURL_SIZE:-0} bytes, sha256 ${CURL_SUM:0:16} (want ${BIG_SUM:0:16})"
			grep -v ': stats:' "$out.err" | tail -n 3 | sed 's/^/    stderr: /' >&2 || true
			bad=1
		else
			speeds="$speeds $CURL_SPEED"
		fi
		rm -f "$out"
	done
	FIG["curl $user $mode"]=$(ra_mean_mb "$speeds")
	[ "$bad" -eq 0 ] && fs_pass "$RA_CASE $mode: curl fetched the 4 MB file $CURL_RUNS times ($user), sha256 equal, ${FIG["curl $user $mode"]} MB/s"
	fs_log "$mode: curl $user: connect() took (s):$tconns"
	return 0
}

# nginx_case MODE USER: one nginx instance, the clients as USER.
nginx_case() {
	local mode=$1 user=$2 dir port srv moved conns name i ro rk rother
	dir=$FS_TMP/nginx-$user-$mode
	name=nginx-$user
	mkdir -p "$dir"
	port=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	nginx_conf "$dir" "$port" "root $DOCROOT;"
	nginx_start "$mode" "$name" "$dir" "$port" || return 0
	srv=$NGX_PID

	[ "$user" = nobody ] && { fs_tcp_count_start "$port" || fs_fail "$RA_CASE $mode: nft counter not set up"; }
	moved=0 conns=0
	wrk_run "$mode" "$user" "$user" "$dir" "$port" && :
	moved=$((moved + WRK_BYTES)) conns=$((conns + WRK_CONNS_SEEN))
	curl_runs "$mode" "$user" "$user" "$port"
	moved=$((moved + CURL_BYTES)) conns=$((conns + CURL_RUNS))
	if [ "$user" = nobody ]; then
		ra_tcp_payload_check "$mode" "$moved" "$conns"
		fs_tcp_count_stop
	fi
	nginx_stop "$mode" "$dir" "$srv" "nginx ($user clients)" 'exited on signal|core dumped|\[alert\]|\[emerg\]'
	ra_cores_report "$mode $user clients"

	[ "$mode" = fabsock ] || return 0
	fs_log "$mode $user clients: nginx stats lines: $(grep -c ': stats:' "$RA_DIR/$name.$mode.log" || true) (master + 2 workers expected); server fallbacks: $(ra_why "$name" "$mode")"
	if [ "$user" = nobody ]; then
		ra_offloaded "$name" "$mode" $((WRK_CONNS + CURL_RUNS))
		ra_offloaded "wrk-$user" "$mode" "$WRK_CONNS"
		ra_offloaded "curl-$user" "$mode" "$CURL_RUNS"
	else
		# root clients of nobody workers: TCP on both ends, counted; the
		# connection counts come from the access log and the curl runs.
		local want
		for i in "$name" "wrk-$user" "curl-$user"; do
			case $i in
			nginx-*) want=$conns ;;
			wrk-*) want=$WRK_CONNS_SEEN ;;
			curl-*) want=$CURL_RUNS ;;
			esac
			ro=$(ra_sum "$i" "$mode" offloaded)
			# (the workers' connections: tracked and settled on TCP,
			# or, once a worker's listener turned plain, untracked)
			rk=$(($(ra_sum "$i" "$mode" kernel) + $(ra_sum "$i" "$mode" plain_accepted)))
			rother=$(ra_sum "$i" "$mode" fallback_other_user)
			if [ "$ro" -eq 0 ] && [ "$rk" -ge "$want" ]; then
				fs_pass "$RA_CASE $mode: root clients: $i offloaded 0, left $rk streams on TCP ($(ra_why "$i" "$mode"))"
			else
				fs_fail "$RA_CASE $mode: root clients: $i offloaded $ro, left $rk on TCP (want 0 and >= $want): $(ra_why "$i" "$mode")"
			fi
			case $i in
			wrk-* | curl-*)
				# issue 27 target 5: the workers' setuid marked root's
				# listener record as served by nobody, so a root
				# client says no before any probe, rail or HELLO
				# (core/records.h); the workers see plain clients
				local rp rn
				rp=$(ra_sum "$i" "$mode" probes_sent)
				rn=$(ra_sum "$i" "$mode" fallback_no_record)
				if [ "$rp" -eq 0 ] && [ "$rn" -eq "$rk" ]; then
					fs_pass "$RA_CASE $mode: root clients: $i sent no probe, said no early on all $rn connections"
				else
					fs_fail "$RA_CASE $mode: root clients: $i sent $rp probes, said no early on $rn of $rk connections (want 0, all)"
				fi
				;;
			*) [ "$rother" -eq 0 ] || fs_log "note: $i counted $rother fallback_other_user (a connection that probed)" ;;
			esac
		done
	fi
	for i in "$name" "wrk-$user" "curl-$user"; do
		ra_log_clean "$i" "$mode" || true
		ra_fabsock_notes "$i" "$mode"
	done
}

for user in nobody root; do
	for mode in $FS_MODES; do
		nginx_case "$mode" "$user"
	done
	ra_figure "wrk -c $WRK_CONNS small file, $user clients" "req/s" "${FIG["wrk $user kernel"]:-0}" "${FIG["wrk $user fabsock"]:-0}"
	ra_figure "curl 4 MB, $user clients" "MB/s" "${FIG["curl $user kernel"]:-0}" "${FIG["curl $user fabsock"]:-0}"
	ra_ratio_check "wrk $user clients (req/s)" "${FIG["wrk $user kernel"]:-0}" "${FIG["wrk $user fabsock"]:-0}"
	ra_ratio_check "curl 4 MB $user clients (MB/s)" "${FIG["curl $user kernel"]:-0}" "${FIG["curl $user fabsock"]:-0}"
done
ra_done
