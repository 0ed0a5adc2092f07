#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The rule from STYLE.md that keeps fabsock out of its own wrappers: core/ and
# config/ never call an interposed function by name, only through fs_real.
# A direct call binds to fabsock's own exported wrapper: ppoll() from the wait
# loop once ran the whole poll emulation (and its spin) on every sleep. This
# lists the undefined symbols of every object of the core and config
# libraries and fails on any name from preload/symbols.def. It also checks
# the library's export list against that file: every listed function has an
# exported wrapper, and nothing else is exported but _Exit (wrappers.c
# wraps it beside _exit, outside the table) and syscall (resolved apart).
set -euo pipefail
: "${FS_BUILD:?FS_BUILD must name the build directory}"
src=$(cd "$(dirname "$0")/../.." && pwd)
# a skip (77) fails under CI=true, as lib.sh's fs_skip
command -v nm >/dev/null || { echo "nm is missing"; [ "${CI:-}" = true ] && exit 1; exit 77; }
mapfile -t syms < <(sed -nE -e 's/^FS_SYM\([^,]+, ([A-Za-z_0-9]+),.*/\1/p' \
	-e 's/^FS_ALIAS\(([A-Za-z_0-9]+),.*/\1/p' "$src/preload/symbols.def")
[ "${#syms[@]}" -gt 20 ] || { echo "could not read the symbol list"; exit 1; }
fails=0 checked=0
for lib in "$FS_BUILD/libfabsock_core.a" "$FS_BUILD/libfabsock_base.a"; do
	[ -f "$lib" ] || { echo "missing $lib"; exit 1; }
	while read -r obj sym; do
		checked=$((checked + 1))
		# real.c resolves the table itself; preload/ is allowed to call the real ones
		case $obj in real.c.o) continue ;; esac
		for s in "${syms[@]}"; do
			if [ "$sym" = "$s" ]; then
				echo "FAIL: $obj calls the interposed $sym by name (use fs_real.$sym)"
				fails=$((fails + 1))
			fi
		done
	done < <(nm -u -A "$lib" 2>/dev/null | sed -E 's/^[^:]*:([^:]*):[[:space:]]*U[[:space:]]+(.*)$/\1 \2/')
done
[ "$checked" -gt 0 ] || { echo "nm listed nothing"; exit 1; }
lib_so=${FABSOCK_LIB:-$FS_BUILD/libfabsock.so}
mapfile -t exported < <(nm -D --defined-only "$lib_so" | awk '$2 ~ /^[TtWi]$/ { print $3 }' | sort)
[ "${#exported[@]}" -gt 20 ] || { echo "nm listed no exports of $lib_so"; exit 1; }
# Set lookups, not `printf | grep -q`: under pipefail, grep leaving at its
# first match could fail printf with SIGPIPE, and a listed name then read
# as missing (it failed so once under load).
declare -A in_def in_so
for s in "${syms[@]}"; do in_def[$s]=1; done
for s in "${exported[@]}"; do in_so[$s]=1; done
for s in "${syms[@]}"; do
	checked=$((checked + 1))
	[ -n "${in_so[$s]:-}" ] || {
		echo "FAIL: symbols.def lists $s, but $lib_so exports no $s"
		fails=$((fails + 1))
	}
done
for s in "${exported[@]}"; do
	checked=$((checked + 1))
	# _Exit: wrapped beside _exit; syscall: resolved apart from the
	# table (preload/real.h), since fabsock's own raw calls use it
	case $s in _Exit | syscall) continue ;; esac
	[ -n "${in_def[$s]:-}" ] || {
		echo "FAIL: $lib_so exports $s, which symbols.def does not list"
		fails=$((fails + 1))
	}
done
# Every release of the engine lock goes through fs_engine_unlock (engine.h),
# which writes the rings to sleeping peers that the hold owed (ring.c):
# a plain unlock of it leaves them owed until the thread's next release, and
# the peer's sleeper waits its deep sleep's slice for a message already there.
while IFS= read -r hit; do
	echo "FAIL: $hit: the engine lock released past fs_engine_unlock"
	fails=$((fails + 1))
done < <(grep -nE 'pthread_mutex_unlock\(&(e|eng|engine|[a-z_]+->e|[a-z_]+->engine)->lock\)' "$src"/core/*.c || true)
checked=$((checked + 1))
echo "$((checked - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
