#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What the preload costs a process that never opens a TCP socket (issue 27,
# target 2: a curl per download, a CGI, `psql -c`, a shell's every command
# pay the constructor). Counted, not timed: /bin/true with NFDS extra open
# descriptors, under strace -c, plain and under the preload. The preloaded
# run may add the loading of one library and the constructor's few calls,
# but:
#   - no readlink: the search for a previous program's exec records read
#     the name of every open descriptor through /proc (one readlink each);
#   - no brk and no getrandom beyond the plain run's: no malloc (the first
#     one sets up the heap; the rules' copy and opendir's buffer were it);
#   - at most LOAD_CALLS calls more in all, not counting fcntl (one
#     F_GET_SEALS a descriptor: what is left of that search).
# A listener's start sweeps the records through sock_diag, not by reading
# /proc/net/tcp. Then a record file does still reach the new program: a fabsock listener
# exec'd into a new program (python3 re-exec'ing itself, the socket
# without CLOEXEC) is adopted there: the new program's connections offload
# (counted by the client and the server), the echo checked.
. "$(dirname "$0")/lib.sh"

command -v strace >/dev/null || fs_skip "strace is missing"
# listener records of this script's own (other scripts' listeners, and their
# sweeps, in the shared directory are no concern of these counts)
mkdir -p "$FS_TMP/rec"
export FABSOCK_RECORDS_DIR=$FS_TMP/rec
NFDS=40
LOAD_CALLS=24

# traced NAME ENV...: strace -c of /bin/true with NFDS more descriptors
traced() {
	local name=$1
	shift
	# fds 20..59 on /dev/null, in the traced process only
	bash -c 'for ((fd = 20; fd < 20 + $0; fd++)); do eval "exec $fd</dev/null"; done; exec "$@"' "$NFDS" \
		strace -f -c -o "$FS_TMP/$name.strace" "$@" /bin/true
}
# calls FILE NAME: the number of calls of NAME in an strace -c table
calls() { awk -v n="$2" '$NF == n && $1 ~ /^[0-9.]+$/ { print $4; f = 1 } END { if (!f) print 0 }' "$1"; }
total() { awk '$NF == "total" { print $4 }' "$1"; }

# A sanitizer's runtime, loaded with a sanitizer build of the library, makes
# start-up calls of its own (its maps, its shadow memory): the counts are
# the release build's to check.
if readelf -d "$FABSOCK_LIB" 2>/dev/null | grep -qE 'lib(a|t|ub)san'; then
	fs_log "a sanitizer build: the start-up counts are left to the release build"
else
	traced plain
	traced pre -E "LD_PRELOAD=$FABSOCK_LIB"
	p=$FS_TMP/plain.strace
	q=$FS_TMP/pre.strace
	[ "$(total "$p")" -gt 0 ] || fs_fail "no strace table for the plain run: $(cat "$p")"
	bad=
	for name in readlink readlinkat brk getrandom; do
		[ "$(calls "$q" "$name")" -le "$(calls "$p" "$name")" ] ||
			bad="$bad $name $(calls "$p" "$name")->$(calls "$q" "$name")"
	done
	if [ -z "$bad" ]; then
		fs_pass "no readlink, brk nor getrandom added (plain $(total "$p") calls, preloaded $(total "$q"), $NFDS more descriptors open)"
	else
		fs_fail "the preload added calls to /bin/true:$bad"
		cat "$q" >&2
	fi
	# (fcntl: one a descriptor, the ones the test's caller left open too)
	plain_n=$(($(total "$p") - $(calls "$p" fcntl)))
	pre_n=$(($(total "$q") - $(calls "$q" fcntl)))
	if [ "$pre_n" -le $((plain_n + LOAD_CALLS)) ]; then
		fs_pass "preloaded /bin/true: $pre_n calls besides fcntl, plain $plain_n (at most $LOAD_CALLS more)"
	else
		fs_fail "preloaded /bin/true: $pre_n calls besides fcntl, plain $plain_n (at most $LOAD_CALLS more)"
		cat "$q" >&2
	fi
fi

command -v python3 >/dev/null || fs_skip "python3 is missing"

# A listener's start: publishing its record sweeps the user's records,
# listing the listening sockets with sock_diag, never reading /proc/net/tcp
# (every socket of the host: tens of thousands of TIME_WAITs after a
# connection-per-request bench, megabytes read before the first accept).
strace -f -qq -e trace=openat,socket -o "$FS_TMP/listen.trace" -E "LD_PRELOAD=$FABSOCK_LIB" \
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1); print("ok")' \
	>"$FS_TMP/listen.out" 2>&1 || true
if ! grep -q '^ok' "$FS_TMP/listen.out"; then
	fs_fail "the traced listener failed: $(tail -n 3 "$FS_TMP/listen.out" | tr '\n' ' ')"
elif grep -q '/proc/net/tcp' "$FS_TMP/listen.trace"; then
	fs_fail "a listener's start read /proc/net/tcp: $(grep -c '/proc/net/tcp' "$FS_TMP/listen.trace") opens"
elif ! grep -q 'NETLINK_SOCK_DIAG' "$FS_TMP/listen.trace"; then
	fs_fail "a listener's start made no sock_diag socket (no sweep?): $(grep -c . "$FS_TMP/listen.trace") calls traced"
else
	fs_pass "a listener's start swept the records with sock_diag, no /proc/net/tcp"
fi

# A listener that survives exec is still found and adopted.
cat >"$FS_TMP/reexec.py" <<'PY'
import hashlib, os, socket, sys
if len(sys.argv) == 2:  # first program: listen, then become the second
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", int(sys.argv[1]))); ls.listen(8)
    os.set_inheritable(ls.fileno(), True)
    os.execv(sys.executable, [sys.executable, sys.argv[0], "served", str(ls.fileno())])
ls = socket.socket(fileno=int(sys.argv[2]))
print("listening", flush=True)
for _ in range(3):
    c, _ = ls.accept()
    got = b""
    while len(got) < 65536:
        d = c.recv(65536)
        if not d: break
        got += d
    c.sendall(hashlib.sha256(got).hexdigest().encode())
    c.close()
PY
cat >"$FS_TMP/client.py" <<'PY'
import hashlib, socket, sys
data = bytes((i * 13 + 5) & 255 for i in range(65536))
ok = 0
for _ in range(3):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.sendall(data)
    got = b""
    while len(got) < 64:
        d = s.recv(64)
        if not d: break
        got += d
    ok += got == hashlib.sha256(data).hexdigest().encode()
    s.close()
print("echoes", ok)
PY
port=$(fs_free_port)
fs_bg srv fs_pre python3 "$FS_TMP/reexec.py" "$port" >"$FS_TMP/s.out" 2>"$FS_TMP/s.err"
if fs_wait_line "$FS_TMP/s.out" listening "$srv" 20; then
	fs_pre python3 "$FS_TMP/client.py" "$port" >"$FS_TMP/c.out" 2>"$FS_TMP/c.err" || true
	fs_wait_pid "$srv" 20 || true
	if grep -q '^echoes 3$' "$FS_TMP/c.out" && [ "$(fs_stat "$FS_TMP/c.err" offloaded)" = 3 ] &&
		[ "$(fs_stat "$FS_TMP/s.err" offloaded)" = 3 ]; then
		fs_pass "a listener exec'd into a new program was adopted: 3 connections offloaded, echoes right"
	else
		fs_fail "exec'd listener: $(tr '\n' ' ' <"$FS_TMP/c.out"); client offloaded $(fs_stat "$FS_TMP/c.err" offloaded), server $(fs_stat "$FS_TMP/s.err" offloaded): $(fs_stats_fallbacks "$FS_TMP/c.err")"
	fi
else
	fs_fail "the re-exec'd server did not listen: $(tr '\n' ' ' <"$FS_TMP/s.err")"
fi
fs_done
