#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two rails (issue 28, item 3, spreading): server and client in two fresh
# network namespaces (fs2r-PID-a, fs2r-PID-b) joined by two veth pairs, link 1
# with 10.248.X.1/24 and .2/24 and link 2 with 10.249.X.1/24 and .2/24, both
# ends preloaded with FABSOCK_PROVIDER=tcp, FABSOCK_RAILS=2 and
# FABSOCK_RAIL_ADDRS naming each side's two addresses: eight streams of one
# process pair byte-exact, each link carrying at least 20 % of the payload by
# the kernel's interface counters, and nic_rails=1 in both processes' stats;
# with only link 1 named, one rail (nic_rails=0) and link 2 idle. Striping
# (wire 12): one stream of 128 MiB over both links (each >= 20 %), again
# with link 2's packets held back (netem, or tbf queues where the kernel has
# no netem) so that its messages arrive out of order (rx_early > 0), and one
# side offering one rail (none striped); a link taken down under striped
# streams resets them within seconds. Exits 77
# (skipped) when network namespaces cannot be created; under CI=true that
# fails instead (fs_skip). The work is done by the stream driver in
# e2e_stream.sh (case "tworails"), which states the pass/fail rules; FS_MODES
# picks the modes (default "kernel fabsock": the kernel run checks the
# measurement itself).
FS_STREAM_CASE=tworails
. "$(dirname "$0")/e2e_stream.sh"
