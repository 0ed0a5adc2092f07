#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Connection history (core/history.h, issue 27 "offload only when it will
# pay"): a program whose connections to a destination are short stops paying
# the rail and the HELLO there; one whose connections are long keeps
# offloading. One fixed port, a new fs_stream server (preloaded, speaking
# first: --banner) per round, the same client command line per kind, a
# private record directory (so the rounds see only their own history):
#   learn:    the short client's first rounds offload (4 connections, each
#             under FABSOCK_HISTORY_BYTES=1M: short).
#   decided:  the next round goes TCP at connect(): fallback_short_history
#             per stream, no probe, no rail; the kernel's counter shows the
#             payload on TCP; the server, about to speak first, wrote at
#             once (server_first_plain_local: the client noted no intent
#             to probe) instead of waiting FABSOCK_FIRST_SEND_WAIT_MS.
#   long:     another command line (4 MiB per stream: long) offloads round
#             after round; the kernel's counter shows no payload on TCP.
#   family:   a command line new to the destination but for its last
#             argument (the client's --timeout) goes TCP at connect() from
#             the first round when the family's connections were short
#             (fallback_short_history_family), and offloads when they were
#             long.
#   relearn:  with FABSOCK_HISTORY_RELEARN=2 both TCP decisions stay on
#             TCP (history_relearn=0): a short decision is re-judged by the
#             TCP connections' own counts (flip below), never by offloading
#             one (the relearn of a step-back's decision: e2e_stepback).
#   quick:    a round whose TCP connections close within
#             FABSOCK_HISTORY_QUICK_US of their connect() counts them short
#             without asking the kernel (long by their bytes here): the
#             streak stands, the flip round still starts on TCP.
#   flip:     a round whose TCP connections count as long at their close
#             (FABSOCK_HISTORY_BYTES=1000 in the client, no quick bound:
#             learnt from the kernel's TCP_INFO) ends the streak: the next
#             round offloads.
#   sole:     a client process whose one connection to the destination was
#             short counts it twice at its exit (a curl per URL: its next run
#             will be the same): with FABSOCK_HISTORY_SHORT=4, one stream per
#             process, the third process already goes TCP at connect() (two
#             connections in one process, as in the rounds above, count once
#             each).
#   command:  a process's first connection to a destination that neither
#             its command line nor its family knows follows its command's
#             processes of one connection each (the sole ones above, all
#             short): once FABSOCK_HISTORY_SHORT of them were short in a
#             row, a new command line of the same program (another
#             --bytes) goes TCP at connect() (fallback_short_history_command:
#             no probe, no rail); one such connection that turns out long
#             (16 MiB over TCP, learnt from TCP_INFO) ends the streak, and
#             the next new command line offloads.
#   family in turn: two processes of one stream each, of a command line
#             new but for its last argument: both follow the short family
#             to TCP (the first one's report made the command line's own
#             entry, too young to decide, all short: it leaves it to the
#             family).
#   planted:  a history file that is not private (mode 0644) is never used
#             (history_refused=1) and the connections negotiate as before.
# Every stream's bytes are checked end to end by fs_stream.
FS_HISTORY=1 # lib.sh turns the history off for the other tests
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || fs_skip "needs root (nftables counter)"
fs_need_nft
PROG=$FS_PROGS/fs_stream
REC=$FS_TMP/rec
mkdir -p "$REC"
export FABSOCK_RECORDS_DIR=$REC FABSOCK_HISTORY_SHORT=4 FABSOCK_HISTORY_BYTES=1048576 FABSOCK_HISTORY_RELEARN=64
# a server that speaks first waits this long for a probe (the learning
# rounds must offload on a loaded machine); one that did not wait is told by
# its counter, not by a clock
export FABSOCK_FIRST_SEND_WAIT_MS=300
STREAMS=2
PORT=$(fs_free_port)

# round DIR BYTES [client env...]: a server on PORT for one run of STREAMS
# streams, and the client (its last argument: --timeout $TAIL); both must
# end "result ok".
TAIL=600
round() {
	local dir=$1 bytes=$2 spid cpid crc=0 src=0
	shift 2
	mkdir -p "$dir"
	fs_bg spid env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info "$PROG" server --port "$PORT" \
		--ready-file "$dir/ready" --streams "$STREAMS" --bytes "$bytes" --banner >"$dir/server.out" 2>"$dir/server.err"
	for _ in $(seq 1 100); do [ -s "$dir/ready" ] && break; sleep 0.05; done
	fs_bg cpid env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$@" "$PROG" client 127.0.0.1 "$PORT" \
		--streams "$STREAMS" --bytes "$bytes" --banner --timeout "$TAIL" >"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cpid" 60 || crc=$?
	fs_wait_pid "$spid" 20 || src=$?
	fs_pair_ok "$dir" "$(basename "$dir")" "$src" "$crc" || return 1
}

# ---- learn: the first 4 short connections offload --------------------------
for i in 1 2; do
	d=$FS_TMP/learn$i
	round "$d" 64K &&
		fs_expect_stats "$d/client.err" "learn $i: the short client offloads while it learns" \
			offloaded=$STREAMS fallback_short_history=0
done

# ---- decided: TCP at connect, nothing opened, the server does not wait ------
d=$FS_TMP/decided
fs_tcp_count_start "$PORT"
if round "$d" 64K; then
	read -r _ _ pl hs _ < <(fs_tcp_count_read)
	fs_expect_stats "$d/client.err" "decided: the client stayed on TCP at connect()" \
		fallback_short_history=$STREAMS offloaded=0 probes_sent=0 fabric_loads=0
	fs_expect_stats "$d/server.err" "decided: the server spoke first at once (no wait for a probe)" \
		server_first_plain_local=$STREAMS fallback_server_first=$STREAMS offloaded=0
	if [ "${hs:-x}" = 0 ] && [ "${pl:-0}" -ge $((STREAMS * 65536)) ]; then
		fs_pass "decided: the kernel's counter shows the payload on TCP ($pl bytes) and no HELLO"
	else
		fs_fail "decided: TCP carried ${pl:-?} payload bytes and ${hs:-?} handshake segments (expected >= $((STREAMS * 65536)), 0)"
	fi
fi
fs_tcp_count_stop

# ---- long: another command line keeps offloading -----------------------------
for i in 1 2 3; do
	d=$FS_TMP/long$i
	[ "$i" = 3 ] && fs_tcp_count_start "$PORT"
	if round "$d" 4M; then
		fs_expect_stats "$d/client.err" "long $i: offloaded" offloaded=$STREAMS fallback_short_history=0
		[ "$i" = 3 ] && fs_tcp_proof "long $i" fabsock "$STREAMS"
	fi
	fs_tcp_count_stop
done

# ---- family: a new last argument, the family's history -----------------------
TAIL=601
d=$FS_TMP/family_short
round "$d" 64K &&
	fs_expect_stats "$d/client.err" "family: a new command line of a short family stays on TCP at its first connect()" \
		fallback_short_history_family=$STREAMS fallback_short_history=0 offloaded=0 probes_sent=0 fabric_loads=0
TAIL=602
d=$FS_TMP/family_long
round "$d" 4M &&
	fs_expect_stats "$d/client.err" "family: a new command line of a long family offloads" \
		offloaded=$STREAMS fallback_short_history_family=0 fallback_short_history=0
TAIL=600

# ---- relearn: a short decision is not relearnt on the fabric ----------------------
d=$FS_TMP/relearn
round "$d" 64K FABSOCK_HISTORY_RELEARN=2 &&
	fs_expect_stats "$d/client.err" "relearn: short decisions stay on TCP (their own counts re-judge them)" \
		history_relearn=0 offloaded=0 fallback_short_history=$STREAMS probes_sent=0

# ---- quick: TCP connections that close within HISTORY_QUICK_US are short ------
# (long by their bytes here, but the client does not ask the kernel: with
# the bound at 60 s every connection is quick) and keep the streak: the
# flip round below still starts on TCP.
d=$FS_TMP/quick
round "$d" 64K FABSOCK_HISTORY_BYTES=1000 FABSOCK_HISTORY_QUICK_US=60000000 &&
	fs_expect_stats "$d/client.err" "quick: TCP at connect" fallback_short_history=$STREAMS

# ---- flip: TCP connections that were long end the streak -----------------------
d=$FS_TMP/flip
round "$d" 64K FABSOCK_HISTORY_BYTES=1000 FABSOCK_HISTORY_QUICK_US=0 &&
	fs_expect_stats "$d/client.err" "flip: TCP at connect (the streak still stood)" fallback_short_history=$STREAMS
d=$FS_TMP/flipped
round "$d" 64K &&
	fs_expect_stats "$d/client.err" "flip: the kernel's counts of those TCP connections said long: offloaded again" \
		offloaded=$STREAMS fallback_short_history=0

# ---- sole: a process's only connection there, short, counts twice at exit ------
STREAMS=1
for i in 1 2 3; do
	d=$FS_TMP/sole$i
	round "$d" 64K || continue
	if [ "$i" -lt 3 ]; then
		fs_expect_stats "$d/client.err" "sole $i: the one-connection client offloads while it learns" \
			offloaded=1 fallback_short_history=0
	else
		fs_expect_stats "$d/client.err" "sole 3: two such processes were enough: TCP at connect()" \
			fallback_short_history=1 offloaded=0 probes_sent=0 fabric_loads=0
	fi
done

# ---- command: a new command line of a program whose processes were short ----
# (sole 1-3 counted three short one-connection processes: this one is the
# fourth, offloaded while its command learns; the next new one is decided)
d=$FS_TMP/command1
round "$d" 65536 &&
	fs_expect_stats "$d/client.err" "command 1: a new command line, the command's streak short of 4: offloaded" \
		offloaded=1 fallback_short_history_command=0 fallback_short_history_family=0 fallback_short_history=0
d=$FS_TMP/command2
round "$d" 65535 &&
	fs_expect_stats "$d/client.err" "command 2: a new command line after 4 short one-connection processes: TCP at connect()" \
		fallback_short_history_command=1 offloaded=0 probes_sent=0 fabric_loads=0
d=$FS_TMP/command_long1
fs_tcp_count_start "$PORT"
if round "$d" 16M; then
	read -r _ _ pl hs _ < <(fs_tcp_count_read)
	fs_expect_stats "$d/client.err" "command long 1: a long new command line starts on TCP all the same (the command's streak)" \
		fallback_short_history_command=1 offloaded=0 probes_sent=0
	if [ "${hs:-x}" = 0 ] && [ "${pl:-0}" -ge 16777216 ]; then
		fs_pass "command long 1: the kernel's counter shows its 16 MiB on TCP"
	else
		fs_fail "command long 1: TCP carried ${pl:-?} payload bytes and ${hs:-?} handshake segments (expected >= 16777216, 0)"
	fi
fi
fs_tcp_count_stop
d=$FS_TMP/command_long2
round "$d" 16777216 &&
	fs_expect_stats "$d/client.err" "command long 2: that long connection ended the command's streak: a new command line offloads" \
		offloaded=1 fallback_short_history_command=0

# ---- family, in turn: a young entry of its own, all short, leaves it to the family ----
# (one stream per process: the first process followed the family to TCP and
# made the command line's own entry; the second must follow the family too,
# not negotiate because that entry is too young to decide: the family case
# above raced its two streams on this)
TAIL=603
for i in 1 2; do
	d=$FS_TMP/family_turn$i
	round "$d" 64K &&
		fs_expect_stats "$d/client.err" "family in turn $i: a short family's new command line, process $i: TCP at connect()" \
			fallback_short_history_family=1 fallback_short_history=0 offloaded=0 probes_sent=0 fabric_loads=0
done
TAIL=600
STREAMS=2

# ---- planted: a history file open to others is not used ------------------------
P=$FS_TMP/planted
mkdir -m 700 "$P" "$P/fabsock-u$(id -u)"
head -c 34832 /dev/zero >"$P/fabsock-u$(id -u)/history-v2"
chmod 644 "$P/fabsock-u$(id -u)/history-v2"
export FABSOCK_RECORDS_DIR=$P
for i in 1 2 3; do
	d=$FS_TMP/planted$i
	round "$d" 64K || continue
	[ "$i" = 3 ] && fs_expect_stats "$d/client.err" "planted: a history file open to others is refused, connections negotiate as before" \
		history_refused=1 offloaded=$STREAMS fallback_short_history=0
done
export FABSOCK_RECORDS_DIR=$REC
if [ "$(stat -c %a "$P/fabsock-u$(id -u)/history-v2")" = 644 ] && cmp -s "$P/fabsock-u$(id -u)/history-v2" <(head -c 34832 /dev/zero); then
	fs_pass "planted: the refused history file was left as it was"
else
	fs_fail "planted: the refused history file was changed"
fi

fs_done
