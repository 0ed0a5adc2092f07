#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run_fuzz.sh FUZZER SEEDS WORK SECONDS: fuzzes for SECONDS from a fresh copy
# of the seed corpus SEEDS (the committed files are never written), with a
# fixed seed so a run can be repeated, and fails on any crash, sanitizer
# report, failed round-trip check, leak, or input that takes over 5 s. The
# crashing input is left in WORK.
# FS_FUZZ_BUDGET=cpu: SECONDS of the fuzzer's CPU time instead of SECONDS
# of wall time (.ci/run runs the fuzzers at nice 19 beside the sanitizer
# tests, where a second of wall time may be a fraction of a second of
# CPU: the budget counts the fuzzing done, as a quiet machine's SECONDS
# of wall time do). The fuzzer is stopped with SIGINT once its CPU time
# (utime + stime) reaches SECONDS; it then prints its final stats and
# exits 72, which counts as its normal end. Wall time is bounded by
# FS_FUZZ_WALL_LIMIT (default 40 x SECONDS; CTest's limit is 1800 s).
set -euo pipefail
fuzzer=$1 seeds=$2 work=$3 seconds=$4
budget=${FS_FUZZ_BUDGET:-wall}
[ -x "$fuzzer" ] || { echo "no fuzzer at $fuzzer"; exit 1; }
[ -d "$seeds" ] && [ -n "$(ls -A "$seeds")" ] || { echo "no seed corpus in $seeds"; exit 1; }
case $budget in
wall | cpu) ;;
*) echo "FS_FUZZ_BUDGET=$budget: wall or cpu"; exit 1 ;;
esac
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$seeds"/* "$work/corpus/"
rc=0 wall=$seconds stopped=0 t0=$SECONDS
[ "$budget" = wall ] || wall=${FS_FUZZ_WALL_LIMIT:-$((seconds * 40))}
"$fuzzer" -max_total_time="$wall" -seed=1 -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
	-artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 &
pid=$!
if [ "$budget" = cpu ]; then
	ticks=$(getconf CLK_TCK)
	while kill -0 "$pid" 2>/dev/null; do
		stat=$(cat "/proc/$pid/stat" 2>/dev/null) || break
		stat=${stat##*) } # fields after "pid (comm) ": utime is the 12th, stime the 13th
		read -r -a f <<<"$stat"
		if [ $(((f[11] + f[12]) / ticks)) -ge "$seconds" ]; then
			kill -INT "$pid" 2>/dev/null && stopped=1
			break
		fi
		sleep 0.5
	done
fi
wait "$pid" || rc=$?
# 72: libFuzzer's exit status after SIGINT ("run interrupted"), the end of a
# CPU budget when this script sent it
[ "$stopped" = 1 ] && [ "$rc" = 72 ] && grep -q 'libFuzzer: run interrupted' "$work/log" && rc=0
grep -E '^(stat::number_of_executed_units|stat::new_units_added)|^#[0-9]+ *DONE' "$work/log" || true
if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
	tail -n 40 "$work/log"
	echo "FAIL: $(basename "$fuzzer") exit $rc; inputs in $work/artifacts"
	exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
[ "${runs:-0}" -gt 1000 ] || { tail -n 20 "$work/log"; echo "FAIL: only ${runs:-0} inputs ran"; exit 1; }
if [ "$budget" = cpu ]; then
	if [ "$stopped" != 1 ]; then
		# the wall limit ended it first: less fuzzing than asked for
		echo "FAIL: $(basename "$fuzzer"): $runs inputs, but the wall limit of $wall s came before $seconds s of CPU"
		exit 1
	fi
	echo "PASS: $(basename "$fuzzer"): $runs inputs in ${seconds} s of CPU ($((SECONDS - t0)) s of wall time), no finding"
else
	echo "PASS: $(basename "$fuzzer"): $runs inputs in ${seconds} s, no finding"
fi
