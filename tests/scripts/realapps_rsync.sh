#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: the rsync daemon in its packaged shape: started as root
# (--daemon --no-detach, a private config, 127.0.0.1 and a private port), a
# read-only module served as nobody:nogroup; the daemon forks a child per
# connection, which drops to nobody and forks again (sender and generator
# share the socket). The client pulls the module with rsync -a over
# rsync:// (the client forks too: receiver and generator use the socket),
# once as root and once as nobody into a directory nobody owns.
#   - the tree: 50 files of 0 bytes to 3 MiB in nested directories; after
#     each pull, the sha256 of every file of the copy equals the source's;
#   - the client exits 0 within its bound; a client still running at the
#     bound is a hang: the state, wchan, kernel stack and gdb backtrace of
#     every process of the client and of the daemon are printed;
#   - the daemon's log (log file = ...) reports no child killed by a signal
#     and no protocol error, and the daemon is alive after the pulls;
#   - fabsock mode: daemon and clients under the library. The root pull
#     offloads (bytes over the fabric), then the client's fork shares the
#     socket and its stream goes back to TCP: exactly one hand-back on each
#     side (core/handback.h). The nobody pull stays on TCP because the
#     daemon reads the client's first bytes as root (fallback_other_user=1
#     on each side, no other fallback). Both are documented limits; the
#     figure shows what that costs (kernel speed expected).
#   - kernel mode: the TCP connections carried >= 2 x the tree (the
#     nftables counter works);
#   - the kernel's side of the offload: the root pull's TCP segments that
#     start with "@RSYNCD:" (FS_TCP_MARK: both greetings and the daemon's
#     OK): at least 3 in kernel mode, none in fabsock mode.
# Kernel mode first, then fabsock. MB/s of the root pull is the figure.

. "$(dirname "$0")/realapps_lib.sh"

ra_need rsync setpriv nft timeout sha256sum
id nobody >/dev/null 2>&1 || fs_skip "no nobody user"
getent group nogroup >/dev/null 2>&1 || fs_skip "no nogroup group"

NFILES=50
CLIENT_LIMIT=25
FS_TCP_MARK=@RSY # the greetings (fs_tcp_count_start)
: "${RA_FABSOCK_LOG:=info}" # the notes: how each connection settled

D=$FS_TMP/rsync
SRC=$D/src
mkdir -p "$SRC"
# 50 files: sizes from 0 bytes to 3 MiB, over 5 directories (2 nested).
SIZES=(0 1 7 100 511 1024 4095 4096 4097 10000 65535 65536 131073 300000 1048576 1500000 2097152 3145728)
for i in $(seq 0 $((NFILES - 1))); do
	dir=$SRC/d$((i % 5))
	[ $((i % 5)) -ge 3 ] && dir=$SRC/d$((i % 5))/sub
	mkdir -p "$dir"
	head -c "${SIZES[$((i * 7 % ${#SIZES[@]}))]}" /dev/urandom >"$dir/f$i.bin"
done
chmod -R a+rX "$SRC"
TOTAL=$(find "$SRC" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
(cd "$SRC" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$D/want.sha"

cat >"$D/rsyncd.conf" <<EOF
pid file = $D/rsyncd.pid
log file = $D/rsyncd.log
use chroot = no
max connections = 10
[mod]
	path = $SRC
	comment = fabsock test module
	read only = yes
	list = yes
	uid = nobody
	gid = nogroup
	use chroot = no
EOF

declare -A FIG_ROOT FIG_NOBODY

# Prints, for PID and its descendants, what each is doing: a hang report.
rsync_where() { # LABEL PID...
	local label=$1 pid p
	shift
	for pid in "$@"; do
		for p in $(fs_tree "$pid"); do
			[ -d "/proc/$p" ] || continue
			[ "$(cat "/proc/$p/comm" 2>/dev/null)" = timeout ] && continue
			echo "    --- $label: pid $p ($(tr '\0' ' ' </proc/$p/cmdline | cut -c1-100)) state $(awk '{print $3}' /proc/$p/stat) wchan $(cat /proc/$p/wchan 2>/dev/null)" >&2
			sed 's/^/        kstack: /' "/proc/$p/stack" >&2 2>/dev/null || true
			# The application's thread in full, fabsock's own threads by their top frames.
			timeout 20 gdb -batch -p "$p" -ex 'thread apply all bt 10' 2>/dev/null |
				grep -E '^(Thread|#)' | grep -vE '^#[0-9]+ +0x[0-9a-f]+ in \?\? \(\)$' |
				sed -E 's/ \(Thread 0x[0-9a-f]+ \(LWP ([0-9]+)\)/ (LWP \1/; s/^/        /' >&2 || true
		done
	done
}

# rsync_pull MODE NAME USER DEST: one pull of the module; passes when the
# client exits 0 in time and every file's sha256 equals the source's.
rsync_pull() {
	local mode=$1 name=$2 user=$3 dest=$4 cli rc=0 t0 t1 i
	local -a RA_AS=()
	mkdir -p "$dest"
	if [ "$user" != root ]; then
		chown "$user:$(id -gn "$user")" "$dest"
		ra_as_argv "$user"
	fi
	t0=$(date +%s.%N)
	fs_bg cli timeout -k 5 $((CLIENT_LIMIT + 30)) "${RA_AS[@]}" "${RA_ENV[@]}" \
		rsync -a "rsync://127.0.0.1:$PORT/mod/" "$dest/" >"$LOG-$name.out" 2>"$LOG-$name.err"
	for i in $(seq 1 $((CLIENT_LIMIT * 10))); do
		kill -0 "$cli" 2>/dev/null || break
		fs_sleep 0.1
	done
	if kill -0 "$cli" 2>/dev/null; then
		fs_fail "$RA_CASE $mode: rsync pull as $user still running after ${CLIENT_LIMIT}s: a hang ($(find "$dest" -type f | wc -l) of $NFILES files there, $(du -sb "$dest" | cut -f1) bytes)"
		rsync_where "client as $user" "$cli"
		rsync_where "daemon" "$SRV"
		kill -KILL -- "-$cli" 2>/dev/null || true
		fs_wait_pid "$cli" 5 >/dev/null 2>&1 || true
		# The daemon's children of this connection may hang on: end them.
		for i in $(pgrep -P "$SRV_RSYNC" 2>/dev/null); do kill -KILL "$i" 2>/dev/null || true; done
		return 1
	fi
	wait "$cli" || rc=$?
	t1=$(date +%s.%N)
	if [ "$rc" -ne 0 ]; then
		fs_fail "$RA_CASE $mode: rsync pull as $user exited $rc"
		ra_tail 6 "$LOG-$name.err"
		return 1
	fi
	if (cd "$dest" && sha256sum --quiet -c "$D/want.sha" >"$LOG-$name.cmp" 2>&1) &&
		[ "$(find "$dest" -type f | wc -l)" -eq "$NFILES" ]; then
		eval "$name[\$mode]=\$(awk -v s=\"\$TOTAL\" -v a=\"\$t0\" -v b=\"\$t1\" 'BEGIN { printf \"%.1f\", s / (b - a) / 1e6 }')"
		fs_pass "$RA_CASE $mode: rsync pull as $user: $NFILES files, $TOTAL bytes, every sha256 equal"
	else
		fs_fail "$RA_CASE $mode: rsync pull as $user: the copy differs: $(head -n 3 "$LOG-$name.cmp" | tr '\n' ' ')"
		return 1
	fi
}

rsync_run() {
	local mode=$1 i marks
	LOG=$FS_TMP/$mode
	ra_env "$mode" rsyncd
	PORT=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	rm -f "$D/rsyncd.pid"
	: >"$D/rsyncd.log"
	fs_bg SRV timeout -s TERM -k 5 110 "${RA_ENV[@]}" rsync --daemon --no-detach --config="$D/rsyncd.conf" \
		--port="$PORT" --address=127.0.0.1 >"$LOG-daemon.out" 2>&1
	if ! ra_wait_listen "$PORT" "$SRV"; then
		fs_fail "$RA_CASE $mode: the rsync daemon did not listen on 127.0.0.1:$PORT ($RA_LISTEN_WHY)"
		tail -n 5 "$LOG-daemon.out" "$D/rsyncd.log" | sed 's/^/    /' >&2 || true
		return
	fi
	SRV_RSYNC=$(pgrep -P "$SRV" rsync | head -n 1 || true)
	[ -n "$SRV_RSYNC" ] || SRV_RSYNC=$SRV

	ra_env "$mode" rsync
	fs_tcp_count_start "$PORT" || fs_fail "$RA_CASE $mode: nft counter not set up"
	rsync_pull "$mode" FIG_ROOT root "$FS_TMP/dest-root-$mode" || true
	# The kernel's side of the proof: the TCP segments of the root pull
	# that start with "@RSYNCD:" (each end's greeting, then the daemon's
	# "@RSYNCD: OK" before the transfer): three in kernel mode (more if one
	# was sent again), none in fabsock mode: they went over the fabric,
	# before the hand-back at the client's fork.
	read -r _ _ _ _ _ _ marks _ < <(fs_tcp_count_read)
	if [ "$mode" = kernel ] && [ "$marks" -ge 3 ]; then
		fs_pass "$RA_CASE kernel: the root pull's TCP carried $marks segments that begin with \"@RSYNCD:\" (>= 3)"
	elif [ "$mode" = fabsock ] && [ "$marks" = 0 ]; then
		fs_pass "$RA_CASE fabsock: no TCP segment of the root pull began with \"@RSYNCD:\": its greetings went over the fabric"
	else
		fs_fail "$RA_CASE $mode: the root pull's TCP carried $marks segments that begin with \"@RSYNCD:\" (want $([ "$mode" = kernel ] && echo ">= 3: the counter works" || echo "0: the greetings go over the fabric"))"
	fi
	rsync_pull "$mode" FIG_NOBODY nobody "$FS_TMP/dest-nobody-$mode" || true
	# Over TCP in both modes: fabsock hands the root pull back to TCP when
	# the client forks (below), and the nobody pull never offloads. The
	# count then shows that the data did not vanish into neither.
	if [ "$mode" = kernel ]; then ra_tcp_payload_check "$mode" $((2 * TOTAL)) 0; fi
	fs_tcp_count_stop

	ra_alive "$mode" "$SRV_RSYNC" "the daemon" "the pulls" || true
	# SIGTERM: the daemon leaves through exit() (its stats line).
	kill -TERM "$SRV" 2>/dev/null || true
	fs_wait_pid "$SRV" 15 >/dev/null 2>&1 || true
	ra_log_no_signal "$D/rsyncd.log" 'signal [0-9]+|killed by'
	if grep -qE 'rsync error|error in (socket|rsync protocol)|connection unexpectedly closed' "$D/rsyncd.log"; then
		fs_fail "$RA_CASE $mode: the daemon's log reports errors:"
		grep -E 'rsync error|error in|unexpectedly' "$D/rsyncd.log" | head -n 4 | sed 's/^/    /' >&2
	fi
	cp "$D/rsyncd.log" "$LOG-rsyncd.log"

	if [ "$mode" = fabsock ]; then
		grep -hv ': stats:' "$RA_DIR/rsync.fabsock.log" "$RA_DIR/rsyncd.fabsock.log" 2>/dev/null |
			sed -E 's/^fabsock\[[0-9]+\]: //; s/fd [0-9]+: //; s/stream [0-9]+( -> [0-9]+)?/stream N/' |
			sort | uniq -c | sed 's/^/    note: /' >&2 || true
		# The root pull offloads, then the client forks (receiver and
		# generator both use the socket) and the stream goes back to TCP:
		# one hand-back on each side, its first bytes over the fabric.
		# The nobody pull is refused: the daemon reads the client's first
		# bytes as root, before it drops to nobody (README, "What is not
		# offloaded"). Nothing else may leave a connection on TCP.
		# The nobody client finds no listener record of nobody's for the
		# daemon's port (its record is root's) and says no before any
		# probe (core/records.h): fallback_no_record on its side, and the
		# daemon, which speaks first, waits for no probe and counts
		# fallback_server_first; without records the HELLO's refusal
		# counted fallback_other_user on both.
		for i in rsync rsyncd; do
			local off hb other tx early
			off=$(ra_sum "$i" fabsock offloaded)
			hb=$(ra_sum "$i" fabsock handbacks)
			other=$(ra_sum "$i" fabsock fallback_other_user)
			if [ "$i" = rsync ]; then
				early=$(ra_sum "$i" fabsock fallback_no_record)
			else
				early=$(ra_sum "$i" fabsock fallback_server_first)
			fi
			[ "$early" = 1 ] && [ "$other" = 0 ] && other=1 # the same refusal, said early
			tx=$(( $(ra_sum "$i" fabsock fabric_tx_bytes) + $(ra_sum "$i" fabsock fabric_rx_bytes) ))
			if [ "$off" = 1 ] && [ "$hb" = 1 ] && [ "$other" = 1 ] && [ "$tx" -gt 0 ] &&
				[ "$(ra_why "$i" fabsock | tr ' ' '\n' | grep -c '^fallback_')" = 1 ]; then
				fs_pass "$RA_CASE fabsock: $i: the root pull offloaded ($tx bytes over the fabric) and went back to TCP at the fork; the nobody pull stayed on TCP (another user)"
			else
				fs_fail "$RA_CASE fabsock: $i: offloaded=$off handbacks=$hb fallback_other_user=$other fabric bytes=$tx, expected 1, 1, 1, > 0; fallbacks: $(ra_why "$i" fabsock)"
			fi
			ra_log_clean "$i" fabsock || true
		done
	fi
}

for mode in $FS_MODES; do
	rsync_run "$mode"
done

ra_figure "rsync pull as root ($((TOTAL >> 20)) MiB)" MB/s "${FIG_ROOT[kernel]:-0}" "${FIG_ROOT[fabsock]:-0}"
ra_figure "rsync pull as nobody" MB/s "${FIG_NOBODY[kernel]:-0}" "${FIG_NOBODY[fabsock]:-0}"
ra_done
