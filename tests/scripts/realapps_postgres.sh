#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: PostgreSQL 15 in its packaged shape (a postmaster that forks a
# backend per connection, plus its checkpointer, walwriter, autovacuum...)
# on a private cluster (initdb under $FS_TMP, owned by postgres), listening
# on 127.0.0.1 only, with pgbench and psql as clients over TCP (-h 127.0.0.1,
# never the unix socket). Server and clients run as postgres, so in fabsock
# mode every connection must offload (shm: same user).
#   - pgbench -i -s 2 (client-side generation: 200000 rows go up by COPY);
#   - pgbench -S -c 4 -j 2 (select only, 60000 transactions) and pgbench
#     -c 4 -j 2 (TPC-B, 6000): exit 0, every transaction done, none failed,
#     tps printed as figures (RA_PG_CLIENTS sets -c: scale_postgres_c300
#     runs 300 clients, so that pgbench talks to 300 backend processes, past
#     shm's 256 peers per endpoint; max_connections grows to match, and the
#     time pgbench took to connect them all is a figure). A count of
#     transactions per client (-t), not a duration: pgbench's -T counts its
#     connection phase too, which for 300 backend processes took 10 s once
#     in CI, leaving no time for a single transaction;
#   - psql: count(*) of pgbench_accounts is 200000; after TPC-B the balances
#     of accounts, tellers and branches each sum to the sum of the history
#     deltas, and the history holds one row per transaction pgbench counted;
#   - psql downloads every (aid, bid, filler) row: its output must equal the
#     rows pgbench generates (awk computes them here), byte for byte; in
#     fabsock mode a second time with FABSOCK_SPIN_US=0 in psql, within 60 s;
#   - the server log reports no backend killed by a signal and no restart,
#     the postmaster is the same live process after the load, shuts down
#     cleanly on SIGINT (fast shutdown) and leaves through exit(): every
#     backend (exits at each disconnect) and the postmaster log a stats line;
#   - fabsock mode: server and clients offloaded >= 12 streams each, no
#     fallback, no fabsock warning about lost bytes, and the TCP connections
#     on the port carried only the handshakes (nftables byte counter) while
#     the download alone moved ~18 MB.
# Kernel mode first (the baseline), then fabsock.

. "$(dirname "$0")/realapps_lib.sh"

PGBIN=/usr/lib/postgresql/15/bin
[ -x "$PGBIN/postgres" ] || PGBIN=$(dirname "$(readlink -f "$(command -v postgres 2>/dev/null || echo /nonexistent)")")
for p in postgres initdb; do
	[ -x "$PGBIN/$p" ] || fs_skip "PostgreSQL 15 is not installed (apt-get install postgresql)"
done
ra_need pgbench psql setpriv nft timeout sha256sum
id postgres >/dev/null 2>&1 || fs_skip "no postgres user (apt-get install postgresql)"

SCALE=2
ROWS=$((SCALE * 100000))
CLIENTS=${RA_PG_CLIENTS:-4}
MIN_CONNS=$((2 * CLIENTS + 4)) # pgbench -i 1, -S C+1, TPC-B C+1, psql 4 (at least)
# transactions per client: about 60000 select-only and 6000 TPC-B in all
# (RA_PG_TPCB_TOTAL: scale_postgres_c300 runs 3000, 10 a client, the least
# below: at ~170 tps there, 6000 took 35 s of CI)
S_TX=$((60000 / CLIENTS)) TPCB_TX=$((${RA_PG_TPCB_TOTAL:-6000} / CLIENTS))
[ "$S_TX" -ge 100 ] || S_TX=100
[ "$TPCB_TX" -ge 10 ] || TPCB_TX=10
SRV_LIMIT=$((110 + CLIENTS / 2)) # seconds for the whole run of one mode

PG_DATA=$FS_TMP/pgdata
PG_SOCK=$FS_TMP/pgsock
PG_HOME=$FS_TMP/pghome
mkdir -p "$PG_DATA" "$PG_SOCK" "$PG_HOME"
chown postgres:postgres "$PG_DATA" "$PG_SOCK" "$PG_HOME"
chmod 700 "$PG_DATA"

declare -A FIG_S FIG_TPCB FIG_INIT FIG_DL FIG_CONN

# The argv prefix that runs a program as postgres (its own group, no
# supplementary groups) in the current mode (RA_ENV), with a HOME it owns.
pg_as() {
	ra_as_argv postgres
	PG_AS=("${RA_AS[@]}" "${RA_ENV[@]}" "HOME=$PG_HOME")
}

# The client programs, bounded, as postgres, output in $LOG-NAME.{out,err}.
pgc() { # LIMIT NAME PROGRAM ARGS...
	local limit=$1 name=$2
	shift 2
	timeout -k 5 "$limit" "${PG_AS[@]}" "$@" >"$LOG-$name.out" 2>"$LOG-$name.err"
}
pg_sql() { # NAME SQL
	pgc 60 "$1" psql -X -At -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "$2"
}

# One pgbench -t run: PASS needs exit 0, a tps figure, no failed
# transaction, and all CLIENTS x PER_CLIENT of them done.
pg_bench() { # MODE NAME FIGVAR PER_CLIENT PGBENCH-ARGS...
	local mode=$1 name=$2 fig=$3 per=$4 want=$(($4 * CLIENTS)) rc=0 tps failed n
	shift 4
	set -- "$@" -c "$CLIENTS" -t "$per"
	pgc $((40 + CLIENTS / 4)) "$name" pgbench -h 127.0.0.1 -p "$PORT" -U postgres "$@" postgres &
	local pid=$!
	# a pgbench still running after 30 s (4 clients) hangs: its stacks and the
	# server's go to the log before the timeout kills it (seen once, ASan)
	ra_stacks_if_running "$pid" $((30 + CLIENTS / 4)) pgbench postgres
	wait "$pid" || rc=$?
	tps=$(sed -nE 's/^tps = ([0-9.]+) \(without initial connection time\).*/\1/p' "$LOG-$name.out" | head -n 1)
	failed=$(sed -nE 's/^number of failed transactions: ([0-9]+).*/\1/p' "$LOG-$name.out" | head -n 1)
	n=$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' "$LOG-$name.out" | head -n 1)
	PG_LAST_CONN_MS=$(sed -nE 's/^initial connection time = ([0-9.]+) ms.*/\1/p' "$LOG-$name.out" | head -n 1)
	if [ "$rc" -ne 0 ] || [ -z "$tps" ] || [ "${failed:-0}" != 0 ] || [ "${n:-0}" != "$want" ]; then
		fs_fail "$RA_CASE $mode: pgbench $* exited $rc, tps=${tps:-none}, processed=${n:-none} of $want, failed=${failed:-?}, connecting took ${PG_LAST_CONN_MS:-?} ms"
		ra_tail 12 "$LOG-$name.out" "$LOG-$name.err"
		# what the server said about it (a backend's own view of a lost
		# connection), and fabsock's warnings on both sides
		grep -E 'FATAL|could not|unexpected' "$LOG-server.log" 2>/dev/null | tail -n 8 |
			sed 's/^/    server: /' >&2 || true
		[ "$mode" = fabsock ] && grep -hE ': (warn|error): ' "$RA_DIR/postgres.fabsock.log" \
			"$RA_DIR/pgclients.fabsock.log" 2>/dev/null | grep -v ': stats: ' | tail -n 12 |
			sed 's/^/    fabsock: /' >&2 || true
		return 1
	fi
	tps=$(printf "%.0f" "$tps")
	eval "$fig[\$mode]=\$tps"
	PG_LAST_N=$n
	fs_pass "$RA_CASE $mode: pgbench $*: $n transactions, $tps tps, 0 failed, connecting took $PG_LAST_CONN_MS ms"
}

pg_run() {
	local mode=$1 srv pm pm_after rc t0 t1 got want n_tpcb=0 i loads
	LOG=$FS_TMP/$mode
	ra_env "$mode" postgres
	pg_as
	PORT=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	# timeout runs in its own process group (killed at exit) and passes its
	# SIGINT on: a fast shutdown of the postmaster.
	fs_bg srv timeout -s INT -k 10 "$SRV_LIMIT" "${PG_AS[@]}" "$PGBIN/postgres" -D "$PG_DATA" -p "$PORT" -k "$PG_SOCK" \
		-c max_connections=$((CLIENTS + 20)) -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c logging_collector=off \
		>"$LOG-server.log" 2>&1
	if ! ra_wait_listen "$PORT" "$srv" 15 || ! ra_pg_ready "$PG_DATA" "$srv" 15; then
		fs_fail "$RA_CASE $mode: the postmaster did not listen on 127.0.0.1:$PORT or get ready ($RA_LISTEN_WHY)"
		tail -n 5 "$LOG-server.log" | sed 's/^/    /' >&2 || true
		kill -INT "$srv" 2>/dev/null || true
		fs_wait_pid "$srv" 20 >/dev/null || true
		return
	fi
	pm=$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)
	fs_tcp_count_start "$PORT" || fs_fail "$RA_CASE $mode: nft counter not set up"

	ra_env "$mode" pgclients
	pg_as
	t0=$(date +%s.%N)
	rc=0
	pgc 90 init pgbench -i -s "$SCALE" -h 127.0.0.1 -p "$PORT" -U postgres postgres || rc=$?
	t1=$(date +%s.%N)
	if [ "$rc" -eq 0 ] && grep -q '^done in' "$LOG-init.err" "$LOG-init.out" 2>/dev/null; then
		FIG_INIT[$mode]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
		fs_pass "$RA_CASE $mode: pgbench -i -s $SCALE in ${FIG_INIT[$mode]} s"
	else
		fs_fail "$RA_CASE $mode: pgbench -i -s $SCALE exited $rc"
		ra_tail 6 "$LOG-init.out" "$LOG-init.err"
	fi

	got=$(pg_sql count 'select count(*) from pgbench_accounts' && cat "$LOG-count.out" || true)
	if [ "$got" = "$ROWS" ]; then
		fs_pass "$RA_CASE $mode: psql count(*) of pgbench_accounts = $ROWS"
	else
		fs_fail "$RA_CASE $mode: psql count(*) of pgbench_accounts = '${got:-nothing}' (want $ROWS)"
		ra_tail 6 "$LOG-count.out" "$LOG-count.err"
	fi

	# A ~18 MB download: every account row as pgbench generated it.
	awk -v n="$ROWS" 'BEGIN { for (a = 1; a <= n; a++) printf "%d|%d|%84s\n", a, int((a - 1) / 100000) + 1, "" }' |
		sha256sum | cut -d' ' -f1 >"$FS_TMP/rows.want"
	rc=0
	t0=$(date +%s.%N)
	pg_sql rows 'select aid, bid, filler from pgbench_accounts order by aid' || rc=$?
	t1=$(date +%s.%N)
	got=$(sha256sum <"$LOG-rows.out" | cut -d' ' -f1)
	PG_DL_BYTES=$(stat -c %s "$LOG-rows.out")
	if [ "$rc" -eq 0 ] && [ "$got" = "$(cat "$FS_TMP/rows.want")" ]; then
		FIG_DL[$mode]=$(awk -v s="$PG_DL_BYTES" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", s / (b - a) / 1e6 }')
		fs_pass "$RA_CASE $mode: psql downloaded all $ROWS rows ($PG_DL_BYTES bytes, ${FIG_DL[$mode]} MB/s), byte-exact"
	else
		fs_fail "$RA_CASE $mode: psql row download: exit $rc, $PG_DL_BYTES bytes, $(wc -l <"$LOG-rows.out") lines, sha256 differs from the generated rows"
		ra_tail 6 "$LOG-rows.err"
	fi

	# The same download with psql polling without a spin: libpq polls
	# before each read of an incomplete message, and with
	# FABSOCK_SPIN_US=0 those polls slept 250 ms each with bytes queued
	# (issue 26: the download crawled at ~60 KB/s and hit this limit).
	if [ "$mode" = fabsock ]; then
		local -a pg_as_saved=("${PG_AS[@]}")
		PG_AS+=(FABSOCK_SPIN_US=0)
		rc=0
		t0=$(date +%s.%N)
		pgc 60 rows0 psql -X -At -h 127.0.0.1 -p "$PORT" -U postgres -d postgres \
			-c 'select aid, bid, filler from pgbench_accounts order by aid' || rc=$?
		t1=$(date +%s.%N)
		PG_AS=("${pg_as_saved[@]}")
		got=$(sha256sum <"$LOG-rows0.out" | cut -d' ' -f1)
		if [ "$rc" -eq 0 ] && [ "$got" = "$(cat "$FS_TMP/rows.want")" ]; then
			fs_pass "$RA_CASE $mode: psql with FABSOCK_SPIN_US=0 downloaded all $ROWS rows in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, byte-exact"
		else
			fs_fail "$RA_CASE $mode: psql with FABSOCK_SPIN_US=0: exit $rc, $(stat -c %s "$LOG-rows0.out") bytes, sha256 differs from the generated rows"
			ra_tail 6 "$LOG-rows0.err"
		fi
		PG_DL_BYTES=$((PG_DL_BYTES + $(stat -c %s "$LOG-rows0.out")))
	fi

	pg_bench "$mode" select FIG_S "$S_TX" -S -j 2 || true
	FIG_CONN[$mode]=$PG_LAST_CONN_MS
	if pg_bench "$mode" tpcb FIG_TPCB "$TPCB_TX" -j 2; then n_tpcb=$PG_LAST_N; fi

	# TPC-B consistency: each balance table sums to the history's deltas,
	# and the history has one row per transaction pgbench counted.
	want="t|t|t|$n_tpcb"
	got=$(pg_sql consist "select (select sum(abalance) from pgbench_accounts) = h.s, (select sum(tbalance) from pgbench_tellers) = h.s, (select sum(bbalance) from pgbench_branches) = h.s, h.n from (select coalesce(sum(delta), 0) as s, count(*) as n from pgbench_history) h" &&
		cat "$LOG-consist.out" || true)
	if [ "$got" = "$want" ]; then
		fs_pass "$RA_CASE $mode: after TPC-B the balances match the $n_tpcb history rows"
	else
		fs_fail "$RA_CASE $mode: TPC-B consistency '$got' (want '$want')"
		ra_tail 6 "$LOG-consist.err"
	fi

	# every client connection (all offloaded: checked below) a handshake
	ra_tcp_payload_check "$mode" "$PG_DL_BYTES" "$(ra_sum pgclients "$mode" offloaded)"
	fs_tcp_count_stop

	# The postmaster: the same process, alive, no backend lost to a signal.
	pm_after=$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)
	if [ -n "$pm" ] && [ "$pm" = "$pm_after" ] && kill -0 "$pm" 2>/dev/null; then
		fs_pass "$RA_CASE $mode: the postmaster (pid $pm) is alive after the load"
	else
		fs_fail "$RA_CASE $mode: the postmaster is gone or changed (pid ${pm:-?} before, ${pm_after:-none} after)"
	fi
	kill -INT "$srv" 2>/dev/null || true
	rc=0
	fs_wait_pid "$srv" 30 || rc=$?
	if [ "$rc" -eq 0 ] && grep -q 'database system is shut down' "$LOG-server.log"; then
		fs_pass "$RA_CASE $mode: fast shutdown on SIGINT, clean"
	else
		fs_fail "$RA_CASE $mode: the postmaster's shutdown: exit $rc"
		tail -n 5 "$LOG-server.log" | sed 's/^/    /' >&2 || true
	fi
	ra_log_no_signal "$LOG-server.log" 'terminated by signal|terminated by exception|reinitializing|PANIC'

	if [ "$mode" = fabsock ]; then
		ra_offloaded postgres fabsock "$MIN_CONNS"
		ra_offloaded pgclients fabsock "$MIN_CONNS"
		# the postmaster loaded libfabric when it listened (fs_fabric_warm):
		# every backend it forked inherited it instead of loading its own
		loads=$(ra_sum postgres fabsock fabric_loads)
		if [ "$loads" = 1 ]; then
			fs_pass "$RA_CASE fabsock: libfabric loaded once on the server side (the postmaster), inherited by every backend"
		else
			fs_fail "$RA_CASE fabsock: libfabric loaded ${loads:-?} times on the server side (want 1: the postmaster's, inherited by its backends)"
		fi
		fs_log "$RA_CASE fabsock: stats lines: server processes $(grep -c ': stats:' "$RA_DIR/postgres.fabsock.log" || true), clients $(grep -c ': stats:' "$RA_DIR/pgclients.fabsock.log" || true)"
		if [ "$(ra_sum postgres fabsock offloaded)" != "$(ra_sum pgclients fabsock offloaded)" ]; then
			fs_fail "$RA_CASE fabsock: the server offloaded $(ra_sum postgres fabsock offloaded) streams, the clients $(ra_sum pgclients fabsock offloaded)"
		fi
		for i in postgres pgclients; do
			ra_log_clean "$i" fabsock || true # ra_offloaded checked that none stayed on TCP
		done
	fi
}

# One cluster for both modes (pgbench -i recreates the tables).
rc=0
ra_env kernel initdb
pg_as
timeout -k 5 60 "${PG_AS[@]}" "$PGBIN/initdb" -D "$PG_DATA" -U postgres -A trust -E UTF8 --no-sync >"$FS_TMP/initdb.log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	fs_fail "$RA_CASE: initdb exited $rc"
	tail -n 5 "$FS_TMP/initdb.log" | sed 's/^/    /' >&2
	ra_done
	exit
fi

for mode in $FS_MODES; do
	pg_run "$mode"
done

ra_figure "pgbench -i -s $SCALE" s "${FIG_INIT[kernel]:-0}" "${FIG_INIT[fabsock]:-0}" lower
ra_figure "psql download of $ROWS rows" MB/s "${FIG_DL[kernel]:-0}" "${FIG_DL[fabsock]:-0}"
ra_figure "pgbench -S -c $CLIENTS -j 2" tps "${FIG_S[kernel]:-0}" "${FIG_S[fabsock]:-0}"
ra_figure "pgbench -S -c $CLIENTS: connecting them all" ms "${FIG_CONN[kernel]:-0}" "${FIG_CONN[fabsock]:-0}" lower
ra_figure "pgbench TPC-B -c $CLIENTS -j 2" tps "${FIG_TPCB[kernel]:-0}" "${FIG_TPCB[fabsock]:-0}"
ra_done
