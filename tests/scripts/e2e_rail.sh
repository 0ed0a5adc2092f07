#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A process's first rail (issue 27, "cheaper rails"): what fabsock does to
# make it cheap must not show to the application.
#   - strncpy keeps the C library's semantics under the preload (fabsock
#     interposes it to skip the zero-fill of a new shm region's name;
#     tests/progs/fs_strncpy.c checks lengths around the threshold);
#   - a client process that opens its first rail (FABSOCK_LOG=debug shows
#     the rail open's steps), fetches a file from a fabsock server over it
#     (offloaded on both ends, sha256 equal, TCP carried only the HELLOs)
#     and then runs a program: that program's environment has none of the
#     variables fabsock sets for libfabric's initialisation only
#     (FI_PROVIDER_PATH, IPATH_NO_BACKTRACE, FI_EFA_FORK_SAFE,
#     FI_SHM_DISABLE_CMA, FI_OFI_RXM_*: core/fabric.c fs_fabric_env_names),
#     and a FI_PROVIDER_PATH and FI_SHM_DISABLE_CMA the user set are kept
#     as they were;
#   - the client's region is gone from /dev/shm once it has ended;
#   - the queue depths asked of shm (engine.c, fs_engine_depth): a client's
#     rail shm's own depth by default (1024) and FABSOCK_SHM_DEPTH=256 deep
#     when asked, the server's shm's own (1024) always, and a user's
#     FI_SHM_RX_SIZE kept (a hint above it would find no provider).
. "$(dirname "$0")/lib.sh"

STRNCPY="$FS_PROGS/fs_strncpy"
PY=/usr/bin/python3
[ -x "$STRNCPY" ] || { fs_fail "$STRNCPY is not built"; fs_done; exit 1; }
[ -x "$PY" ] || fs_skip "no $PY"
fs_need_nft

out=$(fs_pre "$STRNCPY" 2>"$FS_TMP/strncpy.err") || true
if [ "$out" = ok ]; then
	fs_pass "strncpy under the preload: string and zero-fill as the C library's, nothing written past the length"
else
	fs_fail "strncpy under the preload: ${out:-no output}"
fi

DOC=$FS_TMP/www
mkdir -p "$DOC"
head -c $((1 << 20)) /dev/urandom >"$DOC/file.bin"
SUM=$(sha256sum <"$DOC/file.bin" | cut -d' ' -f1)
port=$(fs_free_port) || { fs_fail "no free port"; fs_done; exit 1; }
fs_bg srv env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=info "$PY" -c '
import http.server, signal, sys
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
h = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=sys.argv[2], **k)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), h).serve_forever()' "$port" "$DOC" \
	>"$FS_TMP/srv.out" 2>"$FS_TMP/srv.err"
fs_wait_listen "$port" || { fs_fail "the server did not listen"; fs_done; exit 1; }

# The client: fetch, then run `env` through system() (the C environment,
# as the process has it now), then print the sha256 of what it fetched.
CLIENT='
import hashlib, os, sys, urllib.request
data = urllib.request.urlopen("http://127.0.0.1:%s/file.bin" % sys.argv[1], timeout=20).read()
os.system("env > " + sys.argv[2])
print(hashlib.sha256(data).hexdigest(), flush=True)'

# client LABEL TX RX [ENV...]: TX and RX, the depths its rail must have.
client() {
	local label=$1 tx=$2 rx=$3 rc=0 got pid so line; shift 3
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	got=$(timeout -k 2 30 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_LOG=debug "$@" \
		"$PY" -c "$CLIENT" "$port" "$FS_TMP/$label.env" 2>"$FS_TMP/$label.err") || rc=$?
	fs_tcp_proof "$label" fabsock 1
	if [ "$rc" -ne 0 ] || [ "$got" != "$SUM" ]; then
		fs_fail "$label: exit status $rc, sha256 ${got:0:16} (want ${SUM:0:16})"
		grep -v 'debug' "$FS_TMP/$label.err" | tail -n 3 | sed 's/^/    /' >&2 || true
		return 1
	fi
	so=$(fs_stat "$FS_TMP/$label.err" offloaded)
	[ "${so:-0}" = 1 ] || fs_fail "$label: client offloaded=${so:-no stats line}, expected 1"
	grep -q 'rail open: fi_enable' "$FS_TMP/$label.err" ||
		fs_fail "$label: no rail-open stamps in the client's debug log: did it open its own rail?"
	line=$(grep -m 1 'opened shm rail' "$FS_TMP/$label.err" || true)
	case $line in
	*", tx $tx, rx $rx,"*) fs_pass "$label: the client's rail is $tx/$rx deep (${line#*opened })" ;;
	*) fs_fail "$label: the client's rail should be tx $tx, rx $rx deep: ${line:-no 'opened shm rail' line}" ;;
	esac
	pid=$(sed -nE 's/^fabsock\[([0-9]+)\]: debug: rail open.*/\1/p' "$FS_TMP/$label.err" | head -n 1)
	if [ -n "$pid" ] && ls /dev/shm | grep -q -- "-$pid-"; then
		fs_fail "$label: the client's region is still in /dev/shm after its end: $(ls /dev/shm | grep -- "-$pid-" | head -n 2)"
	fi
	fs_pass "$label: fetched 1 MiB over its first rail, sha256 equal, offloaded"
}

FABRIC_ENV='^(FI_PROVIDER_PATH|IPATH_NO_BACKTRACE|FI_EFA_FORK_SAFE|FI_SHM_DISABLE_CMA|FI_OFI_RXM_BUFFER_SIZE|FI_OFI_RXM_EAGER_LIMIT)='
if client plain 1024 1024; then
	if grep -qE "$FABRIC_ENV" "$FS_TMP/plain.env"; then
		fs_fail "plain: a program run after the rail opened inherited $(grep -E "$FABRIC_ENV" "$FS_TMP/plain.env" | tr '\n' ' ')"
	else
		fs_pass "plain: a program run after the rail opened has none of the variables set for libfabric"
	fi
fi
if client userpath 1024 1024 FI_PROVIDER_PATH=/nonexistent/fabsock-test FI_SHM_DISABLE_CMA=no; then
	got=$(grep -E "$FABRIC_ENV" "$FS_TMP/userpath.env" | sort | tr '\n' ' ')
	if [ "$got" = "FI_PROVIDER_PATH=/nonexistent/fabsock-test FI_SHM_DISABLE_CMA=no " ]; then
		fs_pass "userpath: the user's FI_PROVIDER_PATH and FI_SHM_DISABLE_CMA are kept, nothing of ours added"
	else
		fs_fail "userpath: the variables for libfabric became: ${got:-none}"
	fi
fi

client depth256 256 256 FABSOCK_SHM_DEPTH=256 || true
client depth0 1024 1024 FABSOCK_SHM_DEPTH=0 || true
client userrx 256 128 FABSOCK_SHM_DEPTH=256 FI_SHM_RX_SIZE=128 || true

kill -TERM "$srv" 2>/dev/null || true
fs_wait_pid "$srv" 15 || true
so=$(fs_stat_sum "$FS_TMP/srv.err" offloaded)
[ "${so:-0}" -ge 4 ] || fs_fail "server offloaded=${so:-no stats line}, expected 4"
line=$(grep -m 1 'opened shm rail' "$FS_TMP/srv.err" || true)
case $line in
*", tx 1024, rx 1024,"*) fs_pass "server: its rail, opened for a connection it accepted, is shm's own depth" ;;
*) fs_fail "server: its rail should be 1024/1024 deep: ${line:-no 'opened shm rail' line}" ;;
esac
fs_done
