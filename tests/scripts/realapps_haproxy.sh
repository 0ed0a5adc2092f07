#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: haproxy (Debian's 2.6, `mode http` and the defaults
# otherwise: no splicing, one process, its event loop on epoll) in front of
# Python's http.server (`python3 -m http.server`, HTTP/1.0: it closes after
# every answer), curl through the proxy (issue 26). All three under the
# library in fabsock mode, none in kernel mode, on free ports of 127.0.0.1.
# haproxy reads the backend as its raw socket layer does: once epoll
# reported EPOLLRDHUP, a read shorter than asked is the end of the stream
# (the kernel never returns less than it holds); the backend closes with
# the end of the 4 MB file still queued.
#   - DOWNLOADS downloads of the 4 MB file by one curl process, keep-alive
#     to haproxy (one client connection reused; a backend connection per
#     answer), each sha256 equal;
#   - DOWNLOADS downloads, a curl process each, with `Connection: close`,
#     each sha256 equal;
#   - http.server logged every answer 200 and no traceback; haproxy and
#     http.server alive after the load and stopped cleanly (SIGUSR1: a
#     soft stop, SIGINT), their stats lines written, no core files;
#   - fabsock mode: every connection offloaded on every end, no reset, no
#     message dropped, no fabsock warning about lost bytes; the TCP
#     connections of both ports carried only the HELLOs (nftables), while
#     in kernel mode they carried every byte (the counter works).
# Then the splice round (issue 26: splice() on an offloaded socket): the
# same three in `mode tcp` with `option splice-request` and `option
# splice-response`, so haproxy moves both legs' bytes with splice()
# through its pipes (SPLICE_F_NONBLOCK, nonblocking sockets, epoll);
# SPLICE_DOWNLOADS (3) curls with Connection: close, each sha256 equal;
# haproxy's pipes were used (`show info` on its stats socket: PipesUsed +
# PipesFree > 0, in both modes), and in fabsock mode its streams moved at
# least every download's bytes twice through splice (splice_bytes), every
# connection was offloaded and TCP carried only the HELLOs. One more
# haproxy and http.server per mode, a few seconds: kept in this script,
# where the programs and their checks already are. RA_HAP_SPLICE_ONLY=1
# runs only this round.
# Figures: MB/s of the keep-alive series, of the Connection: close series
# and of the splice round, kernel vs fabsock.

. "$(dirname "$0")/realapps_lib.sh"

PY=/usr/bin/python3
HAPROXY=$(command -v haproxy || true)
[ -x "$PY" ] || fs_skip "no $PY (apt-get install python3)"
[ -n "$HAPROXY" ] || fs_skip "haproxy is not installed (bash tools/setup.sh --deps-only)"
ra_need curl nft sha256sum timeout

DOWNLOADS=${RA_DOWNLOADS:-10}
SPLICE_DOWNLOADS=${RA_SPLICE_DOWNLOADS:-3}
CURL_MAX=${RA_CURL_MAX:-15}
BIG_SIZE=$((4 << 20))

DOCROOT=$RA_DIR/www
ra_make_docroot "$DOCROOT" 0 "$BIG_SIZE"

PY_MAIN='import runpy, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
runpy.run_module("http.server", run_name="__main__", alter_sys=True)'

declare -A FIG

# check_download MODE WHAT OUT CODE SIZE: fails unless OUT holds the file
# (CODE 200, SIZE and sha256 right); returns 0 when it does.
check_download() {
	local mode=$1 what=$2 out=$3 code=$4 size=$5 sum
	sum=$(sha256sum <"$out" 2>/dev/null | cut -d' ' -f1) || true
	if [ "$code" = 200 ] && [ "$size" = "$BIG_SIZE" ] && [ "$sum" = "$BIG_SUM" ]; then
		return 0
	fi
	fs_fail "$RA_CASE $mode: $what: HTTP ${code:-none}, ${size:-0} of $BIG_SIZE bytes ($((BIG_SIZE - ${size:-0})) missing), sha256 ${sum:0:16} (want ${BIG_SUM:0:16})"
	return 1
}

# hap_curl_round LABEL WHAT OUT PORT COUNT: COUNT curl processes one after
# the other (under RA_ENV), each downloading big.bin with `Connection:
# close` through haproxy on PORT into OUT.N; every body is checked
# (check_download: HTTP 200, size, sha256) and so is every curl's exit
# status, failures named "LABEL: WHAT N". Sets HAP_GOOD (whole downloads),
# HAP_SPEEDS (their speeds, B/s, for ra_mean_mb) and HAP_MOVED (the bytes
# curl said it received, whole or not: for the TCP payload check).
hap_curl_round() {
	local label=$1 what=$2 out=$3 port=$4 count=$5 i rc t code size
	HAP_GOOD=0 HAP_SPEEDS="" HAP_MOVED=0
	for i in $(seq 1 "$count"); do
		rc=0
		t=$(timeout -k 2 $((CURL_MAX + 5)) "${RA_ENV[@]}" curl -sS --max-time "$CURL_MAX" -H 'Connection: close' \
			-o "$out.$i" -w '%{http_code} %{size_download} %{speed_download}' \
			"http://127.0.0.1:$port/big.bin" 2>"$out.$i.err") || rc=$?
		read -r code size t <<<"$t" || true
		HAP_MOVED=$((HAP_MOVED + ${size:-0}))
		if [ "$rc" -eq 0 ] && check_download "$label" "$what $i" "$out.$i" "${code:-}" "${size:-}"; then
			HAP_GOOD=$((HAP_GOOD + 1))
			HAP_SPEEDS="$HAP_SPEEDS $t"
		else
			[ "$rc" -eq 0 ] || fs_fail "$RA_CASE $label: $what $i: curl exit status $rc"
			grep -v ': stats:' "$out.$i.err" | tail -n 2 | sed 's/^/    stderr: /' >&2 || true
		fi
		rm -f "$out.$i"
	done
}

# hap_ports LABEL: two free ports, HAP_BPORT (http.server's) and HAP_FPORT
# (haproxy's); returns 1, having failed LABEL, without them.
hap_ports() {
	HAP_BPORT=$(fs_free_port) || { fs_fail "$RA_CASE $1: no free port"; return 1; }
	HAP_FPORT=$(fs_free_port) || { fs_fail "$RA_CASE $1: no free port"; return 1; }
	[ "$HAP_FPORT" != "$HAP_BPORT" ] || HAP_FPORT=$((HAP_BPORT + 1))
}

# hap_config DIR GLOBAL DEFAULTS: DIR/haproxy.cfg, one haproxy process on
# HAP_FPORT in front of http.server on HAP_BPORT; GLOBAL and DEFAULTS are
# lines more for those sections (the mode among the defaults).
hap_config() {
	local dir=$1 global=$2 defaults=$3
	{
		printf 'global\n    maxconn 200\n'
		[ -z "$global" ] || printf '%s\n' "$global"
		printf 'defaults\n%s\n' "$defaults"
		printf '    timeout %s\n' "connect 5s" "client 30s" "server 30s"
		printf 'frontend fe\n    bind 127.0.0.1:%s\n    default_backend be\n' "$HAP_FPORT"
		printf 'backend be\n    server py 127.0.0.1:%s\n' "$HAP_BPORT"
	} >"$dir/haproxy.cfg"
}

# hap_start MODE LABEL SUFFIX DIR: http.server on HAP_BPORT serving DOCROOT
# and haproxy with DIR/haproxy.cfg (written for HAP_FPORT and HAP_BPORT),
# each under the preload in fabsock mode (ra_env MODE pyhttpSUFFIX and
# haproxySUFFIX), and waits until both listen. Sets HAP_PY and HAP_HAP,
# their pids; returns 1, having failed LABEL, when one does not listen.
hap_start() {
	local mode=$1 label=$2 suffix=$3 dir=$4
	ra_env "$mode" "pyhttp$suffix"
	fs_bg HAP_PY setsid "${RA_ENV[@]}" PYTHONUNBUFFERED=1 "$PY" -c "$PY_MAIN" --bind 127.0.0.1 \
		--directory "$DOCROOT" "$HAP_BPORT" >"$dir/py.stdout" 2>"$dir/py.stderr"
	ra_env "$mode" "haproxy$suffix"
	fs_bg HAP_HAP setsid "${RA_ENV[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/hap.stdout" 2>"$dir/hap.stderr"
	if ! ra_wait_listen "$HAP_BPORT" "$HAP_PY"; then
		fs_fail "$RA_CASE $label: http.server did not listen on $HAP_BPORT ($RA_LISTEN_WHY)"
		return 1
	fi
	if ! ra_wait_listen "$HAP_FPORT" "$HAP_HAP"; then
		fs_fail "$RA_CASE $label: haproxy did not listen on $HAP_FPORT ($RA_LISTEN_WHY)"
		tail -n 5 "$dir/hap.stderr" | sed 's/^/    /' >&2 || true
		return 1
	fi
}

# hap_stop MODE DIR: haproxy and http.server (hap_start's) alive after the
# load, then stopped cleanly (SIGUSR1: a soft stop, SIGINT), their stats
# lines written, no core files (ra_alive, ra_stop).
hap_stop() {
	local mode=$1 dir=$2
	ra_alive "$mode" "$HAP_HAP" haproxy || true
	ra_alive "$mode" "$HAP_PY" http.server || true
	ra_stop "$mode" "$HAP_HAP" SIGUSR1 haproxy 15 "$dir/hap.stderr" || true
	ra_stop "$mode" "$HAP_PY" SIGINT http.server 15 "$dir/py.stderr" || true
}

haproxy_case() {
	local mode=$1 dir fport bport i rc good moved=0 n200 tb code size t KA_CONNS=0
	local -a urls=()
	dir=$FS_TMP/hap-$mode
	mkdir -p "$dir"
	hap_ports "$mode" || return
	bport=$HAP_BPORT fport=$HAP_FPORT
	hap_config "$dir" "" "    mode http"
	hap_start "$mode" "$mode" "" "$dir" || return

	fs_tcp_count_start "$fport" "$bport" || fs_fail "$RA_CASE $mode: nft counter not set up"
	ra_env "$mode" curl
	# keep-alive: one curl, one client connection to haproxy for them all
	for i in $(seq 1 "$DOWNLOADS"); do
		urls+=(-o "$dir/ka.$i" "http://127.0.0.1:$fport/big.bin")
	done
	rc=0
	timeout -k 2 $((CURL_MAX * 2 + 5)) "${RA_ENV[@]}" curl -sS --max-time $((CURL_MAX * 2)) \
		-w '%{http_code} %{size_download} %{time_total} %{num_connects}\n' "${urls[@]}" \
		>"$dir/ka.out" 2>"$dir/ka.err" || rc=$?
	good=0 t=0
	for i in $(seq 1 "$DOWNLOADS"); do
		read -r code size _ _ < <(sed -n "${i}p" "$dir/ka.out") || true
		moved=$((moved + $(stat -c %s "$dir/ka.$i" 2>/dev/null || echo 0)))
		check_download "$mode" "keep-alive download $i" "$dir/ka.$i" "${code:-}" "${size:-}" && good=$((good + 1))
		rm -f "$dir/ka.$i"
	done
	KA_CONNS=$(awk '{ c += $4 } END { print c + 0 }' "$dir/ka.out")
	FIG["$mode ka"]=$(awk '$1 == 200 { b += $2; t += $3 } END { if (t > 0) printf "%.1f", b / t / 1e6; else print 0 }' "$dir/ka.out")
	if [ "$rc" -eq 0 ] && [ "$good" -eq "$DOWNLOADS" ]; then
		fs_pass "$RA_CASE $mode: one curl, keep-alive, $DOWNLOADS downloads through haproxy, sha256 equal, ${FIG["$mode ka"]} MB/s ($KA_CONNS connection(s) opened)"
	else
		fs_fail "$RA_CASE $mode: one curl, keep-alive: exit status $rc, $good of $DOWNLOADS whole"
		grep -v ': stats:' "$dir/ka.err" | tail -n 2 | sed 's/^/    stderr: /' >&2 || true
	fi
	# Connection: close, a curl process each
	hap_curl_round "$mode" "Connection: close download" "$dir/cc" "$fport" "$DOWNLOADS"
	moved=$((moved + HAP_MOVED))
	FIG["$mode cc"]=$(ra_mean_mb "$HAP_SPEEDS")
	[ "$HAP_GOOD" -eq "$DOWNLOADS" ] &&
		fs_pass "$RA_CASE $mode: $DOWNLOADS curls with Connection: close through haproxy, sha256 equal, ${FIG["$mode cc"]} MB/s"
	# (each byte crosses both ports: in kernel mode the counter sees it twice)
	ra_tcp_payload_check "$mode" "$moved" $((2 * DOWNLOADS + 2 * KA_CONNS))
	fs_tcp_count_stop

	hap_stop "$mode" "$dir"
	# (haproxy forwards HTTP/1.1 requests, and HTTP/1.0 after a backend closed)
	n200=$(grep -cE '"GET /big.bin HTTP/1.[01]" 200' "$dir/py.stderr" || true)
	tb=$(grep -cE '^Traceback|Error:' "$dir/py.stderr" || true)
	if [ "$n200" -eq $((2 * DOWNLOADS)) ] && [ "$tb" -eq 0 ]; then
		fs_pass "$RA_CASE $mode: http.server logged $n200 answers 200, no traceback"
	else
		fs_fail "$RA_CASE $mode: http.server logged $n200 answers 200 (want $((2 * DOWNLOADS))) and $tb traceback/error lines"
		grep -E 'Error:|^Traceback' "$dir/py.stderr" | sort | uniq -c | sort -rn | head -n 4 | sed 's/^/    /' >&2 || true
	fi

	[ "$mode" = fabsock ] || return 0
	ra_offloaded pyhttp "$mode" $((2 * DOWNLOADS))
	# its backend connections, and the frontend ones: the keep-alive curl's
	# (haproxy closes some after an HTTP/1.0 backend's answer), one per curl
	ra_offloaded haproxy "$mode" $((3 * DOWNLOADS + KA_CONNS))
	ra_offloaded curl "$mode" $((DOWNLOADS + KA_CONNS))
	ra_streams_clean "$mode" pyhttp haproxy curl
}

# haproxy's pipes, from `show info` on its stats socket SOCK: PipesUsed +
# PipesFree (a pipe haproxy spliced through goes back to its pool).
hap_pipes() { # SOCK
	"$PY" - "$1" <<'PYEOF' 2>/dev/null || echo 0
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(b"show info\n")
d = b""
while True:
    x = s.recv(65536)
    if not x:
        break
    d += x
f = dict(l.split(": ", 1) for l in d.decode().splitlines() if ": " in l)
print(int(f.get("PipesUsed", 0)) + int(f.get("PipesFree", 0)))
PYEOF
}

haproxy_splice_case() {
	local mode=$1 dir fport bport moved=0 pipes spliced
	dir=$FS_TMP/hap-splice-$mode
	mkdir -p "$dir"
	hap_ports "splice $mode" || return
	bport=$HAP_BPORT fport=$HAP_FPORT
	hap_config "$dir" "    stats socket $dir/hap.sock mode 600 level admin" \
		"    mode tcp
    option splice-request
    option splice-response"
	hap_start "$mode" "splice $mode" -splice "$dir" || return
	fs_tcp_count_start "$fport" "$bport" || fs_fail "$RA_CASE splice $mode: nft counter not set up"
	ra_env "$mode" curl-splice
	hap_curl_round "splice $mode" download "$dir/sp" "$fport" "$SPLICE_DOWNLOADS"
	moved=$HAP_MOVED
	FIG["$mode splice"]=$(ra_mean_mb "$HAP_SPEEDS")
	[ "$HAP_GOOD" -eq "$SPLICE_DOWNLOADS" ] &&
		fs_pass "$RA_CASE splice $mode: $SPLICE_DOWNLOADS curls through haproxy splicing both legs, sha256 equal, ${FIG["$mode splice"]} MB/s"
	# (each byte crosses both ports: in kernel mode the counter sees it twice)
	ra_tcp_payload_check "$mode" "$moved" $((2 * SPLICE_DOWNLOADS))
	fs_tcp_count_stop
	pipes=$(hap_pipes "$dir/hap.sock")
	if [ "${pipes:-0}" -gt 0 ]; then
		fs_pass "$RA_CASE splice $mode: haproxy spliced through its pipes ($pipes in its pool)"
	else
		fs_fail "$RA_CASE splice $mode: haproxy reports no pipe used (show info): it did not splice, the round proves nothing"
	fi
	hap_stop "$mode" "$dir"
	[ "$mode" = fabsock ] || return 0
	# every byte of a download crosses haproxy twice: in from the backend,
	# out to curl (the request adds a few bytes more)
	spliced=$(ra_sum haproxy-splice "$mode" splice_bytes)
	if [ "${spliced:-0}" -ge $((2 * SPLICE_DOWNLOADS * BIG_SIZE)) ]; then
		fs_pass "$RA_CASE splice $mode: haproxy's offloaded streams moved $spliced bytes by splice()"
	else
		fs_fail "$RA_CASE splice $mode: haproxy's offloaded streams moved ${spliced:-0} bytes by splice(), expected >= $((2 * SPLICE_DOWNLOADS * BIG_SIZE))"
	fi
	ra_offloaded pyhttp-splice "$mode" "$SPLICE_DOWNLOADS"
	ra_offloaded haproxy-splice "$mode" $((2 * SPLICE_DOWNLOADS))
	ra_offloaded curl-splice "$mode" "$SPLICE_DOWNLOADS"
	ra_streams_clean "$mode" pyhttp-splice haproxy-splice curl-splice
}

for mode in kernel fabsock; do
	[ -n "${RA_HAP_SPLICE_ONLY:-}" ] || haproxy_case "$mode"
	haproxy_splice_case "$mode"
done
ra_figure "haproxy+http.server, curl keep-alive, 4 MB" "MB/s" "${FIG["kernel ka"]:-0}" "${FIG["fabsock ka"]:-0}"
ra_figure "haproxy+http.server, Connection: close, 4 MB" "MB/s" "${FIG["kernel cc"]:-0}" "${FIG["fabsock cc"]:-0}"
ra_figure "haproxy splicing (mode tcp), Connection: close, 4 MB" "MB/s" "${FIG["kernel splice"]:-0}" "${FIG["fabsock splice"]:-0}"
ra_done
