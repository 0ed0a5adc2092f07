#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: OpenSSH's sshd in its packaged shape, as root, on a private
# port of 127.0.0.1 with a private host key, sshd_config, pid file and
# authorized_keys under $FS_TMP (the system's sshd and its files are not
# touched). Per connection sshd forks, re-executes itself (-R, the socket
# on fds 0/1), forks a sandboxed unprivileged child (seccomp, chroot
# /run/sshd, user sshd) that does the key exchange and authentication, then
# a child running as the user for the session. The client is ssh with a key
# of the test's own, logging in as root (PermitRootLogin prohibit-password).
#   - a 20 MiB random file: `ssh ... cat FILE` must return it byte-exact
#     (sha256), MB/s is the figure; the other way, `ssh ... sha256sum` of
#     the file on stdin must print its checksum;
#   - five short sessions in a row (`echo`), each a fork + re-exec of sshd;
#   - sshd's log (-E) reports no child killed by a signal, the listener
#     (the pid in the private PidFile) is alive after the sessions;
#   - fabsock mode (sshd and ssh under the library): every connection is
#     offloaded by the re-executed sshd, then handed back to TCP once when
#     the sandboxed preauth child (forked after the offload) uses it (a
#     documented limit: the data then moves at kernel speed); no fabsock
#     warning about lost bytes, no child killed (seccomp);
#   - kernel mode: the TCP connections carried the 40 MiB (the nftables
#     counter works);
#   - the kernel's side of the offload: TCP segments that start with an SSH
#     version banner, at least two per connection in kernel mode, none in
#     fabsock mode (the banners went over the fabric before the hand-back).
# Kernel mode first, then fabsock.

. "$(dirname "$0")/realapps_lib.sh"

SSHD=/usr/sbin/sshd
[ -x "$SSHD" ] || fs_skip "sshd is not installed (apt-get install openssh-server)"
ra_need ssh ssh-keygen nft timeout sha256sum
id sshd >/dev/null 2>&1 || fs_skip "no sshd privilege-separation user"

SIZE_MB=20
NSHORT=5
FS_TCP_MARK=SSH- # the version banners (fs_tcp_count_start)

D=$FS_TMP/ssh
mkdir -p "$D"
chmod 700 "$D"
# The privilege-separation directory (the chroot of the preauth child).
RUN_SSHD_MADE=
if [ ! -d /run/sshd ]; then
	mkdir -p /run/sshd
	chmod 755 /run/sshd
	RUN_SSHD_MADE=1
fi
sshd_cleanup() {
	[ -n "$RUN_SSHD_MADE" ] && rmdir /run/sshd 2>/dev/null || true
	ra_cleanup
}
trap sshd_cleanup EXIT

ssh-keygen -q -t ed25519 -N '' -C fabsock-test-host -f "$D/hostkey"
ssh-keygen -q -t ed25519 -N '' -C fabsock-test-client -f "$D/id"
cp "$D/id.pub" "$D/authorized_keys"
chmod 600 "$D/authorized_keys"
head -c $((SIZE_MB << 20)) /dev/urandom >"$D/data"
chmod 644 "$D/data"
WANT=$(sha256sum <"$D/data" | cut -d' ' -f1)
# The sessions' HOME (SetEnv below), an empty directory: bash run by sshd
# reads ~/.bashrc even for `ssh host command`, and a root whose .bashrc
# starts tools (a pyenv init took 3.8 s on a loaded CI machine) made every
# session wait for it, 14 of them per run; nothing here reads HOME.
mkdir -p "$D/home"
cat >"$D/sshd_config" <<EOF
ListenAddress 127.0.0.1
SetEnv HOME=$D/home
PidFile $D/sshd.pid
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile $D/authorized_keys
StrictModes no
UseDNS no
X11Forwarding no
PrintMotd no
LogLevel VERBOSE
EOF

declare -A FIG_DOWN FIG_UP

# ra_env's "stderr" variant: ssh and the re-executed sshd closefrom() every
# descriptor above 2 early on, FABSOCK_LOG_FILE's among them, so their stats
# lines were lost (or written into whatever the descriptor number was reused
# for). The client's stderr goes to a file, sshd's into a pipe (not a
# regular file: the preauth child runs with RLIMIT_FSIZE 0, and any line it
# writes to a regular file kills it with SIGXFSZ). Both are appended to
# $RA_DIR/NAME.MODE.log, which ra_sum and ra_why read.
: "${RA_FABSOCK_LOG:=info}" # the notes: why connections stayed on TCP

# ssh_c LIMIT NAME REMOTE-COMMAND... (stdin, stdout: the caller's)
ssh_c() {
	local limit=$1 name=$2
	shift 2
	timeout -k 5 "$limit" "${RA_ENV[@]}" ssh -F /dev/null -o StrictHostKeyChecking=no \
		-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=20 \
		-i "$D/id" -p "$PORT" root@127.0.0.1 "$@" 2>>"$LOG-$name.err"
}

sshd_run() {
	local mode=$1 srv cat_pid lpid lpid_after rc t0 t1 got i ok marks
	LOG=$FS_TMP/$mode
	: >"$LOG-sshd.log"
	ra_env "$mode" sshd stderr
	PORT=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	rm -f "$D/sshd.pid"
	mkfifo "$LOG-sshd.fifo"
	fs_bg cat_pid cat "$LOG-sshd.fifo" >>"$RA_DIR/sshd.$mode.log"
	fs_bg srv timeout -s TERM -k 5 100 "${RA_ENV[@]}" "$SSHD" -D -f "$D/sshd_config" -p "$PORT" -h "$D/hostkey" \
		-E "$LOG-sshd.log" >"$LOG-sshd.out" 2>"$LOG-sshd.fifo"
	if ! ra_wait_listen "$PORT" "$srv"; then
		fs_fail "$RA_CASE $mode: sshd did not listen on 127.0.0.1:$PORT ($RA_LISTEN_WHY)"
		fs_wait_pid "$srv" 10 >/dev/null 2>&1 || true
		fs_wait_pid "$cat_pid" 5 >/dev/null 2>&1 || true
		ra_tail 8 "$LOG-sshd.out" "$LOG-sshd.log" "$RA_DIR/sshd.$mode.log"
		return
	fi
	for i in $(seq 1 100); do [ -s "$D/sshd.pid" ] && break; fs_sleep 0.05; done
	lpid=$(cat "$D/sshd.pid" 2>/dev/null || true)

	fs_tcp_count_start "$PORT" || fs_fail "$RA_CASE $mode: nft counter not set up"

	ok=0
	for i in $(seq 1 "$NSHORT"); do
		got=$(ssh_c 30 short echo "fabsock-$i" || true)
		[ "$got" = "fabsock-$i" ] && ok=$((ok + 1))
	done
	if [ "$ok" -eq "$NSHORT" ]; then
		fs_pass "$RA_CASE $mode: $NSHORT short sessions (ssh ... echo) answered"
	else
		fs_fail "$RA_CASE $mode: only $ok of $NSHORT short sessions answered"
		ra_tail 8 "$LOG-short.err"
	fi

	rc=0
	t0=$(date +%s.%N)
	ssh_c 60 down cat "$D/data" >"$LOG-down.out" </dev/null || rc=$?
	t1=$(date +%s.%N)
	got=$(sha256sum <"$LOG-down.out" | cut -d' ' -f1)
	if [ "$rc" -eq 0 ] && [ "$got" = "$WANT" ]; then
		FIG_DOWN[$mode]=$(awk -v s=$((SIZE_MB << 20)) -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", s / (b - a) / 1e6 }')
		fs_pass "$RA_CASE $mode: ssh cat of the $SIZE_MB MiB file: byte-exact, ${FIG_DOWN[$mode]} MB/s"
	else
		fs_fail "$RA_CASE $mode: ssh cat of the $SIZE_MB MiB file: exit $rc, $(stat -c %s "$LOG-down.out") bytes back, sha256 $([ "$got" = "$WANT" ] && echo equal || echo differs)"
		ra_tail 8 "$LOG-down.err"
	fi

	rc=0
	t0=$(date +%s.%N)
	got=$(ssh_c 60 up sha256sum <"$D/data") || rc=$?
	t1=$(date +%s.%N)
	got=${got%% *}
	if [ "$rc" -eq 0 ] && [ "$got" = "$WANT" ]; then
		FIG_UP[$mode]=$(awk -v s=$((SIZE_MB << 20)) -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", s / (b - a) / 1e6 }')
		fs_pass "$RA_CASE $mode: $SIZE_MB MiB up through ssh ... sha256sum: checksum equal, ${FIG_UP[$mode]} MB/s"
	else
		fs_fail "$RA_CASE $mode: $SIZE_MB MiB up through ssh ... sha256sum: exit $rc, answer '${got:-nothing}'"
		ra_tail 8 "$LOG-up.err"
	fi

	# Over TCP in both modes: under fabsock each connection goes back to
	# TCP when the preauth child takes it over (below). The kernel's side
	# of the offload: the TCP segments that start with an SSH version
	# banner ("SSH-2.0-...", each end's first message, FS_TCP_MARK): two
	# per connection in kernel mode (more if one was sent again), none in
	# fabsock mode (they went over the fabric, before the hand-back).
	read -r _ _ _ _ _ _ marks _ < <(fs_tcp_count_read)
	if [ "$mode" = kernel ] && [ "$marks" -ge $((2 * (NSHORT + 2))) ]; then
		fs_pass "$RA_CASE kernel: $marks TCP segments began with an SSH banner (>= $((2 * (NSHORT + 2))))"
	elif [ "$mode" = fabsock ] && [ "$marks" = 0 ]; then
		fs_pass "$RA_CASE fabsock: no TCP segment began with an SSH banner: they went over the fabric"
	else
		fs_fail "$RA_CASE $mode: $marks TCP segments began with an SSH banner (want $([ "$mode" = kernel ] && echo ">= $((2 * (NSHORT + 2))): the counter works" || echo "0: the banners go over the fabric, before the hand-back"))"
	fi
	if [ "$mode" = kernel ]; then ra_tcp_payload_check "$mode" $((2 * SIZE_MB << 20)) 0; fi
	fs_tcp_count_stop

	lpid_after=$(cat "$D/sshd.pid" 2>/dev/null || true)
	if [ -n "$lpid" ] && [ "$lpid" = "$lpid_after" ] && kill -0 "$lpid" 2>/dev/null; then
		fs_pass "$RA_CASE $mode: the listening sshd (pid $lpid) is alive after the sessions"
	else
		fs_fail "$RA_CASE $mode: the listening sshd is gone (pid ${lpid:-?} before, ${lpid_after:-none} after)"
	fi
	# SIGTERM: sshd's listener leaves through exit() (its stats line).
	kill -TERM "$srv" 2>/dev/null || true
	fs_wait_pid "$srv" 20 >/dev/null || true
	fs_wait_pid "$cat_pid" 5 >/dev/null 2>&1 || true
	cat "$LOG"-short.err "$LOG"-down.err "$LOG"-up.err >>"$RA_DIR/ssh.$mode.log" 2>/dev/null || true
	ra_log_no_signal "$LOG-sshd.log" 'killed by signal|terminated by signal|fatal:|Bad packet|Connection reset|incomplete message'

	if [ "$mode" = fabsock ]; then
		# A connection the preauth child and the session child share: each
		# client counts one stream per session, the server side is spread
		# over the processes of each connection.
		# Why connections stayed on TCP, by the library's info lines.
		grep -h 'stays on kernel TCP\|offloaded (\|forked after it was offloaded' "$RA_DIR/ssh.fabsock.log" "$RA_DIR/sshd.fabsock.log" |
			sed -E 's/^fabsock\[[0-9]+\]: //; s/fd [0-9]+: //' | sort | uniq -c | sed 's/^/    note: /' >&2 || true
		# Each connection offloads in the re-executed sshd (the listener's
		# probe table came along with the socket), and goes back to TCP
		# when its forked preauth child, sandboxed, takes it over: one
		# hand-back per connection on each side, none left on TCP for any
		# other reason.
		ra_offloaded ssh fabsock $((NSHORT + 2))
		ra_offloaded sshd fabsock $((NSHORT + 2))
		for i in ssh sshd; do
			local hb
			hb=$(ra_sum "$i" fabsock handbacks)
			[ "$hb" = $((NSHORT + 2)) ] ||
				fs_fail "$RA_CASE fabsock: $i handed $hb streams back to TCP, expected $((NSHORT + 2)) (one per connection, at the preauth child)"
			# ra_offloaded checked that none stayed on TCP
			ra_log_clean "$i" fabsock || true
		done
	fi
}

for mode in $FS_MODES; do
	sshd_run "$mode"
done

ra_figure "ssh cat ${SIZE_MB} MiB (down)" MB/s "${FIG_DOWN[kernel]:-0}" "${FIG_DOWN[fabsock]:-0}"
ra_figure "ssh stdin ${SIZE_MB} MiB (up)" MB/s "${FIG_UP[kernel]:-0}" "${FIG_UP[fabsock]:-0}"
ra_done
