# SPDX-License-Identifier: MIT
# Shared helpers for the end-to-end test scripts. Source it first thing:
#   . "$(dirname "$0")/lib.sh"
# It sets strict mode, a bounded overall timeout, and a cleanup trap that
# kills every process the script started (fs_bg), deletes the network
# namespaces it created (fs_netns_add) and removes its temporary directory.

set -euo pipefail
# An expansion error (arithmetic on "1.5", a bad substitution) abandons the
# whole top-level command it is in, a `for` loop of scenarios say, and the
# script went on to fs_done and "passed" with those checks skipped; errexit
# does not catch it. In POSIX mode such an error ends the script (status 1).
set -o posix

: "${FABSOCK_LIB:?FABSOCK_LIB must name the built libfabsock.so}"
: "${FS_PROGS:?FS_PROGS must name the directory of the test programs}"

# The connection history (core/history.h) outlives processes, per user: a
# test that runs the same short client against a fixed port would see its
# earlier runs' (and earlier scripts') connections and go TCP. Off unless the
# script sets FS_HISTORY=1 before sourcing this (e2e_history, with a private
# record directory; the real-programs bench, which measures what a user gets).
if [ "${FS_HISTORY:-0}" != 1 ]; then
	export FABSOCK_HISTORY_SHORT=0
fi
# The step-back (core/stepback.h) hands a stream back to TCP when most of its
# answers come after a sleep: on a loaded machine (CI runs several scripts at
# once on two cores) that is any ping-pong, and which ones is up to the
# scheduler. A test that proves offload (no payload on TCP), or studies the
# fabric's own wake-ups (rings, doorbells, paced clients: sleeping waits by
# design), would then fail by the host's load, not by its code. Off unless
# the script sets FS_STEPBACK=1 before sourcing this (e2e_stepback, whose
# shapes make waits sleep by construction; the real-programs bench, which
# measures what a user gets).
if [ "${FS_STEPBACK:-0}" != 1 ]; then
	export FABSOCK_STEPBACK=0
fi

FS_TMP=$(mktemp -d /tmp/fabsock-test.XXXXXX)
# The script's name for fs_log, found once (a basename(1) per log line was a
# process per line).
FS_NAME=${0##*/}
FS_NAME=${FS_NAME%.sh}
# fs_sleep SECONDS: a sleep that starts no process. The scripts poll (a
# pid, a port, a line) every 50 ms while their programs run, and a fork
# and exec of sleep(1) costs ~10 ms of CPU on the CI's VM (a loaded one):
# e2e_evloop's harness spent several times the CPU of its programs, on a
# 2-core machine. (The helpers below start as few processes as they can
# for the same reason.) This is read's
# timeout on a FIFO nobody writes, opened read-write for the call only (so
# it never blocks in open and no program inherits it); without the FIFO
# (mkfifo failed, the directory removed) it is sleep(1).
FS_SLEEP_FIFO=$FS_TMP/.sleep
mkfifo "$FS_SLEEP_FIFO" 2>/dev/null || FS_SLEEP_FIFO=
fs_sleep() {
	local rc=0
	if [ -n "$FS_SLEEP_FIFO" ]; then
		read -rt "$1" <>"$FS_SLEEP_FIFO" 2>/dev/null || rc=$?
		# > 128: the timeout ran out, the normal end
		[ "$rc" -le 128 ] || return 0
	fi
	sleep "$1"
}
FS_PIDS=()
FS_NETNS=()
FS_FAILS=0
FS_PASSES=0
FS_NFT=fstest_$$ # the nftables table of fs_tcp_count_start
FS_NFT_SWEPT=    # set once the tables of dead scripts are removed

# The modes a script runs its cases in: "kernel" (no preload anywhere: the
# baseline, and a check of the test itself) and "fabsock". With
# FS_SKIP_KERNEL_HALF=1 the kernel half is left out: CMake sets it in
# sanitizer builds (the kernel half runs none of fabsock's code under the
# sanitizer) and .ci/run in its slow stage (the scale tests' baselines). The
# release build's default run keeps both halves. The skip is said at the
# start and in fs_done's closing line, never counted as a pass. A script
# loops `for mode in $FS_MODES` (or asks mode_wanted); FS_MODES set by hand
# wins.
if [ "${FS_SKIP_KERNEL_HALF:-0}" = 1 ]; then
	FS_MODES=${FS_MODES:-fabsock}
else
	FS_MODES=${FS_MODES:-kernel fabsock}
fi
FS_KERNEL_SKIPPED=
if [[ " $FS_MODES " != *" kernel "* ]]; then
	# (an if, not `[ ] && echo` in the substitution: a false test there
	# made the assignment fail and set -e end the script silently)
	FS_KERNEL_SKIPPED="kernel half not run (FS_MODES=\"$FS_MODES\""
	if [ "${FS_SKIP_KERNEL_HALF:-0}" = 1 ]; then FS_KERNEL_SKIPPED+=', FS_SKIP_KERNEL_HALF=1'; fi
	FS_KERNEL_SKIPPED+=")"
	# (said once: not again by the half of the scenarios beside, fs_split_beside)
	[ -n "${FS_SPLIT_SECOND:-}" ] || printf '%s: %s\n' "$FS_NAME" "SKIP: $FS_KERNEL_SKIPPED" >&2
fi

# PID and all its descendants, children first (while the tree is intact).
fs_tree() {
	local kid
	for kid in $(pgrep -P "$1" 2>/dev/null); do
		fs_tree "$kid"
	done
	echo "$1"
}

fs_cleanup() {
	local pid ns
	local -a tree=() regions=()
	# The programs and whatever they forked (prefork workers, children);
	# a pid that has ended has no children left to it (they went to init).
	for pid in "${FS_PIDS[@]:-}"; do
		[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && tree+=($(fs_tree "$pid"))
	done
	for pid in "${tree[@]:-}"; do
		[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
	done
	FS_PIDS+=("${tree[@]:-}")
	wait 2>/dev/null || true
	for ns in "${FS_NETNS[@]:-}"; do
		[ -n "$ns" ] && ip netns del "$ns" 2>/dev/null || true
	done
	# Regions of fabsock processes this test started and that did not exit
	# cleanly (one rm for all: the names that match, or the patterns)
	for pid in "${FS_PIDS[@]:-}"; do
		[ -n "$pid" ] && regions+=(/dev/shm/fabsock-*-"$pid"-*)
	done
	[ "${#regions[@]}" = 0 ] || rm -f "${regions[@]}" 2>/dev/null || true
	fs_tcp_count_stop
	# FS_KEEP_TMP=DIR: a developer's copy of what the test left (logs,
	# every process's stats lines) before it is removed
	[ -z "${FS_KEEP_TMP:-}" ] || cp -a "$FS_TMP" "$FS_KEEP_TMP" 2>/dev/null || true
	rm -rf "$FS_TMP"
}
trap fs_cleanup EXIT

fs_log() { printf '%s: %s\n' "$FS_NAME" "$*" >&2; }
fs_fail() { fs_log "FAIL: $*"; FS_FAILS=$((FS_FAILS + 1)); }
fs_pass() { fs_log "ok: $*"; FS_PASSES=$((FS_PASSES + 1)); }
# A missing prerequisite (program, user, permission) skips the test: exit 77,
# which CTest reports as skipped, not failed. Under CI=true the machine is
# one .ci/run set up completely, and a skip there is a check that silently
# did not run: it fails instead (exit 1), saying what was missing.
fs_skip() {
	if [ "${CI:-}" = true ]; then
		fs_log "FAIL: CI=true and a prerequisite is missing (a skip fails in CI): $*"
		exit 1
	fi
	fs_log "SKIP: $*"
	exit 77
}
# The end of an fs_stream pair in DIR (server.out/.err, client.out/.err):
# fails LABEL, with the pair's result lines and errors, unless both exited
# 0 (exit statuses SRC and CRC) and both printed "result ok".
# Usage: fs_pair_ok DIR LABEL SRC CRC || return ...
fs_pair_ok() {
	local dir=$1 label=$2 src=$3 crc=$4
	if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ] || ! grep -qx 'result ok' "$dir/client.out" ||
		! grep -qx 'result ok' "$dir/server.out"; then
		fs_fail "$label: exit $src/$crc: $(grep -h '^result' "$dir/server.out" "$dir/client.out" | tr '\n' ' ')"
		grep -hv 'stats:' "$dir/server.err" "$dir/client.err" | head -n 5 >&2
		# each side's counters that moved (a rare failure in CI leaves
		# nothing else: its directory goes with the run)
		local side moved
		for side in server client; do
			moved=$(grep -h 'stats:' "$dir/$side.err" 2>/dev/null | tr ' ' '\n' | grep -vE '=0$|^$' | tr '\n' ' ' || true)
			[ -z "$moved" ] || echo "$label: $side $moved" >&2
		done
		return 1
	fi
}

# Ends the script: prints the closing count line and exits by the result.
# A failed run also prints the first sanitizer report any of its programs
# left in the test's directory (a program that exits 66 under TSan or 1
# under ASan says why only in its stderr file).
fs_done() {
	local t
	# A thread of ours that could not start is a lost guarantee (the shm
	# watchdog: a killed peer's lock is never released; the service thread:
	# probes unanswered), whatever the test checked: any process of any
	# test that said so fails it (a program with 64 KiB of __thread data
	# once had no watchdog: glibc refused its 64 KiB stack).
	# (Not under TSan: a TSan build does not retry a refused stack size,
	# core/util.c fs_thread_start, and its runtime's TLS is large.)
	t=
	[ -n "${TSAN_OPTIONS:-}" ] ||
		t=$(grep -rlE 'warn: cannot start the (shm watchdog|fabsock service) thread' "$FS_TMP" 2>/dev/null | head -n 1 || true)
	[ -z "$t" ] || fs_fail "a process could not start a fabsock thread (${t#"$FS_TMP"/}: $(grep -m 1 -E 'cannot start the' "$t"))"
	# fabsock's own consistency checks (a buffer given back twice): any
	# process that tripped one fails the test, whatever else it checked
	t=$(grep -rl 'warn: internal error' "$FS_TMP" 2>/dev/null | head -n 1 || true)
	[ -z "$t" ] || fs_fail "fabsock reported an internal error (${t#"$FS_TMP"/}: $(grep -m 1 'internal error' "$t"))"
	echo "$FS_PASSES passed, $FS_FAILS failed${FS_KERNEL_SKIPPED:+, $FS_KERNEL_SKIPPED}"
	if [ "$FS_FAILS" -ne 0 ]; then
		local f
		f=$(grep -rlE '^(WARNING: ThreadSanitizer|==[0-9]+==ERROR: (Address|Leak)Sanitizer|.*: runtime error: )' "$FS_TMP" 2>/dev/null | head -n 1 || true)
		if [ -n "$f" ]; then
			echo "first sanitizer report, in ${f#"$FS_TMP"/}:"
			grep -v '^fabsock\[' "$f" | grep -m 1 -A 40 -E '^(WARNING: ThreadSanitizer|==[0-9]+==ERROR|.*: runtime error: )' || true
		fi
	fi
	[ "$FS_FAILS" -eq 0 ]
}

# Runs a command in the background and remembers its pid for cleanup.
# Usage: fs_bg VAR cmd...   (VAR receives the pid)
fs_bg() {
	local __var=$1; shift
	# A shell function would run in a subshell whose pid is not the
	# program's: expand fs_pre here so the recorded pid is the program.
	if [ "$1" = fs_pre ]; then
		shift
		set -- env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$@"
	fi
	"$@" &
	local pid=$!
	FS_PIDS+=("$pid")
	printf -v "$__var" '%s' "$pid"
}

# A TCP port that is free now on loopback (and its UDP twin too).
# Below the kernel's ephemeral range (ip_local_port_range, 32768 by
# default) when it leaves room: a port there is never a client's local port
# of another test's connection, whose segments a count on the port
# (fs_tcp_count_start) would take for ours (e2e_evloop's late_reader_close
# once saw 898 payload bytes in 12 segments on a connection that carried
# none, under CI's -j2).
fs_free_port() {
	local port i low=32768 span
	read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
	span=$((low - 20000))
	[ "$span" -ge 4000 ] || span=30000
	for ((i = 0; i < 200; i++)); do
		port=$((20000 + RANDOM % span))
		# (one ss for TCP and UDP, its output read here: no grep)
		if [ -z "$(ss -Htuan "sport = :$port")" ]; then
			echo "$port"; return 0
		fi
	done
	return 1
}

# Waits until something listens on TCP PORT (optionally inside netns NS).
fs_wait_listen() {
	local port=$1 ns=${2:-} i
	for ((i = 0; i < 200; i++)); do
		if [ -n "$ns" ]; then
			[ -n "$(ip netns exec "$ns" ss -Htln "sport = :$port")" ] && return 0
		else
			[ -n "$(ss -Htln "sport = :$port")" ] && return 0
		fi
		fs_sleep 0.05
	done
	fs_log "nothing listens on port $port after 10 s"
	return 1
}

# Waits (at most SEC seconds, 10 if not given) until FILE has a line
# matching PATTERN while PID lives (a line written just before it exited
# counts). Returns 0 or 1.
fs_wait_line() { # FILE PATTERN PID [SEC]
	local i
	for ((i = 0; i < ${4:-10} * 20; i++)); do
		grep -q "$2" "$1" 2>/dev/null && return 0
		kill -0 "$3" 2>/dev/null || { grep -q "$2" "$1" 2>/dev/null; return; }
		fs_sleep 0.05
	done
	return 1
}

# The N of the `listening port=N` line a test program PID prints into FILE,
# once it has; empty if it never does (within SEC seconds, 10 if not given:
# fs_wait_line's bound).
fs_listen_port() { # FILE PID [SEC]
	if fs_wait_line "$1" '^listening port=' "$2" "${3:-10}"; then
		sed -n 's/^listening port=//p' "$1" | head -n 1
	fi
}

# Writes FILE, a python3 echo server, for the tests whose server must be a
# program this build did not make (one without the ASan runtime, say):
# `python3 FILE PORT [COUNT [reuseport]]` listens on 127.0.0.1:PORT (0:
# any; with `reuseport`, SO_REUSEPORT too), prints `listening port=N`
# (fs_listen_port), then serves COUNT connections one after the other (0,
# the default: until it is killed), each echoed until its EOF; it exits 0
# after the last.
fs_py_echo_server() { # FILE
	cat >"$1" <<'EOF'
import socket, sys
port = int(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else 0
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if sys.argv[3:4] == ["reuseport"]:
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
l.bind(("127.0.0.1", port))
l.listen(8)
print("listening port=%d" % l.getsockname()[1], flush=True)
served = 0
while count == 0 or served < count:
    c, _ = l.accept()
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
    served += 1
EOF
}

# Waits for a pid with a time bound in seconds; returns its exit status, or
# 124 after killing it if it ran too long.
fs_wait_pid() {
	local pid=$1 limit=${2:-60} i
	for ((i = 0; i < limit * 20; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid"; return $?
		fi
		fs_sleep 0.05
	done
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	fs_log "pid $pid still running after ${limit}s: killed"
	return 124
}

# fs_check_files LABEL DIR [PAIRS]: for each pair A:B (default
# "client.sent:server.recv server.sent:client.recv"), DIR/A is not empty and
# its sha256 equals DIR/B's (what one side sent, what the other read).
fs_check_files() { # LABEL DIR [PAIRS]
	local label=$1 dir=$2 a b
	for pair in ${3:-"client.sent:server.recv server.sent:client.recv"}; do
		pair=${pair/:/ }
		set -- $pair
		a=$(sha256sum <"$dir/$1" | cut -d' ' -f1) b=$(sha256sum <"$dir/$2" | cut -d' ' -f1)
		[ -s "$dir/$1" ] || fs_fail "$label: $1 is empty"
		[ "$a" = "$b" ] || fs_fail "$label: sha256 of $1 ($a) differs from $2 ($b)"
	done
}

# fs_check_exit LABEL SIDE RC OUTFILE ERRFILE: a test program's exit: 0 with
# "result ok" in OUTFILE, else a failure naming the signal and its last lines.
fs_check_exit() { # LABEL SIDE RC OUTFILE ERRFILE
	if [ "$3" -ne 0 ] || ! grep -q 'result ok' "$4"; then
		fs_fail "$1: $2 exit $3$([ "$3" -gt 128 ] && echo " (signal $(($3 - 128)))"): $(grep -h 'result' "$4" | head -n 2)"
		grep -v ': stats:' "$5" | tail -n 5 >&2 || true
	fi
}

# Runs CMD under the preload: fs_pre cmd...
fs_pre() { LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$@"; }

# fs_stat FILE NAME: the value of counter NAME in the last
# "fabsock[PID]: warn: stats: ..." line of FILE (empty without one).
fs_stat() {
	# (the last matching line held, printed at the end: one sed, no tail)
	sed -nE "/^.*: stats: (.* )?$2=[0-9]+/h; \${x; s/^.*: stats: (.* )?$2=([0-9]+).*$/\2/p}" "$1" 2>/dev/null
}

# fs_expect_stats FILE LABEL NAME=VALUE...: each counter of the stats line
# in FILE exactly (fs_stat), one fs_pass or fs_fail for them all.
fs_expect_stats() {
	local file=$1 label=$2 kv name want got bad=
	shift 2
	for kv in "$@"; do
		name=${kv%%=*} want=${kv#*=}
		got=$(fs_stat "$file" "$name")
		[ "${got:-none}" = "$want" ] || bad+=" $name=${got:-none} (expected $want)"
	done
	if [ -n "$bad" ]; then
		fs_fail "$label:$bad"
	else
		fs_pass "$label: $*"
	fi
}

# fs_stat_sum FILE NAME: counter NAME summed over every stats line of FILE
# (one per process: prefork workers, forked children).
fs_stat_sum() {
	sed -nE "s/^.*: stats: (.* )?$2=([0-9]+).*$/\2/p" "$1" 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'
}

# fs_stats_fallbacks FILE: the nonzero counters that say why connections
# stayed on TCP (fallback_*, kernel, probes_*), summed over FILE's stats lines.
fs_stats_fallbacks() {
	grep -h 'warn: stats:' "$1" 2>/dev/null | tr ' ' '\n' | grep -E '^(fallback_[a-z_]+|kernel|probes_[a-z_]+)=' |
		grep -v '=0$' | awk -F= '{s[$1] += $2} END {for (k in s) printf "%s=%d ", k, s[k]}'
}

# fs_why_tcp SIDE FILE: prints fs_stats_fallbacks of FILE to stderr.
fs_why_tcp() {
	echo "    $1: $(fs_stats_fallbacks "$2")" >&2
}

# The attacker of the security tests: another local user where the test
# runs as root (nobody, through setpriv), else this uid. Sets ATTACKER (the
# command prefix, never preloaded) and ATTACKER_RAW (PROGRAM, copied where
# nobody can run it).
fs_attacker() { # PROGRAM
	ATTACKER=(env -u LD_PRELOAD)
	ATTACKER_RAW=$1
	if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
		chmod 755 "$FS_TMP"
		cp "$1" "$FS_TMP/$(basename "$1")"
		chmod 755 "$FS_TMP/$(basename "$1")"
		ATTACKER=(setpriv --reuid nobody --regid nogroup --clear-groups env -u LD_PRELOAD)
		ATTACKER_RAW=$FS_TMP/$(basename "$1")
	fi
}

# Creates a network namespace owned by this test (deleted at exit).
fs_netns_add() {
	local ns=$1
	ip netns add "$ns" || return 1
	FS_NETNS+=("$ns")
	ip -n "$ns" link set lo up
}

# fs_lib_copy DIR: copies the library and the PSM stand-ins built next to it
# (core/fabric.c loads them from its own directory) into DIR, readable by
# every user, and prints the copy's path. For tests whose processes drop to
# another user, who may not be able to read the build tree.
fs_lib_copy() {
	local dir=$1 f
	mkdir -p "$dir"
	for f in "$FABSOCK_LIB" "$(dirname "$FABSOCK_LIB")"/libfabsock-psm*.so; do
		[ -f "$f" ] || continue
		cp "$f" "$dir/" && chmod 755 "$dir/$(basename "$f")"
	done
	echo "$dir/$(basename "$FABSOCK_LIB")"
}

# ---- the proof that the payload did not go over kernel TCP --------------

# The largest HELLO or HELLO-ACK (core/wire.h: FS_WIRE_HELLO_MAX, 64 fixed
# bytes, a fabric address of at most 256 bytes, the CRC); the smallest is
# FS_WIRE_HELLO_MIN (68: a NAK carries no address).
FS_WIRE_HELLO_MAX=324
FS_WIRE_HELLO_MIN=68

# fs_tcp_count_start PORT...: counts, from now on, every TCP segment to or
# from each PORT on this host (a loopback segment passes the output hook
# once), in three exact classes:
#   handshake  a segment whose payload starts with a HELLO's or an ACK's
#              magic ('FSBH', 'FSBA': core/wire.h) and whose length is
#              one's (FS_WIRE_HELLO_MIN..MAX): fabsock's own negotiation
#              (a NAK too);
#   payload    every other segment's TCP payload: its bytes less its own
#              IP and TCP headers (each header length matched, not assumed:
#              a SYN's options or SACK blocks do not count as payload);
#   odd        a segment whose headers no rule knows (IP options, IPv6
#              extension headers): counted, so that nothing goes unseen.
# SYNs carry no payload (no TCP Fast Open) and are counted apart.
# With FS_TCP_MARK set to 4 ASCII characters, the segments whose payload
# starts with them are counted too (fs_tcp_count_read's MARKS): where a
# protocol's first message (rsync's "@RSYNCD" greeting) went.
# With FS_TCP_SKIP_UID set, a connection to a PORT whose SYN came from a
# socket of that uid is not counted at all (conntrack marks it), only the
# number of them (SKIPPED): a case says so when such connections stay on
# TCP on purpose (apache's root parent waking its workers).
fs_tcp_count_start() {
	local ports doff fam hdr len mark= skipmark=$((0x5a000000 | ($$ & 0xffffff)))
	[ "$#" -gt 0 ] || return 1
	ports=$(IFS=,; echo "$*")
	if [ -n "${FS_TCP_MARK:-}" ]; then
		[ "${#FS_TCP_MARK}" = 4 ] || return 1
		mark=0x$(printf '%s' "$FS_TCP_MARK" | od -An -tx1 | tr -d ' \n')
	fi
	# Tables of test scripts that died without their cleanup (ctest's
	# timeout kills with SIGKILL): their hooks would count every packet of
	# the host on those ports for ever. Looked for once per script.
	local t
	if [ -z "$FS_NFT_SWEPT" ]; then
		FS_NFT_SWEPT=1
		for t in $(nft list tables inet 2>/dev/null | sed -n 's/^table inet fstest_\([0-9]*\)$/\1/p'); do
			kill -0 "$t" 2>/dev/null || nft delete table inet "fstest_$t" 2>/dev/null || true
		done
	fi
	{
		# a count still up replaced in the same transaction (created
		# empty if absent, deleted, made anew: no nft process more)
		echo "table inet $FS_NFT {}"
		echo "delete table inet $FS_NFT"
		echo "table inet $FS_NFT {"
		echo "chain count {"
		echo "tcp flags & syn == syn counter accept comment \"syn 0\""
		for ((doff = 5; doff <= 15; doff++)); do
			for fam in 4 6; do
				if [ "$fam" = 4 ]; then
					hdr=$((20 + 4 * doff))
					fam="ip hdrlength 5"
					len="ip length $((hdr + FS_WIRE_HELLO_MIN))-$((hdr + FS_WIRE_HELLO_MAX))"
				else
					hdr=$((40 + 4 * doff))
					fam="ip6 nexthdr tcp"
					len="ip6 length $((4 * doff + FS_WIRE_HELLO_MIN))-$((4 * doff + FS_WIRE_HELLO_MAX))"
				fi
				[ -z "$mark" ] || echo "$fam tcp doff $doff @th,$((32 * doff)),32 $mark counter comment \"mark 0\""
				echo "$fam tcp doff $doff @th,$((32 * doff)),32 { 0x46534248, 0x46534241 } $len counter accept comment \"hs $hdr\""
				echo "$fam tcp doff $doff counter accept comment \"data $hdr\""
			done
		done
		echo "counter accept comment \"odd 0\""
		echo "}"
		echo "chain out { type filter hook output priority 0; policy accept;"
		if [ -n "${FS_TCP_SKIP_UID:-}" ]; then
			echo "tcp dport { $ports } tcp flags & (syn | ack) == syn meta skuid ${FS_TCP_SKIP_UID} ct mark set $skipmark counter comment \"skip 0\""
			echo "ct mark $skipmark accept"
		fi
		echo "tcp sport { $ports } goto count"
		echo "tcp dport { $ports } goto count"
		echo "}"
		echo "}"
	} | nft -f -
}

# Prints "PACKETS BYTES PAYLOAD HANDSHAKES HS_BYTES ODD MARKS SKIPPED"
# counted since fs_tcp_count_start: every segment and its bytes; the
# payload bytes of the segments that are not handshakes; the handshake
# segments and their payload bytes; the segments of unknown header shape;
# the segments that start with FS_TCP_MARK (also counted in the others);
# the connections not counted (FS_TCP_SKIP_UID).
fs_tcp_count_read() {
	nft list table inet "$FS_NFT" 2>/dev/null | awk '
		/counter packets/ && /comment "/ {
			p = 0; b = 0
			for (i = 1; i <= NF; i++) { if ($i == "packets") p = $(i + 1); if ($i == "bytes") b = $(i + 1) }
			c = $0; sub(/.*comment "/, "", c); sub(/".*/, "", c); split(c, k, " ")
			if (k[1] == "mark") { marks += p; next }
			if (k[1] == "skip") { skipped += p; next }
			np += p; nb += b
			if (k[1] == "hs") { hs += p; hsb += b - k[2] * p }
			else if (k[1] == "data") pl += b - k[2] * p
			else if (k[1] == "odd") odd += p
		}
		END { printf "%d %d %d %d %d %d %d %d\n", np, nb, pl, hs, hsb, odd, marks, skipped }'
}

fs_tcp_count_stop() {
	nft delete table inet "$FS_NFT" 2>/dev/null || true
}

# fs_tcp_proof LABEL MODE CONNECTIONS [ALLOWED WHY]: reads and stops the
# count that fs_tcp_count_start began, and logs it. In MODE fabsock (any
# other mode only logs) LABEL fails when TCP carried any payload byte beyond
# the handshakes (exactly: the HELLO and ACK segments are told apart by
# their magic, not by an allowance of bytes), or a segment of unknown
# shape. (The handshake segments are only logged: a segment the kernel
# sent again, on a loaded machine, passes the hook twice.) A scenario that
# puts bytes on TCP on purpose (a stream handed back to TCP) says how many
# at most in ALLOWED, and WHY. In any mode it fails when the counter saw no segment of the
# CONNECTIONS (> 0): a counter on the wrong port proves nothing.
fs_tcp_proof() {
	local label=$1 mode=$2 connections=${3:-1} allowed=${4:-0} why=${5:-} p b pl hs hsb odd made=1
	read -r p b pl hs hsb odd _ < <(fs_tcp_count_read)
	fs_tcp_count_stop
	[ "$connections" -ge 1 ] 2>/dev/null || { connections=1 made=0; }
	fs_log "$label: TCP carried $pl payload bytes in $p segments, besides $hs handshake segments ($hsb bytes, $connections connections)"
	FS_TCP_PAYLOAD=$pl FS_TCP_HS_BYTES=$hsb
	# a connection's handshake segments always pass the hook: none counted
	# means a counter on the wrong port, or none at all, proving nothing
	[ "$p" -gt 0 ] || [ "$made" = 0 ] || { fs_fail "$label: the TCP counter saw no segment on the port: it proves nothing"; return 0; }
	[ "$mode" = fabsock ] || return 0
	[ "$odd" = 0 ] || fs_fail "$label: $odd TCP segments of a header shape the counter does not know: it cannot account for them"
	if [ "$pl" -gt "$allowed" ]; then
		fs_fail "$label: TCP carried $pl payload bytes besides the handshakes (allowed: $allowed${why:+, $why}): the data did not go over the fabric"
	elif [ "$allowed" -gt 0 ]; then
		fs_log "$label: $pl of the $allowed payload bytes allowed on TCP: $why"
	fi
}

# The kernel half beside the fabsock half. A script whose two halves share
# nothing (the kernel half runs no fabsock code, makes no shm region and no
# probe, and its processes mostly sleep in the scenarios' waits) calls
# fs_kernel_beside_start [NAME=VALUE...] before its mode loop: when FS_MODES
# holds both halves (the release build's default run), it starts this
# script again with FS_MODES=kernel (and the NAME=VALUEs, e.g. a narrower
# FS_SCENARIOS) in the background, with its own temporary directory and
# nftables table, and takes "kernel" out of FS_MODES. The script then runs
# its fabsock half and calls fs_kernel_beside_wait LIMIT_S before fs_done:
# it prints the output of every instance started beside (this one and
# fs_split_beside's), adds their passes and failures to this script's
# counts and fails when one exited otherwise than its closing line says,
# or did not end within LIMIT_S. FS_KERNEL_BESIDE=0 runs the halves one
# after the other as before.
FS_BESIDE_PIDS=()
FS_BESIDE_LOGS=()
FS_BESIDE_WHAT=()
# fs_beside_start WHAT NAME=VALUE...: this script again, in the background,
# with NAME=VALUE... in its environment; fs_kernel_beside_wait collects it.
fs_beside_start() {
	# (not `pid`: fs_bg's own local of that name would take the value)
	local what=$1 beside_pid log=$FS_TMP/beside-${#FS_BESIDE_PIDS[@]}.log
	shift
	fs_bg beside_pid env "$@" bash "$0" >"$log" 2>&1
	FS_BESIDE_PIDS+=("$beside_pid")
	FS_BESIDE_LOGS+=("$log")
	FS_BESIDE_WHAT+=("$what")
	fs_log "$what runs beside (pid $beside_pid); its output follows at the end"
}
fs_kernel_beside_start() {
	[ "${FS_KERNEL_BESIDE:-1}" != 0 ] || return 0
	[[ " $FS_MODES " == *" kernel "* && " $FS_MODES " == *" fabsock "* ]] || return 0
	fs_beside_start "the kernel half" "$@" FS_MODES=kernel FS_KERNEL_BESIDE=0
	FS_MODES=$(printf '%s\n' $FS_MODES | grep -vx kernel | tr '\n' ' ')
}
# fs_split_beside SCENARIO...: the other way to share the machine's idle
# time. A script whose scenarios are independent of each other (each its
# own processes, port, nftables count and directory) and mostly sleep in
# their waits calls it with the scenarios it would run in its mode loop
# (after fs_kernel_beside_start, so the kernel half is already elsewhere):
# with FS_SPLIT=1 (the default) and two or more scenarios, it starts this
# script again beside with the second half of them (FS_SCENARIOS, same
# FS_MODES, FS_SPLIT=0, FS_KERNEL_BESIDE=0), and leaves the first half in
# FS_SPLIT_MINE; otherwise FS_SPLIT_MINE is every scenario given. The
# halves alternate through the list, so that long scenarios (grouped by
# name) go to both. A sanitizer build's fabsock-only run becomes two
# instances side by side, as the release run's fabsock and kernel halves
# are (each of those splits its own list too). FS_SPLIT=0: one instance.
FS_SPLIT_MINE=
fs_split_beside() {
	local mine= other= i=0 scenario
	FS_SPLIT_MINE="$*"
	[ "${FS_SPLIT:-1}" != 0 ] && [ "$#" -ge 2 ] || return 0
	for scenario in "$@"; do
		if [ $((i % 2)) = 0 ]; then mine+="$scenario "; else other+="$scenario "; fi
		i=$((i + 1))
	done
	fs_beside_start "the second half of the $(echo $FS_MODES) scenarios" \
		FS_SCENARIOS="$other" FS_MODES="$FS_MODES" FS_SPLIT=0 FS_KERNEL_BESIDE=0 FS_SPLIT_SECOND=1
	FS_SPLIT_MINE=$mine
}
fs_kernel_beside_wait() { # LIMIT_S
	local rc i passed failed line what log
	for i in "${!FS_BESIDE_PIDS[@]}"; do
		rc=0 what=${FS_BESIDE_WHAT[$i]} log=${FS_BESIDE_LOGS[$i]}
		fs_wait_pid "${FS_BESIDE_PIDS[$i]}" "$1" || rc=$?
		echo "---- $what (run beside, exit status $rc):"
		cat "$log" 2>/dev/null || true
		echo "---- end of $what"
		line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" 2>/dev/null | tail -n 1 || true)
		passed=$(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed.*/\1/p' <<<"$line")
		failed=$(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed.*/\2/p' <<<"$line")
		if [ -z "$line" ]; then
			fs_fail "$what (beside) printed no closing count line (exit status $rc)"
			continue
		fi
		FS_PASSES=$((FS_PASSES + passed))
		FS_FAILS=$((FS_FAILS + failed))
		if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
			fs_fail "$what (beside) exited $rc after $passed passes and no failure"
		elif [ "$rc" -eq 0 ] && [ "$failed" -ne 0 ]; then
			fs_fail "$what (beside) exited 0 after $failed failures"
		fi
		[ "$passed" -gt 0 ] || fs_fail "$what (beside) passed nothing"
	done
	FS_BESIDE_PIDS=() FS_BESIDE_LOGS=() FS_BESIDE_WHAT=()
}

# Fails the script at once when nft (the counter of fs_tcp_count_start) is missing.
fs_need_nft() {
	command -v nft >/dev/null 2>&1 && return 0
	fs_fail "nft is needed to prove the payload did not go over TCP (bash tools/setup.sh --deps-only)"
	fs_done
	exit 1
}
