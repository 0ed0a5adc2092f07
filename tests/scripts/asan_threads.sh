#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ASan build only (registered when FABSOCK_SANITIZE=address): fabsock's own
# threads must be started through ASan's pthread_create interceptor
# (core/util.c fs_create: `__interceptor_pthread_create`), so that the
# runtime has their thread state (a thread started past it ran with none,
# and ASan took a reused stack's stale shadow for a stack-buffer-underflow
# in the shm watchdog: "thread T-1"). In a program not built with ASan
# (python3 here) the global pthread_create is libc's, so only that explicit
# call makes the runtime see them. A python echo server and client, both
# preloaded, each open an shm rail (1 MiB echoed, sha256, offloaded on both
# ends), which starts fabsock's threads in each: the service thread and the
# shm watchdog. With ASAN_OPTIONS verbosity=2 the runtime prints a
# "Thread T<n>" ... line for each thread it creates ("SetCurrentThread" as
# it starts); python starts none of its own, so every one but the main
# thread's is fabsock's: each process must show exactly the two (a start
# past the interceptor shows none).
. "$(dirname "$0")/lib.sh"

[ -n "${ASAN_OPTIONS:-}" ] || fs_skip "not an ASan build (ASAN_OPTIONS unset)"
# (the system's: a wrapper script in PATH, pyenv's shim, would start a dozen
# processes under the preload first)
PY=/usr/bin/python3
[ -x "$PY" ] || fs_skip "no $PY"
SIZE=$((1 << 20))
export ASAN_OPTIONS="$ASAN_OPTIONS:verbosity=2"

fs_py_echo_server "$FS_TMP/server.py"
cat >"$FS_TMP/client.py" <<'EOF'
import hashlib, os, socket, sys, threading
data = os.urandom(int(sys.argv[2]))
c = socket.create_connection(('127.0.0.1', int(sys.argv[1])))
got = bytearray()
sent = 0
while sent < len(data) or len(got) < len(data):
    if sent < len(data):
        sent += c.send(data[sent:sent + 16384])
    b = c.recv(65536)
    if not b:
        break
    got += b
c.shutdown(socket.SHUT_WR)
print('sent', hashlib.sha256(data).hexdigest(), 'got', hashlib.sha256(bytes(got)).hexdigest(), len(got), flush=True)
EOF

# threads PROCESS_STDERR: the threads the runtime created ("==PID==T<n>:
# stack [...) size S", n > 0), as "n:size" words
threads() { sed -nE 's/^==[0-9]+==T([1-9][0-9]*): stack .* size (0x[0-9a-f]+);.*/\1:\2/p' "$1" | tr '\n' ' '; }

fs_bg spid timeout -k 2 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PY" "$FS_TMP/server.py" 0 1 \
	>"$FS_TMP/server.out" 2>"$FS_TMP/server.err"
# (a python under ASan on a loaded machine may take more than 10 s to start)
port=$(fs_listen_port "$FS_TMP/server.out" "$spid" 60)
[ -n "$port" ] || { fs_fail "the server did not listen: $(grep -v '^==\|^||\|^  ' "$FS_TMP/server.err" | tail -n 3 | tr '\n' ' ')"; fs_done; exit 1; }
rc=0 src=0
timeout -k 2 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PY" "$FS_TMP/client.py" "$port" "$SIZE" \
	>"$FS_TMP/client.out" 2>"$FS_TMP/client.err" || rc=$?
fs_wait_pid "$spid" 30 || src=$?
read -r _ sent _ got len <"$FS_TMP/client.out" || true
if [ "$rc" != 0 ] || [ "$src" != 0 ] || [ -z "${sent:-}" ] || [ "$sent" != "${got:-}" ] || [ "${len:-}" != "$SIZE" ]; then
	fs_fail "echo: client exit $rc, server exit $src, sha256 ${sent:0:16} vs ${got:0:16} (${len:-?} bytes): $(grep -hv '^==\|^||\|^  \|: stats:' "$FS_TMP/client.err" "$FS_TMP/server.err" | tail -n 4 | tr '\n' ' ')"
else
	fs_pass "echo: 1 MiB byte-exact between two preloaded python3 processes"
fi
for side in server client; do
	err=$FS_TMP/$side.err
	off=$(fs_stat "$err" offloaded)
	list=$(threads "$err")
	set -- $list
	# (fabsock's stacks: the service thread 256 KiB, the watchdog 64 KiB,
	# less what glibc takes for the static TLS)
	sizes=$(for t in "$@"; do echo $((${t#*:} > 0x20000 ? 256 : 64)); done | sort -n | tr '\n' ' ')
	if [ "${off:-0}" != 1 ]; then
		fs_fail "$side: offloaded=${off:-none}, expected 1 (no rail, no threads of fabsock's to count)"
	elif ! grep -q '==T0: stack' "$err"; then
		fs_fail "$side: no thread lines from ASan (verbosity=2 not in effect?)"
	elif [ "$#" != 2 ] || [ "$sizes" != "64 256 " ]; then
		fs_fail "$side: ASan created ${#} thread(s) besides main (${list:-none}), expected fabsock's 2 (service thread ~256 KiB, shm watchdog ~64 KiB): started past ASan's pthread_create interceptor?"
	else
		fs_pass "$side: ASan created fabsock's 2 threads ($list)"
	fi
done
fs_done
