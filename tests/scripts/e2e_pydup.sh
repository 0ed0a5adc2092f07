#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Python's socket.dup() (issue 26): Debian's python3 calls fcntl64(fd,
# F_DUPFD_CLOEXEC), which fabsock once did not see. The client connects,
# sends 1000 bytes, dup()s the socket, closes the original and sends 1 MiB
# through the duplicate, then closes it; the server reads until the end of
# the stream and prints how many bytes came, their sha256 and how the stream
# ended (eof, or the exception). Once on the kernel, then FS_PYDUP_RUNS (3)
# times with both ends under the preload. Every run: both exit 0, the server
# read exactly 1000 + 1 MiB with the client's sha256 and a clean end of
# stream (it once read an end of stream after 1000 bytes: the rest went over
# the kernel socket, the control connection, which reset the stream); under
# fabsock both ends offloaded the connection (stats lines), no reset was
# counted, and TCP carried no more than the handshake (nftables).
. "$(dirname "$0")/lib.sh"
fs_need_nft

PY=/usr/bin/python3
[ -x "$PY" ] || fs_skip "no $PY (apt-get install python3)"
RUNS=${FS_PYDUP_RUNS:-3}

cat >"$FS_TMP/server.py" <<'EOF'
import hashlib, socket, sys
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0))
lst.listen(1)
print("listening port=%d" % lst.getsockname()[1], flush=True)
conn, _ = lst.accept()
h, n, end = hashlib.sha256(), 0, "eof"
try:
    while True:
        b = conn.recv(65536)
        if not b:
            break
        h.update(b)
        n += len(b)
except OSError as e:
    end = type(e).__name__
print("bytes=%d sha256=%s end=%s" % (n, h.hexdigest(), end), flush=True)
conn.close()
lst.close()
EOF
cat >"$FS_TMP/client.py" <<'EOF'
import hashlib, random, socket, sys
data = random.Random(26).randbytes(1000 + (1 << 20))
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(data[:1000])
d = s.dup()  # fcntl64(fd, F_DUPFD_CLOEXEC)
s.close()
d.sendall(data[1000:])
d.close()
print("bytes=%d sha256=%s" % (len(data), hashlib.sha256(data).hexdigest()), flush=True)
EOF

pydup_run() { # MODE N
	local mode=$1 n=$2 label="$1 run $2" dir=$FS_TMP/$1-$2 srv cli port rc_s=0 rc_c=0 want got
	local -a prefix=(env)
	[ "$mode" = fabsock ] && prefix=(env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1)
	mkdir -p "$dir"
	fs_bg srv "${prefix[@]}" "$PY" "$FS_TMP/server.py" >"$dir/server.out" 2>"$dir/server.err"
	port=$(fs_listen_port "$dir/server.out" "$srv")
	[ -n "$port" ] || { fs_fail "$label: the server did not listen"; fs_wait_pid "$srv" 1 || true; return 0; }
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	fs_bg cli "${prefix[@]}" "$PY" "$FS_TMP/client.py" "$port" >"$dir/client.out" 2>"$dir/client.err"
	fs_wait_pid "$cli" 30 || rc_c=$?
	fs_wait_pid "$srv" 15 || rc_s=$?
	fs_tcp_proof "$label" "$mode" 1
	want=$(sed -n 's/^bytes=\([0-9]*\) sha256=\([0-9a-f]*\)$/bytes=\1 sha256=\2 end=eof/p' "$dir/client.out")
	got=$(grep '^bytes=' "$dir/server.out" || true)
	if [ "$rc_c" -ne 0 ] || [ "$rc_s" -ne 0 ] || [ -z "$want" ] || [ "$got" != "$want" ]; then
		fs_fail "$label: client exit $rc_c, server exit $rc_s; server read '${got:-nothing}', client sent '${want:-nothing}'"
		grep -hv ': stats:' "$dir/server.err" "$dir/client.err" | tail -n 5 | sed 's/^/    /' >&2 || true
		return 0
	fi
	if [ "$mode" = fabsock ]; then
		local so co resets
		so=$(fs_stat_sum "$dir/server.err" offloaded)
		co=$(fs_stat_sum "$dir/client.err" offloaded)
		resets=$(fs_stat_sum "$dir/server.err" resets)
		if [ "$so" != 1 ] || [ "$co" != 1 ] || [ "$resets" != 0 ]; then
			fs_fail "$label: server offloaded=$so, client offloaded=$co (expected 1 each), server resets=$resets (expected 0)"
			return 0
		fi
		! grep -q 'unexpected bytes on the control connection' "$dir/server.err" ||
			{ fs_fail "$label: the server saw bytes on the control connection"; return 0; }
	fi
	fs_pass "$label: $got"
}

pydup_run kernel 1
for i in $(seq 1 "$RUNS"); do
	pydup_run fabsock "$i"
done
fs_done
