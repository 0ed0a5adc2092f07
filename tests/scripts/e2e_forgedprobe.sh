#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A local user must not hold up another user's connection (issue 26). A
# root server under the preload speaks first (a banner, as sshd and SMTP
# do). A plain root client (the victim, no preload) connects; before the
# server accepts, nobody (setpriv, when run as root) sends a well-formed
# probe for the victim's connection, from the victim's address, asking for
# the longest wait (10 s). A yes to it used to make the server hold the
# banner back for that wait plus its HELLO margin (13 s measured). Checks:
# the forger's probe reached the listener and was answered no
# (probes_foreign); the victim's banner comes within BANNER_MAX_MS of the
# accept; then a root client under the preload still offloads (its probe
# comes from a socket of the connection's own user): 256 KiB each way,
# sha256-checked, and TCP_INFO says the kernel connection did not carry it.
. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null || fs_skip "python3 is missing"
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null || fs_skip "needs root and setpriv (the forger runs as nobody)"
BANNER_MAX_MS=2000 # the server's own wait for a probe is FABSOCK_FIRST_SEND_WAIT_MS (5 ms)

PORT=$(fs_free_port) || fs_skip "no free port"
chmod 755 "$FS_TMP"

cat >"$FS_TMP/server.py" <<'PY'
# Accepts when told (a file per connection), sends a banner at once, then
# echoes until EOF.
import os, socket, sys, time
port, tmp = int(sys.argv[1]), sys.argv[2]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(16)
open(tmp + "/ready", "w").close()
for n in range(2):
    go = "%s/go%d" % (tmp, n)
    end = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < end:
        time.sleep(0.01)
    c, _ = l.accept()
    t0 = time.monotonic()
    c.sendall(b"BANNER fabsock test\n")
    print("conn %d banner_sent_ms=%.1f" % (n, (time.monotonic() - t0) * 1000), flush=True)
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
PY

cat >"$FS_TMP/client.py" <<'PY'
# Connects, notes its port in PORTFILE, tells the server to accept (GOFILE)
# once FORGED exists (or at once), times the banner from that moment, then
# sends SIZE bytes and checks the echo; prints whether TCP carried them.
import hashlib, os, socket, struct, sys, time
port, portfile, gofile, wait_for, size = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
c = socket.create_connection(("127.0.0.1", port), timeout=30)
with open(portfile + ".tmp", "w") as f:
    f.write("%d\n" % c.getsockname()[1])
os.rename(portfile + ".tmp", portfile)
end = time.monotonic() + 30
while wait_for != "-" and not os.path.exists(wait_for) and time.monotonic() < end:
    time.sleep(0.01)
t0 = time.monotonic()
open(gofile, "w").close()
banner = b""
while not banner.endswith(b"\n"):
    b = c.recv(100)
    if not b:
        break
    banner += b
banner_ms = (time.monotonic() - t0) * 1000
data = os.urandom(size)
c.sendall(data)
got = bytearray()
while len(got) < size:
    b = c.recv(65536)
    if not b:
        break
    got += b
ok = int(banner == b"BANNER fabsock test\n" and hashlib.sha256(bytes(got)).digest() == hashlib.sha256(data).digest())
info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
acked, received = struct.unpack_from("=QQ", info, 120)  # tcpi_bytes_acked, tcpi_bytes_received
c.close()
print("banner_ms=%.1f ok=%d tcp_carried=%d" % (banner_ms, ok, int(acked >= size or received >= size)), flush=True)
PY

cat >"$FS_TMP/forge.py" <<'PY'
# A well-formed probe ASK for the connection from 127.0.0.1:CPORT, wait
# 10 s, sent from 127.0.0.1 to the listener's UDP port; prints the answer.
import os, socket, struct, sys
port, portfile, version = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cport = int(open(portfile).read())
addr = b"\0" * 10 + b"\xff\xff" + socket.inet_aton("127.0.0.1")
ask = struct.pack(">IBBHQIHH16s", 0x46534250, version, 1, 0, int.from_bytes(os.urandom(8), "big"), 10000, cport, 0, addr)
assert len(ask) == 40
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
u.connect(("127.0.0.1", port))
u.settimeout(1.0)
answer = "none"
for _ in range(3):
    u.send(ask)
    try:
        r = u.recv(100)
    except socket.timeout:
        continue
    except ConnectionRefusedError:
        answer = "refused"
        break
    answer = {2: "yes", 3: "no"}.get(r[5], "other") if len(r) == 40 else "other"
    break
print("uid=%d answer=%s" % (os.getuid(), answer), flush=True)
PY
chmod 644 "$FS_TMP"/*.py
VERSION=$(sed -n 's/^#define FS_WIRE_VERSION \([0-9]*\).*/\1/p' "$(dirname "$0")/../../core/wire.h")
[ -n "$VERSION" ] || { fs_fail "cannot read FS_WIRE_VERSION"; fs_done; exit 1; }

fs_bg SRV env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/server.py" "$PORT" "$FS_TMP" \
	>"$FS_TMP/server.out" 2>"$FS_TMP/server.err"
for _ in $(seq 1 200); do [ -e "$FS_TMP/ready" ] && break; fs_sleep 0.05; done
[ -e "$FS_TMP/ready" ] || { fs_fail "the server did not start"; fs_done; exit 1; }

# 1. the victim: plain, root; the forger: nobody, between connect and accept
fs_bg VIC env -u LD_PRELOAD timeout 60 python3 "$FS_TMP/client.py" "$PORT" "$FS_TMP/vport" "$FS_TMP/go0" \
	"$FS_TMP/forged" 65536 >"$FS_TMP/victim.out" 2>"$FS_TMP/victim.err"
for _ in $(seq 1 200); do [ -s "$FS_TMP/vport" ] && break; fs_sleep 0.05; done
setpriv --reuid nobody --regid nogroup --clear-groups env -u LD_PRELOAD timeout 20 \
	python3 "$FS_TMP/forge.py" "$PORT" "$FS_TMP/vport" "$VERSION" >"$FS_TMP/forge.out" 2>&1 || true
touch "$FS_TMP/forged"
fs_wait_pid "$VIC" 60 || fs_fail "the victim exited $?: $(tail -n 3 "$FS_TMP/victim.err" | tr '\n' ' ')"
forge=$(cat "$FS_TMP/forge.out")
victim=$(cat "$FS_TMP/victim.out")
fs_log "forger: $forge; victim: $victim"
case $forge in
"uid=65534 answer=no") fs_pass "nobody's probe for root's connection was answered no" ;;
*) fs_fail "nobody's probe for root's connection: $forge (want uid=65534 answer=no)" ;;
esac
ms=$(sed -n 's/^banner_ms=\([0-9]*\).*/\1/p' <<<"$victim")
if [ -z "$ms" ] || ! grep -q ' ok=1 ' <<<"$victim"; then
	fs_fail "the victim's banner or echo was wrong: $victim"
elif [ "$ms" -gt "$BANNER_MAX_MS" ]; then
	fs_fail "the victim's banner came after $ms ms (> $BANNER_MAX_MS): the forged probe held the server"
else
	fs_pass "the victim's banner came after $ms ms, its bytes exact"
fi

# 2. a legitimate client under the preload still offloads
timeout 60 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 python3 "$FS_TMP/client.py" "$PORT" "$FS_TMP/lport" \
	"$FS_TMP/go1" - 262144 >"$FS_TMP/legit.out" 2>"$FS_TMP/legit.err" || fs_fail "the preloaded client exited $?"
legit=$(cat "$FS_TMP/legit.out")
fs_log "preloaded client: $legit"
if grep -q ' ok=1 tcp_carried=0' <<<"$legit"; then
	fs_pass "a legitimate probe still offloads (banner and 256 KiB echo off TCP, exact)"
else
	fs_fail "the preloaded client: $legit (want ok=1 tcp_carried=0)"
fi

kill "$SRV" 2>/dev/null || true
fs_wait_pid "$SRV" 10 || true
foreign=$(fs_stat "$FS_TMP/server.err" probes_foreign)
[ "${foreign:-0}" -ge 1 ] && fs_pass "the server counted $foreign foreign probe(s)" ||
	fs_fail "the server counted no foreign probe (probes_foreign=${foreign:-none}): $(grep -m1 stats "$FS_TMP/server.err" || true)"
fs_done
