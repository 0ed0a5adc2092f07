#!/bin/bash
# SPDX-License-Identifier: MIT
# Acceptance: the real sockperf (Debian's package) with its SERVER in
# event-loop mode: `sockperf server -f FEED -F epoll|poll|select` (the feed
# file names the TCP listener, T:127.0.0.1:PORT), against the ordinary
# blocking client, ping-pong (64-byte messages) and throughput, first on the
# kernel and then with both ends under the preload. In fabsock mode the run
# must succeed with plausible numbers AND be shown to have used the fabric:
#   - both processes print "stats: offloaded=N" at exit with N >= 1;
#   - `ss -tin` sampled on the test port while the client runs shows every
#     TCP connection received < 64 KiB while sockperf moved MiBs.
# The same sampling in kernel mode must show MiBs on the connection, which
# proves the check can fail. The kernel runs that once, with the epoll
# server (FS_SOCKPERF_KERNEL_MUXES, default "epoll"; "epoll poll select" for
# every kernel figure): the sampling is the same whichever call the
# server waits in, and the kernel's poll and select run none of fabsock's
# code (each run takes ~5 s: sockperf's client sleeps 2 s before it
# starts).

. "$(dirname "$0")/lib.sh"

command -v sockperf >/dev/null 2>&1 || fs_skip "sockperf is not installed (apt-get install sockperf)"
APP_NAME=sockperf
MIN_MOVED=$((1 << 20))
. "$(dirname "$0")/apps_lib.sh"
. "$(dirname "$0")/sockperf_lib.sh"

DURATION=2
KERNEL_MUXES=${FS_SOCKPERF_KERNEL_MUXES:-epoll}
for mode in kernel fabsock; do
	muxes="epoll poll select"
	[ "$mode" = kernel ] && muxes=$KERNEL_MUXES
	for mux in $muxes; do
		for test in ping-pong throughput; do
			sockperf_run "$mode" "$mux" "$test"
		done
	done
done
fs_done
