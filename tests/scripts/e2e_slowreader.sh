#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A receiver reading 64 MiB at 32 MiB/s in small chunks with short sleeps, so
# the sender stays blocked most of the time. VmRSS of both processes is
# sampled every 0.2 s and must stay under 256 MiB; kernel and fabsock maxima
# are printed side by side.
# The work is done by the stream driver in e2e_stream.sh (case "slowreader"), which
# states the pass/fail rules; FS_MODES picks the modes (default "kernel fabsock").
FS_STREAM_CASE=slowreader
. "$(dirname "$0")/e2e_stream.sh"
