#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sixteen connections between the same two processes, each carrying 16 MiB in
# each direction at once, every byte verified and checksums matched per
# connection, in kernel mode and with both ends under the preload; then a
# storm of 320 connections opened at once by 320 threads, 64 KiB echoed on
# each, all of them offloaded.
# The work is done by the stream driver in e2e_stream.sh (case "many"), which
# states the pass/fail rules; FS_MODES picks the modes (default "kernel fabsock").
FS_STREAM_CASE=many
. "$(dirname "$0")/e2e_stream.sh"
