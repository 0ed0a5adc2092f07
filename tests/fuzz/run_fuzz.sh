#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run_fuzz.sh FUZZER SEEDS WORK SECONDS: fuzzes for SECONDS from a fresh copy
# of the seed corpus SEEDS (the committed files are never written), with a
# fixed seed so a run can be repeated, and fails on any crash, sanitizer
# report, failed round-trip check, leak, or input that takes over 5 s. The
# crashing input is left in WORK.
set -euo pipefail
fuzzer=$1 seeds=$2 work=$3 seconds=$4
[ -x "$fuzzer" ] || { echo "no fuzzer at $fuzzer"; exit 1; }
[ -d "$seeds" ] && [ -n "$(ls -A "$seeds")" ] || { echo "no seed corpus in $seeds"; exit 1; }
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$seeds"/* "$work/corpus/"
rc=0
"$fuzzer" -max_total_time="$seconds" -seed=1 -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
	-artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 || rc=$?
grep -E '^(stat::number_of_executed_units|stat::new_units_added)|^#[0-9]+ *DONE' "$work/log" || true
if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
	tail -n 40 "$work/log"
	echo "FAIL: $(basename "$fuzzer") exit $rc; inputs in $work/artifacts"
	exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
[ "${runs:-0}" -gt 1000 ] || { tail -n 20 "$work/log"; echo "FAIL: only ${runs:-0} inputs ran"; exit 1; }
echo "PASS: $(basename "$fuzzer"): $runs inputs in ${seconds} s, no finding"
