#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The rule from STYLE.md that keeps fabsock out of its own wrappers: core/ and
# config/ never call an interposed function by name, only through fs_real.
# A direct call binds to fabsock's own exported wrapper: ppoll() from the wait
# loop once ran the whole poll emulation (and its spin) on every sleep. This
# lists the undefined symbols of every object of the core and config
# libraries and fails on any name from preload/symbols.def.
set -euo pipefail
: "${FS_BUILD:?FS_BUILD must name the build directory}"
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v nm >/dev/null || { echo "nm is missing"; exit 77; }
mapfile -t syms < <(sed -nE 's/^FS_SYM\([^,]+, ([a-z_0-9]+),.*/\1/p' "$src/preload/symbols.def")
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
echo "$((checked - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
