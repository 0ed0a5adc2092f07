#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The probe's UDP twin lives as long as its listener, and the application's
# own use of the UDP port wins (issue 26); tests/progs/fs_twin.c.
#  relisten: a server closes its listener while the connection it accepted
#    stays open and listens again on the port, ROUNDS times; a client under
#    the preload connects once per round. Every round's connection is
#    offloaded (TCP_INFO: the kernel connection carried less than the 1 MiB
#    echo each way), every echo exact, and the old connections still echo
#    at the end. (The closed listener's twin used to stay bound: every
#    round after the first stayed on TCP.)
#  dns udp-first / tcp-first: a DNS-like server binds a UDP socket and a TCP
#    listener on one port number, in either order; both binds succeed (the
#    twin gives way). A client under the preload sends UDP queries, all
#    answered, and makes TCP connections, echoed exactly; the server's UDP
#    socket receives no probe (the client probes that port). Those
#    connections stay on TCP: the port's UDP side is the application's, so
#    no twin can answer and the probe is dropped before the application's
#    socket (the client waits its probe timeout once, then its negative
#    cache keeps it on TCP). Then the server closes its UDP socket, the
#    twin binds again, and a new client's connections offload.
. "$(dirname "$0")/lib.sh"

TWIN=$FS_PROGS/fs_twin
[ -x "$TWIN" ] || { fs_fail "$TWIN is not built"; fs_done; exit 1; }
ROUNDS=4

# ---- close and listen again -------------------------------------------------
PORT=$(fs_free_port) || fs_skip "no free port"
mkdir -p "$FS_TMP/re"
fs_bg SRV fs_pre "$TWIN" relisten-server "$PORT" "$ROUNDS" "$FS_TMP/re" >"$FS_TMP/re.srv" 2>"$FS_TMP/re.srv.err"
rc=0
timeout 100 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$TWIN" relisten-client "$PORT" "$ROUNDS" "$FS_TMP/re" \
	>"$FS_TMP/re.cli" 2>"$FS_TMP/re.cli.err" || rc=$?
rc_srv=0
fs_wait_pid "$SRV" 30 || rc_srv=$?
sed 's/^/    /' "$FS_TMP/re.cli" >&2
if [ "$rc" != 0 ] || [ "$rc_srv" != 0 ]; then
	fs_fail "relisten: client exited $rc, server $rc_srv: $(grep -h FAIL "$FS_TMP"/re.* | head -n 3 | tr '\n' ' ')"
	fs_why_tcp client "$FS_TMP/re.cli.err"
	fs_why_tcp server "$FS_TMP/re.srv.err"
elif grep -q "^offloaded=$ROUNDS of $ROUNDS$" "$FS_TMP/re.cli"; then
	fs_pass "relisten: $ROUNDS listeners in turn on one port, each one's connection offloaded, old ones alive, bytes exact"
else
	fs_fail "relisten: $(tail -n 1 "$FS_TMP/re.cli") connections offloaded"
	fs_why_tcp client "$FS_TMP/re.cli.err"
	fs_why_tcp server "$FS_TMP/re.srv.err"
fi

# ---- one port number for TCP and UDP ----------------------------------------
for order in udp-first tcp-first; do
	PORT=$(fs_free_port) || fs_skip "no free port"
	d=$FS_TMP/$order
	mkdir -p "$d"
	fs_bg SRV fs_pre "$TWIN" dns-server "$PORT" "$order" "$d" >"$d/srv" 2>"$d/srv.err"
	for _ in $(seq 1 200); do
		[ -e "$d/ready" ] && break
		kill -0 "$SRV" 2>/dev/null || break
		fs_sleep 0.05
	done
	if [ ! -e "$d/ready" ]; then
		fs_fail "$order: the server did not start: $(head -n 3 "$d/srv" "$d/srv.err" | tr '\n' ' ')"
		continue
	fi
	rc=0
	timeout 100 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$TWIN" dns-client "$PORT" 3 20 \
		>"$d/cli1" 2>"$d/cli1.err" || rc=$?
	sed 's/^/    /' "$d/cli1" >&2
	touch "$d/close-udp"
	for _ in $(seq 1 200); do [ -e "$d/udp-closed" ] && break; fs_sleep 0.05; done
	[ -e "$d/udp-closed" ] || fs_fail "$order: the server did not close its UDP socket"
	rc2=0
	timeout 100 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$TWIN" dns-client "$PORT" 3 0 \
		>"$d/cli2" 2>"$d/cli2.err" || rc2=$?
	sed 's/^/    /' "$d/cli2" >&2
	kill "$SRV" 2>/dev/null || true
	rc_srv=0
	fs_wait_pid "$SRV" 30 || rc_srv=$?
	sed 's/^/    server: /' "$d/srv" >&2
	if [ "$rc" != 0 ] || [ "$rc2" != 0 ] || [ "$rc_srv" != 0 ]; then
		fs_fail "$order: clients exited $rc and $rc2, server $rc_srv: $(grep -h FAIL "$d"/srv "$d"/cli* | head -n 3 | tr '\n' ' ')"
		continue
	fi
	grep -q '^probes_seen=0 udp_answered=20 tcp_conns=6$' "$d/srv" &&
		fs_pass "$order: both binds succeeded, 20 UDP queries answered, 6 TCP echoes, no probe reached the application" ||
		fs_fail "$order: server says $(tail -n 1 "$d/srv")"
	n_ok=$(grep -c ' ok=1 offloaded=0$' "$d/cli1" || true)
	[ "$n_ok" = 3 ] && fs_pass "$order: while the application holds the UDP port its TCP connections stay on TCP, exact" ||
		fs_fail "$order: while the application holds the UDP port: $(grep '^conn' "$d/cli1" | tr '\n' ' ')"
	n_off=$(grep -c ' ok=1 offloaded=1$' "$d/cli2" || true)
	if [ "$n_off" = 3 ]; then
		fs_pass "$order: after the application closed its UDP socket, 3 of 3 connections offloaded"
	else
		fs_fail "$order: after the UDP socket closed: $(grep '^conn' "$d/cli2" | tr '\n' ' ')"
		fs_why_tcp client "$d/cli2.err"
		fs_why_tcp server "$d/srv.err"
	fi
done
fs_done
