#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: socat moving 200 MiB one way over loopback, the receiver
#   socat -u TCP-LISTEN:PORT,bind=127.0.0.1,reuseaddr OPEN:FILE,creat
# fed by
#   socat -u - TCP:127.0.0.1:PORT  < 200 MiB of random bytes (a file)
# both as root (one user: shm works), once on the kernel, then RA_SOCAT_RUNS
# (3) times with both under the preload and FABSOCK_LOG=info. Each run: the
# file received has the sender's sha256, both exit 0, no core; in fabsock
# mode both ends offloaded the connection (stats lines) and the TCP
# connection carried no payload beyond the HELLOs (nftables counter). A run
# whose connection stayed on TCP is counted and its fabsock log lines (both
# ends) are printed: on an idle machine the client sometimes logs "no probe
# answer in time" while the server says it answered yes.
# Figure: MB/s (MiB moved / time from the sender's start to the receiver's
# exit), kernel vs the median of the fabsock runs.

. "$(dirname "$0")/realapps_lib.sh"

ra_need socat nft sha256sum gdb file

SIZE_MB=${RA_SOCAT_MB:-200}
RUNS=${RA_SOCAT_RUNS:-3}
: "${RA_FABSOCK_LOG:=info}" # the lines of a run that stayed on TCP

SRC=$FS_TMP/src.bin
head -c "${SIZE_MB}M" /dev/urandom >"$SRC"
SRC_SUM=$(sha256sum <"$SRC" | cut -d' ' -f1)
BYTES=$((SIZE_MB << 20))
TCP_RUNS=0
FAB_MBS=()
KERNEL_MBS=0

# socat_run MODE N: one transfer; prints the verdicts, records MB/s.
socat_run() {
	local mode=$1 n=$2 name=socat$2 port out srv cli rc_s=0 rc_c=0 t0 t1 mbs sum p b pl hs hsb odd so co
	port=$(fs_free_port) || { fs_fail "$mode run $n: no free port"; return; }
	out=$FS_TMP/out.$mode.$n
	ra_env "$mode" "$name-srv"
	fs_bg srv timeout -k 2 60 "${RA_ENV[@]}" socat -u "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr" "OPEN:$out,creat" \
		2>"$FS_TMP/$name.$mode.srv.err"
	if ! ra_wait_listen "$port" "$srv"; then
		fs_fail "$RA_CASE $mode run $n: the receiving socat did not listen ($RA_LISTEN_WHY)"
		return
	fi
	fs_tcp_count_start "$port"
	ra_env "$mode" "$name-cli"
	t0=$(date +%s.%N)
	timeout -k 2 60 "${RA_ENV[@]}" socat -u - "TCP:127.0.0.1:$port" <"$SRC" 2>"$FS_TMP/$name.$mode.cli.err" || rc_c=$?
	fs_wait_pid "$srv" 60 || rc_s=$?
	t1=$(date +%s.%N)
	read -r p b pl hs hsb odd _ < <(fs_tcp_count_read)
	fs_tcp_count_stop
	mbs=$(awk -v b="$BYTES" -v a="$t0" -v z="$t1" 'BEGIN { printf "%.1f", b / 1048576 / (z - a) }')
	sum=$(sha256sum <"$out" 2>/dev/null | cut -d' ' -f1) || true
	if [ "$rc_c" -ne 0 ] || [ "$rc_s" -ne 0 ] || [ "$sum" != "$SRC_SUM" ]; then
		fs_fail "$RA_CASE $mode run $n: sender exit $rc_c, receiver exit $rc_s, $(stat -c %s "$out" 2>/dev/null || echo 0) bytes received, sha256 ${sum:0:16} (want ${SRC_SUM:0:16})"
		grep -hv ': stats:' "$FS_TMP/$name.$mode."*.err 2>/dev/null | grep -v 'fabsock\[' | tail -n 3 | sed 's/^/    /' >&2 || true
	else
		fs_pass "$RA_CASE $mode run $n: $SIZE_MB MiB, sha256 equal, $mbs MB/s; TCP carried $pl payload bytes in $p segments"
	fi
	rm -f "$out"
	if [ "$mode" = kernel ]; then
		KERNEL_MBS=$mbs
		[ "$pl" -ge "$BYTES" ] || fs_fail "$RA_CASE kernel: TCP carried $pl payload bytes, less than the $BYTES moved: the counter is broken"
		return
	fi
	FAB_MBS+=("$mbs")
	so=$(ra_sum "$name-srv" "$mode" offloaded)
	co=$(ra_sum "$name-cli" "$mode" offloaded)
	# one connection: its HELLO and ACK on TCP, no other byte
	if [ "$so" -ge 1 ] && [ "$co" -ge 1 ] && [ "$pl" = 0 ] && [ "$odd" = 0 ]; then
		fs_pass "$RA_CASE fabsock run $n: offloaded on both ends, no TCP payload besides $hs handshake segments ($hsb bytes)"
	else
		TCP_RUNS=$((TCP_RUNS + 1))
		fs_fail "$RA_CASE fabsock run $n: the connection stayed on TCP (receiver offloaded=$so, sender offloaded=$co, TCP payload $pl bytes besides $hs handshake segments, $odd of unknown shape); sender: $(ra_why "$name-cli" "$mode"); receiver: $(ra_why "$name-srv" "$mode")"
		# both ends' own lines, in time order per end
		grep -hv ': stats:' "$RA_DIR/$name-cli.$mode.log" 2>/dev/null | head -n 6 | sed 's/^/    sender:   /' >&2 || true
		grep -hv ': stats:' "$RA_DIR/$name-srv.$mode.log" 2>/dev/null | head -n 6 | sed 's/^/    receiver: /' >&2 || true
	fi
	ra_log_clean "$name-srv" "$mode" || true
	ra_log_clean "$name-cli" "$mode" || true
}

[[ " $FS_MODES " != *" kernel "* ]] || socat_run kernel 1
for i in $(seq 1 "$RUNS"); do
	socat_run fabsock "$i"
done
ra_cores_report "all runs"
fs_log "fabsock: $TCP_RUNS of $RUNS run(s) stayed on TCP; MB/s per run: ${FAB_MBS[*]:-none}"
# the fabsock figure: the median run
FAB_MED=$(printf '%s\n' "${FAB_MBS[@]:-0}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
ra_figure "one-way ${SIZE_MB} MiB (median of $RUNS)" "MB/s" "$KERNEL_MBS" "$FAB_MED"
ra_done
