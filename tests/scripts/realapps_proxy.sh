#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: nginx as a reverse proxy (proxy_pass), both tiers under
# fabsock. Two nginx instances in Debian's shape (root master, `user nobody
# nogroup;` workers, worker_processes 2, sendfile on, epoll, private prefix
# and config under FS_TMP), on free ports of 127.0.0.1:
#   backend  serves a 600-byte file and a 4 MB random file;
#   front    proxy_pass http://127.0.0.1:BACKEND with nginx's defaults:
#            HTTP/1.0 to the upstream, a new upstream connection per request,
#            proxy_buffering on (large answers spill to its proxy_temp_path).
# Clients as nobody (the workers' user), each mode run once on the kernel and
# once with both nginx instances and the clients under the library:
#   1. curl of the 4 MB file through the front, CURL_RUNS times, sha256 and
#      time per run (a run slower than STALL_SECS counts as a stall; every run
#      bounded by curl --max-time);
#   2. wrk -c 4 on the small file for 3 s: keep-alive to the front, one short
#      upstream connection per request (thousands in a few seconds), checked
#      through wrk's error counters and both access logs ($connection,
#      $status, $upstream_status; 499 allowed for at most one request per
#      connection, abandoned when wrk's time is up);
#   3. CURL_AFTER more 4 MB downloads after the storm of short connections.
# Also: no "exited on signal" in either error log, both masters alive after
# the load and stopped gracefully (SIGQUIT; the stats lines are written at
# exit), the offload counters of all four kinds of process, the TCP payload
# on both ports (nftables) in fabsock mode, fabsock's own warnings (e.g. "the
# shm receive queue (1024 entries) is full") and the upstream errors in the
# front's error log.
# Figures: curl MB/s and wrk requests/s through the proxy, kernel vs fabsock
# (a ratio check only with RA_MIN_RATIO set: realapps_lib.sh). The number of curl runs stops at MAX_STALLS failed ones per series, to bound the
# time (whole script about 90 s at worst).

. "$(dirname "$0")/realapps_nginx_lib.sh"

CURL_RUNS=${RA_CURL_RUNS:-4}
CURL_AFTER=${RA_CURL_AFTER:-2}
CURL_MAX=${RA_CURL_MAX:-12} # curl --max-time per download
STALL_SECS=5                # a 4 MB download on loopback takes well under 1 s
MAX_STALLS=${RA_MAX_STALLS:-2} # after that many failed or stalled downloads in a series, skip the rest

declare -A FIG

# curl_runs MODE TAG N: N downloads of the 4 MB file through the front as
# nobody, each checked by sha256 and timed; adds the MB/s of the good runs to
# SPEEDS, the bytes to CURL_BYTES, the failed or stalled runs to STALLS, the
# runs made (not skipped) to CURL_DONE.
curl_runs() {
	local mode=$1 tag=$2 n=$3 i out bad=0
	ra_env "$mode" curl
	for i in $(seq 1 "$n"); do
		if [ "$bad" -ge "$MAX_STALLS" ]; then
			fs_log "$mode: curl $tag run $i skipped: already $bad failed or stalled runs (bounding the time)"
			continue
		fi
		CURL_DONE=$((CURL_DONE + 1))
		out=$RA_DIR/curl-$tag.$mode.$i
		: >"$FDIR/access.log"
		: >"$BDIR/access.log"
		ra_curl_get nobody "$CURL_MAX" "http://127.0.0.1:$FRONT/big.bin" "$out"
		CURL_BYTES=$((CURL_BYTES + ${CURL_SIZE:-0}))
		if [ "$CURL_RC" -ne 0 ] || [ "${CURL_CODE:-}" != 200 ] || [ "$CURL_SUM" != "$BIG_SUM" ]; then
			fs_fail "$RA_CASE $mode: curl $tag run $i: exit status $CURL_RC, HTTP ${CURL_CODE:-none}, ${CURL_SIZE:-0} of $BIG_SIZE bytes in ${CURL_TTOT:-?} s, sha256 ${CURL_SUM:0:16} (want ${BIG_SUM:0:16})"
			grep -v ': stats:' "$out.err" | tail -n 2 | sed 's/^/    stderr: /' >&2 || true
			sleep 0.5
			curl_hops
			STALLS=$((STALLS + 1)) bad=$((bad + 1))
		elif awk -v t="$CURL_TTOT" -v m="$STALL_SECS" 'BEGIN { exit !(t > m) }'; then
			fs_fail "$RA_CASE $mode: curl $tag run $i: sha256 equal but it took $CURL_TTOT s (a stall: > $STALL_SECS s)"
			curl_hops
			STALLS=$((STALLS + 1)) bad=$((bad + 1))
		else
			SPEEDS="$SPEEDS $CURL_SPEED"
			fs_log "$mode: curl $tag run $i: sha256 equal, $CURL_TTOT s"
		fi
		rm -f "$out"
	done
}

# curl_hops: which hop a failed download stopped on: the front's big.bin
# line (bytes it sent to curl, bytes it received from the backend, upstream
# time) and the backend's (bytes it sent); both logs are emptied before each
# download, and a request still in progress has no line yet.
curl_hops() {
	awk '$5 == "/big.bin" { l = $0 } END { if (l == "") print "    front: no access log line yet"; else { split(l, f, " ");
		printf "    front: status %s, sent %s body bytes to curl in %s s; received %s bytes from the backend in %s s\n", f[3], f[4], f[7], f[8], f[9] } }' \
		"$FDIR/access.log" >&2 || true
	awk '$5 == "/big.bin" { l = $0 } END { if (l == "") print "    backend: no access log line yet (still sending)"; else { split(l, f, " ");
		printf "    backend: status %s, sent %s body bytes to the front in %s s\n", f[3], f[4], f[7] } }' \
		"$BDIR/access.log" >&2 || true
}

# wrk_run MODE: wrk on the small file through the front for WRK_SECS s;
# sets WRK_BYTES, WRK_FCONNS and WRK_BCONNS (client and upstream connections
# seen in the access logs).
wrk_run() {
	local mode=$1 fbad flines n499
	ra_env "$mode" wrk
	: >"$FDIR/access.log"
	: >"$BDIR/access.log"
	wrk_load nobody "http://127.0.0.1:$FRONT/small.txt" "$RA_DIR/wrk.$mode.out"
	FIG["wrk $mode"]=$WRK_RPS
	sleep 0.3 # the access log lines of the last requests
	# Abandoned at wrk's end (access_count): at most one per connection;
	# anything else is an error.
	access_count "$FDIR/access.log"
	flines=$AL_LINES fbad=$AL_BAD n499=$AL_499 WRK_FCONNS=$AL_CONNS
	[ "$n499" -le "$WRK_CONNS" ] || fbad=$((fbad + n499))
	access_count "$BDIR/access.log"
	WRK_BCONNS=$AL_CONNS
	# A request the front abandoned (its 499) may reach the backend's log as
	# 200 with fewer body bytes (the front closed the upstream connection
	# while the answer went out): one such line per front 499 is allowed.
	# (access_count took the backend's 200s with no body for abandoned by
	# wrk, each being its connection's last: here the front's 499s are
	# what allows them, so they count as bad first.)
	local bpartial b499
	bpartial=$(awk -v sz="$SMALL_SIZE" '$3 == 200 && $4 < sz' "$BDIR/access.log" | wc -l)
	b499=$(awk '$3 == 499' "$BDIR/access.log" | wc -l)
	AL_BAD=$((AL_BAD + AL_499 - b499))
	[ "$bpartial" -le "$n499" ] && AL_BAD=$((AL_BAD - bpartial))
	fs_log "$mode: wrk: front access log $flines requests ($n499 abandoned at wrk's end) on $WRK_FCONNS connections, backend $AL_LINES requests on $WRK_BCONNS connections"
	if [ "$WRK_RC" -ne 0 ] || [ -z "$WRK_SUMMARY" ] || [ "${WRK_REQ:-0}" -eq 0 ] || [ "$WRK_NERR" -ne 0 ] ||
		[ "$fbad" -ne 0 ] || [ "$AL_BAD" -ne 0 ] || [ "$flines" -lt "$WRK_REQ" ]; then
		fs_fail "$RA_CASE $mode: wrk through the proxy: exit status $WRK_RC, ${WRK_REQ:-?} requests in ${WRK_DUR:-?} us, errors $WRK_ERRS; front: $fbad of $flines answers not 200/$SMALL_SIZE bytes; backend: $AL_BAD of $AL_LINES"
		awk -v sz="$SMALL_SIZE" '$3 != 200 || $4 != sz { print "status", $3, "upstream", $6, "time", int($7) "s" }' "$FDIR/access.log" |
			sort | uniq -c | sort -rn | head -n 4 | sed 's/^/    front: /' >&2 || true
		awk -v sz="$SMALL_SIZE" '($3 != 200 || $4 != sz) && $3 != 499 { print "status", $3, "body bytes", $4, "time", $7 "s" }' "$BDIR/access.log" |
			sort | uniq -c | sort -rn | head -n 4 | sed 's/^/    backend: /' >&2 || true
		# after how many good answers the first bad one came
		awk -v sz="$SMALL_SIZE" '$3 != 200 || $4 != sz { print NR - 1; exit }' "$FDIR/access.log" |
			sed 's/^/    good answers through the front before the first bad one: /' >&2 || true
		grep -v ': stats:' "$RA_DIR/wrk.$mode.out.err" | tail -n 3 | sed 's/^/    stderr: /' >&2 || true
		return 1
	fi
	fs_pass "$RA_CASE $mode: wrk through the proxy: $WRK_REQ requests, 0 errors, $WRK_RPS req/s; $WRK_BCONNS upstream connections"
}

proxy_case() {
	local mode=$1 fsrv bsrv moved conns i upstream_errs
	BDIR=$FS_TMP/back-$mode
	FDIR=$FS_TMP/front-$mode
	mkdir -p "$BDIR" "$FDIR"
	BACK=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	FRONT=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	[ "$FRONT" != "$BACK" ] || FRONT=$(fs_free_port)
	nginx_conf "$BDIR" "$BACK" "root $DOCROOT;"
	nginx_conf "$FDIR" "$FRONT" "location / { proxy_pass http://127.0.0.1:$BACK; }"
	nginx_start "$mode" nginx-back "$BDIR" "$BACK" || return 0
	bsrv=$NGX_PID
	nginx_start "$mode" nginx-front "$FDIR" "$FRONT" || return 0
	fsrv=$NGX_PID

	fs_tcp_count_start "$FRONT" "$BACK" || fs_fail "$RA_CASE $mode: nft counter not set up"
	SPEEDS="" STALLS=0 CURL_BYTES=0 CURL_DONE=0 WRK_BYTES=0 WRK_FCONNS=0 WRK_BCONNS=0
	SECONDS=0
	curl_runs "$mode" before "$CURL_RUNS"
	fs_log "$mode: $CURL_RUNS downloads in ${SECONDS}s"
	wrk_run "$mode" && :
	SECONDS=0
	curl_runs "$mode" after "$CURL_AFTER"
	fs_log "$mode: $CURL_AFTER downloads after wrk in ${SECONDS}s"
	FIG["curl $mode"]=$(ra_mean_mb "$SPEEDS")
	if [ "$STALLS" -eq 0 ]; then
		fs_pass "$RA_CASE $mode: curl fetched the 4 MB file $CURL_DONE times through the proxy, sha256 equal, ${FIG["curl $mode"]} MB/s"
	fi
	# Every byte a client received crossed both ports.
	moved=$((2 * CURL_BYTES + 2 * WRK_BYTES))
	conns=$((2 * CURL_DONE + WRK_FCONNS + WRK_BCONNS))
	ra_tcp_payload_check "$mode" "$moved" "$conns"
	fs_tcp_count_stop

	upstream_errs=$(grep -cE '\[(error|crit|alert)\].*upstream' "$FDIR/error.log" || true)
	if [ "$upstream_errs" -gt 0 ]; then
		fs_fail "$RA_CASE $mode: the front's error log has $upstream_errs upstream error(s):"
		grep -E '\[(error|crit|alert)\].*upstream' "$FDIR/error.log" | sed -E 's/^[0-9/]+ [0-9:]+ //; s/[0-9]+#[0-9]+: \*[0-9]+ //; s/, client: .*//' |
			sort | uniq -c | sort -rn | head -n 4 | sed 's/^/    /' >&2
	fi

	nginx_stop "$mode" "$FDIR" "$fsrv" "front nginx"
	nginx_stop "$mode" "$BDIR" "$bsrv" "backend nginx"
	ra_cores_report "$mode"

	[ "$mode" = fabsock ] || return 0
	for i in nginx-front nginx-back curl wrk; do
		fs_log "$mode: $i: $(grep -c ': stats:' "$RA_DIR/$i.$mode.log" || true) stats lines, offloaded $(ra_sum "$i" "$mode" offloaded), kernel $(ra_sum "$i" "$mode" kernel) $(ra_why "$i" "$mode")"
	done
	ra_offloaded curl "$mode" "$CURL_DONE"
	ra_offloaded wrk "$mode" "$WRK_CONNS"
	# the backend: every upstream connection of the front
	ra_offloaded nginx-back "$mode" $((CURL_DONE + WRK_BCONNS))
	# the front: its clients' connections and its upstream connections
	ra_offloaded nginx-front "$mode" $((2 * CURL_DONE + WRK_FCONNS + WRK_BCONNS))
	for i in nginx-front nginx-back curl wrk; do
		ra_log_clean "$i" "$mode" || true # ra_offloaded checked that none stayed on TCP
		ra_fabsock_notes "$i" "$mode"
	done
}

for mode in $FS_MODES; do
	proxy_case "$mode"
done
ra_figure "curl 4 MB through proxy_pass" "MB/s" "${FIG["curl kernel"]:-0}" "${FIG["curl fabsock"]:-0}"
ra_figure "wrk -c $WRK_CONNS small file through proxy_pass" "req/s" "${FIG["wrk kernel"]:-0}" "${FIG["wrk fabsock"]:-0}"
ra_ratio_check "curl 4 MB through proxy_pass (MB/s)" "${FIG["curl kernel"]:-0}" "${FIG["curl fabsock"]:-0}"
ra_ratio_check "wrk through proxy_pass (req/s)" "${FIG["wrk kernel"]:-0}" "${FIG["wrk fabsock"]:-0}"
ra_done
