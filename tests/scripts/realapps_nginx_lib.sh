# SPDX-License-Identifier: MIT
# Shared by realapps_nginx.sh and realapps_proxy.sh: nginx instances in
# Debian's shape (root master, `user nobody nogroup;` workers,
# worker_processes 2, sendfile on, epoll) with a private prefix, config,
# logs and temp dirs under FS_TMP (never /etc/nginx), on free ports of
# 127.0.0.1; a docroot with a 600-byte file and a 4 MB random file; wrk
# and curl as clients. Source it first thing (it sources realapps_lib.sh):
#   . "$(dirname "$0")/realapps_nginx_lib.sh"

. "$(dirname "${BASH_SOURCE[0]}")/realapps_lib.sh"

ra_need nginx wrk curl nft sha256sum setpriv gdb file timeout
id nobody >/dev/null 2>&1 || fs_skip "no nobody user"
getent group nogroup >/dev/null 2>&1 || fs_skip "no nogroup group"

WRK_SECS=${RA_WRK_SECS:-3}
WRK_CONNS=${RA_WRK_CONNS:-4}
# Debian's worker_connections is 768; the `scale` run (CMake test
# scale_nginx_c1000, issue 14: wrk -c 1000) gives the workers room for them
# whichever worker takes them.
NGX_WORKER_CONNS=${RA_NGX_WORKER_CONNS:-768}
if [ "$WRK_CONNS" -gt 300 ]; then
	ulimit -n $((WRK_CONNS * 4 + 1024)) 2>/dev/null || ulimit -n "$(ulimit -Hn)"
	[ "$(ulimit -n)" -gt $((WRK_CONNS * 2 + 64)) ] || fs_skip "cannot raise the open-file limit for $WRK_CONNS connections"
fi
SMALL_SIZE=600
BIG_SIZE=$((4 << 20))

DOCROOT=$RA_DIR/htdocs
ra_make_docroot "$DOCROOT" "$SMALL_SIZE" "$BIG_SIZE"

# wrk's summary in numbers (its text output rounds the bytes).
WRK_LUA=$RA_DIR/summary.lua
cat >"$WRK_LUA" <<'EOF'
done = function(summary, latency, requests)
	local e = summary.errors
	io.write(string.format("summary requests=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d duration_us=%d\n",
		summary.requests, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout, summary.duration))
end
EOF
chmod 644 "$WRK_LUA"

# nginx_conf DIR PORT SERVER_BODY: writes DIR/nginx.conf (Debian's shape,
# private paths) with one server on PORT. Access log fields: $connection
# $connection_requests $status $body_bytes_sent $request_uri
# $upstream_status $request_time $upstream_bytes_received
# $upstream_response_time.
nginx_conf() {
	local dir=$1 port=$2 body=$3
	mkdir -p "$dir/tmp"
	cat >"$dir/nginx.conf" <<EOF
user nobody nogroup;
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/error.log notice;
events {
	use epoll;
	worker_connections $NGX_WORKER_CONNS;
}
http {
	sendfile on;
	tcp_nopush on;
	types { text/plain txt; application/octet-stream bin; }
	default_type application/octet-stream;
	log_format t '\$connection \$connection_requests \$status \$body_bytes_sent \$request_uri \$upstream_status \$request_time \$upstream_bytes_received \$upstream_response_time';
	access_log $dir/access.log t;
	client_body_temp_path $dir/tmp/body;
	proxy_temp_path $dir/tmp/proxy;
	fastcgi_temp_path $dir/tmp/fastcgi;
	uwsgi_temp_path $dir/tmp/uwsgi;
	scgi_temp_path $dir/tmp/scgi;
	server {
		listen 127.0.0.1:$port;
		server_name localhost;
		$body
	}
}
EOF
}

# nginx_start MODE NAME DIR PORT: starts nginx under MODE with its stats in
# NAME's log, waits for it to listen and 0.3 s for its workers; sets NGX_PID
# (the master). In Debian's packaged shape (nginx.service: `daemon on`, the
# process started forks the master and exits, which leaves the listener to
# a process that did not make it; RA_NGINX_DAEMON=1, the default), or as a
# foreground master in its own process group (RA_NGINX_DAEMON=0). Both
# shapes carry the same checks.
nginx_start() {
	local mode=$1 name=$2 dir=$3 port=$4 rc=0 i
	NGX_PID=
	if ! nginx -t -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/configtest.out" 2>&1; then
		fs_fail "$RA_CASE $mode: nginx -t rejects the $name config: $(tail -n 2 "$dir/configtest.out" | tr '\n' ' ')"
		return 1
	fi
	ra_env "$mode" "$name"
	if [ "${RA_NGINX_DAEMON:-1}" = 1 ]; then
		rm -f "$dir/nginx.pid"
		setsid "${RA_ENV[@]}" nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon on;' \
			>"$dir/stdout" 2>"$dir/stderr" </dev/null || rc=$?
		for ((i = 0; i < 200; i++)); do
			[ -s "$dir/nginx.pid" ] && break
			fs_sleep 0.05
		done
		NGX_PID=$(cat "$dir/nginx.pid" 2>/dev/null || true)
		if [ "$rc" -ne 0 ] || [ -z "$NGX_PID" ]; then
			fs_fail "$RA_CASE $mode: $name did not daemonize (exit status $rc, pid file ${NGX_PID:-missing})"
			tail -n 5 "$dir/stderr" "$dir/error.log" 2>/dev/null | sed 's/^/    /' >&2 || true
			return 1
		fi
		FS_PIDS+=("$NGX_PID")
	else
		fs_bg NGX_PID setsid "${RA_ENV[@]}" nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" \
			-g 'daemon off;' >"$dir/stdout" 2>"$dir/stderr"
	fi
	if ! ra_wait_listen "$port" "$NGX_PID"; then
		fs_fail "$RA_CASE $mode: $name did not listen on $port ($RA_LISTEN_WHY)"
		tail -n 5 "$dir/stderr" "$dir/error.log" 2>/dev/null | sed 's/^/    /' >&2 || true
		return 1
	fi
	sleep 0.3 # the workers
	return 0
}

# nginx_stop MODE DIR PID WHAT [PATTERN]: the master is alive, then a
# graceful stop (SIGQUIT: the workers finish their connections and exit,
# which writes their stats lines), bounded, status 0 (a daemon, not this
# shell's child: gone within the bound, its last word in the error log its
# "exit" notice); the error log must not match PATTERN (a worker lost to a
# signal).
nginx_stop() {
	local mode=$1 dir=$2 pid=$3 what=$4 pattern=${5:-'exited on signal|core dumped|\[emerg\]'} i
	ra_alive "$mode" "$pid" "the $what master" "the load" &&
		fs_log "$mode: $what: $(pgrep -c -P "$pid" 2>/dev/null || echo 0) workers"
	if [ "${RA_NGINX_DAEMON:-1}" = 1 ]; then
		kill -QUIT "$pid" 2>/dev/null || true
		for ((i = 0; i < 400; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			fs_sleep 0.05
		done
		if kill -0 "$pid" 2>/dev/null; then
			fs_fail "$RA_CASE $mode: $what still runs 20 s after SIGQUIT: killed"
			kill -9 "$pid" 2>/dev/null || true
		elif grep -qE "\[notice\] $pid#$pid: exit\$" "$dir/error.log"; then
			fs_pass "$RA_CASE $mode: $what stopped (SIGQUIT), its exit notice logged"
		else
			fs_fail "$RA_CASE $mode: $what ended without its exit notice: $(tail -n 3 "$dir/error.log" | tr '\n' ' ')"
		fi
	else
		ra_stop "$mode" "$pid" SIGQUIT "$what" 20 "$dir/error.log" || true
	fi
	ra_log_no_signal "$dir/error.log" "$pattern"
}

# wrk_load USER URL OUT: wrk -t 2 -c WRK_CONNS on URL for WRK_SECS s as
# USER under "${RA_ENV[@]}" (with the extra wrk arguments of the array
# WRK_ARGS, if set), output in OUT and OUT.err. Sets WRK_RC and,
# from its summary line (WRK_SUMMARY, empty without one): WRK_REQ,
# WRK_BYTES, WRK_ERRS (wrk's error counters in words), WRK_NERR (their
# sum), WRK_DUR (us) and WRK_RPS.
wrk_load() {
	local user=$1 url=$2 out=$3 s k v
	local -A f=()
	WRK_RC=0
	local wpid
	ra_as "$user" timeout -k 2 $((WRK_SECS + 12)) "${RA_ENV[@]}" wrk -t 2 -c "$WRK_CONNS" -d "${WRK_SECS}s" --timeout 5s \
		${WRK_ARGS[@]+"${WRK_ARGS[@]}"} -s "$WRK_LUA" "$url" >"$out" 2>"$out.err" &
	wpid=$!
	# wrk ends on its own after WRK_SECS: if it has not 8 s later, where
	# each thread of it and of the servers waits says why (seen once in CI:
	# wrk -c 1000 stalled after 2447 requests and never ended)
	ra_stacks_if_running "$wpid" $((WRK_SECS + 8)) wrk nginx
	wait "$wpid" || WRK_RC=$?
	s=$(grep '^summary ' "$out" || true)
	WRK_SUMMARY=$s
	for k in requests bytes connect read write status timeout duration_us; do
		v=$(sed -nE "s/.* $k=([0-9]+).*/\1/p" <<<"$s")
		f[$k]=$v
	done
	WRK_REQ=${f[requests]} WRK_BYTES=${f[bytes]:-0} WRK_DUR=${f[duration_us]}
	WRK_ERRS="connect ${f[connect]:-?} read ${f[read]:-?} write ${f[write]:-?} status ${f[status]:-?} timeout ${f[timeout]:-?}"
	WRK_NERR=$((${f[connect]:-0} + ${f[read]:-0} + ${f[write]:-0} + ${f[status]:-0} + ${f[timeout]:-0}))
	WRK_RPS=$(awk -v r="${WRK_REQ:-0}" -v d="${WRK_DUR:-0}" 'BEGIN { if (d > 0) printf "%.0f", r * 1e6 / d; else print 0 }')
}

# access_count FILE: from an access log of the small file: AL_LINES
# requests, AL_BAD answers neither 200 with SMALL_SIZE body bytes nor
# abandoned at wrk's end, AL_499 the abandoned ones, AL_CONNS distinct
# connections. Abandoned: a 499, or a 200 with 0 body bytes that is the last
# request of its connection (nginx read the request after wrk had closed:
# its header write is accepted, as on the kernel, and the body's sendfile
# fails EPIPE; kernel TCP does the same under that timing, checked with two
# writes after the peer's close: the first succeeds, the second EPIPE).
access_count() {
	AL_LINES=$(wc -l <"$1")
	# $1 connection, $2 its request number, $3 status, $4 body bytes
	local counts
	counts=$(awk -v sz="$SMALL_SIZE" '
		{ st[NR] = $3; by[NR] = $4; cn[NR] = $1; rq[NR] = $2; if ($2 > last[$1]) last[$1] = $2 }
		END {
			for (i = 1; i <= NR; i++) {
				if (st[i] == 200 && by[i] == sz) continue
				if (st[i] == 499 || (st[i] == 200 && by[i] == 0 && rq[i] == last[cn[i]])) ab++
				else bad++
			}
			print bad + 0, ab + 0
		}' "$1")
	AL_BAD=${counts% *}
	AL_499=${counts#* }
	AL_CONNS=$(awk '{ print $1 }' "$1" | sort -u | wc -l)
}
