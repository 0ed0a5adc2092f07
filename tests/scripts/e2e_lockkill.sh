#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A peer SIGKILLed while it holds a shm region lock (issue 26): the release
# by core/fabric_shm.c's watchdog, which nothing else exercises. fs_lockkill
# (under the preload, one process that forks two servers and connects to
# both over shm) has the victim take a region lock, found as
# fs_shm_find_lock finds it, and SIGKILLs it (tests/progs/fs_lockkill.c):
#   own   the victim holds its own region's lock; the survivor's next send
#         to it enters that region and waits for the lock;
#   ours  the victim holds the survivor's region's lock (as a sender killed
#         inside a send to it would); the third process's credits to the
#         survivor wait for it, and the survivor, sending to the third, makes
#         no call that gets stuck itself.
# Each round must pass (exit 0, `PASS <round>`: the send returned and 1 MiB
# reached the third process intact, then EOF, within the program's bound (5 s)
# from the kill), the survivor must have offloaded both connections and
# logged the watchdog's release ("stayed taken while a peer process was
# gone"), and the kernel's TCP on the two servers' ports must have carried
# no payload besides the handshakes (fs_tcp_proof: the 64 KiB and the 1 MiB
# went over the fabric). Not timing-sensitive beyond that generous bound (fs_lockkill.c).
# FS_LOCKKILL_ROUNDS (1) repeats both.
. "$(dirname "$0")/lib.sh"
fs_need_nft

PROG=$FS_PROGS/fs_lockkill
ROUNDS=${FS_LOCKKILL_ROUNDS:-1}
[ -x "$PROG" ] || { fs_fail "$PROG is not built"; fs_done; exit 1; }
[ -f "$FABSOCK_LIB" ] || { fs_fail "$FABSOCK_LIB does not exist"; fs_done; exit 1; }

for n in $(seq 1 "$ROUNDS"); do
	for round in own ours; do
		dir=$FS_TMP/$round-$n label="$round (round $n)" rc=0 fails_before=$FS_FAILS
		mkdir -p "$dir"
		vport=$(fs_free_port) && tport=$(fs_free_port) && [ "$vport" != "$tport" ] ||
			{ fs_fail "$label: no free ports"; continue; }
		fs_tcp_count_start "$vport" "$tport" || fs_fail "$label: nft counter not set up"
		timeout 90 env "LD_PRELOAD=$FABSOCK_LIB" FABSOCK_STATS=1 "$PROG" "$round" "$vport" "$tport" \
			>"$dir/out" 2>"$dir/err" || rc=$?
		# both connections (64 KiB to V, 1 MiB to T) over the fabric:
		# the kernel's TCP carried their handshakes only
		fs_tcp_proof "$label" fabsock 2
		pid=$(sed -n 's/^pid=//p' "$dir/out")
		if [ "$rc" -ne 0 ] || ! grep -qx "PASS $round" "$dir/out"; then
			fs_fail "$label: exit $rc: $(grep -h '^FAIL' "$dir/out" | head -n 3 | tr '\n' ' ')"
			grep -v ': stats:' "$dir/err" | tail -n 5 >&2 || true
		elif [ -z "$pid" ] || ! grep -q "^fabsock\[$pid\]: warn: stats: offloaded=2 " "$dir/err"; then
			fs_fail "$label: the survivor (pid ${pid:-?}) did not offload both connections"
			grep ': stats:' "$dir/err" | cut -c1-80 >&2 || true
		elif ! grep -q "^fabsock\[$pid\]: warn: the shm lock of .* stayed taken while a peer process was gone; released it" "$dir/err"; then
			fs_fail "$label: the survivor passed but logged no release of the lock (the path under test did not run)"
		elif [ "$FS_FAILS" -eq "$fails_before" ]; then
			fs_pass "$label: $(grep -h '^send_ms=\|^elapsed_ms=' "$dir/out" | tr '\n' ' ')(from the kill), 1 MiB intact after the release"
		fi
	done
done
fs_done
