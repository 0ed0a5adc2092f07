#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The arithmetic of `fabsock bench` without running a benchmark: medians of
# repeated samples (odd and even counts, failed runs among them), the
# fabsock/kernel and fabsock/raw ratios, and "met?" for each kind of target;
# then fabsock-charts on a small results.json, whose SVG must parse and
# break its line where a cell is missing. And fabsock-netbench's clients
# once over kernel TCP, so a broken key=value line shows up here first.

. "$(dirname "$0")/lib.sh"

TOOLS=${FS_TOOLS:?FS_TOOLS must name the tools directory}
command -v python3 >/dev/null || fs_skip "python3 is missing"

# shellcheck source=/dev/null
. "$TOOLS/fabsock"
set +e # the launcher's functions run under the test's own checks

expect() {
	local what=$1 got=$2 want=$3
	if [ "$got" = "$want" ]; then fs_pass "$what: $got"; else fs_fail "$what: got '$got', want '$want'"; fi
}

bench_define_rows 0
BENCH_SAMPLES=(
	[lat_p50,kernel]="10|12|11" [lat_p50,fabsock]="2|failed|1.5|3" [lat_p50,raw]="n/a"
	[lat_avg,fabsock]="1.4" [lat_avg,raw]="1.0"
	[iperf3_1,kernel]="10" [iperf3_1,fabsock]="29.9"
	[redis_get,kernel]="failed|failed" [redis_get,fabsock]="150000"
	[idle_recv,fabsock]="0.80|1.20|0.90" [mem_conn_client,fabsock]="-1.5|2.5"
	[slow_growth,fabsock]="5.0"
	[scale_mem_client,kernel]="0.02" [scale_mem_client,fabsock]="1.14"
	[scale_mem_server,kernel]="0.00" [scale_mem_server,fabsock]="2.39")
bench_finalize
expect "median of 3" "${BENCH_CELL[lat_p50,kernel]}" 11
expect "median of the numbers, failed run left out (even count)" "${BENCH_CELL[lat_p50,fabsock]}" 2
expect "no number: first sample" "${BENCH_CELL[redis_get,kernel]}" failed
expect "negative samples" "${BENCH_CELL[mem_conn_client,fabsock]}" 0.5
expect "fabsock/kernel" "$(bench_ratio lat_p50 kernel)" 0.18
expect "fabsock/raw" "$(bench_ratio lat_avg raw)" 1.40
expect "fk <= 0.2 met" "$(bench_target_met lat_p50)" yes
expect "fr <= 1.5 met" "$(bench_target_met lat_avg)" yes
expect "fk >= 3 missed by a hair" "$(bench_target_met iperf3_1)" no
expect "kernel failed: no verdict" "$(bench_target_met redis_get)" -
expect "absolute f < 1" "$(bench_target_met idle_recv)" yes
expect "absolute f <= 4 missed" "$(bench_target_met slow_growth)" no
expect "report-only row" "$(bench_target_met mem_conn_client)" reported
expect "row without a target" "$(bench_target_met lat_p99)" -
expect "target text" "$(bench_target_text lat_p50)" "<= 0.2x kernel"
expect "fd <= 2 met (1.12 above the kernel)" "$(bench_target_met scale_mem_client)" yes
expect "fd <= 2 missed (2.39 above the kernel)" "$(bench_target_met scale_mem_server)" no
expect "fd target text" "$(bench_target_text scale_mem_client)" "<= kernel + 2 KiB"
expect "scale row named with its count" "${BENCH_NAME[scale_mem_server]}" "RSS per idle connection at 10000, server"
expect "size label" "$(bench_size_label 262144)" "256 KiB"

# Charts from a results.json with a gap (fabsock failed at 4 KiB).
cat >"$FS_TMP/results.json" <<'JSON'
{"host": "h", "cpu": "c", "provider": "shm", "repeat": 3, "date": "2026-01-01T00:00:00Z",
 "results": [
  {"id": "lat_sz_64", "size_bytes": 64, "kernel_tcp": 10.5, "fabsock": 1.9, "raw_libfabric": 0.8},
  {"id": "lat_sz_4096", "size_bytes": 4096, "kernel_tcp": 12.0, "fabsock": "failed", "raw_libfabric": 2.1},
  {"id": "lat_sz_1048576", "size_bytes": 1048576, "kernel_tcp": 300, "fabsock": 250, "raw_libfabric": null},
  {"id": "bw_sz_64", "size_bytes": 64, "kernel_tcp": 1.6, "fabsock": 1.2, "raw_libfabric": 0.05},
  {"id": "bw_sz_1048576", "size_bytes": 1048576, "kernel_tcp": 24, "fabsock": 40, "raw_libfabric": 110}
 ]}
JSON
if python3 "$TOOLS/fabsock-charts" "$FS_TMP/results.json" "$FS_TMP"; then
	fs_pass "fabsock-charts ran"
else
	fs_fail "fabsock-charts failed"
fi
for svg in latency bandwidth; do
	if python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$FS_TMP/$svg.svg" 2>/dev/null; then
		fs_pass "$svg.svg is well-formed XML"
	else
		fs_fail "$svg.svg missing or not XML"
	fi
done
# kernel: one line of 3 points; fabsock: two pieces around the gap; raw: one of 2.
expect "latency.svg polylines (one per unbroken piece)" "$(grep -c '<polyline' "$FS_TMP/latency.svg")" 4

# fabsock-netbench's clients over kernel TCP print what the bench parses.
NB=${FS_BUILD:-}/tools/fabsock-netbench
if [ -x "$NB" ]; then
	fs_bg srv env -u LD_PRELOAD "$NB" server --ready-file "$FS_TMP/nb.ready"
	for _ in $(seq 1 100); do [ -s "$FS_TMP/nb.ready" ] && break; sleep 0.05; done
	port=$(cat "$FS_TMP/nb.ready")
	check_keys() {
		local what=$1 keys=$2 line k
		shift 2
		line=$(env -u LD_PRELOAD timeout 60 "$NB" "$@" 2>&1 | tail -1)
		for k in $keys; do
			if [[ " $line" =~ \ $k=-?[0-9] ]]; then :; else fs_fail "$what: no $k= in '$line'"; return; fi
		done
		fs_pass "$what: $line"
	}
	check_keys pingpong "avg_usec p50_usec p99_usec" pingpong 127.0.0.1 "$port" --size 65536 --seconds 0.3
	check_keys connect "avg_usec per_sec" connect 127.0.0.1 "$port" --count 50
	check_keys hold "client_rss_one_kib client_rss_all_kib server_rss_one_kib server_rss_all_kib" \
		hold 127.0.0.1 "$port" --conns 8
	check_keys slowwrite "client_peak1_kib client_peak2_kib server_peak1_kib server_peak2_kib" \
		slowwrite 127.0.0.1 "$port" --seconds 0.5
	kill -INT "$srv" 2>/dev/null
	wait "$srv" 2>/dev/null
else
	fs_log "no $NB: netbench checks skipped"
fi
fs_done
