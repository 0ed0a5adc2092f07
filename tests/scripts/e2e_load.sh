#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# How a process loads libfabric (core/fabric.c): the first offloaded
# connection of every process pays for it. Debian's libfabric links two PSM
# libraries whose constructors calibrate the CPU clock (~200 ms), and its
# verbs provider reads /proc/kallsyms twice (~80 ms); fabsock uses neither.
# A client process under the preload connects to a server under the
# preload, exchanges 1 MiB (checked) and reports which libraries it mapped:
#   default: fabsock's stand-ins (libfabsock-psm*.so), never the real PSM
#   libraries, and /proc/kallsyms never opened;
#   FABSOCK_STUB_PSM=0: the real PSM libraries, and the stream still works;
#   alone: a copy of libfabsock.so without the stand-ins beside it (a user
#   who copied the one file): the real PSM libraries, and a warning that
#   says so and where the stand-ins belong (the other two: no warning).
# Both runs must offload, TCP carrying only the handshake (nftables,
# fs_tcp_proof). (The time itself is a benchmark figure, not a test.)
. "$(dirname "$0")/lib.sh"

fs_need_nft
command -v python3 >/dev/null || fs_skip "python3 is missing"
libdir=$(dirname "$FABSOCK_LIB")
ls "$libdir"/libfabsock-psm*.so >/dev/null 2>&1 || fs_skip "no PSM stand-ins were built (this libfabric links no PSM library)"

cat >"$FS_TMP/peer.py" <<'PY'
import hashlib, os, socket, sys
mode, port = sys.argv[1], int(sys.argv[2])
data = bytes((i * 7 + 3) & 255 for i in range(1 << 20))
if mode == "server":
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port)); ls.listen(4); print("listening", flush=True)
    c, _ = ls.accept(); c.sendall(data); c.close()
else:
    s = socket.create_connection(("127.0.0.1", port)); got = bytearray()
    while True:
        d = s.recv(65536)
        if not d: break
        got += d
    maps = open("/proc/self/maps").read()
    libs = sorted({l.split()[-1].rsplit("/", 1)[-1] for l in maps.splitlines() if "psm" in l or "infinipath" in l})
    print("bytes", "ok" if bytes(got) == data else "BAD", len(got))
    print("libs", " ".join(libs) or "-")
PY

run() { # LABEL EXPECT_STUBS ENV...
	local label=$1 stubs=$2 port spid rc=0
	shift 2
	port=$(fs_free_port)
	fs_bg spid env "LD_PRELOAD=$RUN_LIB" FABSOCK_STATS=1 "$@" python3 "$FS_TMP/peer.py" server "$port" \
		>"$FS_TMP/s.out" 2>"$FS_TMP/s.err"
	fs_wait_listen "$port" || { fs_fail "$label: the server did not listen"; return 0; }
	fs_tcp_count_start "$port" || fs_fail "$label: nft counter not set up"
	local -a senv=(-E "LD_PRELOAD=$RUN_LIB" -E FABSOCK_STATS=1) kv
	for kv in "$@"; do senv+=(-E "$kv"); done
	# the preload for the traced client only, not for strace
	strace -f -qq -e trace=openat -o "$FS_TMP/trace" "${senv[@]}" \
		python3 "$FS_TMP/peer.py" client "$port" >"$FS_TMP/c.out" 2>"$FS_TMP/c.err" || rc=$?
	fs_wait_pid "$spid" 10 || true
	fs_tcp_proof "$label" fabsock 1
	if [ "$rc" -ne 0 ] || ! grep -q '^bytes ok' "$FS_TMP/c.out"; then
		fs_fail "$label: client exit $rc: $(tr '\n' ' ' <"$FS_TMP/c.out")"
		return 0
	fi
	[ "$(fs_stat "$FS_TMP/c.err" offloaded)" = 1 ] || fs_fail "$label: the client did not offload: $(fs_stats_fallbacks "$FS_TMP/c.err")"
	local libs kallsyms
	libs=$(sed -n 's/^libs //p' "$FS_TMP/c.out")
	kallsyms=$(grep -c '/proc/kallsyms' "$FS_TMP/trace" || true)
	if [ "$stubs" = yes ]; then
		if [[ " $libs " == *" libfabsock-psm"* ]] && [[ " $libs " != *" libpsm2.so"* ]] &&
			[[ " $libs " != *"libinfinipath"* ]] && [ "$kallsyms" = 0 ]; then
			fs_pass "$label: mapped $libs; /proc/kallsyms opened $kallsyms times"
		else
			fs_fail "$label: mapped '$libs', /proc/kallsyms opened $kallsyms times (want the stand-ins only, 0)"
		fi
	elif [[ " $libs " == *" libpsm2.so"* ]] && [[ " $libs " != *" libfabsock-psm"* ]]; then
		fs_pass "$label: mapped $libs"
	else
		fs_fail "$label: mapped '$libs' (want the real PSM libraries)"
	fi
	local warned=no
	grep -q "libfabric loaded the real PSM libraries.*not found beside $(dirname "$RUN_LIB");" "$FS_TMP/c.err" && warned=yes
	if [ "$warned" = "${WANT_WARN:-no}" ]; then
		fs_pass "$label: the missing stand-ins warning: $warned"
	else
		fs_fail "$label: the missing stand-ins warning: $warned (want ${WANT_WARN:-no}): $(grep -h 'PSM' "$FS_TMP/c.err" | head -n 2)"
	fi
}

command -v strace >/dev/null || fs_skip "strace is missing"
RUN_LIB=$FABSOCK_LIB
run "stand-ins" yes
run "FABSOCK_STUB_PSM=0" no FABSOCK_STUB_PSM=0
mkdir -p "$FS_TMP/alone"
cp "$FABSOCK_LIB" "$FS_TMP/alone/"
RUN_LIB=$FS_TMP/alone/$(basename "$FABSOCK_LIB") WANT_WARN=yes run "alone" no
fs_done
