#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One end preloaded, the other plain (fabsock client + plain server and plain
# client + fabsock server), with and without a server-speaks-first banner,
# 4 MiB each way: the bytes must really cross TCP and arrive exactly. A tiny
# fabsock-client run against a plain server must take < 1 s, and a second run
# to the same port at most 50 ms longer than the first (negative cache). With
# FS_MODES=kernel the same checks run plain on both ends as a baseline.
# The work is done by the stream driver in e2e_stream.sh (case "mixed"), which
# states the pass/fail rules; FS_MODES picks the modes (default "kernel fabsock").
FS_STREAM_CASE=mixed
. "$(dirname "$0")/e2e_stream.sh"
