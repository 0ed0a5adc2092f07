#!/bin/bash
# SPDX-License-Identifier: MIT
# The "real programs" section of `fabsock bench` (tools/fabsock_bench_real.py
# runs this and parses what it writes): the programs of the realapps suite
# in the same packaged shapes, started by the same helpers
# (realapps_nginx_lib.sh, realapps_lib.sh), but in a "bench only" mode: no
# memccapable, no row downloads, no nftables byte proof, no core-file hunt
# per case: those are the realapps tests' job (ctest -L realapps). What stays
# is what makes a figure honest: every answer checked cheaply (HTTP status,
# sizes and sha256 of the downloads, wrk's error counters, pgbench's failed
# transactions, memcslap's key count; a run that fails reads "failed"), and
# the offload counters of every fabsock process printed at the end (a
# figure measured on streams that stayed on TCP says so).
#
# Each round runs every program under kernel TCP and under fabsock (server
# and clients under the library) one after the other, so that drift on a
# shared machine hits both alike; odd rounds the kernel first, even rounds
# fabsock first (RB_MODES): what one side leaves behind (the TIME_WAIT
# sockets of a connection per request on the port both use, a database the
# first side's TPC-B grew) falls on each side in turn. The bench takes the
# median of the rounds per side. Every figure
# goes through ra_figure: one tab-separated line per round in
# $FS_REALAPPS_RESULTS (case, metric, unit, kernel, fabsock, ratio, better).
# A program that is not installed gives "n/a (not installed: X)" cells.
#
#   FABSOCK_LIB=... FS_PROGS=... FS_REALAPPS_RESULTS=FILE \
#     bench_realapps.sh [--quick] [--rounds N] [--only "nginx postgres memcached proxy"]
# --quick: shorter runs (2 s of wrk or pgbench instead of 5, fewer curl
# processes and memcslap keys, pgbench -i -s 1); the same figures.
# --base-lib LIB: an A/B of two builds in these shapes: the column and
# ratios labelled "kernel" are LIB's (both sides preloaded, each round in
# turn as above); for a developer comparing a change, never a bench figure.
# Needs root (the servers start as root and drop to their packaged users).

RB_QUICK=0 RB_ROUNDS=3 RB_ONLY="nginx postgres memcached proxy"
while [ $# -gt 0 ]; do
	case $1 in
	--quick) RB_QUICK=1 ;;
	--rounds) RB_ROUNDS=$2; shift ;;
	--only) RB_ONLY=$2; shift ;;
	--base-lib) export RA_BASE_LIB=$2; shift ;;
	*) echo "bench_realapps.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
case $RB_ROUNDS in [1-9]) ;; *) echo "bench_realapps.sh: --rounds 1..9" >&2; exit 2 ;; esac

# The connection history (core/history.h) is on, as for a user: the bench
# measures what a program gets once fabsock has seen it (lib.sh turns it off
# for the tests; FS_HISTORY=0 here measures without it).
FS_HISTORY=${FS_HISTORY:-1}
[ "$FS_HISTORY" = 1 ] || export FABSOCK_HISTORY_SHORT=0
# So is the step-back from the fabric (core/stepback.h; FS_STEPBACK=0 or
# FABSOCK_STEPBACK=0 measures without it).
FS_STEPBACK=${FS_STEPBACK:-1}
[ "$FS_STEPBACK" = 1 ] || export FABSOCK_STEPBACK=0

# rb_port NAME: sets RB_P to the port of server NAME for every round and
# both modes (not in a subshell: it remembers), as
# a user's server keeps its port: the connection history (and the listener
# records) a program learns is per destination, port included, and a new
# port every round made every round a first contact (the history of round
# 1 never reached round 2). Picked free once; later taken again unless
# something else listens there now (the servers set SO_REUSEADDR, so the
# last round's TIME_WAIT connections are no obstacle).
declare -A RB_PORTS
rb_port() {
	RB_P=${RB_PORTS[$1]:-}
	if [ -z "$RB_P" ] || [ -n "$(ss -Hltun "sport = :$RB_P")" ]; then
		RB_P=$(fs_free_port) || return 1
		RB_PORTS[$1]=$RB_P
	fi
}

# A missing program is an n/a cell here, never a failed prerequisite.
unset CI
export FS_MODES="kernel fabsock"
if [ "$RB_QUICK" = 1 ]; then
	RB_SECS=2 RB_CURLS=5 RB_PX_CURLS=2 RB_SLAP_N=1000 RB_PG_SCALE=1
else
	RB_SECS=5 RB_CURLS=10 RB_PX_CURLS=4 RB_SLAP_N=4000 RB_PG_SCALE=2
fi
export RA_WRK_SECS=$RB_SECS RA_WRK_CONNS=4

# rb_missing PROGRAM...: the ones not on the PATH, space-separated.
rb_missing() {
	local c out=""
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || out="$out $c"
	done
	echo "${out# }"
}

RB_NGX_MISSING=$(rb_missing nginx wrk curl nft sha256sum setpriv gdb file timeout)
if [ -z "$RB_NGX_MISSING" ] && id nobody >/dev/null 2>&1 && getent group nogroup >/dev/null 2>&1; then
	. "$(dirname "$0")/realapps_nginx_lib.sh"
	MID_SIZE=102400
	head -c "$MID_SIZE" /dev/urandom >"$DOCROOT/mid.bin"
	chmod 644 "$DOCROOT/mid.bin"
	MID_SUM=$(sha256sum <"$DOCROOT/mid.bin" | cut -d' ' -f1)
else
	. "$(dirname "$0")/realapps_lib.sh"
	[ -n "$RB_NGX_MISSING" ] || RB_NGX_MISSING="the nobody user or nogroup group"
fi

declare -A FIG
RB_NOTES=()

# rb_figures CASE ID... : one ra_figure per figure ID of this round, from
# FIG["ID kernel"] and FIG["ID fabsock"] ("failed" when a side is unset).
# The figures' names, units and directions: RB_NAME, RB_UNIT, RB_DIR.
declare -A RB_NAME RB_UNIT RB_DIR
rb_def() { # ID NAME UNIT DIR
	RB_NAME[$1]=$2 RB_UNIT[$1]=$3 RB_DIR[$1]=$4
}
rb_def nginx_ka "wrk -c 4 keep-alive, 600 B file" req/s higher
rb_def nginx_cc "wrk -c 4 Connection: close, 600 B file" req/s higher
rb_def curl_4m "curl process per 4 MB download" ms lower
rb_def curl_100k "curl process per 100 KB download" ms lower
rb_def pg_s1 "pgbench -S -c 1" tps higher
rb_def pg_s4 "pgbench -S -c 4 -j 2" tps higher
rb_def pg_b1 "pgbench TPC-B -c 1" tps higher
rb_def pg_b4 "pgbench TPC-B -c 4 -j 2" tps higher
rb_def pg_s16 "pgbench -S -c 16 -j 2" tps higher
rb_def pg_b16 "pgbench TPC-B -c 16 -j 2" tps higher
rb_def pg_s1_busy "pgbench -S -c 1 beside 2 busy loops at nice 19" tps higher
rb_def mc_set "memcslap set -c 8" ops/s higher
rb_def mc_get "memcslap get -c 8" ops/s higher
rb_def px_wrk "wrk -c 4 through proxy_pass, 600 B file" req/s higher
rb_def px_curl "curl 4 MB through proxy_pass" MB/s higher

rb_figures() {
	local id
	RA_CASE=$1
	shift
	for id in "$@"; do
		ra_figure "${RB_NAME[$id]}" "${RB_UNIT[$id]}" "${FIG["$id kernel"]:-failed}" "${FIG["$id fabsock"]:-failed}" \
			"${RB_DIR[$id]}"
		unset "FIG[$id kernel]" "FIG[$id fabsock]"
	done
}

# rb_na CASE WHY ID...: every figure ID reads WHY on both sides.
rb_na() {
	local c=$1 why=$2 id
	shift 2
	for id in "$@"; do
		FIG["$id kernel"]=$why FIG["$id fabsock"]=$why
	done
	rb_figures "$c" "$@"
}

# rb_offload NAME...: after the rounds, what each NAME's fabsock processes
# did with their streams (stdout: the bench shows it under the section).
rb_offload() {
	local n
	for n in "$@"; do
		[ -f "$RA_DIR/$n.fabsock.log" ] || continue
		RB_NOTES+=("$n offloaded=$(ra_sum "$n" fabsock offloaded) kernel=$(ra_sum "$n" fabsock kernel) stepped_back=$(ra_sum "$n" fabsock handback_fabric_slower)$(w=$(ra_why "$n" fabsock); [ -z "$w" ] || echo " ($w)")")
	done
}

# ---- nginx: keep-alive, a connection per request, curl per process -------

# rb_wrk ID MODE USER URL [WRK ARGS...]: FIG["ID MODE"] = req/s, "failed" on
# any wrk error.
rb_wrk() {
	local id=$1 mode=$2 user=$3 url=$4
	shift 4
	# shellcheck disable=SC2034 # read by wrk_load (realapps_nginx_lib.sh)
	local -a WRK_ARGS=("$@")
	ra_env "$mode" "wrk"
	wrk_load "$user" "$url" "$RA_DIR/wrk-$id.$mode.out"
	if [ "$WRK_RC" -ne 0 ] || [ -z "$WRK_SUMMARY" ] || [ "${WRK_REQ:-0}" -eq 0 ] || [ "$WRK_NERR" -ne 0 ]; then
		fs_fail "$mode: $id: wrk exit status $WRK_RC, ${WRK_REQ:-?} requests, errors $WRK_ERRS"
		FIG["$id $mode"]=failed
		return
	fi
	FIG["$id $mode"]=$WRK_RPS
}

# rb_curls ID MODE N URL SIZE SUM: N curl processes one after another, each
# one download checked (200, SIZE bytes, sha256 SUM); FIG["ID MODE"] = the
# median wall time of one process, exec to exit (the library's start-up and
# a first connection's set-up included: what a new process pays), in ms.
rb_curls() {
	local id=$1 mode=$2 n=$3 url=$4 size=$5 sum=$6 i t0 t1 rc w code got out=$RA_DIR/curl-$1.$2.out times=""
	local -a RA_AS
	ra_env "$mode" curl
	ra_as_argv nobody
	for i in $(seq 1 "$n"); do
		rc=0
		t0=$EPOCHREALTIME
		w=$("${RA_AS[@]}" timeout -k 2 25 "${RA_ENV[@]}" curl -sS --max-time 20 -o "$out" -w '%{http_code} %{size_download}' \
			"$url" 2>"$out.err") || rc=$?
		t1=$EPOCHREALTIME
		read -r code got <<<"$w" || true
		if [ "$rc" -ne 0 ] || [ "${code:-}" != 200 ] || [ "${got:-0}" != "$size" ] ||
			[ "$(sha256sum <"$out" | cut -d' ' -f1)" != "$sum" ]; then
			fs_fail "$mode: $id run $i: exit status $rc, HTTP ${code:-none}, ${got:-0} of $size bytes (or sha256 differs)"
			FIG["$id $mode"]=failed
			return
		fi
		times="$times $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) * 1000 }')"
	done
	rm -f "$out"
	FIG["$id $mode"]=$(tr ' ' '\n' <<<"$times" | grep . | sort -n |
		awk '{ v[NR] = $1 } END { printf "%.1f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
}

rb_nginx() {
	local mode dir port ids="nginx_ka nginx_cc curl_4m curl_100k"
	if [ -n "$RB_NGX_MISSING" ]; then
		rb_na nginx "n/a (not installed: $RB_NGX_MISSING)" $ids
		return
	fi
	for mode in $RB_MODES; do
		dir=$FS_TMP/nginx-$mode
		mkdir -p "$dir"
		rb_port nginx && port=$RB_P || { fs_fail "$mode: no free port"; continue; }
		nginx_conf "$dir" "$port" "root $DOCROOT;"
		nginx_start "$mode" nginx "$dir" "$port" || continue
		rb_wrk nginx_ka "$mode" nobody "http://127.0.0.1:$port/small.txt"
		rb_wrk nginx_cc "$mode" nobody "http://127.0.0.1:$port/small.txt" -H "Connection: close"
		rb_curls curl_4m "$mode" "$RB_CURLS" "http://127.0.0.1:$port/big.bin" "$BIG_SIZE" "$BIG_SUM"
		rb_curls curl_100k "$mode" "$RB_CURLS" "http://127.0.0.1:$port/mid.bin" "$MID_SIZE" "$MID_SUM"
		nginx_stop "$mode" "$dir" "$NGX_PID" nginx
	done
	rb_figures nginx $ids
}

# ---- nginx proxy_pass: a front nginx before a backend nginx --------------

rb_proxy() {
	local mode bdir fdir back front bsrv i speeds ids="px_wrk px_curl"
	if [ -n "$RB_NGX_MISSING" ]; then
		rb_na proxy "n/a (not installed: $RB_NGX_MISSING)" $ids
		return
	fi
	for mode in $RB_MODES; do
		bdir=$FS_TMP/back-$mode fdir=$FS_TMP/front-$mode
		mkdir -p "$bdir" "$fdir"
		rb_port proxy-back && back=$RB_P && rb_port proxy-front && front=$RB_P ||
			{ fs_fail "$mode: no free port"; continue; }
		if [ "$front" = "$back" ]; then
			front=$(fs_free_port) && RB_PORTS[proxy-front]=$front
		fi
		nginx_conf "$bdir" "$back" "root $DOCROOT;"
		nginx_conf "$fdir" "$front" "location / { proxy_pass http://127.0.0.1:$back; }"
		nginx_start "$mode" nginx-back "$bdir" "$back" || continue
		bsrv=$NGX_PID
		if nginx_start "$mode" nginx-front "$fdir" "$front"; then
			rb_wrk px_wrk "$mode" nobody "http://127.0.0.1:$front/small.txt"
			ra_env "$mode" curl
			speeds=""
			for i in $(seq 1 "$RB_PX_CURLS"); do
				ra_curl_get nobody 20 "http://127.0.0.1:$front/big.bin" "$RA_DIR/pxcurl.$mode.out" 25
				if [ "$CURL_RC" -ne 0 ] || [ "${CURL_CODE:-}" != 200 ] || [ "$CURL_SUM" != "$BIG_SUM" ]; then
					fs_fail "$mode: curl through the proxy run $i: exit status $CURL_RC, HTTP ${CURL_CODE:-none}, ${CURL_SIZE:-0} bytes"
					speeds=failed
					break
				fi
				speeds="$speeds $CURL_SPEED"
				fs_log "$mode: curl through the proxy run $i: $CURL_SPEED B/s, connected after $CURL_TCONN s, $CURL_TTOT s in all"
			done
			[ "$speeds" = failed ] && FIG["px_curl $mode"]=failed || FIG["px_curl $mode"]=$(ra_mean_mb "$speeds")
			nginx_stop "$mode" "$fdir" "$NGX_PID" "front nginx"
		fi
		nginx_stop "$mode" "$bdir" "$bsrv" "backend nginx"
	done
	rb_figures proxy $ids
}

# ---- PostgreSQL: pgbench -S and TPC-B at 1, 4 and 16 clients --------------

PGBIN=/usr/lib/postgresql/15/bin
[ -x "$PGBIN/postgres" ] || PGBIN=$(dirname "$(readlink -f "$(command -v postgres 2>/dev/null || echo /nonexistent)")")
PG_READY= PG_WHY=

pg_as() {
	ra_as_argv postgres
	PG_AS=("${RA_AS[@]}" "${RA_ENV[@]}" "HOME=$PG_HOME")
}

# pg_init: one cluster for every round (initdb once; pgbench -i on the
# first start); PG_READY=init on success, else PG_WHY says why not.
pg_init() {
	local miss
	miss=$(rb_missing pgbench psql setpriv)
	[ -x "$PGBIN/postgres" ] && [ -x "$PGBIN/initdb" ] || miss="${miss:+$miss }postgres"
	id postgres >/dev/null 2>&1 || miss="${miss:+$miss }(user postgres)"
	[ -z "$miss" ] || { PG_WHY="n/a (not installed: $miss)"; return; }
	PG_DATA=$FS_TMP/pgdata PG_SOCK=$FS_TMP/pgsock PG_HOME=$FS_TMP/pghome
	mkdir -p "$PG_DATA" "$PG_SOCK" "$PG_HOME"
	chown postgres:postgres "$PG_DATA" "$PG_SOCK" "$PG_HOME"
	chmod 700 "$PG_DATA"
	ra_env kernel initdb
	pg_as
	timeout -k 5 60 "${PG_AS[@]}" "$PGBIN/initdb" -D "$PG_DATA" -U postgres -A trust -E UTF8 --no-sync \
		>"$FS_TMP/initdb.log" 2>&1 || { fs_fail "initdb failed"; PG_WHY=failed; return; }
	PG_READY=init
}

# pg_tps ID MODE PGBENCH-ARGS...: FIG["ID MODE"] = tps without the initial
# connection time, "failed" unless pgbench exits 0 with no failed transaction.
pg_tps() {
	local id=$1 mode=$2 rc=0 tps failed out=$RA_DIR/pgbench-$1.$2.out
	shift 2
	ra_env "$mode" pgclients
	pg_as
	timeout -k 5 $((RB_SECS + 40)) "${PG_AS[@]}" pgbench -h 127.0.0.1 -p "$PG_PORT" -U postgres -T "$RB_SECS" "$@" \
		postgres >"$out" 2>"$out.err" || rc=$?
	tps=$(sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p' "$out" | head -n 1)
	failed=$(sed -nE 's/^number of failed transactions: ([0-9]+).*/\1/p' "$out" | head -n 1)
	if [ "$rc" -ne 0 ] || [ -z "$tps" ] || [ "${failed:-0}" != 0 ]; then
		fs_fail "$mode: pgbench $*: exit status $rc, tps ${tps:-none}, failed ${failed:-?}"
		ra_tail 4 "$out" "$out.err"
		FIG["$id $mode"]=failed
		return
	fi
	FIG["$id $mode"]=$(printf "%.0f" "$tps")
}

# rb_busy_start / rb_busy_stop: two busy loops at nice 19 beside a figure
# (bounded by timeout), and their end.
RB_BUSY=()
rb_busy_start() {
	local i p
	RB_BUSY=()
	for i in 1 2; do
		fs_bg p nice -n 19 timeout -k 1 $((RB_SECS + 60)) sh -c 'while :; do :; done'
		RB_BUSY+=("$p")
	done
}
rb_busy_stop() {
	local p
	[ "${#RB_BUSY[@]}" -gt 0 ] || return 0
	kill "${RB_BUSY[@]}" 2>/dev/null || true
	for p in "${RB_BUSY[@]}"; do fs_wait_pid "$p" 10 >/dev/null || true; done
	RB_BUSY=()
}

rb_postgres() {
	local mode srv ids="pg_s1 pg_s4 pg_b1 pg_b4 pg_s16 pg_b16 pg_s1_busy" rc
	[ -n "$PG_READY" ] || [ -n "$PG_WHY" ] || pg_init
	if [ -z "$PG_READY" ]; then
		rb_na postgres "${PG_WHY:-failed}" $ids
		return
	fi
	for mode in $RB_MODES; do
		ra_env "$mode" postgres
		pg_as
		rb_port postgres && PG_PORT=$RB_P || { fs_fail "$mode: no free port"; continue; }
		fs_bg srv timeout -s INT -k 10 $((10 * RB_SECS + 120)) "${PG_AS[@]}" "$PGBIN/postgres" -D "$PG_DATA" \
			-p "$PG_PORT" -k "$PG_SOCK" -c max_connections=30 -c listen_addresses=127.0.0.1 -c fsync=off \
			-c synchronous_commit=off -c logging_collector=off >"$FS_TMP/pg-$mode.log" 2>&1
		if ! ra_wait_listen "$PG_PORT" "$srv" 15 || ! ra_pg_ready "$PG_DATA" "$srv" 15; then
			fs_fail "$mode: the postmaster did not listen or get ready ($RA_LISTEN_WHY)"
			kill -INT "$srv" 2>/dev/null || true
			fs_wait_pid "$srv" 20 >/dev/null || true
			continue
		fi
		if [ "$PG_READY" = init ]; then
			ra_env "$mode" pgclients
			pg_as
			rc=0
			timeout -k 5 90 "${PG_AS[@]}" pgbench -i -s "$RB_PG_SCALE" -h 127.0.0.1 -p "$PG_PORT" -U postgres postgres \
				>"$FS_TMP/pginit.out" 2>&1 || rc=$?
			[ "$rc" -eq 0 ] && PG_READY=yes || fs_fail "$mode: pgbench -i exited $rc"
		fi
		pg_tps pg_s1 "$mode" -S -c 1
		pg_tps pg_s4 "$mode" -S -c 4 -j 2
		pg_tps pg_b1 "$mode" -c 1
		pg_tps pg_b4 "$mode" -c 4 -j 2
		# more clients than cores: 16 backends and pgbench's two threads
		# on the 2-core VMs (issue 27, target 4)
		pg_tps pg_s16 "$mode" -S -c 16 -j 2
		pg_tps pg_b16 "$mode" -c 16 -j 2
		# a host with other work: two busy loops at nice 19 (a build, a
		# batch job), as many as the cores of the 2-core VMs this runs on.
		# Its own command line (-P 3600: a progress line an hour in,
		# never within the run), so that the connection history keeps it
		# apart: a step-back here must not start the next round's
		# -S -c 1 on TCP (the history's key is the client's command line)
		rb_busy_start
		pg_tps pg_s1_busy "$mode" -S -c 1 -P 3600
		rb_busy_stop
		kill -INT "$srv" 2>/dev/null || true
		fs_wait_pid "$srv" 30 >/dev/null || fs_fail "$mode: the postmaster's fast shutdown"
	done
	rb_figures postgres $ids
}

# ---- memcached: memcslap set, then get ------------------------------------

rb_slap() { # MODE TEST
	local mode=$1 t=$2 out=$RA_DIR/slap-$2.$1.out rc=0 keys secs
	ra_env "$mode" memcslap
	ra_as nobody timeout -k 2 30 "${RA_ENV[@]}" memcslap -s "127.0.0.1:$MC_PORT" -t "$t" -c 8 -e "$RB_SLAP_N" \
		>"$out" 2>"$out.err" || rc=$?
	read -r keys secs < <(sed -nE "s/^Time to $t +([0-9]+) keys by +8 threads: +([0-9.]+) seconds.*/\1 \2/p" "$out") || true
	if [ "$rc" -ne 0 ] || [ -z "$keys" ] || [ "$keys" -ne $((8 * RB_SLAP_N)) ] ||
		! awk -v s="${secs:-0}" 'BEGIN { exit !(s > 0) }'; then
		fs_fail "$mode: memcslap -t $t: exit status $rc, ${keys:-no} keys in ${secs:-?} s"
		FIG["mc_$t $mode"]=failed
		return
	fi
	FIG["mc_$t $mode"]=$(awk -v k="$keys" -v s="$secs" 'BEGIN { printf "%.0f", k / s }')
}

rb_memcached() {
	local mode srv miss ids="mc_set mc_get"
	miss=$(rb_missing memcached memcslap setpriv)
	id nobody >/dev/null 2>&1 || miss="${miss:+$miss }(user nobody)"
	if [ -n "$miss" ]; then
		rb_na memcached "n/a (not installed: $miss)" $ids
		return
	fi
	for mode in $RB_MODES; do
		rb_port memcached && MC_PORT=$RB_P || { fs_fail "$mode: no free port"; continue; }
		ra_env "$mode" memcached
		fs_bg srv setsid "${RA_ENV[@]}" memcached -u nobody -l 127.0.0.1 -p "$MC_PORT" -U 0 -m 256 -c 1024 \
			>"$RA_DIR/memcached.$mode.out" 2>"$RA_DIR/memcached.$mode.err"
		if ! ra_wait_listen "$MC_PORT" "$srv"; then
			fs_fail "$mode: memcached did not listen ($RA_LISTEN_WHY)"
			continue
		fi
		rb_slap "$mode" set
		rb_slap "$mode" get
		ra_stop "$mode" "$srv" SIGTERM memcached 20 "$RA_DIR/memcached.$mode.err" >/dev/null 2>&1 || true
	done
	rb_figures memcached $ids
}

# ---- the rounds -------------------------------------------------------------

for round in $(seq 1 "$RB_ROUNDS"); do
	# which side goes first: the kernel in odd rounds (a one-round quick
	# bench: the kernel), fabsock in even ones
	RB_MODES="kernel fabsock"
	[ $((round % 2)) = 0 ] && RB_MODES="fabsock kernel"
	for group in $RB_ONLY; do
		SECONDS=0
		case $group in
		nginx) rb_nginx ;;
		proxy) rb_proxy ;;
		postgres) rb_postgres ;;
		memcached) rb_memcached ;;
		*) fs_fail "unknown group $group" ;;
		esac
		echo "round $round: $group took ${SECONDS}s" >&2
	done
	echo "round $round of $RB_ROUNDS done" >&2
done
rb_offload nginx nginx-front nginx-back wrk curl postgres pgclients memcached memcslap
for n in "${RB_NOTES[@]:-}"; do
	[ -z "$n" ] || echo "offload $n"
done
RA_CASE=bench_realapps
ra_done
