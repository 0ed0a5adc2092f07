#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Peer death mid-stream (issue 4): fs_shapes source streams into fs_shapes
# sink, both under the preload (and once under kernel TCP, as the reference);
# once data flows, one end is kill -9'ed. The survivor, blocked in send or
# recv at that moment, must end by itself within 5 s: the source with EPIPE
# or ECONNRESET, the sink with EOF or ECONNRESET. Three rounds each way. The
# survivor's stats line must show the connection was offloaded, and the shm
# regions the killed processes left must be removed by the later ones; in
# fabsock mode TCP carried only the handshake (nftables, fs_tcp_proof).
. "$(dirname "$0")/lib.sh"
fs_need_nft

PROG=$FS_PROGS/fs_shapes
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }

# Waits up to 5 s for PID; if it is still running, records its threads'
# stacks (gdb, when installed) in FILE before fs_wait_pid kills it.
wait_survivor() { # PID FILE
	local i
	for i in $(seq 1 100); do
		kill -0 "$1" 2>/dev/null || break
		fs_sleep 0.05
	done
	if kill -0 "$1" 2>/dev/null && command -v gdb >/dev/null; then
		timeout 20 gdb -p "$1" -batch -ex 'thread apply all bt 12' >"$2" 2>&1 || true
	fi
	fs_wait_pid "$1" 1
}

round() { # MODE VICTIM N
	local mode=$1 victim=$2 n=$3 dir=$FS_TMP/$1-$2-$3 sink source port rc=0 start end survivor_out survivor_err
	local -a prefix=(env)
	[ "$mode" = fabsock ] && prefix=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	mkdir -p "$dir"
	fs_bg sink "${prefix[@]}" "$PROG" sink >"$dir/sink.out" 2>"$dir/sink.err"
	port=$(fs_listen_port "$dir/sink.out" "$sink")
	[ -n "$port" ] || { fs_fail "$mode $victim $n: no listener"; return; }
	fs_tcp_count_start "$port" || fs_fail "$mode $victim $n: nft counter not set up"
	fs_bg source "${prefix[@]}" "$PROG" source 127.0.0.1 "$port" >"$dir/source.out" 2>"$dir/source.err"
	if ! fs_wait_line "$dir/sink.out" '^streaming' "$sink"; then
		fs_fail "$mode $victim $n: no data flowed"
		return
	fi
	sleep 0.3
	start=$(date +%s%N)
	[ "$mode" = fabsock ] && VICTIMS+=("$([ "$victim" = sink ] && echo "$sink" || echo "$source")")
	if [ "$victim" = sink ]; then
		kill -9 "$sink"
		wait_survivor "$source" "$dir/stacks" || rc=$?
		survivor_out=$dir/source.out survivor_err=$dir/source.err
	else
		kill -9 "$source"
		wait_survivor "$sink" "$dir/stacks" || rc=$?
		survivor_out=$dir/sink.out survivor_err=$dir/sink.err
	fi
	end=$(date +%s%N)
	if [ "$rc" -ne 0 ]; then
		fs_fail "$mode: kill -9 of the $victim (round $n): the other end exited $rc after $(((end - start) / 1000000)) ms ($(grep -h 'ended' "$survivor_out"))"
		tail -n 3 "$survivor_err" >&2 || true
		# where it was stuck (libfabric's shm spinlock on the dead peer's
		# region is the known case: docs/design.md, "Peer death")
		grep -E '^#|^Thread' "$dir/stacks" 2>/dev/null | head -n 40 >&2 || true
	elif [ "$mode" = fabsock ] && ! grep -qE 'stats: offloaded=1' "$survivor_err"; then
		fs_fail "$mode: kill -9 of the $victim (round $n): the survivor's connection was not offloaded"
	else
		fs_pass "$mode: kill -9 of the $victim (round $n): $(grep -h 'ended' "$survivor_out") $(((end - start) / 1000000)) ms later"
	fi
	fs_tcp_proof "$mode: kill -9 of the $victim (round $n)" "$mode" 1
}

VICTIMS=()
for victim in sink source; do
	round kernel "$victim" 1
	for n in 1 2 3; do
		round fabsock "$victim" "$n"
	done
done

# A SIGKILLed process cannot remove its shm region; the next fabsock process
# of the PID namespace that opens its shm rail does. Every victim but the
# last was followed by such a process here.
stale=""
for pid in "${VICTIMS[@]:0:${#VICTIMS[@]}-1}"; do
	for f in /dev/shm/fabsock-*-"$pid"-*; do
		[ -e "$f" ] && stale="$stale $f"
	done
done
if [ -n "$stale" ]; then
	fs_fail "shm regions of killed processes were not cleaned:$stale"
else
	fs_pass "the shm regions of the $((${#VICTIMS[@]} - 1)) earlier killed processes were removed by later ones"
fi
fs_done
