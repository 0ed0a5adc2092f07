#!/bin/bash
# SPDX-License-Identifier: MIT
# Real application: a Node.js HTTP server (Debian's /usr/bin/node, libuv's
# event loop) answering every request with a 4 MB body and
# `Connection: close`, exactly the issue's shape (issue 26):
#   http.createServer((q, s) => { s.writeHead(200, {'Content-Length':
#   big.length, 'Connection': 'close'}); s.end(big); }).listen(port, ip)
# libuv writes nonblocking as EPOLLOUT allows, shuts the writing side down
# and closes with syscall(SYS_close) once the response is queued; under
# fabsock the end of the response then still waits for the reader's credit.
# (node -e: the arguments start at process.argv[1].)
# Server and clients run as root. Kernel mode first, then fabsock (server
# and clients under the library):
#   - DOWNLOADS downloads from the one server, a curl process each (the
#     second and later ones failed most, before the fix): exit status 0,
#     HTTP 200, the exact size, sha256 equal;
#   - the server is alive after the load, and leaves on SIGTERM (its
#     handler calls process.exit(0), so the stats line is written), status 0,
#     no core files;
#   - fabsock mode: every connection offloaded on both ends, no reset, no
#     message dropped, no fabsock warning about lost bytes, and the TCP
#     connections carried only the HELLOs (nftables), while the kernel
#     mode's carried every byte (the counter works).
# Figure: curl MB/s (mean of the good downloads), kernel vs fabsock.

. "$(dirname "$0")/realapps_lib.sh"

NODE=/usr/bin/node
[ -x "$NODE" ] || fs_skip "no $NODE (apt-get install nodejs)"
ra_need curl nft sha256sum timeout

DOWNLOADS=${RA_DOWNLOADS:-10}
CURL_MAX=${RA_CURL_MAX:-15}
BIG_SIZE=$((4 << 20))

# (Sanitizer builds do not register this test: node cannot start with the
# sanitizer runtime preloaded; tests/scripts/CMakeLists.txt.)
ra_env fabsock node-probe
if ! "${RA_ENV[@]}" "$NODE" -e 0 >"$RA_DIR/node-probe.out" 2>&1; then
	fs_fail "$RA_CASE: node -e 0 under the library failed: $(head -n 3 "$RA_DIR/node-probe.out" | tr '\n' ' ')"
	ra_done
fi

DOCROOT=$RA_DIR/www
ra_make_docroot "$DOCROOT" 0 "$BIG_SIZE"

NODE_MAIN='const http = require("http"), fs = require("fs");
const big = fs.readFileSync(process.argv[1]);
let served = 0;
process.on("SIGTERM", () => { console.log("served " + served); process.exit(0); });
http.createServer((q, s) => {
	s.writeHead(200, {"Content-Length": big.length, "Connection": "close"});
	s.end(big);
	served++;
}).listen(+process.argv[2], "127.0.0.1");'

declare -A FIG

node_case() {
	local mode=$1 dir srv port i out speeds="" good=0 moved=0
	dir=$FS_TMP/node-$mode
	mkdir -p "$dir"
	port=$(fs_free_port) || { fs_fail "$RA_CASE $mode: no free port"; return; }
	ra_env "$mode" node
	fs_bg srv setsid "${RA_ENV[@]}" "$NODE" -e "$NODE_MAIN" "$DOCROOT/big.bin" "$port" >"$dir/stdout" 2>"$dir/stderr"
	if ! ra_wait_listen "$port" "$srv"; then
		fs_fail "$RA_CASE $mode: node did not listen on $port ($RA_LISTEN_WHY)"
		tail -n 5 "$dir/stderr" | sed 's/^/    /' >&2 || true
		return
	fi

	fs_tcp_count_start "$port" || fs_fail "$RA_CASE $mode: nft counter not set up"
	ra_env "$mode" curl
	for i in $(seq 1 "$DOWNLOADS"); do
		out=$dir/big.$i
		ra_curl_get - "$CURL_MAX" "http://127.0.0.1:$port/big.bin" "$out"
		moved=$((moved + ${CURL_SIZE:-0}))
		if [ "$CURL_RC" -ne 0 ] || [ "${CURL_CODE:-}" != 200 ] || [ "${CURL_SIZE:-0}" != "$BIG_SIZE" ] || [ "$CURL_SUM" != "$BIG_SUM" ]; then
			fs_fail "$RA_CASE $mode: download $i: exit status $CURL_RC, HTTP ${CURL_CODE:-none}, ${CURL_SIZE:-0} of $BIG_SIZE bytes ($((BIG_SIZE - ${CURL_SIZE:-0})) missing) in ${CURL_TTOT:-?} s, sha256 ${CURL_SUM:0:16} (want ${BIG_SUM:0:16})"
			grep -v ': stats:' "$out.err" | tail -n 2 | sed 's/^/    stderr: /' >&2 || true
		else
			good=$((good + 1))
			speeds="$speeds $CURL_SPEED"
		fi
		rm -f "$out"
	done
	FIG[$mode]=$(ra_mean_mb "$speeds")
	[ "$good" -eq "$DOWNLOADS" ] &&
		fs_pass "$RA_CASE $mode: $DOWNLOADS downloads of 4 MB from one node server, sha256 equal, ${FIG[$mode]} MB/s"
	ra_tcp_payload_check "$mode" "$moved" "$DOWNLOADS"
	fs_tcp_count_stop

	ra_alive "$mode" "$srv" node || true
	ra_stop "$mode" "$srv" SIGTERM node 15 "$dir/stderr" || true
	grep -qx "served $DOWNLOADS" "$dir/stdout" ||
		fs_fail "$RA_CASE $mode: node said '$(head -c 80 "$dir/stdout")', want 'served $DOWNLOADS'"

	[ "$mode" = fabsock ] || return 0
	ra_offloaded node "$mode" "$DOWNLOADS"
	ra_offloaded curl "$mode" "$DOWNLOADS"
	ra_streams_clean "$mode" node curl
}

for mode in kernel fabsock; do
	node_case "$mode"
done
ra_figure "curl 4 MB from node, Connection: close" "MB/s" "${FIG[kernel]:-0}" "${FIG[fabsock]:-0}"
ra_done
