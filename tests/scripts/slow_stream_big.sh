#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Large transfers (label slow): 2 GiB one way on one connection, then 512 MiB
# in each direction at once, every byte verified, in kernel mode and with
# both ends under the preload.
# The work is done by the stream driver in e2e_stream.sh (case "big"), which
# states the pass/fail rules; FS_MODES picks the modes (default "kernel fabsock").
FS_STREAM_CASE=big
. "$(dirname "$0")/e2e_stream.sh"
