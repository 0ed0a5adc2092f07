#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Interposed calls outside fabsock's own lifetime (issue: real programs call
# read() from other libraries' constructors). fs_early links a library whose
# constructor and destructor make file and socket calls; under the preload
# they run before fabsock's constructor and after its exit handlers. Then the
# same from a vfork child (close_range, dup2) and from a signal handler. Each
# run must exit 0 with every check line "ok", and not die by a signal. Real
# programs whose libraries do this (postgres and sshd: libcap-ng) are run too
# when installed.
. "$(dirname "$0")/lib.sh"

prog=$FS_PROGS/fs_early
[ -x "$prog" ] || fs_skip "no $prog"

for mode in "" vfork signal; do
	label="fs_early ${mode:-constructor}"
	rc=0
	fs_pre "$prog" $mode >"$FS_TMP/out" 2>"$FS_TMP/err" || rc=$?
	if [ "$rc" -ne 0 ]; then
		fs_fail "$label: exit status $rc$( [ "$rc" -gt 128 ] && echo " (signal $((rc - 128)))")"
		cat "$FS_TMP/out" "$FS_TMP/err" >&2
	elif grep -q FAILED "$FS_TMP/out" || ! grep -q '^destructor calls: ok' "$FS_TMP/out"; then
		fs_fail "$label: $(tr '\n' ' ' <"$FS_TMP/out")"
	else
		fs_pass "$label: $(grep -c ': ok' "$FS_TMP/out") checks"
	fi
done

# Real programs whose libraries' constructors call read() and close()
# (libcap-ng) or fopen() (libselinux: ssh).
for cmd in "/usr/lib/postgresql/15/bin/postgres --version" "/usr/sbin/sshd -V" "/usr/bin/ssh -V"; do
	set -- $cmd
	if [ ! -x "$1" ]; then
		fs_log "not installed: $1"
		continue
	fi
	rc=0
	fs_pre "$@" >"$FS_TMP/out" 2>&1 || rc=$?
	# sshd -V prints its version and exits 1 (an unknown option to it)
	if [ "$rc" -gt 128 ]; then
		fs_fail "$cmd: died by signal $((rc - 128))"
	elif grep -qiE 'postgres|openssh' "$FS_TMP/out"; then
		fs_pass "$cmd: $(head -n 1 "$FS_TMP/out")"
	else
		fs_fail "$cmd: exit $rc: $(head -n 2 "$FS_TMP/out")"
	fi
done
fs_done
