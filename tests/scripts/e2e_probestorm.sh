#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A probe storm must not keep a legitimate client off the fabric for longer
# than the documented bound (issue 16: rate limits do not turn into a
# denial of offload; docs/security.md: at most FS_NEGCACHE_TIMEOUT_SEC,
# 10 s, after the storm ends). A root echo server under the preload
# (fs_rawpeer serve); a root client under the preload (python3) makes a
# connection every 250 ms for the whole run: 64 KiB out, the echo back,
# sha256 compared, and whether the kernel TCP connection carried the
# payload (TCP_INFO bytes_acked and bytes_received) says whether that
# connection was offloaded. After a second of that, nobody (setpriv, when
# run as root) sends well-formed probes as fast as it can for STORM_SEC
# seconds, beyond the listener's 20,000 answers a second. Checks: every
# connection byte-exact, none failed; those before the storm offloaded;
# every connection that began more than BOUND_SEC after the storm ended
# offloaded; the storm really exceeded the rate limit; the server lives.
# Prints how many connections the storm sent to TCP and how long after its
# end offload came back.
. "$(dirname "$0")/lib.sh"

RAW=$FS_PROGS/fs_rawpeer
[ -x "$RAW" ] || { fs_fail "$RAW is not built"; fs_done; exit 1; }
command -v python3 >/dev/null || fs_skip "python3 is missing"
STORM_SEC=3
BOUND_SEC=11 # FS_NEGCACHE_TIMEOUT_SEC (10) and a second for the client's own pace
AFTER_SEC=$((BOUND_SEC + 3))
RATE_LIMIT=20000

fs_attacker "$RAW"

PORT=$(fs_free_port) || fs_skip "no free port"
fs_bg SRV env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "$RAW" serve --port "$PORT" \
	--ready-file "$FS_TMP/ready" >"$FS_TMP/server.out" 2>"$FS_TMP/server.err"
for _ in $(seq 1 200); do [ -s "$FS_TMP/ready" ] && break; fs_sleep 0.05; done
[ -s "$FS_TMP/ready" ] || { fs_fail "the server did not start"; fs_done; exit 1; }
fs_wait_listen "$PORT"

cat >"$FS_TMP/client.py" <<'PY'
import hashlib, os, socket, struct, sys, time
port, seconds, stop = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
size = 65536
end = time.monotonic() + seconds
while time.monotonic() < end and not os.path.exists(stop):
    began = time.monotonic()
    data = os.urandom(size)
    ok = 0
    offloaded = -1
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=20)
        c.sendall(data)
        got = bytearray()
        while len(got) < size:
            b = c.recv(16384)
            if not b:
                break
            got += b
        ok = int(hashlib.sha256(bytes(got)).digest() == hashlib.sha256(data).digest())
        info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        acked, received = struct.unpack_from("=QQ", info, 120)  # tcpi_bytes_acked, tcpi_bytes_received
        offloaded = int(acked < size and received < size)
        c.close()
    except OSError as e:
        print("error", e, file=sys.stderr)
    print("conn began=%.3f ok=%d offloaded=%d" % (began, ok, offloaded), flush=True)
    time.sleep(max(0.0, began + 0.25 - time.monotonic()))
PY

TOTAL=$((30 + STORM_SEC + AFTER_SEC)) # at most; it stops when told
fs_bg CLI timeout -k 2 $((TOTAL + 60)) env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 \
	python3 "$FS_TMP/client.py" "$PORT" "$TOTAL" "$FS_TMP/stop" >"$FS_TMP/client.out" 2>"$FS_TMP/client.err"
# the storm begins once the client made a few connections (a slow start,
# a sanitizer build, must not leave none before it)
for _ in $(seq 1 300); do
	n=$(grep -c '^conn ' "$FS_TMP/client.out" 2>/dev/null || true)
	[ "${n:-0}" -ge 4 ] && break
	kill -0 "$CLI" 2>/dev/null || break
	sleep 0.1
done
rc=0
"${ATTACKER[@]}" FS_STORM_SEC=$STORM_SEC timeout 60 "$ATTACKER_RAW" 127.0.0.1 "$PORT" probe_storm \
	>"$FS_TMP/storm.out" 2>&1 || rc=$?
sed "s/^/    /" "$FS_TMP/storm.out" >&2
sleep "$AFTER_SEC"
touch "$FS_TMP/stop"
rc_cli=0
fs_wait_pid "$CLI" $((TOTAL + 60)) || rc_cli=$?
[ "$rc_cli" = 0 ] || fs_fail "the client exited $rc_cli: $(tail -n 3 "$FS_TMP/client.err" | tr '\n' ' ')"

rate=$(sed -n 's/.* rate=\([0-9]*\) .*/\1/p' "$FS_TMP/storm.out")
ended=$(sed -n 's/.* ended_at=\([0-9.]*\).*/\1/p' "$FS_TMP/storm.out")
started=$(sed -n 's/.* started_at=\([0-9.]*\) .*/\1/p' "$FS_TMP/storm.out")
if [ "$rc" != 0 ] || [ -z "$rate" ] || [ -z "$ended" ] || [ -z "$started" ]; then
	fs_fail "the storm did not run (exit $rc)"
elif [ "$rate" -le "$RATE_LIMIT" ]; then
	fs_fail "the storm sent $rate probes a second, not above the listener's $RATE_LIMIT: nothing was measured"
else
	# before: connections that began (and sent their probe) at least 0.1 s
	# before the storm began; after: those that began more than BOUND_SEC
	# after it ended
	read -r total bad before before_off during_tcp after after_off back <<<"$(awk -v end="$ended" -v bound="$BOUND_SEC" \
		-v start="$started" '
		/^conn / {
			split($2, b, "="); split($3, o, "="); split($4, f, "=")
			t = b[2]; total++
			if (o[2] != 1 || f[2] < 0) bad++
			if (t < start - 0.1) { before++; before_off += (f[2] == 1) }
			else if (t <= end) { during_tcp += (f[2] == 0) }
			if (t > end + bound) { after++; after_off += (f[2] == 1) }
			if (t > end && f[2] == 1 && back == "") back = t - end
			if (t > end && f[2] == 0) back = ""
		}
		END { printf "%d %d %d %d %d %d %d %s\n", total, bad, before, before_off, during_tcp, after, after_off, (back == "" ? "never" : sprintf("%.2f", back)) }
	' "$FS_TMP/client.out")"
	fs_log "storm: $rate probes/s for ${STORM_SEC}s; client: $total connections, $during_tcp during the storm on TCP; offload back $back s after the storm"
	[ "$total" -ge 10 ] || fs_fail "only $total connections made"
	[ "$bad" = 0 ] || fs_fail "$bad connections failed or echoed wrong bytes"
	[ "$before" -ge 1 ] && [ "$before_off" = "$before" ] ||
		fs_fail "before the storm $before_off of $before connections offloaded"
	[ "$after" -ge 4 ] && [ "$after_off" = "$after" ] ||
		fs_fail "more than ${BOUND_SEC}s after the storm $after_off of $after connections offloaded"
	[ "$FS_FAILS" = 0 ] && fs_pass "a ${STORM_SEC}s probe storm at $rate/s: every connection byte-exact, offload back ${back}s after it (bound ${BOUND_SEC}s)"
fi
if kill -0 "$SRV" 2>/dev/null; then
	fs_pass "the server lives"
	kill -TERM "$SRV"
	fs_wait_pid "$SRV" 20 || fs_fail "server exit on SIGTERM"
else
	fs_fail "the server died"
fi
fs_done
