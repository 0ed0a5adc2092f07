#!/bin/bash
# SPDX-License-Identifier: MIT
# Real applications whose connections settle on kernel TCP after the
# negotiation began (issue 26), every process under the preload:
#   - memcaslap (libmemcached-tools; libevent, one worker thread) as root
#     against memcached -u nobody: every connection is refused as "another
#     user" and stays on TCP. memcaslap -t 1s -c 16 runs RA_SETTLE_RUNS times
#     (default 20), each under a hard 20 s timeout; each must end with its
#     summary (Ops > 0), offloaded=0 and fallback_other_user >= 16. It used
#     to hang at exit in 1 of 2-5 runs (an epoll record converted after
#     the application's own epoll_ctl put back the EPOLLOUT of before);
#   - in a private mount namespace whose /dev/shm is a 2 MiB tmpfs (too
#     small for the shm provider's region: the clients send an empty HELLO):
#     redis-benchmark -n 200 -c 1 -t set against redis-server,
#     RA_SETTLE_RUNS times under a hard 20 s timeout (it never finished: a
#     busy loop on that same EPOLLOUT), offloaded=0 and fallback_provider
#     counted; redis-cli storing and reading back a 100 KB value; a blocking
#     fs_stream of 10 MiB, checked byte for byte, on TCP.
# .ci/run sets RA_SETTLE_RUNS=2 (release and ASan: 4 memcaslap runs per CI,
# which a 1-in-4 hang escapes with a probability of 32 %; the release race
# behind the last, rarer one has its own widened test, e2e_settle
# "release"); the 20 runs in a row of issue 26's stop check are the default.

. "$(dirname "$0")/realapps_lib.sh"
# memcaslap must reach the negotiation and its refusal (the path under
# test): with listener records (core/records.h) a root client of nobody's
# memcached would say no before it. e2e_records covers the early no.
export FABSOCK_RECORDS=0

ra_need memcached memcaslap redis-server redis-benchmark redis-cli setpriv unshare cmp base64
id nobody >/dev/null 2>&1 || fs_skip "no nobody user"
unshare -m true 2>/dev/null || fs_skip "no permission for a private mount namespace"
RUNS=${RA_SETTLE_RUNS:-20}
PRE=(env "LD_PRELOAD=$RA_LIB" FABSOCK_STATS=1)

# ---- memcaslap against memcached -u nobody -----------------------------------

port=$(fs_free_port) || { fs_fail "no free port"; fs_done; exit 1; }
fs_bg mc "${PRE[@]}" memcached -u nobody -U 0 -l 127.0.0.1 -p "$port" >"$RA_DIR/memcached.out" 2>"$RA_DIR/memcached.err"
if fs_wait_listen "$port"; then
	bad=0
	for i in $(seq 1 "$RUNS"); do
		rc=0
		timeout -s KILL 20 "${PRE[@]}" memcaslap -s "127.0.0.1:$port" -t 1s -c 16 \
			>"$RA_DIR/slap.$i.out" 2>"$RA_DIR/slap.$i.err" &
		slap=$!
		# a hang says where each thread waits before it is killed
		ra_stacks_if_running "$slap" 15 memcaslap
		wait "$slap" || rc=$?
		off=$(fs_stat "$RA_DIR/slap.$i.err" offloaded)
		other=$(fs_stat "$RA_DIR/slap.$i.err" fallback_other_user)
		if [ "$rc" != 0 ]; then
			fs_fail "memcaslap run $i: exit $rc$([ "$rc" = 137 ] && echo ' (killed after 20 s: a hang)')"
			bad=$((bad + 1))
		elif ! grep -qE '^Run time: .* Ops: [1-9]' "$RA_DIR/slap.$i.out"; then
			fs_fail "memcaslap run $i: no summary with operations: $(tail -n 2 "$RA_DIR/slap.$i.out" | tr '\n' ' ')"
			bad=$((bad + 1))
		elif [ "$off" != 0 ] || [ "${other:-0}" -lt 16 ]; then
			fs_fail "memcaslap run $i: offloaded=${off:-none} fallback_other_user=${other:-none}, expected 0 and >= 16"
			bad=$((bad + 1))
		fi
	done
	[ "$bad" = 0 ] && fs_pass "memcaslap -t 1s -c 16 against memcached -u nobody: $RUNS runs, each ended, on TCP ($(grep -h '^Run time' "$RA_DIR/slap.$RUNS.out"))"
	kill -0 "$mc" 2>/dev/null || fs_fail "memcached died: $(tail -n 3 "$RA_DIR/memcached.err" | tr '\n' ' ')"
	kill -TERM "$mc" 2>/dev/null || true
	fs_wait_pid "$mc" 10 >/dev/null || fs_fail "memcached did not leave on SIGTERM"
else
	fs_fail "memcached did not listen: $(tail -n 3 "$RA_DIR/memcached.err" | tr '\n' ' ')"
fi

# ---- redis and a stream with a 2 MiB /dev/shm ----------------------------------

# Runs inside the namespace; prints `ok WHAT` and `FAIL WHAT` lines.
cat >"$RA_DIR/shm_full.sh" <<'EOF'
port=$1 dir=$2 lib=$3 progs=$4 runs=$5
pre=(env "LD_PRELOAD=$lib" FABSOCK_STATS=1)
mount -t tmpfs -o size=2m fabsock_test_shm /dev/shm || { echo "FAIL cannot mount a tmpfs on /dev/shm"; exit 0; }
"${pre[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$dir/redis.out" 2>"$dir/redis.err" &
rs=$!
for _ in $(seq 1 200); do ss -Htln "sport = :$port" | grep -q . && break; sleep 0.05; done
bad=0
for i in $(seq 1 "$runs"); do
	rc=0
	timeout -s KILL 20 "${pre[@]}" redis-benchmark -p "$port" -n 200 -c 1 -t set -q >"$dir/bench.$i.out" 2>"$dir/bench.$i.err" || rc=$?
	stats=$(grep -o ': stats: .*' "$dir/bench.$i.err" | tail -n 1)
	if [ "$rc" != 0 ] || ! grep -q 'SET: .*requests per second' "$dir/bench.$i.out"; then
		echo "FAIL redis-benchmark run $i: exit $rc$([ "$rc" = 137 ] && echo ' (killed after 20 s)')"; bad=1
	elif [[ "$stats" != *" offloaded=0 "* ]] || [[ "$stats" == *" fallback_provider=0 "* ]]; then
		echo "FAIL redis-benchmark run $i: expected offloaded=0 and fallback_provider >= 1: $stats"; bad=1
	fi
done
[ "$bad" = 0 ] && echo "ok redis-benchmark -n 200 -c 1 -t set: $runs runs, on TCP ($(tr '\r' '\n' <"$dir/bench.$runs.out" | grep 'requests per second' | tail -n 1))"
head -c 75000 /dev/urandom | base64 -w0 >"$dir/value"
if timeout 20 "${pre[@]}" redis-cli -p "$port" -x set big <"$dir/value" >"$dir/cli.out" 2>"$dir/cli.err" &&
	timeout 20 "${pre[@]}" redis-cli -p "$port" --raw get big >"$dir/value.back" 2>>"$dir/cli.err" &&
	cmp -s <(cat "$dir/value"; echo) "$dir/value.back"; then
	echo "ok redis-cli: a 100 KB value stored and read back equal"
else
	echo "FAIL redis-cli: the value did not come back equal: $(tail -n 2 "$dir/cli.err" | tr '\n' ' ')"
fi
kill -TERM "$rs"
wait "$rs" || echo "FAIL redis-server exit $?"
# a blocking stream of 10 MiB
"${pre[@]}" "$progs/fs_stream" server --port 0 --ready-file "$dir/ready" --bytes 10M --timeout 60 >"$dir/ss.out" 2>"$dir/ss.err" &
sp=$!
for _ in $(seq 1 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
crc=0
timeout -s KILL 70 "${pre[@]}" "$progs/fs_stream" client 127.0.0.1 "$(cat "$dir/ready")" --bytes 10M --timeout 60 \
	>"$dir/sc.out" 2>"$dir/sc.err" || crc=$?
src=0
wait "$sp" || src=$?
if [ "$crc" = 0 ] && [ "$src" = 0 ] && grep -q '^result ok' "$dir/sc.out" && grep -q '^result ok' "$dir/ss.out" &&
	grep -q 'stats: offloaded=0 ' "$dir/sc.err" && grep -q 'fallback_provider=[1-9]' "$dir/sc.err"; then
	echo "ok a blocking stream of 10 MiB, checked, on TCP"
else
	echo "FAIL the 10 MiB stream: client $crc server $src: $(grep -h '^result' "$dir/sc.out" "$dir/ss.out" | tr '\n' ' ')"
fi
EOF

port=$(fs_free_port) || { fs_fail "no free port"; fs_done; exit 1; }
fs_bg ns unshare -m bash "$RA_DIR/shm_full.sh" "$port" "$RA_DIR" "$RA_LIB" "$FS_PROGS" "$RUNS" >"$RA_DIR/shm_full.out" 2>&1
fs_wait_pid "$ns" $((RUNS * 25 + 120)) || fs_fail "the /dev/shm-full part did not end in time"
grep -q '^ok\|^FAIL' "$RA_DIR/shm_full.out" || fs_fail "the /dev/shm-full part printed nothing: $(tail -n 3 "$RA_DIR/shm_full.out")"
while read -r verdict what; do
	case $verdict in
	ok) fs_pass "/dev/shm 2 MiB: $what" ;;
	FAIL) fs_fail "/dev/shm 2 MiB: $what" ;;
	esac
done <"$RA_DIR/shm_full.out"
fs_done
