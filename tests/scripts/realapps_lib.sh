# SPDX-License-Identifier: MIT
# Shared by the realapps_* tests: real Debian server programs started in
# their packaged shape (root master, workers that drop privileges, forks per
# connection), real clients, each case run twice in one script:
#   kernel   no LD_PRELOAD anywhere: the baseline
#   fabsock  server and clients under libfabsock.so
# and judged on: the work succeeded, bytes exact (checksums, query results),
# no process died by a signal (the server's own log, its pid alive after the
# load, core files), the connections were offloaded (the stats lines every
# fabsock process appends to a log file at exit) and the TCP connections
# carried no payload (an nftables byte counter on the service's port), with
# the main figure printed kernel vs fabsock side by side. Speed is reported
# (ra_figure) and judged by the benchmark, not here: ra_ratio_check is off
# unless RA_MIN_RATIO is set.
#
# Source it first thing (it sources lib.sh):
#   . "$(dirname "$0")/realapps_lib.sh"
# Needs root: the servers start as root and drop to their packaged users.
# It changes into $FS_TMP: a process that dropped privileges may not be able
# to enter the caller's directory (a clone under /root), and some (rsync)
# fail without a working directory they can reach.
#
# Stopping servers: a background job of a non-interactive shell (fs_bg)
# starts with SIGINT ignored, and an ignored signal stays ignored across
# exec: `kill -INT` does nothing to it, and Python never installs its
# KeyboardInterrupt handler. Stop servers with SIGTERM or SIGQUIT, the
# server's own stop command, or start them under `timeout -s INT`: timeout
# catches SIGINT, so its child starts with the default action; but timeout
# passes a signal on to its whole process group, so signal the child itself
# (`pgrep -P TIMEOUT_PID`) when receiving it twice would hurt.
#
# Knobs (environment):
#   RA_FABSOCK_LOG=info|debug  log level of the fabsock programs (FABSOCK_LOG)
#   RA_MIN_RATIO=R             ra_ratio_check fails a fabsock figure below R
#                              times the kernel's (default 0: off)

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$(id -u)" = 0 ] || fs_skip "needs root (the servers start as root and drop privileges)"
[ -f "$FABSOCK_LIB" ] || fs_skip "no library at $FABSOCK_LIB"

RA_CASE=$(basename "$0" .sh)
RA_CASE=${RA_CASE#realapps_}
# Every user a server drops to must be able to append to the fabsock logs
# and read the library: a world-writable, sticky directory of the test's own.
umask 022
RA_DIR=$FS_TMP/ra
mkdir -p "$RA_DIR"
chmod 755 "$FS_TMP"
chmod 1777 "$RA_DIR"
RA_CORES=$RA_DIR/cores
mkdir -p "$RA_CORES"
chmod 1777 "$RA_CORES"
RA_CORES_SAVED=
RA_OLD_CORE_PATTERN=
RA_OLD_SUID_DUMPABLE=
# The library as every user can read it: $FABSOCK_LIB may lie in a tree
# other users cannot enter (a clone under /root, mode 700), and the dynamic
# loader then ignores LD_PRELOAD in the processes that dropped privileges.
# ra_env preloads this copy (with the PSM stand-ins fabric.c loads from its
# own directory).
RA_LIB=$(fs_lib_copy "$RA_DIR/lib")
chmod 755 "$RA_DIR/lib"
# RA_BASE_LIB (bench_realapps.sh --base-lib): the "kernel" side runs under
# this other build of the library instead, copied the same way (an A/B of
# two builds in the bench's own shapes; a developer's tool, not a figure of
# the bench).
if [ -n "${RA_BASE_LIB:-}" ]; then
	RA_BASE_LIB=$(FABSOCK_LIB=$RA_BASE_LIB fs_lib_copy "$RA_DIR/libbase")
	chmod 755 "$RA_DIR/libbase"
fi
cd "$FS_TMP"

# Requires each COMMAND on the PATH, or skips the test.
ra_need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || fs_skip "$c is not installed (bash tools/setup.sh --deps-only)"
	done
}

ra_cleanup() {
	local pid
	# daemons and process groups the case registered
	for pid in "${FS_PIDS[@]:-}"; do
		[ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null || true
	done
	if [ -n "$RA_CORES_SAVED" ]; then
		# fs.suid_dumpable first: the kernel warns when it is 2 while
		# core_pattern is a relative path.
		sysctl -qw fs.suid_dumpable="$RA_OLD_SUID_DUMPABLE" 2>/dev/null || true
		echo "$RA_OLD_CORE_PATTERN" >/proc/sys/kernel/core_pattern 2>/dev/null || true
	fi
	fs_cleanup
}
trap ra_cleanup EXIT

# Core files of daemons that change user land in RA_CORES (restored at exit;
# a second call keeps the values saved by the first).
ra_cores_on() {
	if [ -z "$RA_CORES_SAVED" ]; then
		RA_OLD_CORE_PATTERN=$(cat /proc/sys/kernel/core_pattern)
		RA_OLD_SUID_DUMPABLE=$(sysctl -n fs.suid_dumpable)
		if echo "$RA_CORES/core.%e.%p" >/proc/sys/kernel/core_pattern 2>/dev/null; then
			RA_CORES_SAVED=1
			sysctl -qw fs.suid_dumpable=2 || true
		fi
	fi
	ulimit -c unlimited 2>/dev/null || true
}
ra_cores_on

# ra_env MODE NAME [stderr]: sets RA_ENV to the `env` prefix of a program in
# MODE (kernel: no preload; fabsock: the library, its stats at exit appended
# to $RA_DIR/NAME.MODE.log, which ra_sum and ra_why read; with RA_FABSOCK_LOG
# set, at that log level). With "stderr" the library logs to stderr instead,
# for programs that close every descriptor above 2 (the caller appends that
# stderr to NAME's log).
ra_env() {
	local log=$RA_DIR/$2.$1.log
	case $1 in
	kernel)
		if [ -n "${RA_BASE_LIB:-}" ]; then
			: >>"$log"
			chmod 666 "$log"
			RA_ENV=(env "LD_PRELOAD=$RA_BASE_LIB" FABSOCK_STATS=1 "FABSOCK_LOG_FILE=$log")
		else
			RA_ENV=(env -u LD_PRELOAD)
		fi
		;;
	fabsock)
		: >>"$log"
		chmod 666 "$log"
		if [ "${3:-}" = stderr ]; then
			RA_ENV=(env -u FABSOCK_LOG_FILE "LD_PRELOAD=$RA_LIB" FABSOCK_STATS=1)
		else
			RA_ENV=(env "LD_PRELOAD=$RA_LIB" FABSOCK_STATS=1 "FABSOCK_LOG_FILE=$log")
		fi
		[ -z "${RA_FABSOCK_LOG:-}" ] || RA_ENV+=("FABSOCK_LOG=$RA_FABSOCK_LOG")
		;;
	*) fs_log "ra_env: unknown mode $1"; return 1 ;;
	esac
}

# ra_as_argv USER: sets RA_AS to the argv prefix that runs a program as USER
# (its primary group, no other groups); empty for USER "-". A prefix, not a
# function, so that fs_bg records the program's pid.
ra_as_argv() {
	if [ -z "$1" ] || [ "$1" = - ]; then
		RA_AS=()
	else
		RA_AS=(setpriv --reuid="$1" --regid="$(id -gn "$1")" --init-groups --)
	fi
}

# ra_as USER CMD...: runs CMD as USER (ra_as_argv).
ra_as() {
	local -a RA_AS
	ra_as_argv "$1"
	shift
	"${RA_AS[@]}" "$@"
}

# ra_wait_listen PORT PID [SECS]: waits (10 s) until something listens on
# TCP PORT, failing at once when PID (a server started by fs_bg) is gone.
# Returns 0 when it listens; else 1 with RA_LISTEN_WHY saying how PID ended
# ("exit status N", with the signal) or that it still runs.
ra_wait_listen() {
	local port=$1 pid=$2 secs=${3:-10} i rc=0
	RA_LISTEN_WHY=
	for i in $(seq 1 $((secs * 20))); do
		ss -Htln "sport = :$port" | grep -q . && return 0
		kill -0 "$pid" 2>/dev/null || break
		fs_sleep 0.05
	done
	ss -Htln "sport = :$port" | grep -q . && return 0
	if kill -0 "$pid" 2>/dev/null; then
		RA_LISTEN_WHY="still running after ${secs}s"
	else
		wait "$pid" 2>/dev/null || rc=$?
		RA_LISTEN_WHY="exit status $rc$([ "$rc" -gt 128 ] && echo ": signal $((rc - 128))")"
	fi
	return 1
}

# ra_pg_ready DATADIR PID [SECS]: waits until the postmaster PID of DATADIR
# accepts connections: the status line of its postmaster.pid says "ready"
# (it listens before its startup process has finished, and a client that
# connects in between is refused with "the database system is starting
# up"). No connection is made. Returns 1 if it does not within SECS (10).
ra_pg_ready() {
	local data=$1 pid=$2 secs=${3:-10} i
	for i in $(seq 1 $((secs * 20))); do
		[ "$(sed -n '8{s/ *$//;p;q}' "$data/postmaster.pid" 2>/dev/null)" = ready ] && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		fs_sleep 0.05
	done
	return 1
}

# ra_alive MODE PID WHAT [WHEN]: passes when PID still lives after WHEN
# ("the load"), fails otherwise. Returns 0 if it lives.
ra_alive() {
	local mode=$1 pid=$2 what=$3 when=${4:-the load}
	if kill -0 "$pid" 2>/dev/null; then
		fs_pass "$RA_CASE $mode: $what ($pid) is alive after $when"
		return 0
	fi
	fs_fail "$RA_CASE $mode: $what ($pid) died during $when"
	return 1
}

# ra_stop MODE PID HOW WHAT SECS [LOG]: stops server PID (started by fs_bg)
# and waits SECS for it: HOW is SIGTERM, SIGQUIT or SIGINT (sent to PID), or
# words saying how the caller already asked it to stop. Passes on exit
# status 0; fails otherwise, with the signal that ended it and LOG's last
# lines. Returns the exit status (124: killed after SECS).
ra_stop() {
	local mode=$1 pid=$2 how=$3 what=$4 secs=$5 log=${6:-} rc=0
	case $how in
	SIG*) kill -"${how#SIG}" "$pid" 2>/dev/null || true ;;
	esac
	fs_wait_pid "$pid" "$secs" || rc=$?
	if [ "$rc" -eq 0 ]; then
		fs_pass "$RA_CASE $mode: $what stopped ($how), status 0"
	else
		fs_fail "$RA_CASE $mode: $what exit status $rc after $how$([ "$rc" -gt 128 ] && [ "$rc" -ne 124 ] && echo " (signal $((rc - 128)))")"
		[ -z "$log" ] || tail -n 3 "$log" 2>/dev/null | sed 's/^/    /' >&2 || true
	fi
	return "$rc"
}

# ra_sum NAME MODE COUNTER: COUNTER summed over every stats line that the
# processes run as NAME in MODE left (0 without any).
ra_sum() {
	local v
	v=$(fs_stat_sum "$RA_DIR/$1.$2.log" "$3")
	echo "${v:-0}"
}

# ra_why NAME MODE: why NAME's processes left streams on TCP: the nonzero
# fallback_* counters and `kernel`, summed (empty when all offloaded).
ra_why() {
	grep -h 'warn: stats:' "$RA_DIR/$1.$2.log" 2>/dev/null | tr ' ' '\n' | grep -E '^(fallback_[a-z_]+|kernel)=' |
		grep -v '=0$' | awk -F= '{s[$1] += $2} END {for (k in s) printf "%s=%d ", k, s[k]}' || true
}

# ra_all_offloaded NAME MODE [ON_TCP WHY]: fails the case if NAME's
# processes in MODE left streams on TCP, other than exactly ON_TCP (0) that
# the case puts there on purpose, saying WHY (clients without the preload).
# A connection its client closed before negotiating (fallback_peer_closed)
# is not one lost to TCP.
ra_all_offloaded() {
	local left want=${3:-0}
	left=$(($(ra_sum "$1" "$2" kernel) - $(ra_sum "$1" "$2" fallback_peer_closed)))
	[ "$left" = "$want" ] ||
		fs_fail "$RA_CASE $2: $1 left $left streams on TCP (want $want${4:+: $4}): $(ra_why "$1" "$2")"
}

# ra_log_clean NAME MODE: fails the case on fabsock warnings that mean a
# lost byte, a broken stream or a stream refused for room in NAME's log
# (resets, failed pulls, a full receive queue); the stats lines are skipped.
ra_log_clean() {
	local log=$RA_DIR/$1.$2.log bad
	[ -f "$log" ] || return 0
	bad=$(grep -v ': stats:' "$log" |
		grep -E 'warn: .*(could not be received|failed|resetting|dropped|undelivered|\bfull\b)' | head -n 5 || true)
	if [ -n "$bad" ]; then
		fs_fail "$RA_CASE $2: fabsock warnings in $1's log:"
		printf '    %s\n' "$bad" >&2
		return 1
	fi
	return 0
}

# ra_stacks_if_running PID SEC NAME...: waits up to SEC seconds for PID;
# if it still runs then, prints the stacks (gdb, every thread, frames only)
# of every process called NAME, for a hang to be diagnosable from the log.
ra_stacks_if_running() {
	local pid=$1 sec=$2 i p name
	shift 2
	for i in $(seq 1 $((sec * 10))); do
		kill -0 "$pid" 2>/dev/null || return 0
		fs_sleep 0.1
	done
	command -v gdb >/dev/null || return 0
	for name in "$@"; do
		for p in $(pgrep -x "$name" 2>/dev/null); do
			echo "    --- stacks of $name $p (still running after ${sec}s)" >&2
			timeout 20 gdb -p "$p" -batch -ex 'thread apply all bt 25' 2>/dev/null |
				grep -E '^(#|Thread)' | cut -c1-200 | head -n 80 | sed 's/^/    /' >&2 || true
		done
	done
}

# ra_tail N FILE...: the last N lines of the FILEs but fabsock's stats
# lines, indented, on stderr (what a failing program said).
ra_tail() {
	local n=$1
	shift
	grep -hv ': stats:' "$@" 2>/dev/null | tail -n "$n" | sed 's/^/    /' >&2 || true
}

# ra_fabsock_notes NAME MODE [N]: the N (6) most frequent distinct non-stats
# lines of NAME's fabsock log (what happened, in fabsock's words).
ra_fabsock_notes() {
	grep -hv ': stats:' "$RA_DIR/$1.$2.log" 2>/dev/null | sed -E 's/^fabsock\[[0-9]+\]/fabsock[N]/; s/[0-9]{3,}/N/g' |
		sort | uniq -c | sort -rn | head -n "${3:-6}" | sed "s/^/    $1: /" >&2 || true
}

# ---- workload helpers ---------------------------------------------------

# ra_make_docroot DIR SMALL BIG: DIR (readable by all) with small.txt, SMALL
# bytes of text (none if 0), and big.bin, BIG random bytes; BIG_SUM gets
# big.bin's sha256.
ra_make_docroot() {
	local dir=$1 small=$2 big=$3
	mkdir -p "$dir"
	[ "$small" -eq 0 ] || head -c "$small" /dev/urandom | base64 -w 64 | head -c "$small" >"$dir/small.txt"
	head -c "$big" /dev/urandom >"$dir/big.bin"
	BIG_SUM=$(sha256sum <"$dir/big.bin" | cut -d' ' -f1)
	chmod 755 "$dir"
	chmod 644 "$dir"/*
}

# ra_curl_get USER MAX URL OUT [LIMIT]: one download of URL into OUT by curl
# --max-time MAX as USER (ra_as_argv; "-": as is) under "${RA_ENV[@]}",
# bounded as a whole by LIMIT s (MAX + 5), its stderr in OUT.err. Sets
# CURL_RC, CURL_CODE, CURL_SIZE, CURL_SPEED (B/s), CURL_TTOT, CURL_TCONN (s)
# and CURL_SUM (OUT's sha256; empty without OUT).
ra_curl_get() {
	local -a RA_AS
	local max=$2 url=$3 out=$4 limit=${5:-$(($2 + 5))} w
	ra_as_argv "$1"
	CURL_RC=0 CURL_SUM=
	w=$("${RA_AS[@]}" timeout -k 2 "$limit" "${RA_ENV[@]}" curl -sS --max-time "$max" -o "$out" \
		-w '%{http_code} %{size_download} %{speed_download} %{time_total} %{time_connect}' \
		"$url" 2>"$out.err") || CURL_RC=$?
	CURL_CODE= CURL_SIZE= CURL_SPEED= CURL_TTOT= CURL_TCONN=
	read -r CURL_CODE CURL_SIZE CURL_SPEED CURL_TTOT CURL_TCONN <<<"$w" || true
	[ -f "$out" ] && CURL_SUM=$(sha256sum <"$out" | cut -d' ' -f1)
	return 0
}

# ra_mean_mb SPEEDS: the mean of the B/s figures in SPEEDS, in MB/s (0 if none).
ra_mean_mb() {
	echo "$1" | awk '{ for (i = 1; i <= NF; i++) s += $i; if (NF) printf "%.1f", s / NF / 1e6; else print 0 }'
}

# ---- judging ------------------------------------------------------------

# ra_cores_report LABEL [MAX]: fails the case for the core files written
# since the last call (a crash), then removes them: one failure per program
# with its count of cores and the crash sites of the ones opened (at most
# MAX, 6, go through gdb; an empty core, of a process without the right to
# write files, is matched with the kernel's seccomp log line), and the
# backtraces of at most 3 distinct sites.
# The backtrace shown is the faulting thread's (the one with "<signal
# handler called>": a server's SIGSEGV handler may re-raise with kill(), so
# the core's current thread is often another one).
ra_cores_report() {
	local label=$1 max=${2:-6} c exe prog out bt site k s n=0 e=0 total=0 shown=0
	local -A count=() sites=() example=() excore=()
	local -a order=()
	for c in "$RA_CORES"/core.*; do
		[ -e "$c" ] || continue
		total=$((total + 1))
		exe=$(file -b "$c" 2>/dev/null | sed -nE "s/.*execfn: '([^']+)'.*/\1/p" || true)
		[ -n "$exe" ] && [ "${exe#/}" = "$exe" ] && exe=$(command -v "$exe" || echo "$exe")
		# core.%e.%p: the program's name when file cannot tell
		prog=$(basename "${exe:-$(basename "$c" | sed -E 's/^core\.//; s/\.[0-9]+$//')}")
		count[$prog]=$((${count[$prog]:-0} + 1))
		if [ ! -s "$c" ]; then
			# An empty core: the process ran with RLIMIT_FSIZE 0 (a
			# sandboxed child, e.g. sshd's preauth). A seccomp kill is in
			# the kernel log (audit type 1326), with the syscall.
			out=$(dmesg 2>/dev/null | grep "type=1326.* pid=${c##*.} " | tail -n 1 || true)
			site="empty core$(sed -nE 's/.* sig=([0-9]+) .* syscall=([0-9]+) .*/, seccomp: signal \1 at syscall \2/p' <<<"$out")"
			k="$prog: $site"
			sites[$k]=$((${sites[$k]:-0} + 1))
			if [ -z "${example[$k]:-}" ]; then
				example[$k]=${out:-(no kernel log line)}
				excore[$k]=$(basename "$c")
				order+=("$k")
			fi
			e=$((e + 1))
		elif [ "$n" -lt "$max" ] && [ -n "$exe" ] && command -v gdb >/dev/null 2>&1; then
			n=$((n + 1))
			out=$(timeout 60 gdb -batch -ex 'echo @@bt\n' -ex bt -ex 'echo @@all\n' -ex 'thread apply all bt' "$exe" "$c" 2>/dev/null |
				sed -n '/^@@bt$/,$p' || true)
			bt=$(awk '/^Thread [0-9]+ \(/ { if (!f && b ~ /<signal handler called>/) { printf "%s", b; f = 1 } b = $0 "\n"; next }
				/^#[0-9]/ && b != "" { b = b $0 "\n" }
				END { if (!f && b ~ /<signal handler called>/) printf "%s", b }' <<<"$out")
			# No handler frame: the current thread (gdb's first bt).
			[ -n "$bt" ] || bt=$(awk '/^@@all$/ { exit } /^#[0-9]/ { print }' <<<"$out")
			# The crash site: the frames from the fault on, addresses dropped.
			site=$(awk -v h="$(grep -c '<signal handler called>' <<<"$bt" || true)" '
				h > 0 && /<signal handler called>/ { s = 1; next }
				/^#[0-9]/ && (s || h == 0) { print }' <<<"$bt" | head -n 5 |
				sed -E 's/^#[0-9]+ +//; s/^0x[0-9a-f]+ in //; s/ \(.*\) (at|from) (.*\/)?/ /; s/ \(.*$//' | paste -sd';' -)
			k="$prog: ${site:-?}"
			sites[$k]=$((${sites[$k]:-0} + 1))
			if [ -z "${example[$k]:-}" ]; then
				example[$k]=${bt:-(no backtrace)}
				excore[$k]=$(basename "$c")
				order+=("$k")
			fi
		fi
		rm -f "$c"
	done
	[ "$total" -gt 0 ] || return 0
	for prog in "${!count[@]}"; do
		s=
		for k in "${order[@]}"; do
			[ "${k%%: *}" = "$prog" ] && s="$s; ${sites[$k]} at ${k#*: }"
		done
		fs_fail "$RA_CASE $label: ${count[$prog]} core(s) of $prog${s:+, crash sites: ${s#; }}"
	done
	for k in "${order[@]}"; do
		[ "$shown" -lt 3 ] || break
		shown=$((shown + 1))
		case $k in
		*": empty core"*) echo "    kernel log on ${excore[$k]} (${k%%: *}):" >&2 ;;
		*) echo "    backtrace of the faulting thread of ${excore[$k]} (${k%%: *}):" >&2 ;;
		esac
		sed 's/^/    /' <<<"${example[$k]}" | head -n 30 >&2
	done
	[ $((n + e)) -eq "$total" ] || fs_log "$label: $((total - n)) more core file(s) counted, not opened with gdb"
	return 0
}

# ra_no_cores: fails the case for any core file not reported yet (a crash).
ra_no_cores() {
	ra_cores_report "${1:-at the end}"
}

# ra_log_no_signal FILE PATTERN: fails the case when the server's own log
# FILE reports a process killed by a signal (PATTERN: how this server says
# it, as an extended regular expression).
ra_log_no_signal() {
	local hits
	[ -f "$1" ] || return 0
	hits=$(grep -E "$2" "$1" | head -n 5 || true)
	if [ -n "$hits" ]; then
		fs_fail "$RA_CASE: the server's log reports a death by signal:"
		printf '    %s\n' "$hits" >&2
	fi
}

# ra_offloaded NAME MODE MIN [ON_TCP WHY]: in fabsock mode, NAME's processes
# must have offloaded at least MIN streams and left none on TCP but the
# ON_TCP the case puts there on purpose (ra_all_offloaded: every fallback_*
# counter is printed).
ra_offloaded() {
	local name=$1 mode=$2 min=$3 got
	got=$(ra_sum "$name" "$mode" offloaded)
	if [ "$got" -ge "$min" ]; then
		fs_pass "$RA_CASE $mode: $name offloaded $got streams (>= $min)"
	else
		fs_fail "$RA_CASE $mode: $name offloaded $got streams, expected >= $min; fallbacks: $(ra_why "$name" "$mode")"
	fi
	ra_all_offloaded "$name" "$mode" "${4:-0}" "${5:-}"
}

# ra_streams_clean MODE NAME...: each NAME's processes in MODE counted no
# reset and no dropped message, and logged no warning that means a lost
# byte (ra_log_clean); their notes are shown. (Whether their streams were
# offloaded is ra_offloaded's.)
ra_streams_clean() {
	local mode=$1 name v
	shift
	for name in "$@"; do
		for v in resets msgs_dropped; do
			[ "$(ra_sum "$name" "$mode" "$v")" = 0 ] ||
				fs_fail "$RA_CASE $mode: $name counted $v=$(ra_sum "$name" "$mode" "$v")"
		done
		ra_log_clean "$name" "$mode" || true
		ra_fabsock_notes "$name" "$mode"
	done
}

# ra_tcp_payload_check MODE MOVED CONNECTIONS [ALLOWED WHY]: after
# fs_tcp_count_start, in kernel mode the TCP connections must have carried
# at least MOVED payload bytes (the counter works); in fabsock mode no
# payload byte besides the handshakes (told apart exactly, fs_tcp_count_read;
# their segments are logged with CONNECTIONS) while the programs moved MOVED
# bytes. A case that puts bytes on TCP on purpose
# (a query that must reach a process not offloaded) says how many at most
# in ALLOWED, and WHY.
ra_tcp_payload_check() {
	local mode=$1 moved=$2 conns=$3 allowed=${4:-0} why=${5:-} p b pl hs hsb odd skipped
	read -r p b pl hs hsb odd _ skipped < <(fs_tcp_count_read)
	[ "$skipped" = 0 ] || fs_log "$RA_CASE $mode: $skipped connections from uid $FS_TCP_SKIP_UID not counted (FS_TCP_SKIP_UID)"
	if [ "$mode" = kernel ]; then
		if [ "$pl" -ge "$moved" ]; then
			fs_pass "$RA_CASE kernel: TCP carried $pl payload bytes (>= $moved moved)"
		else
			fs_fail "$RA_CASE kernel: TCP carried $pl payload bytes, less than the $moved moved: the counter is broken"
		fi
		return 0
	fi
	if [ "$pl" -le "$allowed" ] && [ "$odd" = 0 ]; then
		fs_pass "$RA_CASE fabsock: TCP carried $pl payload bytes (<= $allowed${why:+: $why}) besides $hs handshake segments ($hsb bytes, $conns connections) while $moved moved"
	else
		fs_fail "$RA_CASE fabsock: TCP carried $pl payload bytes (allowed $allowed${why:+: $why}) besides $hs handshake segments ($hsb bytes, $conns connections), $odd segments of unknown shape: the data did not all go over the fabric"
	fi
}

# ra_ratio_check WHAT KERNEL FABSOCK: with RA_MIN_RATIO set above 0 (the
# default is 0: off), fails the case when the fabsock figure is below that
# fraction of the kernel one (higher is better). Off by default: timed
# checks flake on a shared machine; ra_figure prints the ratio anyway.
ra_ratio_check() {
	local what=$1 k=$2 f=$3 min=${RA_MIN_RATIO:-0}
	if awk -v k="$k" -v f="$f" -v m="$min" 'BEGIN { exit !(m > 0 && k > 0 && f < k * m) }'; then
		fs_fail "$RA_CASE: $what: fabsock $f vs kernel $k, below $min of it"
	fi
	return 0
}

# ---- results ------------------------------------------------------------

RA_RESULTS=()

# ra_figure METRIC UNIT KERNEL FABSOCK [lower]: records a main figure of the
# case (higher is better unless "lower"); printed side by side by ra_done and
# appended to $FS_REALAPPS_RESULTS (if set) as a tab-separated line. A value
# may be a word ("failed", "n/a (not installed: X)": bench_realapps.sh); the
# ratio is then "-".
ra_figure() {
	local metric=$1 unit=$2 k=$3 f=$4 dir=${5:-higher} ratio
	ratio=$(awk -v k="$k" -v f="$f" 'BEGIN { n = "^[0-9]+([.][0-9]+)?$"
		if (k ~ n && f ~ n && k > 0) printf "%.2f", f / k; else print "-" }')
	RA_RESULTS+=("$(printf '%-44s %14s %14s %7sx  %s' "$RA_CASE: $metric ($unit)" "$k" "$f" "$ratio" "$dir is better")")
	if [ -n "${FS_REALAPPS_RESULTS:-}" ]; then
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$RA_CASE" "$metric" "$unit" "$k" "$f" "$ratio" "$dir" >>"$FS_REALAPPS_RESULTS"
	fi
}

# Prints the figures and the closing line; exits by the result.
ra_done() {
	local line
	ra_no_cores
	if [ "${#RA_RESULTS[@]}" -gt 0 ]; then
		# what the fabsock column is: the tests' settings, not a user's
		# (lib.sh turns the connection history and the step-back off, so
		# that every connection offloads and its bytes can be proved on
		# the fabric); bench_realapps.sh measures the defaults
		[ "${FABSOCK_HISTORY_SHORT:-}" != 0 ] && [ "${FABSOCK_STEPBACK:-}" != 0 ] ||
			echo "fabsock column: every connection offloaded (FABSOCK_HISTORY_SHORT=${FABSOCK_HISTORY_SHORT:-default}, FABSOCK_STEPBACK=${FABSOCK_STEPBACK:-default}: the tests' settings); what a user gets with the defaults: tests/scripts/bench_realapps.sh" >&2
		printf '%-44s %14s %14s %8s\n' "figure" "kernel TCP" "fabsock" "ratio" >&2
		for line in "${RA_RESULTS[@]}"; do
			echo "$line" >&2
		done
	fi
	fs_done
}
