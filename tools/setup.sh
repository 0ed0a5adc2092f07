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
	apt-get install -y "${FABSOCK_PACKAGES[@]}"
	# The redis-server package starts a system service on port 6379; the tests
	# start their own servers on free ports and do not need it.
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
