#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A probe table planted in /dev/shm by another local user (issue 16, item
# 2). SO_REUSEPORT listeners of one port share a probe table at a
# predictable path, /dev/shm/fabsock-probe-<netns>-<address>-<port>. As
# nobody, plant at that path (a) an empty file, (b) a full-size file of
# random bytes, (c) a symlink to a root-owned file; then start a root
# SO_REUSEPORT echo server (python3, under the preload) on the port and move
# 1 MiB through it from a root client under the preload. Each time: the
# server neither dies nor hangs, it refuses the file (probe_tables_refused
# = 1) and leaves it as it was (the symlink's target untouched), the
# connection stays on kernel TCP (nothing offloaded), and the echo is
# byte-exact (sha256). A control run with nothing planted offloads (the
# MiB crosses the fabric both ways: fabric_rx_bytes), and the server leaves
# no table behind; a file of another user's named like a dead process's
# shm region is still there afterwards. Then a live process of the server's own user holds the
# real table's lock: connections wait at most 1 s for it, then TCP,
# byte-exact, the server says why. Then, as nobody, a HELLO naming a file
# nobody wrote in /dev/shm, against a root server: refused, server alive.
# Needs root.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || fs_skip "needs root (a root server, a planter as nobody)"
command -v setpriv >/dev/null || fs_skip "setpriv is missing (util-linux)"
command -v python3 >/dev/null || fs_skip "python3 is missing"

SIZE=$((1 << 20))
NETNS=$(stat -L -c %i /proc/self/ns/net)
TARGET=$FS_TMP/root-owned
printf 'root data\n' >"$TARGET"
TARGET_SUM=$(sha256sum <"$TARGET")

# the SO_REUSEPORT echo server: one connection
fs_py_echo_server "$FS_TMP/server.py"
cat >"$FS_TMP/client.py" <<'EOF'
import hashlib, os, socket, sys, threading
size = int(sys.argv[2])
data = os.urandom(size)
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def send():
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send)
t.start()
got = bytearray()
while True:
    b = c.recv(16384)
    if not b:
        break
    got += b
t.join()
print("sent", hashlib.sha256(data).hexdigest(), "got", hashlib.sha256(bytes(got)).hexdigest(), len(got))
EOF

# plant KIND PATH: as nobody
plant() {
	case $1 in
	empty) setpriv --reuid nobody --regid nogroup --clear-groups touch "$2" ;;
	random) setpriv --reuid nobody --regid nogroup --clear-groups \
		dd if=/dev/urandom of="$2" bs=1M count=2 status=none ;;
	symlink) setpriv --reuid nobody --regid nogroup --clear-groups ln -s "$TARGET" "$2" ;;
	esac
}

run_case() { # KIND (none|empty|random|symlink)
	local kind=$1 port path dir=$FS_TMP/$1 spid cpid rc=0 src=0 refused off
	mkdir -p "$dir"
	port=$(fs_free_port) || { fs_fail "$kind: no free port"; return 0; }
	path=/dev/shm/fabsock-probe-$NETNS-00000000000000000000ffff7f000001-$port
	rm -f "$path"
	[ "$kind" = none ] || plant "$kind" "$path"
	fs_bg spid timeout -k 2 30 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/server.py" "$port" 1 reuseport \
		>"$dir/server.out" 2>"$dir/server.err"
	if ! fs_wait_line "$dir/server.out" listening "$spid"; then
		fs_fail "$kind: the server did not listen: $(tail -n 3 "$dir/server.err" | tr '\n' ' ')"
		rm -f "$path"
		return 0
	fi
	fs_bg cpid timeout -k 2 30 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/client.py" "$port" "$SIZE" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cpid" 40 || rc=$?
	fs_wait_pid "$spid" 20 || src=$?
	[ "$rc" = 0 ] && [ "$src" = 0 ] ||
		fs_fail "$kind: client exit $rc, server exit $src: $(grep -hv ': stats:' "$dir/server.err" "$dir/client.err" | tail -n 3 | tr '\n' ' ')"
	read -r _ sent _ got len <"$dir/client.out" || true
	[ -n "${sent:-}" ] && [ "${sent:-}" = "${got:-}" ] && [ "${len:-}" = "$SIZE" ] ||
		fs_fail "$kind: echo differs (sent ${sent:-?}, got ${got:-?}, ${len:-?} bytes)"
	refused=$(fs_stat "$dir/server.err" probe_tables_refused)
	off=$(fs_stat "$dir/server.err" offloaded)
	if [ "$kind" = none ]; then
		local srx crx
		[ "${refused:-x}" = 0 ] && [ "${off:-x}" = 1 ] ||
			fs_fail "$kind: server stats probe_tables_refused=${refused:-none} offloaded=${off:-none}, expected 0 and 1"
		# the MiB went over the fabric both ways, not over the kernel connection
		srx=$(fs_stat "$dir/server.err" fabric_rx_bytes)
		crx=$(fs_stat "$dir/client.err" fabric_rx_bytes)
		[ "${srx:-0}" -ge "$SIZE" ] && [ "${crx:-0}" -ge "$SIZE" ] ||
			fs_fail "$kind: fabric bytes received: server ${srx:-none}, client ${crx:-none}, expected >= $SIZE each"
		[ ! -e "$path" ] || fs_fail "$kind: the server left its probe table $path"
	else
		[ "${refused:-x}" = 1 ] && [ "${off:-x}" = 0 ] ||
			fs_fail "$kind: server stats probe_tables_refused=${refused:-none} offloaded=${off:-none}, expected 1 and 0"
		[ -e "$path" ] || [ -L "$path" ] || fs_fail "$kind: the planted file is gone (the server removed another user's file)"
		[ "$(stat -c %U "$path")" = nobody ] || fs_fail "$kind: the planted file changed owner"
		[ "$(sha256sum <"$TARGET")" = "$TARGET_SUM" ] || fs_fail "$kind: the symlink's target changed"
		grep -q 'not one this process made' "$dir/server.err" || fs_fail "$kind: the server did not log the refusal"
	fi
	rm -f "$path"
	[ "$kind" = none ] && fs_log "control: offloaded, byte-exact" || fs_log "$kind: refused, TCP, byte-exact"
	return 0
}

# Another user's file under the name of a dead process's shm region: a
# root process opening its shm rail removes the regions of dead processes
# (fs_shm_clean), and must leave this one alone (it is not root's).
# The pid in the name must be one no process has (fs_pid_alive: kill(pid, 0)
# fails with ESRCH) and one no other run of this script uses at the same
# time (each removes its file at the end; a fixed one made two runs at once,
# two worktrees or a parallel ctest, remove each other's): this script's
# own pid, unique among live processes of this pid namespace (which the
# name carries), above the kernel's largest possible pid (PID_MAX_LIMIT,
# 2^22 on 64-bit), so it never names a live process, and still a pid_t.
# Its owner is a uid no account has and no other program runs as: a
# fabsock process of the file's own user would rightly remove it (its
# user's region of a dead process), and fabsock processes run as nobody
# elsewhere (memcached -u nobody, e2e_users: with nobody as the owner the
# check failed whenever one of them opened a rail meanwhile).
PIDNS=$(stat -L -c %i /proc/self/ns/pid)
DEADPID=$(((1 << 22) + $$))
kill -0 "$DEADPID" 2>/dev/null && fs_fail "pid $DEADPID is alive: it cannot stand for a dead process"
FOREIGN_UID=4242424242
FOREIGN_REGION=/dev/shm/fabsock-$PIDNS-$DEADPID-0badf00d
setpriv --reuid "$FOREIGN_UID" --regid "$FOREIGN_UID" --clear-groups sh -c "printf 'foreign data\n' >$FOREIGN_REGION"

for kind in none empty random symlink; do
	fails=$FS_FAILS
	run_case "$kind"
	[ "$FS_FAILS" = "$fails" ] && fs_pass "$kind"
done

if [ -f "$FOREIGN_REGION" ] && [ "$(stat -c %u "$FOREIGN_REGION")" = "$FOREIGN_UID" ]; then
	fs_pass "another user's file named like a dead process's region: left alone by root's cleanup"
else
	fs_fail "uid $FOREIGN_UID's file $FOREIGN_REGION (named like a dead process's region) was removed by a root process"
fi
rm -f "$FOREIGN_REGION"

# held: a live process of the server's own user takes the lock of the
# server's real table (the mutex at the head of the file: python's ctypes)
# and keeps it. The server must not hang: the answer to the client's probe
# waits at most FS_PROBE_TABLE_LOCK_MS (1 s) for it (the client gives up
# first and stays on TCP), and the connection's first read waits for none
# (no record says yes: nothing to look up or claim); byte-exact, and the
# server says why (the answering thread, when its wait ends: the server
# serves a second, plain client after that).
cat >"$FS_TMP/holder.py" <<'EOF'
import ctypes, mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
mm = mmap.mmap(fd, os.fstat(fd).st_size)
libc = ctypes.CDLL(None)
rc = libc.pthread_mutex_lock(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(mm))))
print("held", rc, flush=True)
time.sleep(60)
EOF
held_case() {
	local port path dir=$FS_TMP/held spid cpid hpid rc=0 src=0 off t0 t1
	mkdir -p "$dir"
	port=$(fs_free_port) || { fs_fail "held: no free port"; return 0; }
	path=/dev/shm/fabsock-probe-$NETNS-00000000000000000000ffff7f000001-$port
	fs_bg spid timeout -k 2 40 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/server.py" "$port" 2 reuseport \
		>"$dir/server.out" 2>"$dir/server.err"
	fs_wait_line "$dir/server.out" listening "$spid" || { fs_fail "held: the server did not listen"; return 0; }
	[ -f "$path" ] || { fs_fail "held: the server made no table at $path"; return 0; }
	fs_bg hpid timeout -k 2 60 python3 "$FS_TMP/holder.py" "$path" >"$dir/holder.out" 2>"$dir/holder.err"
	fs_wait_line "$dir/holder.out" "held 0" "$hpid" ||
		{ fs_fail "held: the holder did not take the lock: $(cat "$dir/holder.out" "$dir/holder.err")"; return 0; }
	t0=$(date +%s%N)
	fs_bg cpid timeout -k 2 30 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/client.py" "$port" "$SIZE" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cpid" 40 || rc=$?
	t1=$(date +%s%N)
	for _ in $(seq 1 100); do
		grep -q "probe table's lock was held" "$dir/server.err" && break
		sleep 0.05
	done
	# the second connection, a plain client's, ends the server
	timeout -k 2 20 python3 "$FS_TMP/client.py" "$port" 1 >"$dir/client2.out" 2>"$dir/client2.err" ||
		fs_fail "held: the plain client failed: $(tail -n 2 "$dir/client2.err" | tr '\n' ' ')"
	kill "$hpid" 2>/dev/null || true
	fs_wait_pid "$spid" 20 || src=$?
	[ "$rc" = 0 ] && [ "$src" = 0 ] ||
		fs_fail "held: client exit $rc, server exit $src (a hang is 124): $(grep -hv ': stats:' "$dir/server.err" "$dir/client.err" | tail -n 3 | tr '\n' ' ')"
	read -r _ sent _ got len <"$dir/client.out" || true
	[ -n "${sent:-}" ] && [ "${sent:-}" = "${got:-}" ] && [ "${len:-}" = "$SIZE" ] ||
		fs_fail "held: echo differs (sent ${sent:-?}, got ${got:-?}, ${len:-?} bytes)"
	off=$(fs_stat "$dir/server.err" offloaded)
	[ "${off:-x}" = 0 ] || fs_fail "held: server offloaded=${off:-none}, expected 0 (its table was held)"
	grep -q "probe table's lock was held" "$dir/server.err" || fs_fail "held: the server did not say why"
	fs_log "held: the connection took $(((t1 - t0) / 1000000)) ms with the table's lock held by another process"
	return 0
}
fails=$FS_FAILS
held_case
[ "$FS_FAILS" = "$fails" ] && fs_pass "held"

# A HELLO naming a region file another user made (issue 16, item 1, as
# nobody against a root server): fs_rawpeer, run as nobody without the
# preload, writes 4 KiB of random bytes into /dev/shm and names it in a
# well-formed HELLO after a YES. The root server must refuse it (NAK),
# echo later bytes over TCP, and live.
RAW=$FS_PROGS/fs_rawpeer
if [ -x "$RAW" ]; then
	chmod 755 "$FS_TMP"
	cp "$RAW" "$FS_TMP/fs_rawpeer"
	chmod 755 "$FS_TMP/fs_rawpeer"
	port=$(fs_free_port) || port=""
	fs_bg rawsrv timeout -k 2 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_HELLO_TIMEOUT_MS=300 \
		"$RAW" serve --port "$port" --ready-file "$FS_TMP/raw.ready" >"$FS_TMP/raw.out" 2>"$FS_TMP/raw.err"
	for _ in $(seq 1 200); do [ -s "$FS_TMP/raw.ready" ] && break; fs_sleep 0.05; done
	rc=0
	timeout 60 setpriv --reuid nobody --regid nogroup --clear-groups env -u LD_PRELOAD \
		"$FS_TMP/fs_rawpeer" 127.0.0.1 "$port" foreign_region_hello --hello-timeout-ms 300 \
		>"$FS_TMP/attack.out" 2>&1 || rc=$?
	sed "s/^/    /" "$FS_TMP/attack.out" >&2
	if [ "$rc" = 0 ] && grep -q '^PASS foreign_region_hello: NAK' "$FS_TMP/attack.out" && kill -0 "$rawsrv" 2>/dev/null; then
		fs_pass "nobody's HELLO naming its own /dev/shm file: refused by the root server, which lives"
	else
		fs_fail "nobody's HELLO naming its own /dev/shm file: exit $rc, server alive: $(kill -0 "$rawsrv" 2>/dev/null && echo yes || echo no)"
	fi
	# A HELLO naming a real region of our own user, the server's own
	# (issue 16: the kernel confirms the pid in a region name): after a
	# good client has made the server open its shm rail, a root client
	# names the root server's region. The owner and the name pass; the
	# kernel says that process does not hold this connection: NAK.
	rc=0
	timeout 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$RAW" 127.0.0.1 "$port" good_client --bytes 64K \
		>"$FS_TMP/good.out" 2>"$FS_TMP/good.err" || rc=$?
	[ "$rc" = 0 ] && [ "$(fs_stat "$FS_TMP/good.err" offloaded)" = 1 ] ||
		fs_fail "a good client before the stolen-region HELLO: exit $rc, offloaded $(fs_stat "$FS_TMP/good.err" offloaded)"
	rc=0
	timeout 60 env -u LD_PRELOAD "$RAW" 127.0.0.1 "$port" stolen_region_hello --hello-timeout-ms 300 \
		>"$FS_TMP/stolen.out" 2>&1 || rc=$?
	sed "s/^/    /" "$FS_TMP/stolen.out" >&2
	if [ "$rc" = 0 ] && grep -q '^PASS stolen_region_hello: NAK' "$FS_TMP/stolen.out" && kill -0 "$rawsrv" 2>/dev/null; then
		fs_pass "a HELLO naming the server's own region (same user): refused, the server lives"
	else
		fs_fail "a HELLO naming the server's own region (same user): exit $rc, server alive: $(kill -0 "$rawsrv" 2>/dev/null && echo yes || echo no)"
	fi
	kill -TERM "$rawsrv" 2>/dev/null || true
	fs_wait_pid "$rawsrv" 20 || true
	# the good client's descriptor was confirmed by the kernel, not let
	# through unconfirmed
	[ "$(fs_stat "$FS_TMP/raw.err" peers_unconfirmed)" = 0 ] ||
		fs_fail "the raw server let $(fs_stat "$FS_TMP/raw.err" peers_unconfirmed) peers through unconfirmed"
else
	fs_fail "$RAW is not built"
fi
fs_done
