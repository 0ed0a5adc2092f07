#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Sets up a fresh Debian 12 machine (as root) to build, test and benchmark
# fabsock: installs the packages below from Debian's archive, then configures
# and builds the project into ./build (RelWithDebInfo). This is the one place
# the dependency list lives; .ci/run uses it too (--deps-only).
#
#   bash tools/setup.sh               install packages, configure, build
#   bash tools/setup.sh --deps-only   install packages only
#   bash tools/setup.sh --build-only  configure and build only
#
# Environment: BUILD_DIR (default build), BUILD_TYPE (default RelWithDebInfo),
# JOBS (default: number of CPUs).
set -euo pipefail

FABSOCK_PACKAGES=(
	build-essential cmake            # compiler, make, cmake
	libfabric-dev libfabric-bin      # libfabric headers (run-time dlopen), fi_info, fi_pingpong
	uthash-dev                       # uthash.h
	rdma-core libibverbs-dev         # verbs libraries libfabric's efa provider loads
	sockperf iperf iperf3 qperf      # acceptance applications and benchmarks
	redis-server redis-tools         # redis-server and redis-benchmark
	iproute2 procps                  # ip netns, ss; ps, pgrep
	# the realapps suite: real servers in their packaged shape, real clients
	nginx apache2 apache2-utils      # nginx; Apache httpd (mpm_event, mpm_prefork) and ab
	postgresql postgresql-contrib    # PostgreSQL 15 server, psql, pgbench
	openssh-server openssh-client    # sshd and ssh
	memcached libmemcached-tools     # memcached, memcslap, memccapable
	rsync socat curl wrk python3     # rsync daemon, socat, HTTP clients; Python servers, the bench driver
	slapd ldap-utils                 # OpenLDAP's slapd, ldapadd and ldapsearch (liblber's fcntl64)
	haproxy nodejs                   # a proxy in front of http.server; Node's libuv server (issue 26)
	nftables util-linux gdb file     # TCP payload counter, setpriv, backtraces of cores
	strace binutils                  # e2e_load's trace; objdump for the PSM stand-ins
	clang libclang-rt-dev            # clang and libFuzzer for tests/fuzz (CI's fuzz stage)
	nghttp2-server nghttp2-client    # nghttpd (HTTP/2: sends SETTINGS first), h2load, nghttp (realapps_h2)
)

cd "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/.."

deps=1 build=1
case ${1:-} in
--deps-only) build=0 ;;
--build-only) deps=0 ;;
'') ;;
-h | --help) sed -n '4,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "setup.sh: unknown argument '$1'" >&2; exit 2 ;;
esac

if [ "$deps" = 1 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "setup.sh: installing packages needs root (run as root, or use --build-only)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	echo "== apt-get update"
	apt-get update
	echo "== apt-get install ${FABSOCK_PACKAGES[*]}"
	# The server packages would start their system services (nginx and
	# Apache both on port 80, where the second fails and fails the install);
	# the tests start their own servers on free ports. policy-rc.d 101 tells
	# invoke-rc.d not to start anything, for this install only.
	policy=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
	fi
	rc=0
	apt-get install -y "${FABSOCK_PACKAGES[@]}" || rc=$?
	[ -z "$policy" ] || rm -f "$policy"
	[ "$rc" = 0 ] || exit "$rc"
fi

if [ "$build" = 1 ]; then
	BUILD_DIR=${BUILD_DIR:-build}
	BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo}
	JOBS=${JOBS:-$(nproc)}
	echo "== cmake -S . -B $BUILD_DIR -DCMAKE_BUILD_TYPE=$BUILD_TYPE"
	cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE"
	echo "== cmake --build $BUILD_DIR -j$JOBS"
	cmake --build "$BUILD_DIR" -j"$JOBS"
	echo "== built: $(readlink -f "$BUILD_DIR")/libfabsock.so"
	echo "   run:   tools/fabsock run -- PROGRAM ARGS   (tools/fabsock help)"
fi
