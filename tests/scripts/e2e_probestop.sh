#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A listener that answers its probes late, or not in time, is still a
# fabsock listener (e2e_many's storm: a busy server answered late and a run
# of connections stayed on TCP). A preloaded echo server (fs_rawpeer serve,
# which publishes a listener record of this user) and one preloaded python
# client making connections one after another (64 KiB out, the echo back,
# sha256 compared; TCP_INFO bytes_acked / bytes_received say whether the
# kernel connection carried the payload). The client's probe timeout is
# 2000 ms here (FABSOCK_PROBE_TIMEOUT_MS): the "resend" stop below ends
# within tens of milliseconds, a loaded machine's delays included; every
# stop ends on what the client sees, not after a fixed time.
#   warm:    a connection, offloaded.
#   resend:  the server is stopped (SIGSTOP) before a connection and
#            continued once its twin's queue holds the probe and a resend of
#            it (/proc/net/udp; the client sends it again after 30 ms); on
#            SIGCONT the first is answered yes and the repeat from the
#            record (probes_repeated): offloaded.
#   timeout: the server is stopped before a connection and continued only
#            once the stopped server's kernel acked the whole payload on TCP
#            (TCP_INFO): the probe timed out, that connection stays on TCP
#            (its bytes echoed once the server runs again).
#   after:   three connections at once after it: all offloaded, none kept
#            on TCP by the negative cache (whose entry would last 10 s).
# Checks: every connection byte-exact; the offloaded/TCP pattern above; the
# client's probes_timeout_listener=1, fallback_probe_timeout=1,
# fallback_neg_cache=0; the server's probes_repeated >= 1; no process died
# by a signal.
. "$(dirname "$0")/lib.sh"

RAW=$FS_PROGS/fs_rawpeer
[ -x "$RAW" ] || { fs_fail "$RAW is not built"; fs_done; exit 1; }
command -v python3 >/dev/null || fs_skip "python3 is missing"

PORT=$(fs_free_port) || fs_skip "no free port"
fs_bg SRV env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$RAW" serve --port "$PORT" \
	--ready-file "$FS_TMP/ready" >"$FS_TMP/server.out" 2>"$FS_TMP/server.err"
for _ in $(seq 1 200); do [ -s "$FS_TMP/ready" ] && break; fs_sleep 0.05; done
[ -s "$FS_TMP/ready" ] || { fs_fail "the server did not start"; fs_done; exit 1; }
fs_wait_listen "$PORT" || { fs_fail "the server does not listen"; fs_done; exit 1; }

cat >"$FS_TMP/client.py" <<'PY'
import hashlib, os, signal, socket, struct, sys, threading, time
port, server = int(sys.argv[1]), int(sys.argv[2])
size = 65536
began = time.monotonic()

def note(what):
    # a timeline on stderr, shown when the test fails
    try:
        state = open("/proc/%d/stat" % server).read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "?"
    print("%.3f %s (server %s)" % (time.monotonic() - began, what, state), file=sys.stderr, flush=True)

def tcp_counts(c):
    info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("=QQ", info, 120)  # tcpi_bytes_acked, tcpi_bytes_received

def one(label, results, after_send=None):
    data = os.urandom(size)
    ok, offloaded = 0, -1
    try:
        note(label + ": connecting")
        c = socket.create_connection(("127.0.0.1", port), timeout=30)
        note(label + ": connected")
        c.sendall(data)
        note(label + ": sent")
        if after_send:
            after_send(c)
        got = bytearray()
        while len(got) < size:
            b = c.recv(16384)
            if not b:
                break
            got += b
        ok = int(hashlib.sha256(bytes(got)).digest() == hashlib.sha256(data).digest())
        acked, received = tcp_counts(c)
        offloaded = int(acked < size and received < size)
        c.close()
    except OSError as e:
        print("error", label, e, file=sys.stderr, flush=True)
    results.append("conn %s ok=%d offloaded=%d" % (label, ok, offloaded))

def all_stopped():
    try:
        for tid in os.listdir("/proc/%d/task" % server):
            with open("/proc/%d/task/%s/stat" % (server, tid)) as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                    return False
    except OSError:
        return False
    return True

def cont():
    os.kill(server, signal.SIGCONT)
    note("SIGCONT")

def stopped(label, during=None, **hooks):
    # the server stops before the connect(); DURING (a thread) or a hook
    # continues it; whatever happens, it is continued before this returns
    results = []
    os.kill(server, signal.SIGSTOP)
    # a stop takes effect in each thread as it next leaves the kernel: a
    # probe may still be answered meanwhile, so wait until every thread
    # of the server is stopped (bounded)
    end = time.monotonic() + 20
    while time.monotonic() < end and not all_stopped():
        time.sleep(0.002)
    note("SIGSTOP")
    helper = threading.Thread(target=during) if during else None
    try:
        if helper:
            helper.start()
        one(label, results, **hooks)
    finally:
        if helper:
            helper.join()
        cont()
    return results

def twin_queue():
    # bytes queued on the listener's UDP twin (127.0.0.1:port, /proc/net/udp)
    with open("/proc/net/udp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(":%04X" % port):
                return int(fields[4].split(":")[1], 16)
    return 0

def resend_then_cont():
    # the stopped server's twin holds the probe, then its first resend
    # (30 ms later: the queue doubles, the datagrams being alike); a
    # nonblocking connect() is writable only once the probe is answered,
    # so this cannot wait for connect() to return; bounded
    end, first = time.monotonic() + 20, 0
    while time.monotonic() < end:
        queued = twin_queue()
        first = first or queued
        if first and queued >= 2 * first:
            break
        time.sleep(0.005)
    cont()

def tcp_then_cont(c):
    # the payload is on TCP once the stopped server's kernel acked it: the
    # probe timed out (however late a loaded machine ran us); bounded
    end = time.monotonic() + 20
    while tcp_counts(c)[0] < size and time.monotonic() < end:
        time.sleep(0.05)
    cont()

out = []
one("warm", out)
out += stopped("resend", during=resend_then_cont)
out += stopped("timeout", after_send=tcp_then_cont)
threads = [threading.Thread(target=one, args=("after%d" % i, out)) for i in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for line in out:
    print(line, flush=True)
PY

rc=0
timeout -k 2 90 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_PROBE_TIMEOUT_MS=2000 \
	python3 "$FS_TMP/client.py" "$PORT" "$SRV" >"$FS_TMP/client.out" 2>"$FS_TMP/client.err" || rc=$?
kill -CONT "$SRV" 2>/dev/null || true # (the client continues it; this is in case it died first)
[ "$rc" = 0 ] || fs_fail "the client exited $rc: $(grep -v 'stats:' "$FS_TMP/client.err" | tail -n 3 | tr '\n' ' ')"
sed "s/^/    /" "$FS_TMP/client.out" >&2

expect_conn() { # LABEL OFFLOADED
	local line
	line=$(grep -E "^conn $1 " "$FS_TMP/client.out" || true)
	if [ -z "$line" ]; then
		fs_fail "$1: no connection reported"
	elif [[ "$line" != *" ok=1 "* ]]; then
		fs_fail "$1: the echo was not byte-exact ($line)"
	elif [[ "$line" != *" offloaded=$2" ]]; then
		fs_fail "$1: offloaded=${line##*offloaded=}, expected $2"
	else
		fs_pass "$1: byte-exact, offloaded=$2"
	fi
}
expect_conn warm 1
expect_conn resend 1
expect_conn timeout 0
for i in 0 1 2; do expect_conn "after$i" 1; done

if kill -0 "$SRV" 2>/dev/null; then
	kill -TERM "$SRV"
	fs_wait_pid "$SRV" 20 || fs_fail "the server did not exit on SIGTERM"
else
	fs_fail "the server died"
fi
fs_expect_stats "$FS_TMP/client.err" "client" probes_timeout_listener=1 fallback_probe_timeout=1 \
	fallback_neg_cache=0 offloaded=5 kernel=1
repeated=$(fs_stat "$FS_TMP/server.err" probes_repeated)
if [ "${repeated:-0}" -ge 1 ]; then
	fs_pass "server: probes_repeated=$repeated (the resent probes answered from the record)"
else
	fs_fail "server: probes_repeated=${repeated:-none}, expected >= 1 (the client resent $(fs_stat "$FS_TMP/client.err" probes_resent) probes)"
fi
if [ "$FS_FAILS" != 0 ]; then
	echo "client's messages:" >&2
	grep -v ': stats:' "$FS_TMP/client.err" | tail -n 20 | sed "s/^/    /" >&2
	echo "server's messages:" >&2
	grep -v ': stats:' "$FS_TMP/server.err" | tail -n 20 | sed "s/^/    /" >&2
fi
fs_done
