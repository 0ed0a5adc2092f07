#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The local ring (core/ring.h): a sleeper of this host is woken by a write
# to the eventfd it handed its peer over a unix socket, not by a doorbell
# datagram. Cases (each echo byte-exact, offloaded, no payload over TCP):
#  - eventfd: a paced client and an echo server (every wait outlasts the
#    spin, so both sleep and are rung): both ends received the other's
#    eventfd and rang by it (bell_rings_local), rings woke both, no round
#    trip lost (a lost ring costs a sleeper its 250 ms safety slice);
#  - refused: the server hands its eventfd to nobody (FABSOCK_TEST_RING_
#    REFUSE): the client's handover fails and it rings by datagram (none
#    local), the server is still woken, nothing lost;
#  - foreign: a connector of another user (nobody) to the server's ring
#    socket reads nothing and no descriptor; one of the server's user
#    (the control: the check can fail) reads the eventfd and the sleepers'
#    page; the server counts
#    one refused, one given;
#  - awake: a server that thinks 300 us before each answer and a client
#    that, every other round, thinks 2 ms between its request and its read
#    (both FABSOCK_SPIN_US=0, so both engines are sleepy and arm every
#    message): the answers of those rounds find the client busy, not
#    asleep, and are not rung (bell_rings_skipped: its page said so), the
#    others are; no round lost (none over 200 ms), byte-exact;
#  - blocking: a thread-per-connection server and a client with two
#    threads, all in blocking calls and without a spin: each waiting thread
#    sleeps on its own stream (deep_beside), armed by its own messages,
#    and hardly any ARM goes by datagram; byte-exact;
#  - fork+exec: a python client that held the server's eventfd forks; the
#    child opens its own connection, fetches its own copy (the server hands
#    out a second), echoes byte-exact, then execs a program without the
#    preload that must hold no eventfd nor page; the parent keeps ringing through
#    the one it had. The client runs without a spin (FABSOCK_SPIN_US=0), so
#    that the server's answers must ring it on any host;
#  - perconn: a connection per request (fabsock-netbench connect: connect,
#    a round trip, close, one after the other, every one offloaded): the
#    entry of a peer outlives its last stream, so each side hands its
#    eventfd over once for all of them (before: once per connection, a
#    unix connection and a wake-up of the peer's service thread each); a
#    second client process is a new peer and gets its own handover; 40
#    short client processes after them (more than the 32 idle entries kept)
#    leave the server no descriptor 1.5 s after the last one ended.
. "$(dirname "$0")/lib.sh"

PROG=$FS_PROGS/fs_scale
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
fs_need_nft
# the system's: another user must be able to run it (not a shim in a home)
PY=/usr/bin/python3
[ -x "$PY" ] || fs_skip "$PY is needed"
ROUNDS=200 GAP_US=2000

dir=$FS_TMP/ring
mkdir -p "$dir"
chmod 755 "$FS_TMP" "$dir"

# start_server NAME [ENV...]: sets SPID and PORT
start_server() {
	local name=$1
	shift
	fs_bg SPID env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$@" "$PROG" server >"$dir/$name.s.out" 2>"$dir/$name.s.err"
	PORT=$(fs_listen_port "$dir/$name.s.out" "$SPID")
	[ -n "$PORT" ] || { fs_fail "$name: the server did not listen"; fs_done; exit 1; }
}
stop_server() { # NAME
	local rc=0
	kill -TERM "$SPID" 2>/dev/null || true
	fs_wait_pid "$SPID" 60 || rc=$?
	[ "$rc" = 0 ] || fs_fail "$1: server exit $rc"
}
# paced NAME [ENV...]: one paced client, checked
paced() {
	local name=$1 rc=0 lost
	shift
	timeout -k 5 90 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$@" "$PROG" paced "$PORT" 1 "$ROUNDS" "$GAP_US" \
		>"$dir/$name.c.out" 2>"$dir/$name.c.err" || rc=$?
	[ "$rc" = 0 ] && grep -q '^PASS paced$' "$dir/$name.c.out" ||
		fs_fail "$name: client exit $rc: $(grep -h '^FAIL' "$dir/$name.c.out" | head -n 2 | tr '\n' ' ')"
	grep -h '^paced ' "$dir/$name.c.out" >&2 || true
	lost=$(sed -n 's/^paced .* lost=\([0-9]*\).*/\1/p' "$dir/$name.c.out" | head -n 1)
	[ "${lost:-1}" = 0 ] || fs_fail "$name: ${lost:-?} round trips over 200 ms: a lost ring"
	# its warm-up connection and the timed one
	[ "$(fs_stat "$dir/$name.c.err" offloaded)" = 2 ] || fs_fail "$name: the client offloaded $(fs_stat "$dir/$name.c.err" offloaded), not 2"
}
st() { fs_stat "$dir/$1.err" "$2"; } # FILE-STEM COUNTER
ge() { # LABEL VALUE MIN
	[ "${2:-0}" -ge "$3" ] 2>/dev/null || fs_fail "$1 = ${2:-none}, want >= $3"
}
within() { # LABEL VALUE MIN MAX
	[ "${2:-0}" -ge "$3" ] 2>/dev/null && [ "${2:-0}" -le "$4" ] || fs_fail "$1 = ${2:-none}, want $3..$4"
}
eq() { # LABEL VALUE WANT
	[ "${2:-none}" = "$3" ] || fs_fail "$1 = ${2:-none}, want $3"
}

# ---- eventfd -------------------------------------------------------------
start_server ev
fs_tcp_count_start "$PORT" || fs_fail "nft counter not set up"
# the client without a spin: every echo it waits for finds it asleep, so
# the server's rings are needed (with the spin, an epoll server that
# answers within it, as it now does on an idle host, left none to ring)
paced ev FABSOCK_SPIN_US=0
fs_tcp_proof "eventfd" fabsock 2
stop_server ev
for side in ev.s ev.c; do
	fs_log "eventfd $side: handovers=$(st $side ring_handovers) given=$(st $side ring_given) rings_local=$(st $side bell_rings_local) rings_sent=$(st $side bell_rings_sent) received=$(st $side bell_rings_received)"
	eq "eventfd $side ring_handovers" "$(st $side ring_handovers)" 1
	eq "eventfd $side ring_handover_failed" "$(st $side ring_handover_failed)" 0
	# datagrams still ring before the handover completes, and for a late
	# ARM or a refused post (ring.h): a few
	d=$(($(st $side bell_rings_sent) - $(st $side bell_rings_local)))
	[ "$d" -le $((ROUNDS / 10)) ] || fs_fail "eventfd $side: $d of its rings were datagrams"
done
# The server sleeps GAP_US between requests, so nearly every request
# rings it; the client, without a spin, sleeps for most echoes (one that
# is there before its first look needs no ring).
ge "eventfd client bell_rings_local" "$(st ev.c bell_rings_local)" $((ROUNDS / 4))
ge "eventfd server bell_rings_received" "$(st ev.s bell_rings_received)" $((ROUNDS / 4))
ge "eventfd server bell_rings_local" "$(st ev.s bell_rings_local)" $((ROUNDS / 10))
ge "eventfd client bell_rings_received" "$(st ev.c bell_rings_received)" $((ROUNDS / 10))
[ "$FS_FAILS" = 0 ] && fs_pass "eventfd: $ROUNDS paced round trips, both ends rung through the eventfd they handed over"

# ---- awake: no ring for a peer that is not asleep ---------------------------
f0=$FS_FAILS
PP=$FS_PROGS/fs_pingpong
fs_bg SPID env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_SPIN_US=0 FABSOCK_STEPBACK=0 \
	"$PP" server 300 >"$dir/aw.s.out" 2>"$dir/aw.s.err"
PORT=$(fs_listen_port "$dir/aw.s.out" "$SPID")
[ -n "$PORT" ] || { fs_fail "awake: the server did not listen"; fs_done; exit 1; }
fs_tcp_count_start "$PORT" || fs_fail "nft counter not set up"
rc=0
timeout -k 5 120 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_SPIN_US=0 FABSOCK_STEPBACK=0 \
	"$PP" client "$PORT" 1 400 64 --think-us 2000 >"$dir/aw.c.out" 2>"$dir/aw.c.err" || rc=$?
fs_tcp_proof "awake" fabsock 1
stop_server awake
grep -q '^PASS pingpong$' "$dir/aw.c.out" || fs_fail "awake: client exit $rc: $(grep -h 'FAIL' "$dir/aw.c.out" | head -n 2 | tr '\n' ' ')"
max=$(sed -n 's/^max_turn_ms=\([0-9.]*\).*/\1/p' "$dir/aw.c.out")
fs_log "awake: server rings_local=$(st aw.s bell_rings_local) skipped=$(st aw.s bell_rings_skipped); client received=$(st aw.c bell_rings_received); max turn ${max:-?} ms ($(sed -n 's/^max_turn_ms=[0-9.]* //p' "$dir/aw.c.out"))"
# 200 answers came while the client thought: most are not rung (a few
# may come after its 2 ms under load, and are rung); 200 came while it
# waited, asleep, and are rung (a few may come before it counted itself
# asleep: not rung, and found by its look)
ge "awake: server bell_rings_skipped" "$(st aw.s bell_rings_skipped)" 100
ge "awake: server rings written" "$(($(st aw.s bell_rings_local) - $(st aw.s bell_rings_skipped)))" 100
ge "awake: client bell_rings_received" "$(st aw.c bell_rings_received)" 100
awk -v m="${max:-1e9}" 'BEGIN { exit !(m < 200) }' || fs_fail "awake: a round took ${max:-?} ms (over 200: a lost ring)"
grep -q 'killed by\|Segmentation\|Aborted' "$dir"/aw.*.err && fs_fail "awake: a process died by a signal"
[ "$FS_FAILS" = "$f0" ] && fs_pass "awake: answers to a busy client not rung, to a sleeping one rung, nothing lost"

# ---- blocking: threads in blocking calls sleep on their own streams -------
# A thread per connection on both ends (fs_pingpong: the server reads and
# writes with blocking calls, each client thread writes and reads back),
# both without a spin, so every wait sleeps beside the other thread's:
# each sleeps on its own stream, armed by its last message, not in the
# poller's slices, and no engine arms the other thread's stream by
# datagram (before: every wait of the poller sent the peer an ARM datagram
# for the stream the other thread had just read from, and the other thread
# slept until the poller's round found its message).
f0=$FS_FAILS
BR=2000
fs_bg SPID env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_SPIN_US=0 FABSOCK_STEPBACK=0 \
	"$PP" server >"$dir/bl.s.out" 2>"$dir/bl.s.err"
PORT=$(fs_listen_port "$dir/bl.s.out" "$SPID")
[ -n "$PORT" ] || { fs_fail "blocking: the server did not listen"; fs_done; exit 1; }
fs_tcp_count_start "$PORT" || fs_fail "nft counter not set up"
rc=0
timeout -k 5 120 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_SPIN_US=0 FABSOCK_STEPBACK=0 \
	"$PP" client "$PORT" 2 "$BR" 64 >"$dir/bl.c.out" 2>"$dir/bl.c.err" || rc=$?
fs_tcp_proof "blocking" fabsock 2
stop_server blocking
grep -q '^PASS pingpong$' "$dir/bl.c.out" || fs_fail "blocking: client exit $rc: $(grep -h 'FAIL' "$dir/bl.c.out" | head -n 2 | tr '\n' ' ')"
for side in bl.s bl.c; do
	fs_log "blocking $side: deep_beside=$(st $side deep_beside) bell_arms=$(st $side bell_arms) inline=$(st $side bell_arms_inline) rings_local=$(st $side bell_rings_local) received=$(st $side bell_rings_received)"
	eq "blocking $side offloaded" "$(st $side offloaded)" 2
	# 2 x BR waits on each side, nearly all asleep beside the other's
	ge "blocking $side deep_beside" "$(st $side deep_beside)" "$BR"
	d=$(($(st $side bell_arms) - $(st $side bell_arms_inline)))
	[ "$d" -le $((BR / 10)) ] || fs_fail "blocking $side: $d of its ARMs were datagrams"
done
grep -q 'killed by\|Segmentation\|Aborted' "$dir"/bl.*.err && fs_fail "blocking: a process died by a signal"
[ "$FS_FAILS" = "$f0" ] && fs_pass "blocking: two threads per end in blocking calls slept on their own streams, armed by their messages, byte-exact"

# ---- refused: the datagram fall-back -------------------------------------
f0=$FS_FAILS
start_server rf FABSOCK_TEST_RING_REFUSE=1
fs_tcp_count_start "$PORT" || fs_fail "nft counter not set up"
paced rf
fs_tcp_proof "refused" fabsock 2
stop_server rf
fs_log "refused: client failed=$(st rf.c ring_handover_failed) local=$(st rf.c bell_rings_local) sent=$(st rf.c bell_rings_sent); server refused=$(st rf.s ring_refused) received=$(st rf.s bell_rings_received)"
eq "refused: client ring_handover_failed" "$(st rf.c ring_handover_failed)" 1
eq "refused: client bell_rings_local" "$(st rf.c bell_rings_local)" 0
ge "refused: client bell_rings_sent (datagrams)" "$(st rf.c bell_rings_sent)" $((ROUNDS / 4))
ge "refused: server ring_refused" "$(st rf.s ring_refused)" 1
ge "refused: server bell_rings_received" "$(st rf.s bell_rings_received)" $((ROUNDS / 4))
[ "$FS_FAILS" = "$f0" ] && fs_pass "refused: the client rang the server by datagram, nothing lost"

# ---- foreign: another user's connector gets nothing ----------------------
f0=$FS_FAILS
if ! id nobody >/dev/null 2>&1 || ! command -v setpriv >/dev/null || [ "$(id -u)" != 0 ]; then
	fs_log "foreign: skipped (needs root, setpriv and the nobody user)"
else
	start_server fo
	paced fo # its bell, and so its ring socket, open with the first HELLO
	name=$(sed -n "s/.*@\(fabsock-ring-$SPID-[0-9]*\)\$/\1/p" /proc/net/unix | head -n 1)
	if [ -z "$name" ]; then
		fs_fail "foreign: the server ($SPID) has no ring socket in /proc/net/unix"
	else
		cat >"$dir/connect.py" <<'PY'
import array, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(5)
s.connect("\0" + sys.argv[1])
try:
    data, anc, flags, _ = s.recvmsg(64, socket.CMSG_SPACE(16 * 4))
except socket.timeout:
    data, anc = b"", []
fds = array.array("i")
for level, kind, blob in anc:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
        fds.frombytes(blob[: len(blob) - len(blob) % fds.itemsize])
print("got bytes=%d fds=%d" % (len(data), len(fds)))
PY
		chmod 644 "$dir/connect.py"
		got=$(timeout 20 setpriv --reuid=nobody --regid=nogroup --clear-groups "$PY" "$dir/connect.py" "$name" 2>&1 || true)
		eq "foreign: what nobody read" "$got" "got bytes=0 fds=0"
		got=$(timeout 20 "$PY" "$dir/connect.py" "$name" 2>&1 || true)
		# the eventfd and the page counting the server's sleepers
		eq "foreign: what the server's own user read (control)" "$got" "got bytes=12 fds=2"
	fi
	stop_server fo
	eq "foreign: server ring_refused" "$(st fo.s ring_refused)" 1
	eq "foreign: server ring_given (the paced client and the control)" "$(st fo.s ring_given)" 2
	[ "$FS_FAILS" = "$f0" ] && fs_pass "foreign: another user's connector read nothing, the server's own user the eventfd"
fi

# ---- fork+exec of a process holding the eventfd --------------------------
f0=$FS_FAILS
start_server fx
fs_tcp_count_start "$PORT" || fs_fail "nft counter not set up"
cat >"$dir/forker.py" <<'PY'
import os, socket, sys, time
port, rounds = int(sys.argv[1]), int(sys.argv[2])

def pingpong(tag):
    s = socket.create_connection(("127.0.0.1", port))
    for i in range(rounds):
        msg = os.urandom(64)
        s.sendall(msg)
        got = b""
        while len(got) < 64:
            chunk = s.recv(64 - len(got))
            if not chunk:
                print("FAIL %s: EOF at round %d" % (tag, i)); sys.exit(1)
            got += chunk
        if got != msg:
            print("FAIL %s: echo differs at round %d" % (tag, i)); sys.exit(1)
        time.sleep(0.002)
    s.close()

pingpong("before")  # the handover happens here
pid = os.fork()
if pid == 0:
    pingpong("child")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    code = ("import os\n"
            "n = m = 0\n"
            "for f in os.listdir('/proc/self/fd'):\n"
            "    try:\n"
            "        l = os.readlink('/proc/self/fd/' + f)\n"
            "        n += l == 'anon_inode:[eventfd]'\n"
            "        m += l.startswith('/memfd:fabsock-ring')\n"
            "    except OSError:\n"
            "        pass\n"
            "print('exec eventfds=%d' % n)\n"
            "print('exec ring pages=%d' % m)\n")
    os.execve(sys.executable, [sys.executable, "-c", code], env)
pingpong("parent")
_, status = os.waitpid(pid, 0)
print("child status=%d" % status)
print("PASS forker" if status == 0 else "FAIL child")
PY
rc=0
# FABSOCK_SPIN_US=0: every answer finds the client asleep, so the server
# rings it and must fetch its eventfd (and the child's); with the default
# spin a fast host's answers came within it, the server never rang, and
# fetched none (server ring_handovers 0-1 on a 2-core Intel Xeon VM)
timeout -k 5 120 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 FABSOCK_SPIN_US=0 "$PY" "$dir/forker.py" "$PORT" 150 \
	>"$dir/fx.c.out" 2>"$dir/fx.c.err" || rc=$?
fs_tcp_proof "fork+exec" fabsock 3
stop_server fx
grep -q '^PASS forker$' "$dir/fx.c.out" || fs_fail "fork+exec: exit $rc: $(grep -h 'FAIL\|status' "$dir/fx.c.out" | tr '\n' ' ')"
fs_log "fork+exec: parent handovers=$(st fx.c ring_handovers) failed=$(st fx.c ring_handover_failed) given=$(st fx.c ring_given) rings_local=$(st fx.c bell_rings_local); server handovers=$(st fx.s ring_handovers) failed=$(st fx.s ring_handover_failed) given=$(st fx.s ring_given) offloaded=$(st fx.s offloaded)"
eq "fork+exec: eventfds in the exec'd program" "$(sed -n 's/^exec eventfds=//p' "$dir/fx.c.out")" 0
eq "fork+exec: ring pages in the exec'd program" "$(sed -n 's/^exec ring pages=//p' "$dir/fx.c.out")" 0
# the parent's own line is the last: the forked child's stats never print (it execs)
eq "fork+exec: parent offloaded" "$(st fx.c offloaded)" 2
# A peer's eventfd goes with the last stream with it (ring.h): the parent's
# connection before the fork may be freed before its next one joins (then
# both ends fetch again) or after (the entry is kept): 1 or 2 handovers to
# the parent, and the child always fetches its own.
within "fork+exec: parent ring_handovers (one per spell of streams with the server)" "$(st fx.c ring_handovers)" 1 2
ge "fork+exec: parent bell_rings_local" "$(st fx.c bell_rings_local)" 10
within "fork+exec: server ring_given (parent once or twice, child)" "$(st fx.s ring_given)" 2 3
within "fork+exec: server ring_handovers (the parent's, the child's)" "$(st fx.s ring_handovers)" 2 3
eq "fork+exec: server offloaded" "$(st fx.s offloaded)" 3
if grep -q 'killed by\|Segmentation\|Aborted' "$dir"/fx.*.err; then fs_fail "fork+exec: a process died by a signal"; fi
[ "$FS_FAILS" = "$f0" ] && fs_pass "fork+exec: parent and child rang through their own handovers, the exec'd program holds no eventfd"
# ---- perconn: one handover for many connections ---------------------------
f0=$FS_FAILS
NETBENCH=${FS_BUILD:-}/tools/fabsock-netbench
if [ ! -x "$NETBENCH" ]; then
	fs_fail "perconn: no $NETBENCH (FS_BUILD must name the build directory)"
else
	PC=60 # timed connections; netbench makes 10 untimed ones first
	fs_bg SPID env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$NETBENCH" server --port 0 \
		--ready-file "$dir/pc.ready" >"$dir/pc.s.out" 2>"$dir/pc.s.err"
	for _ in $(seq 1 200); do [ -s "$dir/pc.ready" ] && break; fs_sleep 0.05; done
	PORT=$(cat "$dir/pc.ready" 2>/dev/null || true)
	if [ -z "$PORT" ]; then
		fs_fail "perconn: the server did not listen"
	else
		fs_tcp_count_start "$PORT" || fs_fail "nft counter not set up"
		for c in 1 2; do
			rc=0
			timeout -k 5 90 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$NETBENCH" connect 127.0.0.1 "$PORT" \
				--count "$PC" >"$dir/pc$c.c.out" 2>"$dir/pc$c.c.err" || rc=$?
			[ "$rc" = 0 ] || fs_fail "perconn: client $c exit $rc: $(tail -n 2 "$dir/pc$c.c.err" | tr '\n' ' ')"
			eq "perconn: client $c connections" "$(sed -n 's/^connections=\([0-9]*\).*/\1/p' "$dir/pc$c.c.out")" "$PC"
			eq "perconn: client $c offloaded" "$(st pc$c.c offloaded)" $((PC + 10))
			eq "perconn: client $c ring_handovers" "$(st pc$c.c ring_handovers)" 1
			eq "perconn: client $c ring_handover_failed" "$(st pc$c.c ring_handover_failed)" 0
		done
		# more client processes, one after another, than the server keeps
		# idle entries for (FS_RING_IDLE_MAX, 32): the release past the cap
		# frees the ended ones' entries, and a second after the last one
		# ended the sweep has freed every eventfd and pidfd they left:
		# the server holds no more descriptors than before them
		fd0=$(ls "/proc/$SPID/fd" 2>/dev/null | wc -l)
		for c in $(seq 1 40); do
			timeout -k 5 30 env "LD_PRELOAD=$FABSOCK_LIB" "$NETBENCH" connect 127.0.0.1 "$PORT" --count 1 \
				>"$dir/pcs.out" 2>"$dir/pcs.err" || fs_fail "perconn: short client $c: $(tail -n 1 "$dir/pcs.err")"
		done
		fs_sleep 1.5
		fd1=$(ls "/proc/$SPID/fd" 2>/dev/null | wc -l)
		fs_log "perconn: server descriptors $fd0 before 40 short client processes, $fd1 1.5 s after them"
		[ "$fd1" -le "$fd0" ] || fs_fail "perconn: the server holds $fd1 descriptors after 40 short clients, $fd0 before"
		# the round trips' bytes (fs_tcp_proof: the HELLOs and ACKs only)
		fs_tcp_proof "perconn" fabsock $((2 * (PC + 10) + 40 * 11))
		kill -INT "$SPID" 2>/dev/null || true
		fs_wait_pid "$SPID" 30 || fs_fail "perconn: the server did not end on SIGINT"
		fs_log "perconn: server handovers=$(st pc.s ring_handovers) given=$(st pc.s ring_given) offloaded=$(st pc.s offloaded)"
		# one eventfd from each client process, one of ours to each
		# one of ours to each of the 42 client processes; theirs come at
		# the server's first ring to each (a short one may end before it)
		eq "perconn: server ring_given" "$(st pc.s ring_given)" 42
		within "perconn: server ring_handovers" "$(st pc.s ring_handovers)" 2 42
		grep -q 'killed by\|Segmentation\|Aborted' "$dir"/pc*.err && fs_fail "perconn: a process died by a signal"
	fi
fi
[ "$FS_FAILS" = "$f0" ] && fs_pass "perconn: $((2 * (PC + 10))) connections from two processes, one eventfd handover per process pair; 40 short processes after them left no descriptor at the server"

fs_done
