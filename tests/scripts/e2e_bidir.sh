#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One connection carrying 128 MiB in each direction at the same time (one
# sending and one receiving thread per end), every byte verified, in kernel
# mode and with both ends under the preload.
# The work is done by the stream driver in e2e_stream.sh (case "bidir"), which
# states the pass/fail rules; FS_MODES picks the modes (default "kernel fabsock").
FS_STREAM_CASE=bidir
. "$(dirname "$0")/e2e_stream.sh"
