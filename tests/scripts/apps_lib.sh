# SPDX-License-Identifier: MIT
# Shared by the apps_* acceptance scripts: running a real server/client pair
# in kernel or fabsock mode, sampling `ss` for the proof that the bytes went
# over the fabric, and reading the stats lines. Source it after lib.sh with
# APP_NAME (for messages) and MIN_MOVED (bytes the program must move for the
# path check to mean anything) set.
: "${APP_NAME:?set APP_NAME before sourcing}"
command -v ss >/dev/null 2>&1 || fs_skip "ss is not installed (apt-get install iproute2)"
command -v timeout >/dev/null 2>&1 || fs_skip "timeout is missing"
[ -f "$FABSOCK_LIB" ] || fs_skip "no library at $FABSOCK_LIB"

DURATION=3
SS_LIMIT=${SS_LIMIT:-65536} # fabsock mode: most bytes one TCP connection may receive
# The kernel runs of a script: one per way of sampling (the proof that the
# check can fail) by default; FS_APPS_KERNEL_ALL=1 runs the kernel side of
# every variant too. Those extra kernel runs check nothing of fabsock; the
# kernel figures of `fabsock bench` (which CI runs too) cover iperf3 -P 1
# and -P 4, iperf 2's one stream and redis -c 50 plain and -P 16, not
# iperf3 -R and --bidir nor iperf 2 -P 2.
apps_kernel_all() { [ "${FS_APPS_KERNEL_ALL:-0}" = 1 ]; }
: "${MIN_MOVED:?set MIN_MOVED (bytes the program must move) before sourcing}"

# Programs run as: fs_bg PID timeout ... env VARS program. The env(1) applies
# the same settings as fs_pre (lib.sh) but after timeout(1), so only the
# application is preloaded (timeout itself prints no stats line), and the pid
# fs_bg records is timeout's: SIGINT to it reaches the program, which then
# exits through exit() and the library prints its counters; timeout runs in
# its own process group, which apps_cleanup kills if anything is left.
apps_env() {
	case $1 in
	kernel) APP_ENV=(env -u LD_PRELOAD) ;;
	fabsock) APP_ENV=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1) ;;
	esac
}

apps_cleanup() {
	local pid
	for pid in "${FS_PIDS[@]:-}"; do
		[ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null || true
	done
	fs_cleanup
}
trap apps_cleanup EXIT

# Stops a background program politely (SIGINT), by force after 15 s.
apps_stop() {
	local pid=$1 i
	kill -INT "$pid" 2>/dev/null || true
	for i in $(seq 1 300); do
		kill -0 "$pid" 2>/dev/null || break
		fs_sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null; then
		fs_log "pid $pid ignored SIGINT for 15 s: killed"
		kill -KILL -- "-$pid" 2>/dev/null || true
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

# Prints "CONNECTIONS MAX_BYTES_RECEIVED" for the established TCP connections
# on PORT (either end). ss omits bytes_received when it is 0.
apps_ss_sample() {
	ss -Htin state established "( sport = :$1 or dport = :$1 )" 2>/dev/null | awk '
		/^[^ \t]/ { n++; next }
		match($0, /bytes_received:[0-9]+/) {
			v = substr($0, RSTART + 15, RLENGTH - 15) + 0
			if (v > max) max = v
		}
		END { printf "%d %.0f\n", n, max }'
}

# Samples `ss -tin` on PORT while PID runs, every 0.1 s for the first 2 s,
# then every 0.5 s (a single sample taken at a fixed time could land before
# the data starts: sockperf's client waits ~2 s after connecting; and
# redis-benchmark's 200,000 requests over offloaded sockets are done in
# 0.3 s); sets SS_CONNS and SS_RXMAX to the largest seen.
apps_sample_while() {
	local pid=$1 port=$2 c r i
	SS_CONNS=0 SS_RXMAX=0
	for i in $(seq 1 $(((DURATION + 40) * 2 + 20))); do
		if [ "$i" -le 20 ]; then fs_sleep 0.1; else fs_sleep 0.5; fi
		kill -0 "$pid" 2>/dev/null || break
		read -r c r < <(apps_ss_sample "$port")
		[ "$c" -gt "$SS_CONNS" ] && SS_CONNS=$c
		[ "$r" -gt "$SS_RXMAX" ] && SS_RXMAX=$r
	done
	return 0
}

# Highest offloaded=N among the stats lines of a log ("" if none).
apps_offloaded() {
	sed -n 's/.*fabsock\[[0-9]*\]: [a-z]*: stats:.*offloaded=\([0-9][0-9]*\).*/\1/p' "$1" |
		sort -n | tail -1
}

# Checks what only holds when the bytes went over the fabric (fabsock) or
# over the kernel (kernel mode): stats lines and the ss sample.
apps_check_path() {
	local mode=$1 what=$2 srv_err=$3 cli_err=$4 conns=$5 rxmax=$6 moved=$7 s c
	if [ "$moved" -lt "$MIN_MOVED" ]; then
		fs_fail "$mode $what: $APP_NAME moved only $moved bytes (< $MIN_MOVED), too little to judge the path"
		return
	fi
	if [ "$conns" -lt 1 ]; then
		fs_fail "$mode $what: ss saw no TCP connection on the port during the run"
		return
	fi
	if [ "$mode" = kernel ]; then
		if [ "$rxmax" -ge "$SS_LIMIT" ]; then
			fs_pass "kernel $what: ss during the run shows the bytes on TCP ($rxmax bytes received)"
		else
			fs_fail "kernel $what: ss during the run shows only $rxmax bytes on TCP: the sampling cannot tell fabric from TCP"
		fi
		return
	fi
	if [ "$rxmax" -lt "$SS_LIMIT" ]; then
		fs_pass "fabsock $what: TCP connections received at most $rxmax bytes during the run while $APP_NAME moved $moved"
	else
		fs_fail "fabsock $what: a TCP connection received $rxmax bytes during the run (>= $SS_LIMIT): data went over the kernel"
	fi
	s=$(apps_offloaded "$srv_err")
	c=$(apps_offloaded "$cli_err")
	# A server stopped with SIGINT may leave through _exit() (iperf 2 does,
	# depending on timing), which skips the exit-time stats line. The ss
	# check above already covers the server's receiving side, so a missing
	# server line is noted; a line that says 0 is a failure.
	if [ -z "$s" ]; then
		fs_log "note: $what: the server left without printing stats (exited without atexit handlers)"
		s=n/a
	fi
	if [ "$s" != 0 ] && [ "${c:-0}" -ge 1 ]; then
		fs_pass "fabsock $what: stats offloaded server=$s client=$c"
	else
		fs_fail "fabsock $what: stats offloaded server=$s client=${c:-no stats line} (need >= 1 each)"
	fi
}

# After starting server PID on PORT: returns 0 once it listens; otherwise
# fails LABEL with the server's stderr (LOG-server.err), stops it, returns 1.
apps_wait_server() { # LABEL PORT PID LOG
	fs_wait_listen "$2" && return 0
	fs_fail "$1: the server did not listen"
	sed 's/^/    /' "$4-server.err" >&2 || true
	apps_stop "$3"
	return 1
}
