#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# FABSOCK_RULES and parameter parsing, end to end, with a preloaded
# fs_stream server and client moving 4 MiB (checked pattern, FNV checksums):
#  a) client rule "kernel client *:PORT": kernel TCP (the server's TCP_INFO
#     bytes_received covers the payload), client fallback_rule=1, offloaded=0
#  b) the same rule read from a file (@FILE)
#  c) server rule "kernel server *:PORT": kernel TCP, byte-exact
#  d) "offload client 127.0.0.1:PORT" / "offload server 127.0.0.1": offloaded
#     on both ends, no probe sent (client probes_sent=0)
#  e) a malformed FABSOCK_RULES: exactly one warning line naming it, the run
#     still works and still offloads by default
#  f) FABSOCK_WINDOW=abc: exactly one warning line naming FABSOCK_WINDOW and
#     its default, the run still works
#  g) FABSOCK_PROVIDER=efaa (a typo): exactly one warning line naming it, at
#     start (the connection is to this host: no remote peer is ever tried),
#     the run still offloads over shm
. "$(dirname "$0")/lib.sh"

STREAM=$FS_PROGS/fs_stream
[ -x "$STREAM" ] || fs_skip "$STREAM not built"
SRC_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BYTES=$((4 * 1024 * 1024))

# conn_field FILE KEY: KEY=value of fs_stream's "conn 0 ..." line.
conn_field() {
	awk -v key="$2" '$1 == "conn" && $2 == "0" { for (i = 3; i <= NF; i++) { n = index($i, "=");
		if (substr($i, 1, n - 1) == key) print substr($i, n + 1) } }' "$1" | head -n 1
}
# expect_stat TAG FILE NAME OP VALUE: one check of a counter (OP: eq, ge).
expect_stat() {
	local tag=$1 file=$2 name=$3 op=$4 want=$5 got
	got=$(fs_stat "$file" "$name")
	if [ -z "$got" ]; then
		fs_fail "$tag: no $name in the stats line of $(basename "$file")"
	elif { [ "$op" = eq ] && [ "$got" -eq "$want" ]; } || { [ "$op" = ge ] && [ "$got" -ge "$want" ]; }; then
		fs_pass "$tag: $(basename "$file" .err) $name=$got"
	else
		fs_fail "$tag: $(basename "$file" .err) $name=$got, expected -$op $want"
	fi
}

# run_pair TAG PORT: preloaded server (extra environment SENV) and client
# (CENV), one connection of BYTES client->server. Checks both say
# "result ok" and the checksums and counts agree. Leaves TAG's files in
# $FS_TMP/TAG/{server,client}.{out,err}.
run_pair() {
	local tag=$1 port=$2 d=$FS_TMP/$1 spid crc=0 src=0 tx rx sent recv
	mkdir -p "$d"
	fs_bg spid env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "${SENV[@]}" \
		"$STREAM" server --port "$port" --bytes "$BYTES" --streams 1 --runs 1 --timeout 60 \
		--ready-file "$d/ready" >"$d/server.out" 2>"$d/server.err"
	for _ in $(seq 1 200); do
		[ -s "$d/ready" ] && break
		kill -0 "$spid" 2>/dev/null || break
		fs_sleep 0.05
	done
	if [ ! -s "$d/ready" ]; then
		sed "s/^/    server: /" "$d/server.out" "$d/server.err" >&2 || true
		fs_fail "$tag: server did not start"
		return 0
	fi
	timeout 70 env LD_PRELOAD="$FABSOCK_LIB" FABSOCK_STATS=1 "${CENV[@]}" \
		"$STREAM" client 127.0.0.1 "$port" --bytes "$BYTES" --timeout 60 \
		>"$d/client.out" 2>"$d/client.err" || crc=$?
	fs_wait_pid "$spid" 30 || src=$?
	sed "s/^/    client: /" "$d/client.out" "$d/client.err" >&2 || true
	sed "s/^/    server: /" "$d/server.out" "$d/server.err" >&2 || true
	if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q '^result ok' "$d/client.out" &&
		grep -q '^result ok' "$d/server.out"; then
		fs_pass "$tag: $BYTES bytes, both ends result ok"
	else
		fs_fail "$tag: client exit $crc, server exit $src"
	fi
	tx=$(conn_field "$d/client.out" sum_tx)
	rx=$(conn_field "$d/server.out" sum_rx)
	sent=$(conn_field "$d/client.out" sent)
	recv=$(conn_field "$d/server.out" recv)
	if [ -n "$tx" ] && [ "$tx" = "$rx" ] && [ "${sent:-0}" -eq "$BYTES" ] && [ "${recv:-0}" -eq "$BYTES" ]; then
		fs_pass "$tag: checksum $tx on both ends"
	else
		fs_fail "$tag: sent=${sent:-?} sum_tx=${tx:-?} vs recv=${recv:-?} sum_rx=${rx:-?}"
	fi
}

# The payload went over kernel TCP: the server socket's TCP_INFO counted it.
expect_kernel_tcp() {
	local tag=$1 got
	got=$(conn_field "$FS_TMP/$tag/server.out" tcp_bytes_received)
	if [ -n "$got" ] && [ "$got" -ge "$BYTES" ]; then
		fs_pass "$tag: server tcp_bytes_received=$got (kernel TCP)"
	else
		fs_fail "$tag: server tcp_bytes_received=${got:-?}, expected >= $BYTES (kernel TCP)"
	fi
}
# The payload did not go over kernel TCP (only the handshake did).
expect_fabric() {
	local tag=$1 got recv
	got=$(conn_field "$FS_TMP/$tag/server.out" tcp_bytes_received)
	recv=$(conn_field "$FS_TMP/$tag/server.out" recv)
	if [ "${recv:-0}" -ne "$BYTES" ]; then
		fs_fail "$tag: the server received ${recv:-no} payload bytes, so no transport to judge"
	elif [ -n "$got" ] && [ "$got" -lt $((BYTES / 2)) ]; then
		fs_pass "$tag: server tcp_bytes_received=$got (payload not on kernel TCP)"
	else
		fs_fail "$tag: server tcp_bytes_received=${got:-?}: payload went over kernel TCP"
	fi
}
# count_lines FILE PATTERN: lines of FILE matching the extended regex.
count_lines() { grep -cE "$2" "$1" || true; }
# expect_one_line TAG FILE PATTERN: exactly one line of FILE names PATTERN.
expect_one_line() {
	local n
	n=$(count_lines "$2" "$3")
	if [ "$n" -eq 1 ]; then
		fs_pass "$1: one warning line names $3"
	else
		fs_fail "$1: $n lines name $3, expected exactly 1"
	fi
}

# a) client-side kernel rule from the environment.
PORT=$(fs_free_port)
SENV=()
CENV=("FABSOCK_RULES=kernel client *:$PORT")
run_pair a_client_kernel "$PORT"
expect_kernel_tcp a_client_kernel
expect_stat a_client_kernel "$FS_TMP/a_client_kernel/client.err" fallback_rule eq 1
expect_stat a_client_kernel "$FS_TMP/a_client_kernel/client.err" offloaded eq 0

# b) the same rule from a file, with a comment and a blank line.
PORT=$(fs_free_port)
printf '# e2e_rules: keep this port on the kernel\n\nkernel client *:%s\n' "$PORT" >"$FS_TMP/rules"
SENV=()
CENV=("FABSOCK_RULES=@$FS_TMP/rules")
run_pair b_rules_file "$PORT"
expect_kernel_tcp b_rules_file
expect_stat b_rules_file "$FS_TMP/b_rules_file/client.err" fallback_rule eq 1
expect_stat b_rules_file "$FS_TMP/b_rules_file/client.err" offloaded eq 0

# c) server-side kernel rule.
PORT=$(fs_free_port)
SENV=("FABSOCK_RULES=kernel server *:$PORT")
CENV=()
run_pair c_server_kernel "$PORT"
expect_kernel_tcp c_server_kernel
expect_stat c_server_kernel "$FS_TMP/c_server_kernel/server.err" offloaded eq 0
expect_stat c_server_kernel "$FS_TMP/c_server_kernel/client.err" offloaded eq 0

# d) known fabsock peers: no probe, straight to HELLO.
PORT=$(fs_free_port)
SENV=("FABSOCK_RULES=offload server 127.0.0.1")
CENV=("FABSOCK_RULES=offload client 127.0.0.1:$PORT")
run_pair d_offload_rules "$PORT"
expect_fabric d_offload_rules
expect_stat d_offload_rules "$FS_TMP/d_offload_rules/client.err" offloaded eq 1
expect_stat d_offload_rules "$FS_TMP/d_offload_rules/server.err" offloaded eq 1
expect_stat d_offload_rules "$FS_TMP/d_offload_rules/client.err" probes_sent eq 0

# e) malformed rules: one warning, no rules in force, default behaviour.
PORT=$(fs_free_port)
SENV=()
CENV=("FABSOCK_RULES=offload sideways 127.0.0.1:$PORT; kernel client 999.1.2.3")
run_pair e_bad_rules "$PORT"
expect_one_line e_bad_rules "$FS_TMP/e_bad_rules/client.err" 'FABSOCK_RULES'
expect_stat e_bad_rules "$FS_TMP/e_bad_rules/client.err" offloaded eq 1
expect_fabric e_bad_rules

# f) bad numeric parameter: one warning naming it and the default used.
window_default=$(sed -n 's/^FS_PARAM_UINT(window, *WINDOW, *\([0-9]*\),.*/\1/p' "$SRC_ROOT/config/params.def")
PORT=$(fs_free_port)
SENV=()
CENV=("FABSOCK_WINDOW=abc")
run_pair f_bad_window "$PORT"
expect_one_line f_bad_window "$FS_TMP/f_bad_window/client.err" 'FABSOCK_WINDOW'
if [ -n "$window_default" ] &&
	grep 'FABSOCK_WINDOW' "$FS_TMP/f_bad_window/client.err" | grep -qE "(^|[^0-9])$window_default([^0-9]|$)"; then
	fs_pass "f_bad_window: the warning names the default ($window_default)"
else
	fs_fail "f_bad_window: the warning does not name the default (${window_default:-?}): $(grep FABSOCK_WINDOW "$FS_TMP/f_bad_window/client.err" || true)"
fi
fs_log "f_bad_window: client offloaded=$(fs_stat "$FS_TMP/f_bad_window/client.err" offloaded)"

# g) an unknown provider: one warning at start, shm unaffected.
PORT=$(fs_free_port)
SENV=()
CENV=("FABSOCK_PROVIDER=efaa")
run_pair g_bad_provider "$PORT"
expect_one_line g_bad_provider "$FS_TMP/g_bad_provider/client.err" 'FABSOCK_PROVIDER=efaa'
expect_stat g_bad_provider "$FS_TMP/g_bad_provider/client.err" offloaded eq 1
expect_fabric g_bad_provider
fs_done
