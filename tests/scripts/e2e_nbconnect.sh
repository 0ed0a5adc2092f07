#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A nonblocking connect() that stays on TCP costs what the kernel's does
# (issue 27, target 5): an event loop's client (wrk, nginx's upstream
# connections, curl) under the preload, connecting COUNT times to a server
# fabsock cannot offload (a plain python server: no listener record), each
# time nonblocking (EINPROGRESS), waiting for the connection in a new epoll
# instance, sending 9 bytes and reading them back (checked), closing.
# Traced with strace -f -c, beside the same client without the preload:
# every connection is settled as TCP at connect() (counted
# fallback_no_record), so no getpeername and no wake-up of the service
# thread per connection (main: one getpeername, three polls, an eventfd
# write and read more per connection), and its EPOLL_CTL_ADD, of a socket
# that is the kernel's by then, asks no readlink whether it is an epoll
# instance (an fstat answers): the kernel client's getpeername count, 10
# polls and 20 readlinks more at most (a sanitizer runtime's start reads
# some).
# Then the same against a fabsock server whose records make it a candidate:
# the client still offloads through its nonblocking connect (echoes right).
. "$(dirname "$0")/lib.sh"

command -v strace >/dev/null || fs_skip "strace is missing"
# listener records of this script's own (other scripts' sweeps of the
# shared directory are no concern here)
mkdir -p "$FS_TMP/rec"
export FABSOCK_RECORDS_DIR=$FS_TMP/rec
command -v python3 >/dev/null || fs_skip "python3 is missing"
COUNT=100
# the interpreter itself: a python3 on the PATH may be a wrapper script
# (pyenv's shim) whose own processes strace would count
PY=$(python3 -c 'import sys; print(sys.executable)')

cat >"$FS_TMP/server.py" <<'PY'
import socket, sys
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0)); ls.listen(64)
print("listening port=%d" % ls.getsockname()[1], flush=True)
for _ in range(int(sys.argv[1])):
    c, _ = ls.accept()
    got = b""
    while len(got) < 9:
        d = c.recv(9 - len(got))
        if not d: break
        got += d
    c.sendall(got)
    c.close()
PY
cat >"$FS_TMP/client.py" <<'PY'
import errno, select, socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
ok = 0
for i in range(count):
    s = socket.socket(); s.setblocking(False)
    rc = s.connect_ex(("127.0.0.1", port))
    if rc not in (0, errno.EINPROGRESS):
        print("connect", rc); break
    ep = select.epoll(); ep.register(s.fileno(), select.EPOLLOUT)
    if not ep.poll(5) or s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        print("connect did not finish"); break
    ep.close()
    s.setblocking(True); s.settimeout(5)
    msg = b"%09d" % i
    s.sendall(msg)
    got = b""
    while len(got) < 9:
        d = s.recv(9 - len(got))
        if not d: break
        got += d
    ok += got == msg
    s.close()
print("echoes", ok)
PY

# calls FILE NAME: the number of calls of NAME in an strace -c table
calls() { awk -v n="$2" '$NF == n && $1 ~ /^[0-9.]+$/ { print $4; f = 1 } END { if (!f) print 0 }' "$1"; }

# run_plain LABEL ENV...: the client traced against a plain server
run_plain() {
	local label=$1
	shift
	fs_bg srv python3 "$FS_TMP/server.py" "$COUNT" >"$FS_TMP/$label.s.out" 2>"$FS_TMP/$label.s.err"
	port=$(fs_listen_port "$FS_TMP/$label.s.out" "$srv")
	[ -n "$port" ] || { fs_fail "$label: the plain server did not listen"; return 1; }
	strace -f -c -o "$FS_TMP/$label.strace" "$@" "$PY" "$FS_TMP/client.py" "$port" "$COUNT" \
		>"$FS_TMP/$label.out" 2>"$FS_TMP/$label.err" || true
	fs_wait_pid "$srv" 20 || true
	grep -q "^echoes $COUNT\$" "$FS_TMP/$label.out" ||
		{ fs_fail "$label: $(tr '\n' ' ' <"$FS_TMP/$label.out") $(tail -n 3 "$FS_TMP/$label.err" | tr '\n' ' ')"; return 1; }
}
# polls FILE: poll and ppoll calls
polls() { echo $(($(calls "$1" poll) + $(calls "$1" ppoll))); }

# 1. A plain server: every connection stays on TCP at connect(), and the
# client makes the calls the same client makes without the preload.
if run_plain kernel env -u LD_PRELOAD && run_plain fabsock -E "LD_PRELOAD=$FABSOCK_LIB" -E FABSOCK_STATS=1; then
	k=$FS_TMP/kernel.strace t=$FS_TMP/fabsock.strace
	if [ "$(fs_stat "$FS_TMP/fabsock.err" kernel)" != "$COUNT" ] ||
		[ "$(fs_stat "$FS_TMP/fabsock.err" fallback_no_record)" != "$COUNT" ]; then
		fs_fail "plain server: kernel=$(fs_stat "$FS_TMP/fabsock.err" kernel) fallback_no_record=$(fs_stat "$FS_TMP/fabsock.err" fallback_no_record), want $COUNT each"
	elif [ "$(calls "$t" getpeername)" -gt "$(calls "$k" getpeername)" ] || [ "$(polls "$t")" -gt $(($(polls "$k") + 10)) ] ||
		[ "$(calls "$t" readlink)" -gt $(($(calls "$k" readlink) + 20)) ]; then
		fs_fail "plain server: the preloaded client made more calls per connection: getpeername $(calls "$k" getpeername) -> $(calls "$t" getpeername), poll and ppoll $(polls "$k") -> $(polls "$t"), readlink $(calls "$k" readlink) -> $(calls "$t" readlink), write $(calls "$k" write) -> $(calls "$t" write), read $(calls "$k" read) -> $(calls "$t" read)"
	else
		fs_pass "plain server: $COUNT nonblocking connections settled at connect(), echoes right; getpeername $(calls "$k" getpeername) -> $(calls "$t" getpeername), poll and ppoll $(polls "$k") -> $(polls "$t"), readlink $(calls "$k" readlink) -> $(calls "$t" readlink) (without -> with the preload)"
	fi
fi

# 2. A fabsock server: the nonblocking connect still offloads.
fs_bg srv fs_pre python3 "$FS_TMP/server.py" 10 >"$FS_TMP/s2.out" 2>"$FS_TMP/s2.err"
port=$(fs_listen_port "$FS_TMP/s2.out" "$srv")
if [ -n "$port" ]; then
	fs_pre python3 "$FS_TMP/client.py" "$port" 10 >"$FS_TMP/c2.out" 2>"$FS_TMP/c2.err" || true
	fs_wait_pid "$srv" 20 || true
	if grep -q '^echoes 10$' "$FS_TMP/c2.out" && [ "$(fs_stat "$FS_TMP/c2.err" offloaded)" = 10 ]; then
		fs_pass "fabsock server: 10 nonblocking connections offloaded, echoes right"
	else
		fs_fail "fabsock server: $(tr '\n' ' ' <"$FS_TMP/c2.out"); offloaded $(fs_stat "$FS_TMP/c2.err" offloaded): $(fs_stats_fallbacks "$FS_TMP/c2.err")"
	fi
else
	fs_fail "the fabsock server did not listen"
fi
fs_done
