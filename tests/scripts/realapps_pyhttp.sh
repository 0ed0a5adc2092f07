#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: Python's http.server (`python3 -m http.server --bind
# 127.0.0.1 PORT`, Debian's /usr/bin/python3), serving a 4 MB random file
# from a private directory under FS_TMP. A thread-per-connection server
# (ThreadingHTTPServer) with blocking sockets that writes the file in 64 KiB
# pieces through a buffered socket file and closes the connection after the
# answer (HTTP/1.0); the client is curl, which reads 16 KiB at a time.
# Server and clients run as root (one user: shm works). Kernel mode first,
# then fabsock (server and clients under the library):
#   - curl of the 4 MB file CURL_RUNS times, a curl process per download
#     (each bounded by --max-time): exit status 0, HTTP 200, the exact size,
#     sha256 equal, time per run and of its connect();
#   - one curl process downloading it CURL_RUNS times (a connection each:
#     the server closes after every answer), sha256 equal: its MB/s after
#     the first download is the data path's, without the per-process setup;
#   - the server's stderr has no traceback (ConnectionResetError,
#     BrokenPipeError) and it answered every request with 200;
#   - the server is alive after the load and leaves on SIGINT with status 0
#     (its stats line is written at exit), no core files;
#   - fabsock mode: every connection offloaded on both ends, no fallback, the
#     TCP connections carried only the HELLOs (nftables), no fabsock warning
#     about lost bytes or resets.
# Figures: curl MB/s (mean of the good runs) and the single curl's MB/s,
# kernel vs fabsock (a ratio check only with RA_MIN_RATIO set: realapps_lib.sh).

. "$(dirname "$0")/realapps_lib.sh"

PY=/usr/bin/python3
[ -x "$PY" ] || fs_skip "no $PY (apt-get install python3)"
ra_need curl nft sha256sum timeout

CURL_RUNS=${RA_CURL_RUNS:-6}
CURL_MAX=${RA_CURL_MAX:-15}
BIG_SIZE=$((4 << 20))

DOCROOT=$RA_DIR/www
ra_make_docroot "$DOCROOT" 0 "$BIG_SIZE"

declare -A FIG
PY_MAIN='import runpy, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
runpy.run_module("http.server", run_name="__main__", alter_sys=True)'

pyhttp_case() {
	local mode=$1 dir srv port i rc out sum speeds="" tconns="" good=0 moved=0 n200 tb
	local -a urls=()
	dir=$FS_TMP/py-$mode
	mkdir -p "$dir"
	port=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	ra_env "$mode" pyhttp
	# setsid: its own process group, which the cleanup kills. `python3 -m
	# http.server` exactly, except that SIGINT is restored first (fs_bg
	# starts it with SIGINT ignored: realapps_lib.sh), so that the graceful
	# stop, which writes the stats line, works.
	fs_bg srv setsid "${RA_ENV[@]}" PYTHONUNBUFFERED=1 "$PY" -c "$PY_MAIN" --bind 127.0.0.1 \
		--directory "$DOCROOT" "$port" >"$dir/stdout" 2>"$dir/stderr"
	if ! ra_wait_listen "$port" "$srv"; then
		fs_fail "$RA_CASE $mode: http.server did not listen on $port ($RA_LISTEN_WHY)"
		tail -n 5 "$dir/stderr" | sed 's/^/    /' >&2 || true
		return
	fi

	fs_tcp_count_start "$port" || fs_fail "$RA_CASE $mode: nft counter not set up"
	ra_env "$mode" curl
	for i in $(seq 1 "$CURL_RUNS"); do
		out=$dir/big.$i
		ra_curl_get - "$CURL_MAX" "http://127.0.0.1:$port/big.bin" "$out"
		tconns="$tconns ${CURL_TCONN:-?}"
		moved=$((moved + ${CURL_SIZE:-0}))
		if [ "$CURL_RC" -ne 0 ] || [ "${CURL_CODE:-}" != 200 ] || [ "${CURL_SIZE:-0}" != "$BIG_SIZE" ] || [ "$CURL_SUM" != "$BIG_SUM" ]; then
			fs_fail "$RA_CASE $mode: curl run $i: exit status $CURL_RC, HTTP ${CURL_CODE:-none}, ${CURL_SIZE:-0} of $BIG_SIZE bytes ($((BIG_SIZE - ${CURL_SIZE:-0})) missing) in ${CURL_TTOT:-?} s, sha256 ${CURL_SUM:0:16} (want ${BIG_SUM:0:16})"
			grep -v ': stats:' "$out.err" | tail -n 2 | sed 's/^/    stderr: /' >&2 || true
		else
			good=$((good + 1))
			speeds="$speeds $CURL_SPEED"
			fs_log "$mode: curl run $i: sha256 equal, $CURL_TTOT s (connect() $CURL_TCONN s), $(awk -v s="$CURL_SPEED" 'BEGIN { printf "%.1f", s / 1e6 }') MB/s"
		fi
		rm -f "$out"
	done
	FIG[$mode]=$(ra_mean_mb "$speeds")
	[ "$good" -eq "$CURL_RUNS" ] &&
		fs_pass "$RA_CASE $mode: curl fetched the 4 MB file $CURL_RUNS times, sha256 equal, ${FIG[$mode]} MB/s (connect() took$tconns s)"

	# The same downloads by one curl process (one connection each: the
	# server closes after every answer): the first pays the process's own
	# setup; the MB/s of the others is the data path's.
	for i in $(seq 1 "$CURL_RUNS"); do
		urls+=(-o "$dir/one.$i" "http://127.0.0.1:$port/big.bin")
	done
	rc=0
	timeout -k 2 $((CURL_MAX + 5)) "${RA_ENV[@]}" curl -sS --max-time "$CURL_MAX" \
		-w '%{http_code} %{size_download} %{time_total} %{time_connect}\n' "${urls[@]}" >"$dir/one.out" 2>"$dir/one.err" || rc=$?
	good=0
	for i in $(seq 1 "$CURL_RUNS"); do
		sum=$(sha256sum <"$dir/one.$i" 2>/dev/null | cut -d' ' -f1) || true
		[ "$sum" = "$BIG_SUM" ] && good=$((good + 1))
		moved=$((moved + $(stat -c %s "$dir/one.$i" 2>/dev/null || echo 0)))
		rm -f "$dir/one.$i"
	done
	FIG["$mode one"]=$(awk 'NR > 1 && $1 == 200 { b += $2; t += $3 } END { if (t > 0) printf "%.1f", b / t / 1e6; else print 0 }' "$dir/one.out")
	if [ "$rc" -eq 0 ] && [ "$good" -eq "$CURL_RUNS" ]; then
		fs_pass "$RA_CASE $mode: one curl fetched the file $CURL_RUNS times, sha256 equal, ${FIG["$mode one"]} MB/s after the first (first: $(awk 'NR == 1 { print $3 " s, connect() " $4 " s" }' "$dir/one.out"))"
	else
		fs_fail "$RA_CASE $mode: one curl fetching the file $CURL_RUNS times: exit status $rc, $good of $CURL_RUNS sha256 equal"
		grep -v ': stats:' "$dir/one.err" | tail -n 2 | sed 's/^/    stderr: /' >&2 || true
	fi
	ra_tcp_payload_check "$mode" "$moved" $((2 * CURL_RUNS))
	fs_tcp_count_stop

	ra_alive "$mode" "$srv" http.server || true
	ra_stop "$mode" "$srv" SIGINT http.server 15 || true
	n200=$(grep -c '"GET /big.bin HTTP/1.1" 200' "$dir/stderr" || true)
	tb=$(grep -cE '^Traceback|Error:' "$dir/stderr" || true)
	# each run, and each download of the single curl
	if [ "$n200" -eq $((2 * CURL_RUNS)) ] && [ "$tb" -eq 0 ]; then
		fs_pass "$RA_CASE $mode: http.server logged $n200 answers 200, no traceback"
	else
		fs_fail "$RA_CASE $mode: http.server logged $n200 answers 200 (want $((2 * CURL_RUNS))) and $tb traceback/error lines:"
		grep -E 'Error:|^Traceback' "$dir/stderr" | sort | uniq -c | sort -rn | head -n 4 | sed 's/^/    /' >&2 || true
	fi

	[ "$mode" = fabsock ] || return 0
	ra_offloaded pyhttp "$mode" $((2 * CURL_RUNS))
	ra_offloaded curl "$mode" $((2 * CURL_RUNS))
	for i in pyhttp curl; do
		fs_log "$mode: $i: $(grep -c ': stats:' "$RA_DIR/$i.$mode.log" || true) stats lines, offloaded $(ra_sum "$i" "$mode" offloaded), resets $(ra_sum "$i" "$mode" resets), pulled direct $(ra_sum "$i" "$mode" pull_direct_bytes) bounce $(ra_sum "$i" "$mode" pull_bounce_bytes), $(ra_why "$i" "$mode")"
		# ra_offloaded checked that none stayed on TCP
		[ "$(ra_sum "$i" "$mode" resets)" = 0 ] || fs_fail "$RA_CASE $mode: $i counted $(ra_sum "$i" "$mode" resets) reset streams"
		ra_log_clean "$i" "$mode" || true
		ra_fabsock_notes "$i" "$mode"
	done
}

for mode in $FS_MODES; do
	pyhttp_case "$mode"
done
ra_figure "curl 4 MB from http.server" "MB/s" "${FIG[kernel]:-0}" "${FIG[fabsock]:-0}"
ra_figure "one curl, 4 MB downloads 2..N" "MB/s" "${FIG["kernel one"]:-0}" "${FIG["fabsock one"]:-0}"
ra_ratio_check "curl 4 MB, a curl process per download (MB/s)" "${FIG[kernel]:-0}" "${FIG[fabsock]:-0}"
ra_ratio_check "one curl, 4 MB downloads 2..N (MB/s)" "${FIG["kernel one"]:-0}" "${FIG["fabsock one"]:-0}"
ra_done
