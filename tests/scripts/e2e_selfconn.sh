#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One thread talks to its own listener (issue 26; tests/progs/fs_selfconn.c):
# it connects, sends (blocking 100 B and 1 MiB, nonblocking 100 B and
# 4 MiB) before it accepts, accepts and reads later, and runs an echo with
# a banner through its own listener. The kernel never blocks there; under
# fabsock the client waited for a HELLO-ACK that only the same thread's
# later use of the accepted socket sends, and hung. Each scenario runs in
# its own process under a 30 s watchdog (a hang fails it), bytes checked
# against the pattern, errno values the kernel's; in every mode: the
# kernel, fabsock, fabsock with the provider failing to open (an empty
# HELLO), and fabsock with an `offload` rule (no probe). peer_late: the
# same between two processes (the server accepts only once the client says
# it sent): offloaded, or with the empty HELLO on TCP. Under fabsock such
# a connection stays on kernel TCP (`fallback_own_listener`): its server
# end has no descriptor until this process accepts it, so nothing could
# answer its HELLO before the thread that waits does. prefork_1m: a worker
# that inherited its parent's listener and accepted from it connects to it
# and writes 1 MiB before accepting: the same, for a prefork server.
. "$(dirname "$0")/lib.sh"

PROG=$FS_PROGS/fs_selfconn
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
mapfile -t SCENARIOS < <("$PROG" list)
[ "${#SCENARIOS[@]}" -ge 6 ] || { fs_fail "fs_selfconn lists ${#SCENARIOS[@]} scenarios"; fs_done; exit 1; }

run_mode() { # MODE: runs every scenario, checks, reports
	local mode=$1 sc rc out err own
	local envs=()
	case $mode in
	kernel) ;;
	fabsock) envs=(LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1) ;;
	fault) envs=(LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_TEST_PROVIDER_FAIL=1) ;;
	rule) envs=(LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_RULES="offload any 127.0.0.1") ;;
	esac
	for sc in "${SCENARIOS[@]}"; do
		out=$FS_TMP/$mode.$sc.out
		err=$FS_TMP/$mode.$sc.err
		rc=0
		timeout 60 env "${envs[@]}" "$PROG" "$sc" >"$out" 2>"$err" || rc=$?
		if [ "$rc" != 0 ] || ! grep -qx "PASS $sc" "$out"; then
			fs_fail "$mode $sc: exit $rc: $(grep -h -m 3 -E 'FAIL|watchdog' "$out" "$err" | tr '\n' ' ')"
			continue
		fi
		if [ "$sc" = peer_late ]; then
			# two processes: offloaded, or (fault) stayed on TCP after an
			# empty HELLO, the client's sends not waiting for the NAK
			local off prov
			off=$(fs_stat_sum "$err" offloaded)
			prov=$(fs_stat_sum "$err" fallback_provider)
			case $mode in
			fault) [ "$off" = 0 ] && [ "${prov:-0}" -ge 1 ] ;;
			fabsock | rule) [ "$off" = 2 ] ;;
			*) true ;;
			esac || {
				fs_fail "$mode $sc: passed, but offloaded=$off fallback_provider=$prov"
				continue
			}
			fs_pass "$mode $sc: $(sed -n 's/^info peer_late: //p' "$out"), bytes exact"
			continue
		fi
		if [ "$sc" = prefork_1m ]; then
			# the worker's second connection, to the listener it
			# inherited and accepts from, stayed on TCP (its first, made
			# before it accepted, may be offloaded: the parent answers)
			own=$(fs_stat_sum "$err" fallback_own_listener)
			if [ "$mode" != kernel ] && [ "${own:-0}" -lt 1 ]; then
				fs_fail "$mode $sc: passed, but fallback_own_listener=${own:-none}, expected >= 1"
				continue
			fi
			fs_pass "$mode $sc: no hang, bytes exact$([ "$mode" != kernel ] && echo ", the worker's own client on TCP")"
			continue
		fi
		if [ "$mode" != kernel ]; then
			own=$(fs_stat "$err" fallback_own_listener)
			if [ "${own:-0}" -lt 1 ] || [ "$(fs_stat "$err" offloaded)" != 0 ]; then
				fs_fail "$mode $sc: passed, but not as a connection to its own listener on TCP (fallback_own_listener=${own:-none}, offloaded=$(fs_stat "$err" offloaded))"
				continue
			fi
		fi
		fs_pass "$mode $sc: no hang, bytes exact$([ "$mode" != kernel ] && echo ", on TCP as its own listener's client")"
	done
}

for mode in $FS_MODES; do
	run_mode "$mode"
	[ "$mode" = fabsock ] && { run_mode fault; run_mode rule; }
done
fs_done
