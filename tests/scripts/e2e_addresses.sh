#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Connections through a host's other addresses. A server listening on the
# wildcard address answers a probe from its UDP twin, also on the wildcard
# address: the answer went out from the route's source address (127.0.0.1)
# while the client's UDP socket, connected to the address it dialled
# (127.0.0.2), dropped it, and every such connection stayed on TCP after
# the probe timeout (a server with several addresses, a VIP, a container's
# second address). The doorbell's datagrams likewise go between the
# connection's own addresses. Cases, both ends under the preload, python3
# echo client and server: (a) server on 0.0.0.0, client to 127.0.0.2;
# (b) server on 0.0.0.0, client bound to 127.0.0.3, to 127.0.0.2;
# (c) server on 127.0.0.2, client to it; (d) a dual-stack server on ::,
# clients to ::1 and to 127.0.0.2. Three exchanges each, 1.5 s idle
# between them so that both ends arm their doorbells, and the server answers
# each 0.2 s late so that the client's wait sleeps too (a peer is rung only
# while it sleeps: wake2's "ring only a sleeper"). Checks: every echo
# byte-exact (sha256), both ends offloaded with no probe timeout, nothing
# dropped (msgs_dropped=0: no doorbell datagram refused), and the doorbell
# rang on both ends (bell_rings_received >= 1).
. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null || fs_skip "python3 is missing"

cat >"$FS_TMP/echo.py" <<'EOF'
import hashlib, os, socket, sys, time
mode = sys.argv[1]
if mode == "server":
    if ":" in sys.argv[2]:  # dual-stack
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    else:
        s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[2], 0))
    s.listen(1)
    print("listening port=%d" % s.getsockname()[1], flush=True)
    c, _ = s.accept()
    while True:
        d = c.recv(65536)
        if not d:
            break
        time.sleep(0.2)  # the client's wait for the echo sleeps: it must be rung
        c.sendall(d)
    c.close()
else:
    host, port, bind = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    c = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if bind != "-":
        c.bind((bind, 0))
    c.connect((host, port))
    ok = True
    for i in range(3):
        data = os.urandom(4096 + i)
        c.sendall(data)
        got = b""
        while len(got) < len(data):
            b = c.recv(65536)
            if not b:
                break
            got += b
        ok = ok and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
        if i < 2:
            time.sleep(1.5)
    c.close()
    print("echo", "ok" if ok else "differs", flush=True)
EOF

run_case() { # LABEL LISTEN_ADDR DIAL_ADDR BIND_ADDR
	local label=$1 dir=$FS_TMP/$1 srv cli port rc=0 src=0 side f v fails=$FS_FAILS
	mkdir -p "$dir"
	fs_bg srv timeout -k 2 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/echo.py" server "$2" \
		>"$dir/server.out" 2>"$dir/server.err"
	port=$(fs_listen_port "$dir/server.out" "$srv")
	[ -n "$port" ] || { fs_fail "$label: the server did not listen"; return 0; }
	fs_bg cli timeout -k 2 60 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/echo.py" client "$3" "$port" "$4" \
		>"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cli" 70 || rc=$?
	fs_wait_pid "$srv" 20 || src=$?
	[ "$rc" = 0 ] && [ "$src" = 0 ] || fs_fail "$label: client exit $rc, server exit $src"
	grep -q '^echo ok$' "$dir/client.out" || fs_fail "$label: the echo differs or is missing"
	for side in server client; do
		f=$dir/$side.err
		[ "$(fs_stat "$f" offloaded)" = 1 ] || fs_fail "$label: $side offloaded=$(fs_stat "$f" offloaded) ($(fs_stats_fallbacks "$f"))"
		v=$(fs_stat "$f" fallback_probe_timeout)
		[ "${v:-0}" = 0 ] || fs_fail "$label: $side fallback_probe_timeout=$v"
		v=$(fs_stat "$f" msgs_dropped)
		[ "${v:-x}" = 0 ] || fs_fail "$label: $side msgs_dropped=${v:-none} (doorbell datagrams refused?)"
		v=$(fs_stat "$f" bell_rings_received)
		[ "${v:-0}" -ge 1 ] || fs_fail "$label: $side bell_rings_received=${v:-none}, expected >= 1"
	done
	[ "$FS_FAILS" = "$fails" ] && fs_pass "$label: offloaded, byte-exact, doorbell rang on both ends, nothing dropped"
	return 0
}

# The cases (LABEL LISTEN_ADDR DIAL_ADDR BIND_ADDR). FS_SCENARIOS narrows
# them by label; they share the run with a second instance of this script
# beside (lib.sh, fs_split_beside; FS_SPLIT=0: not): each is its own pair
# of processes on its own port, and mostly sleeps (3 s of 4-5).
declare -A CASES=(
	[wildcard-to-127.0.0.2]="0.0.0.0 127.0.0.2 -"
	[wildcard-from-127.0.0.3]="0.0.0.0 127.0.0.2 127.0.0.3"
	[bound-127.0.0.2]="127.0.0.2 127.0.0.2 -"
	[dualstack-to-::1]=":: ::1 -"
	[dualstack-to-127.0.0.2]=":: 127.0.0.2 -"
)
cases=${FS_SCENARIOS:-wildcard-to-127.0.0.2 wildcard-from-127.0.0.3 bound-127.0.0.2 dualstack-to-::1 dualstack-to-127.0.0.2}
if ! { [ -e /proc/net/if_inet6 ] && ip -6 addr show dev lo | grep -q '::1'; }; then
	fs_log "no IPv6 on lo: the dual-stack cases are left out"
	cases=$(printf '%s\n' $cases | grep -v '^dualstack-' | tr '\n' ' ')
fi
fs_split_beside $cases
for c in $FS_SPLIT_MINE; do
	[ -n "${CASES[$c]:-}" ] || { fs_fail "no case $c"; continue; }
	run_case "$c" ${CASES[$c]}
done
fs_kernel_beside_wait 120
fs_done
