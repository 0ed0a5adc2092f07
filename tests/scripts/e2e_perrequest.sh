#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A connection per request, many in a row (issue 13, item 7: a backend
# behind a proxy reported "the shm receive queue (1024 entries) is full"
# after ~340 connections with only 8 open at once: closed streams kept
# their receives). One fabsock-netbench server under the preload; CLIENTS
# preloaded client processes at once, each making COUNT sequential
# connections (connect, 9 bytes out, 1 byte back, close; the byte differs
# from one connection to the next and the client exits 1 unless the echo
# is it), so at most
# CLIENTS are open at a time and CLIENTS x (COUNT + 10) pass through the
# server, many times what its endpoint's receive queue could hold if a
# closed stream kept its receives. Every connection must be offloaded on
# both ends (stats: offloaded equals the count, kernel 0), no process may
# fail, the server must answer a last client afterwards, and nothing may
# log a full receive queue. Kernel TCP runs the same load first, for the
# figures side by side.
# Issue 14's measure of it: COUNT makes 8 x 2510 + 11 = 20,091 connections
# through the one server process, and nothing may leak: the server frees
# every stream it offloaded (streams_freed), holds as many descriptors and
# threads after the load as before it, its memory does not grow with the
# count (VmRSS after all of them against after the first tenth, at most
# LEAK_KIB more; not checked under a sanitizer, whose quarantine holds
# freed memory), and /dev/shm holds no more files than before.
. "$(dirname "$0")/lib.sh"

NETBENCH=${FS_BUILD:-}/tools/fabsock-netbench
[ -x "$NETBENCH" ] || { fs_fail "no $NETBENCH (FS_BUILD must name the build directory)"; fs_done; exit 1; }
CLIENTS=8
# Under a sanitizer 500: 8 x 510 + 11 = 4,091 connections still pass four
# times the receive queue's 1024 entries through the server (what issue 13's
# leak needs to show), and the memory check that wants the whole count is
# off there (below); 20,091 took 33 s of CI's ASan stage.
if [ -n "${ASAN_OPTIONS:-}${TSAN_OPTIONS:-}" ]; then
	COUNT=${FS_PERREQUEST_COUNT:-500}
else
	COUNT=${FS_PERREQUEST_COUNT:-2500}
fi
WARMUP=10     # fabsock-netbench connect makes 10 untimed connections first
LEAK_KIB=4096 # VmRSS growth allowed over the last nine tenths of the load

# count PATH...: how many paths a glob gave (0 when it matched nothing and
# gave its pattern back), in the shell: a find and a wc per look were two
# processes, and the clients' files alone are 16 looks per mode
count() { if [ -e "$1" ] || [ -L "$1" ]; then echo "$#"; else echo 0; fi; }
fds() { count /proc/"$1"/fd/*; }
threads() { awk '/^Threads:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
# /dev/shm files named for process PID (other tests run beside this one:
# only this test's processes' files are counted)
shm_files() { count /dev/shm/fabsock-*-"$1"-*; }
# settle MODE SERVER FD0: after a load, until the server has let go of it.
# Under fabsock the last streams' FINs reach the server's engine, which
# frees them: a second. The kernel's server has closed every connection
# once it holds FD0 descriptors again (at most a second; it slept that
# second out, 3 s of the kernel half).
settle() {
	local i
	if [ "$1" = fabsock ]; then
		sleep 1
		return 0
	fi
	for ((i = 0; i < 20; i++)); do
		[ "$(fds "$2")" -gt "$3" ] || return 0
		fs_sleep 0.05
	done
}

run() { # MODE
	local mode=$1 dir=$FS_TMP/$1 srv port i rc total=0 fails=$FS_FAILS
	local -a pre=(env -u LD_PRELOAD) pids=() clients=()
	[ "$mode" = fabsock ] && pre=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	mkdir -p "$dir"
	fs_bg srv "${pre[@]}" "$NETBENCH" server --port 0 --ready-file "$dir/ready" >"$dir/server.out" 2>"$dir/server.err"
	for _ in $(seq 1 200); do [ -s "$dir/ready" ] && break; fs_sleep 0.05; done
	port=$(cat "$dir/ready" 2>/dev/null || true)
	[ -n "$port" ] || { fs_fail "$mode: the server did not start"; return 0; }
	# the server's own resources once it has served one connection (its
	# engine and fabric are open then), and /dev/shm's files
	timeout 30 "${pre[@]}" "$NETBENCH" connect 127.0.0.1 "$port" --count 1 >"$dir/first.out" 2>"$dir/first.err" ||
		fs_fail "$mode: the first connection failed"
	sleep 0.2
	local fd0 th0 rss1 rss2 shm0 fd1 th1
	fd0=$(fds "$srv") th0=$(threads "$srv") shm0=$(shm_files "$srv")
	# a first tenth of the load, then the rest: what grows between the two
	# grows with the count
	for phase in 1 2; do
		local n=$((COUNT / 10))
		[ "$phase" = 2 ] && n=$((COUNT - COUNT / 10))
		pids=()
		for i in $(seq 1 "$CLIENTS"); do
			# (no timeout wrapper: the recorded pid is the client, whose /dev/shm
			# files are counted below; fs_wait_pid bounds it)
			fs_bg "pid_$i" "${pre[@]}" "$NETBENCH" connect 127.0.0.1 "$port" --count "$n" \
				>"$dir/client$i.$phase.out" 2>"$dir/client$i.$phase.err"
			pids+=("$(eval echo "\$pid_$i")")
			clients+=("$(eval echo "\$pid_$i")")
		done
		for i in $(seq 1 "$CLIENTS"); do
			rc=0
			fs_wait_pid "${pids[$((i - 1))]}" 330 || rc=$?
			if [ "$rc" -ne 0 ] || ! grep -q "^connections=$n " "$dir/client$i.$phase.out"; then
				fs_fail "$mode: client $i (phase $phase) exit $rc: $(tail -n 2 "$dir/client$i.$phase.err" | tr '\n' ' ')"
			fi
		done
		settle "$mode" "$srv" "$fd0"
		[ "$phase" = 1 ] && rss1=$(rss "$srv")
	done
	rss2=$(rss "$srv") fd1=$(fds "$srv") th1=$(threads "$srv")
	[ "$fd1" -le "$fd0" ] || fs_fail "$mode: the server held $fd0 descriptors before the load and $fd1 after it"
	[ "$th1" -le "$th0" ] || fs_fail "$mode: the server ran $th0 threads before the load and $th1 after it"
	# (not under a sanitizer: ASan keeps up to 256 MiB of freed memory in
	# quarantine, and the server grew by 100 MiB on the kernel too)
	if [ -z "${ASAN_OPTIONS:-}${TSAN_OPTIONS:-}" ]; then
		[ "$rss2" -le $((rss1 + LEAK_KIB)) ] ||
			fs_fail "$mode: the server's VmRSS grew from $rss1 KiB (a tenth of the load) to $rss2 KiB (all of it)"
	fi
	[ "$(shm_files "$srv")" -le "$shm0" ] ||
		fs_fail "$mode: /dev/shm held $shm0 files of the server before the load and $(shm_files "$srv") after it"
	local left=0
	for i in "${clients[@]}"; do left=$((left + $(shm_files "$i"))); done
	[ "$left" -eq 0 ] || fs_fail "$mode: /dev/shm holds $left files of the ${#clients[@]} clients, which have exited"
	fs_log "$mode: server descriptors $fd0 -> $fd1, threads $th0 -> $th1, VmRSS ${rss1} KiB at a tenth -> ${rss2} KiB"
	# the server still answers afterwards
	rc=0
	timeout 30 "${pre[@]}" "$NETBENCH" connect 127.0.0.1 "$port" --count 1 >"$dir/last.out" 2>"$dir/last.err" || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$mode: the server no longer answers a new client (exit $rc)"
	settle "$mode" "$srv" "$fd0"
	kill -TERM "$srv" 2>/dev/null || true
	rc=0
	fs_wait_pid "$srv" 30 || rc=$?
	[ "$rc" -eq 0 ] || fs_fail "$mode: server exit $rc"
	rate=$(awk -F'per_sec=' '/^connections=/ { split($2, a, " "); s += a[1] } END { printf "%.0f", s }' "$dir"/client*.2.out)
	RATE[$mode]=$rate
	if [ "$mode" = fabsock ]; then
		local off kern freed want phase
		for phase in 1 2; do
			want=$((COUNT / 10 + WARMUP))
			[ "$phase" = 2 ] && want=$((COUNT - COUNT / 10 + WARMUP))
			for i in $(seq 1 "$CLIENTS"); do
				off=$(fs_stat "$dir/client$i.$phase.err" offloaded)
				kern=$(fs_stat "$dir/client$i.$phase.err" kernel)
				[ "${off:-x}" = "$want" ] && [ "${kern:-x}" = 0 ] ||
					fs_fail "$mode: client $i (phase $phase) offloaded=${off:-none} kernel=${kern:-none}, expected $want and 0 ($(fs_stats_fallbacks "$dir/client$i.$phase.err"))"
			done
		done
		# the load, and the first and the last client (1 + WARMUP each)
		want=$((CLIENTS * (COUNT + 2 * WARMUP) + 2 * (WARMUP + 1)))
		off=$(fs_stat "$dir/server.err" offloaded)
		kern=$(fs_stat "$dir/server.err" kernel)
		freed=$(fs_stat "$dir/server.err" streams_freed)
		[ "${off:-x}" = "$want" ] && [ "${kern:-x}" = 0 ] ||
			fs_fail "$mode: server offloaded=${off:-none} kernel=${kern:-none}, expected $want and 0 ($(fs_stats_fallbacks "$dir/server.err"))"
		[ "${freed:-x}" = "${off:-y}" ] || fs_fail "$mode: the server offloaded ${off:-?} streams and freed ${freed:-?}"
		if grep -qi 'queue.*full\|full.*queue' "$dir"/*.err; then
			fs_fail "$mode: a receive queue filled up: $(grep -hi 'full' "$dir"/*.err | head -n 1)"
		fi
	fi
	[ "$FS_FAILS" = "$fails" ] && fs_pass "$mode: $CLIENTS clients x $COUNT connections in a row, ${rate} conn/s in all"
	return 0
}

declare -A RATE
for mode in $FS_MODES; do
	run "$mode"
done
fs_log "connection per request, $CLIENTS clients x $COUNT (the last nine tenths): kernel ${RATE[kernel]:-?} conn/s, fabsock ${RATE[fabsock]:-?} conn/s"
fs_done
