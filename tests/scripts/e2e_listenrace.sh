#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A client that connects the moment a port listens (one that retries until
# it can: a test harness, a supervisor's health check) must find the probe
# port open: the listener's UDP twin is bound before the kernel's listen().
# FABSOCK_TEST_LISTEN_DELAY_MS holds the server inside listen() for 500 ms
# after the kernel's, the window in which the twin used to be missing; the
# client retries connect() every 5 ms from before the listen. Its probe must
# be answered (not refused, which also puts the host in the negative cache),
# and 64 KiB must echo byte-exact over the fabric, offloaded on both ends.
. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null || fs_skip "python3 is missing"
cat >"$FS_TMP/peer.py" <<'PY'
import hashlib, socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
data = bytes((i * 13 + 5) & 255 for i in range(1 << 16))
if mode == "server":
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port)); print("bound", flush=True)
    ls.listen(4)
    c, _ = ls.accept(); got = bytearray()
    while len(got) < len(data):
        d = c.recv(65536)
        if not d: break
        got += d
    c.sendall(got); c.close()
else:
    end = time.time() + 10
    while True:
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", port)); break
        except ConnectionRefusedError:
            s.close()
            if time.time() > end: sys.exit("no listener in 10 s")
            time.sleep(0.005)
    s.sendall(data); got = bytearray()
    while True:
        d = s.recv(65536)
        if not d: break
        got += d
    print("echo", "ok" if bytes(got) == data else "BAD", len(got))
PY

port=$(fs_free_port)
fs_bg spid env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_TEST_LISTEN_DELAY_MS=500 \
	python3 "$FS_TMP/peer.py" server "$port" >"$FS_TMP/s.out" 2>"$FS_TMP/s.err"
fs_wait_line "$FS_TMP/s.out" '^bound' "$spid" || fs_fail "the server did not bind"
rc=0
env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 timeout 30 python3 "$FS_TMP/peer.py" client "$port" \
	>"$FS_TMP/c.out" 2>"$FS_TMP/c.err" || rc=$?
srv=0
fs_wait_pid "$spid" 20 || srv=$?
if [ "$rc" != 0 ] || [ "$srv" != 0 ] || ! grep -q '^echo ok 65536$' "$FS_TMP/c.out"; then
	fs_fail "client exit $rc, server exit $srv: $(tr '\n' ' ' <"$FS_TMP/c.out")"
fi
coff=$(fs_stat "$FS_TMP/c.err" offloaded) soff=$(fs_stat "$FS_TMP/s.err" offloaded)
refused=$(fs_stat "$FS_TMP/c.err" fallback_probe_refused) tx=$(fs_stat "$FS_TMP/c.err" fabric_tx_bytes)
[ "${refused:-x}" = 0 ] || fs_fail "the client's probe was refused (fallback_probe_refused=${refused:-none})"
[ "${coff:-0}" = 1 ] && [ "${soff:-0}" = 1 ] ||
	fs_fail "offloaded: client ${coff:-none} ($(fs_stats_fallbacks "$FS_TMP/c.err")), server ${soff:-none}"
[ "${tx:-0}" -ge 65536 ] || fs_fail "the client sent ${tx:-0} bytes over the fabric, expected >= 65536"
[ "$FS_FAILS" = 0 ] && fs_pass "a client connecting while listen() was under way: probe answered, 64 KiB over the fabric"
fs_done
