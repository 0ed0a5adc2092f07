#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance (issue 27, target 7): an HTTP/2 server that speaks first.
# nghttpd (nghttp2-server) over cleartext h2c sends its SETTINGS frame the
# moment it accepts, as gRPC servers do; with the 5 ms FABSOCK_FIRST_SEND_WAIT_MS
# its fabsock clients' probes came too late on a loaded 2-core machine and
# every connection stayed on TCP. Now a fabsock client notes before its
# connect() that it will probe, and the server waits for that probe (up to a
# probe timeout); a plain client noted nothing and gets its SETTINGS at once.
# Each of RUNS runs (default 4, in a row; RA_H2_RUNS=20 for the issue's 20 in a
# row, 6.4 min at load 13-20; 2 in kernel mode, the baseline)
# starts nghttpd on a new port and, while BUSY busy loops at nice 0 load the
# machine (default 3, for the whole of each mode), runs:
#   - nghttp of a 4 MiB and of a 100 KiB random file (a connection each):
#     both byte-exact (sha256);
#   - h2load -n 2000 -c 4 -m 10 of a 4 KiB file: 2000 succeeded, and the
#     data bytes h2load counted are 2000 x 4096;
#   - fabsock mode: all 6 connections offloaded on both ends (the clients'
#     and nghttpd's counters), none left on TCP, and the kernel's counter on
#     the port saw no payload byte besides the HELLO/ACK segments;
#   - fabsock mode, after the count: nghttp without the preload (a plain
#     program) fetches the 100 KiB file from the same server: byte-exact, on
#     TCP, and nghttpd wrote its SETTINGS to it without waiting: no
#     FIRST_SEND_WAIT_MS (server_first_unseen_waits = 0) and no wait for a
#     probe it did not note (its preface may come before nghttpd writes, the
#     usual plain-client settling, or after: server_first_plain_local);
#     no noted probe missed (server_first_intent_missed = 0).
# FABSOCK_TEST_ACK_DELAY_MS=100 in the clients of one more run (RA_H2_ACKDELAY
# =0 leaves it out): the server's first data reaches a client before it has
# read the HELLO-ACK; its held request bytes must wait for the join (h2load
# died by SIGSEGV in libfabric there before: core/txq.c fs_stream_credits).
# The records and notes live in a private FABSOCK_RECORDS_DIR, so that other
# tests' connections on the host cannot push this test's notes out of the
# 128 (a documented limit, docs/design.md "Connection history").

. "$(dirname "$0")/realapps_lib.sh"

ra_need nghttpd h2load nghttp nft sha256sum timeout

RUNS=${RA_H2_RUNS:-4}
BUSY=${RA_H2_BUSY:-3}
REQS=2000
export FABSOCK_RECORDS_DIR=$FS_TMP/rec
mkdir -p "$FABSOCK_RECORDS_DIR"

WWW=$FS_TMP/www
mkdir -p "$WWW"
head -c $((4 << 20)) /dev/urandom >"$WWW/f4m"
head -c $((100 << 10)) /dev/urandom >"$WWW/f100k"
head -c 4096 /dev/urandom >"$WWW/f4k"
chmod -R a+rX "$WWW"
declare -A SUM
for f in f4m f100k; do SUM[$f]=$(sha256sum <"$WWW/$f" | cut -d' ' -f1); done

declare -A FIG_RPS

# fetch_check MODE LABEL DIR FILE...: the files nghttp saved in DIR are
# byte-exact; returns 1 (and fails) if not.
fetch_check() {
	local mode=$1 label=$2 dir=$3 f got bad=
	shift 3
	for f in "$@"; do
		got=$(sha256sum <"$dir/$f" 2>/dev/null | cut -d' ' -f1)
		[ "$got" = "${SUM[$f]}" ] || bad+="$f($(stat -c %s "$dir/$f" 2>/dev/null || echo missing) bytes) "
	done
	if [ -n "$bad" ]; then
		fs_fail "$RA_CASE $mode $label: not byte-exact: $bad"
		return 1
	fi
}

# one_run MODE N [client env...]
one_run() {
	local mode=$1 n=$2 port srv rc dir=$FS_TMP/$1-$2 p pl hs hsb odd srvname=h2srv$2 cliname=h2cli$2
	local off_s off_c left_s left_c plain missed waits unseen rps data f
	shift 2
	mkdir -p "$dir/get" "$dir/plain"
	port=$(fs_free_port) || { fs_fail "$RA_CASE $mode run $n: no free port"; return; }
	ra_env "$mode" "$srvname"
	fs_bg srv timeout -s TERM -k 5 300 "${RA_ENV[@]}" nghttpd --no-tls -d "$WWW" "$port" \
		>"$dir/nghttpd.out" 2>"$dir/nghttpd.err"
	if ! ra_wait_listen "$port" "$srv"; then
		fs_fail "$RA_CASE $mode run $n: nghttpd did not listen on $port ($RA_LISTEN_WHY)"
		ra_tail 5 "$dir/nghttpd.err"
		return
	fi
	fs_tcp_count_start "$port" || fs_fail "$RA_CASE $mode run $n: nft counter not set up"
	ra_env "$mode" "$cliname"
	for f in f4m f100k; do
		rc=0
		timeout -k 5 60 "${RA_ENV[@]}" "$@" nghttp "http://127.0.0.1:$port/$f" >"$dir/get/$f" 2>"$dir/nghttp.err" || rc=$?
		[ "$rc" = 0 ] || fs_fail "$RA_CASE $mode run $n: nghttp $f exit $rc: $(tail -n 2 "$dir/nghttp.err" | tr '\n' ' ')"
	done
	fetch_check "$mode" "run $n nghttp" "$dir/get" f4m f100k || true
	rc=0
	timeout -k 5 120 "${RA_ENV[@]}" "$@" h2load -n "$REQS" -c 4 -m 10 "http://127.0.0.1:$port/f4k" \
		>"$dir/h2load.out" 2>&1 || rc=$?
	data=$(sed -nE 's/^traffic: .*\(([0-9]+)\) data.*/\1/p' "$dir/h2load.out")
	if [ "$rc" != 0 ] || ! grep -q "^requests: $REQS total, $REQS started, $REQS done, $REQS succeeded, 0 failed" "$dir/h2load.out" ||
		[ "${data:-0}" != $((REQS * 4096)) ]; then
		fs_fail "$RA_CASE $mode run $n: h2load exit $rc$([ "$rc" -gt 128 ] && echo " (signal $((rc - 128)))"), data bytes ${data:-none} (want $((REQS * 4096))): $(grep -E '^requests:' "$dir/h2load.out" || tail -n 2 "$dir/h2load.out")"
	fi
	rps=$(sed -nE 's/^finished in .*, ([0-9.]+) req\/s.*/\1/p' "$dir/h2load.out")
	read -r p _ pl hs hsb odd _ < <(fs_tcp_count_read)
	fs_tcp_count_stop
	if [ "$mode" = fabsock ]; then
		if [ "${pl:-1}" != 0 ] || [ "${odd:-1}" != 0 ]; then
			fs_fail "$RA_CASE fabsock run $n: TCP carried $pl payload bytes besides $hs handshake segments ($hsb bytes), $odd of unknown shape: the data did not all go over the fabric"
		fi
		# a plain program of the same user: SETTINGS at once, on TCP
		rc=0
		timeout -k 5 60 env -u LD_PRELOAD nghttp "http://127.0.0.1:$port/f100k" >"$dir/plain/f100k" \
			2>"$dir/plain.err" || rc=$?
		[ "$rc" = 0 ] || fs_fail "$RA_CASE fabsock run $n: plain nghttp exit $rc"
		fetch_check "$mode" "run $n plain nghttp" "$dir/plain" f100k || true
	elif [ "${pl:-0}" -lt $(((4 << 20) + REQS * 4096)) ]; then
		fs_fail "$RA_CASE kernel run $n: TCP carried $pl payload bytes, less than moved: the counter is broken"
	fi
	kill -TERM "$srv" 2>/dev/null || true
	fs_wait_pid "$srv" 20 >/dev/null 2>&1 || true
	[ -z "$rps" ] || FIG_RPS[$mode]+="$rps "
	[ "$mode" = fabsock ] || { fs_pass "$RA_CASE kernel run $n: nghttp byte-exact, h2load $REQS requests, $rps req/s"; return; }
	off_s=$(ra_sum "$srvname" fabsock offloaded)
	off_c=$(ra_sum "$cliname" fabsock offloaded)
	left_s=$(ra_sum "$srvname" fabsock kernel)
	left_c=$(ra_sum "$cliname" fabsock kernel)
	plain=$(ra_sum "$srvname" fabsock server_first_plain_local)
	missed=$(ra_sum "$srvname" fabsock server_first_intent_missed)
	waits=$(ra_sum "$srvname" fabsock server_first_intent_waits)
	unseen=$(ra_sum "$srvname" fabsock server_first_unseen_waits)
	# nghttpd: 6 offloaded, 1 (the plain client) on TCP, spoken to without a wait
	if [ "$off_s" = 6 ] && [ "$off_c" = 6 ] && [ "$left_s" = 1 ] && [ "$left_c" = 0 ] && [ "$unseen" = 0 ] &&
		[ "$missed" = 0 ] && [ "$waits" -le 6 ]; then
		fs_pass "$RA_CASE fabsock run $n: 6 connections offloaded on both ends, no TCP payload ($hs handshake segments), the plain client on TCP without a wait (server_first_plain_local=$plain); $waits waits for a noted probe; $rps req/s"
	else
		fs_fail "$RA_CASE fabsock run $n: nghttpd offloaded=$off_s kernel=$left_s server_first_unseen_waits=$unseen server_first_intent_missed=$missed server_first_intent_waits=$waits, clients offloaded=$off_c kernel=$left_c (want 6 1 0 0 <=6, 6 0); server: $(ra_why "$srvname" fabsock) clients: $(ra_why "$cliname" fabsock)"
		ra_tail 4 "$RA_DIR/$srvname.fabsock.log"
	fi
	ra_streams_clean fabsock "$srvname" "$cliname"
}

for mode in $FS_MODES; do
	busy=()
	for i in $(seq 1 "$BUSY"); do
		# bounded: killed below, or by the cleanup with the test
		fs_bg b timeout -k 1 900 bash -c 'while :; do :; done'
		busy+=("$b")
	done
	fs_log "$RA_CASE $mode: $BUSY busy loops at nice 0; load average $(cut -d' ' -f1-3 /proc/loadavg)"
	runs=$RUNS
	[ "$mode" = fabsock ] || runs=2
	for n in $(seq 1 "$runs"); do
		one_run "$mode" "$n"
	done
	if [ "$mode" = fabsock ] && [ "${RA_H2_ACKDELAY:-1}" != 0 ]; then
		one_run fabsock ackdelay env FABSOCK_TEST_ACK_DELAY_MS=100
	fi
	for b in "${busy[@]}"; do kill "$b" 2>/dev/null || true; done
	fs_log "$RA_CASE $mode: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
done
med() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "n/a" }'; }
ra_figure "h2load -c 4 -m 10, 4 KiB, median req/s ($BUSY busy loops)" "req/s" \
	"$(med <<<"${FIG_RPS[kernel]:-}")" "$(med <<<"${FIG_RPS[fabsock]:-}")"
ra_done
