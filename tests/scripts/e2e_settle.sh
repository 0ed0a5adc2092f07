#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Connections that settle on kernel TCP after their negotiation began, while
# both ends wait in epoll_wait and then change what they wait for
# (tests/progs/fs_settle.c: LT with DEL and ADD, ET and ONESHOT with MOD;
# woken by data, by EOF and by an eventfd and a pipe in the same set; the
# stream checked byte for byte; every wait bounded). Issue 26: memcaslap
# against memcached -u nobody hung at exit when an epoll record converted
# after the application's own epoll_ctl put back the events of before.
# Setups (both ends under the preload):
#   user  the server runs as nobody (setpriv): the HELLO is refused with
#         FS_NAK_USER (client counts fallback_other_user);
#   rule  FABSOCK_RULES makes the server refuse the probe (client counts
#         fallback_probe_refused);
#   shm   a private mount namespace with a 2 MiB tmpfs on /dev/shm, too small
#         for the provider's region: the client's provider cannot open, it
#         sends an empty HELLO (client counts fallback_provider);
#   fault the provider's open fails by FABSOCK_TEST_PROVIDER_FAIL=1 on the
#         client (fault injection; counts fallback_provider);
#   release as user, in mode lt-busy (the client waits in epoll_wait while
#         the NAK comes) RELEASE_RUNS times, the client's release of the
#         socket to the kernel widened by FABSOCK_TEST_RELEASE_DELAY_US: a
#         look of epoll_wait at the member in that moment took the socket
#         for closed and freed its record, whose kernel entry kept fabsock's
#         tag, and every later event of the socket was dropped (memcaslap's
#         hang at exit, 1 run in 50-100 under ASan).
# Each setup runs each mode FS_SETTLE_ROUNDS times (default 1). A run passes
# when both ends exit 0 with their PASS line, neither offloaded anything,
# the client counted the setup's reason, and nothing was left running.
. "$(dirname "$0")/lib.sh"
# These setups must reach the negotiation: with listener records
# (core/records.h) the user and rule clients would say no before it (no
# record of theirs), and the paths under test would not run. e2e_records
# and e2e_users cover the early no.
export FABSOCK_RECORDS=0

PROG=$FS_PROGS/fs_settle
ROUNDS=${FS_SETTLE_ROUNDS:-1}
SETUPS=${FS_SETTLE_SETUPS:-user rule shm fault release}
MODES="lt et oneshot"
RELEASE_RUNS=${FS_SETTLE_RELEASE_RUNS:-6}
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
command -v setpriv >/dev/null || fs_skip "setpriv is missing (util-linux)"
command -v unshare >/dev/null || fs_skip "unshare is missing (util-linux)"
id nobody >/dev/null 2>&1 || fs_skip "no nobody user"
# nobody must reach the program and the library
setpriv --reuid=nobody --regid="$(id -gn nobody)" --clear-groups -- test -x "$PROG" -a -r "$FABSOCK_LIB" ||
	fs_skip "nobody cannot run $PROG or read $FABSOCK_LIB"
unshare -m true 2>/dev/null || fs_skip "no permission for a private mount namespace"

# One run of a pair, inside a private mount namespace for the shm setup: it
# writes DIR/server.*, DIR/client.* and DIR/rc (`client=RC server=RC`).
cat >"$FS_TMP/pair.sh" <<'EOF'
setup=$1 mode=$2 dir=$3 prog=$4 lib=$5
spre=() senv=() cenv=()
case $setup in
user) spre=(setpriv --reuid=nobody --regid="$(id -gn nobody)" --clear-groups --) ;;
release)
	spre=(setpriv --reuid=nobody --regid="$(id -gn nobody)" --clear-groups --)
	cenv=(FABSOCK_TEST_RELEASE_DELAY_US=40000)
	;;
rule) senv=("FABSOCK_RULES=kernel server *:*") ;;
shm) mount -t tmpfs -o size=2m fs_settle_shm /dev/shm || { echo "client=90 server=90" >"$dir/rc"; exit 0; } ;;
fault) cenv=(FABSOCK_TEST_PROVIDER_FAIL=1) ;;
esac
"${spre[@]}" env LD_PRELOAD="$lib" FABSOCK_STATS=1 "${senv[@]}" "$prog" server 0 "$mode" \
	>"$dir/server.out" 2>"$dir/server.err" &
sp=$!
port=
for _ in $(seq 1 200); do
	port=$(sed -n 's/^listening port=//p' "$dir/server.out")
	[ -n "$port" ] && break
	kill -0 "$sp" 2>/dev/null || break
	sleep 0.05
done
crc=91
# the probe's answer may be late on a loaded host (sanitizers, two cores): a
# probe timeout would settle the connection before its HELLO, which is not
# what is tested here
[ -n "$port" ] && { timeout -s KILL 45 env LD_PRELOAD="$lib" FABSOCK_STATS=1 FABSOCK_PROBE_TIMEOUT_MS=3000 "${cenv[@]}" \
	"$prog" client "$port" "$mode" \
	>"$dir/client.out" 2>"$dir/client.err"; crc=$?; }
for _ in $(seq 1 300); do kill -0 "$sp" 2>/dev/null || break; sleep 0.05; done
kill -9 "$sp" 2>/dev/null && echo "server killed after 15 s" >>"$dir/server.out"
wait "$sp"; src=$?
echo "client=$crc server=$src" >"$dir/rc"
EOF

reason_of() { # SETUP
	case $1 in
	user | release) echo fallback_other_user ;;
	rule) echo fallback_probe_refused ;;
	shm | fault) echo fallback_provider ;;
	esac
}

run_pair() { # SETUP MODE ROUND
	local setup=$1 mode=$2 label="$1-$2-$3" dir=$FS_TMP/$1-$2-$3 runner rc side off reason n
	local fails_before=$FS_FAILS
	mkdir -p "$dir"
	chmod 755 "$dir"
	if [ "$setup" = shm ]; then
		fs_bg runner unshare -m bash "$FS_TMP/pair.sh" "$setup" "$mode" "$dir" "$PROG" "$FABSOCK_LIB"
	else
		fs_bg runner bash "$FS_TMP/pair.sh" "$setup" "$mode" "$dir" "$PROG" "$FABSOCK_LIB"
	fi
	fs_wait_pid "$runner" 70 || true
	rc=$(cat "$dir/rc" 2>/dev/null || echo "no rc")
	if [ "$rc" != "client=0 server=0" ]; then
		fs_fail "$label: $rc: $(grep -h '^FAIL\|killed' "$dir/server.out" "$dir/client.out" 2>/dev/null | head -n 3 | tr '\n' ' ')"
		tail -n 3 "$dir/client.err" "$dir/server.err" >&2 2>/dev/null || true
	fi
	for side in server client; do
		grep -qx "PASS $side $mode" "$dir/$side.out" 2>/dev/null || fs_fail "$label: no 'PASS $side $mode' line"
		off=$(fs_stat "$dir/$side.err" offloaded)
		[ "$off" = 0 ] || fs_fail "$label: $side stats offloaded=${off:-none}, expected 0 (the connection stays on TCP)"
	done
	reason=$(reason_of "$setup")
	n=$(fs_stat "$dir/client.err" "$reason")
	[ "${n:-0}" -ge 1 ] || fs_fail "$label: client stats $reason=${n:-none}, expected >= 1 ($(fs_stats_fallbacks "$dir/client.err"))"
	if [ "$FS_FAILS" -eq "$fails_before" ]; then
		fs_pass "$label ($(grep -h '^info' "$dir/client.out" | head -n 1))"
	fi
}

for round in $(seq 1 "$ROUNDS"); do
	for setup in $SETUPS; do
		if [ "$setup" = release ]; then
			for run in $(seq 1 "$RELEASE_RUNS"); do
				run_pair "$setup" lt-busy "$round.$run"
			done
			continue
		fi
		for mode in $MODES; do
			run_pair "$setup" "$mode" "$round"
		done
	done
done
fs_done
