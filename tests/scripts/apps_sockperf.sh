#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: the real sockperf (Debian's package), server and client, TCP,
# blocking mode (sockperf's default), ping-pong and throughput, first on the
# kernel and then with both ends under the preload. In fabsock mode the run
# must succeed with plausible numbers AND be shown to have used the fabric:
#   - both processes print "stats: offloaded=N" at exit with N >= 1;
#   - `ss -tin` sampled on the test port while the client runs shows every
#     TCP connection received < 64 KiB while sockperf moved MiBs.
# The same sampling in kernel mode must show MiBs on the connection, which
# proves the check can fail.

. "$(dirname "$0")/lib.sh"

command -v sockperf >/dev/null 2>&1 || fs_skip "sockperf is not installed (apt-get install sockperf)"
APP_NAME=sockperf
MIN_MOVED=$((1 << 20))
. "$(dirname "$0")/apps_lib.sh"
. "$(dirname "$0")/sockperf_lib.sh"

# 2 s per run, as apps_sockperf_mux, not apps_lib's 3: the checks (at least
# 1000 messages and 1 MiB moved, the ss sampling, the stats) hold the same.
DURATION=2

for mode in kernel fabsock; do
	for test in ping-pong throughput; do
		sockperf_run "$mode" blocking "$test"
	done
done
fs_done
