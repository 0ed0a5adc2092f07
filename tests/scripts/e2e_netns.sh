#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Server and client in two fresh network namespaces (fs-PID-a, fs-PID-b)
# joined by a veth pair with 10.250.X.1/24 and .2/24, 64 MiB checksummed, in
# kernel mode and with both ends preloaded and FABSOCK_PROVIDER=tcp. Exits 77
# (skipped) when network namespaces cannot be created; under CI=true that
# fails instead (fs_skip). Also FABSOCK_RAIL_ADDRS: naming each side's veth
# address offloads, naming only lo keeps the connection on kernel TCP.
# The work is done by the stream driver in e2e_stream.sh (case "netns"), which
# states the pass/fail rules; FS_MODES picks the modes (default "kernel fabsock").
FS_STREAM_CASE=netns
. "$(dirname "$0")/e2e_stream.sh"
