#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every function the C library exports that can create, duplicate,
# reconfigure, read, write, wait on or close a socket (or start a process
# that inherits one) is either interposed (preload/symbols.def) or listed
# below as deliberately left alone, with the reason. A glibc that adds such
# a name (fcntl64 came with 2.28: python3, node, nginx and liblber call it,
# and fabsock missed their socket.dup() and O_NONBLOCK) fails this test
# until someone decides. The C library checked is the one libfabsock.so
# links against; its exports come from objdump -T (functions, default and
# private versions alike; a compat-only version, shown in parentheses, no
# new binary can bind to).
set -euo pipefail
: "${FS_BUILD:?FS_BUILD must name the build directory}"
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v objdump >/dev/null || { echo "objdump is missing"; exit 77; }
lib_so=${FABSOCK_LIB:-$FS_BUILD/libfabsock.so}
libc=$(ldd "$lib_so" | awk '$1 ~ /^libc\.so/ { print $3 }')
[ -r "$libc" ] || { echo "cannot find the C library of $lib_so"; exit 1; }

# The names that touch descriptors, sockets or processes: a name is
# relevant when, leading underscores stripped, it starts with one of these.
# Deliberately broad: what it catches that is no socket call goes on the
# list below with its reason.
families='accept|bind|connect|listen|shutdown|socket|getsockopt|setsockopt|getpeername|getsockname'
families+='|recv|send|read|write|pread|pwrite|splice|tee|vmsplice|copy_file_range'
families+='|close|dup|fcntl|ioctl|poll|ppoll|select|pselect|epoll|fdopen'
families+='|fork|vfork|clone|exec|fexecve|posix_spawn|system|popen|daemon|_exit|_Exit'
families+='|sigaction|signal|sysv_signal|bsd_signal|ssignal|sigset'
families+='|libc_(fcntl|fork|pread|pwrite|sigaction|system)'
families+='|aio_|lio_listio'

# Deliberately not interposed, because ... (a name or a shell pattern, then
# the reason; the reason is for the reader).
read -r -d '' not_interposed <<'EOF' || true
# Positional I/O: the kernel refuses a socket before touching its data
# (ESPIPE; EINVAL for a negative offset), so the real call's answer is the
# kernel's. (preadv2/pwritev2 are interposed: offset -1 reads and writes.)
pread pread64 __pread64 __pread_chk __pread64_chk	ESPIPE on a socket
pwrite pwrite64 __pwrite64	ESPIPE on a socket
preadv preadv64 pwritev pwritev64	ESPIPE on a socket; offset -1 is EINVAL for these (only the v2 forms take it)
readahead	EINVAL on a socket
copy_file_range	regular files only: EINVAL on a socket
tee vmsplice	pipes only: EINVAL/EBADF on a socket, before any data moves
aio_cancel aio_cancel64 aio_error aio_error64 aio_return aio_return64 aio_suspend aio_suspend64 aio_init	POSIX AIO's bookkeeping: no byte moves (aio_read/aio_write/lio_listio are interposed)
aio_fsync aio_fsync64	fsync on a socket moves no byte (EINVAL)
# Descriptors that cannot be a TCP socket of fabsock's
socketpair	AF_UNIX only (a TCP socketpair is EOPNOTSUPP): never offloaded
bindresvport	binds (bind is the kernel's anyway, fabsock only watches listen/connect)
signalfd	signals, not sockets
readdir readdir64 readdir64_r readdir_r fdopendir closedir	directory streams
readlink readlinkat __readlink_chk __readlinkat_chk	paths, not descriptors
closelog	syslog's own socket, created inside libc (fabsock never saw its socket())
bind_textdomain_codeset bindtextdomain	gettext, not a socket call
duplocale __duplocale	locales
sigsetmask __sigsetjmp	signal masks and setjmp: no handler is installed
# Processes
posix_spawnattr_* posix_spawn_file_actions_*	only describe a posix_spawn (interposed: what survives into the child is settled there); they touch no descriptor
__vfork	glibc's own name of vfork, left alone: programs call vfork, which is interposed (in assembly: preload/vfork.c)
__clone	glibc's own name of clone, left alone: programs call clone, which is interposed (in assembly: preload/vfork.c); glibc's posix_spawn, system and popen reach neither (system and popen are interposed to note their child), and their child runs no interposed call
daemon	forks inside libc at start-up, before a program has connections; the parent _exits at once
execveat	known gap: exec by directory fd (no user on this system; fexecve is interposed)
sigset	known gap: System V API; a handler installed this way for a signal fabsock's exit handler watches replaces it unseen (no user on this system)
fdopen	known gap: stdio reads and writes go through glibc's internal read/write, past every wrapper; a socket of fabsock's under stdio must first be settled as TCP (not done yet)
__sigaction	the TSan build's way past the sigaction wrapper (wrappers.c); no header declares it
# GLIBC_PRIVATE: only glibc's own libraries bind to these (the resolver, nscd,
# libc's internals), on descriptors glibc created itself, which fabsock
# never registered: a socket fabsock did not see created stays the kernel's.
__close_nocancel __read_nocancel __write_nocancel __pread64_nocancel	GLIBC_PRIVATE
__recv __socket __sendmmsg __libc_fcntl64 __libc_fork __libc_pread __libc_pwrite	GLIBC_PRIVATE
__libc_sigaction __libc_system	GLIBC_PRIVATE
EOF

declare -A in_def listed
while read -r s; do in_def[$s]=1; done < <(sed -nE -e 's/^FS_SYM\([^,]+, ([A-Za-z_0-9]+),.*/\1/p' \
	-e 's/^FS_ALIAS\(([A-Za-z_0-9]+),.*/\1/p' "$src/preload/symbols.def")
[ "${#in_def[@]}" -gt 40 ] || { echo "could not read preload/symbols.def"; exit 1; }
in_def[_Exit]=1 # wrapped beside _exit, outside the table (wrappers.c)
patterns=()
while IFS=$'\t' read -r names reason; do
	case $names in '#'* | '') continue ;; esac
	[ -n "$reason" ] || { echo "FAIL: no reason given for: $names"; exit 1; }
	for n in $names; do
		listed[$n]=1
		case $n in *'*'*) patterns+=("$n") ;; esac
	done
done <<<"$not_interposed"

fails=0 checked=0 relevant=0
declare -A seen
# objdump -T: ... DF .text SIZE VERSION NAME; "(VERSION)" is a hidden one
while read -r version name; do
	[ -n "${seen[$name]:-}" ] && continue
	seen[$name]=1
	base=${name##_}
	base=${base##_}
	[[ $base =~ ^($families) ]] || [[ $name =~ ^($families) ]] || continue
	relevant=$((relevant + 1))
	checked=$((checked + 1))
	[ -n "${in_def[$name]:-}" ] && continue
	[ -n "${listed[$name]:-}" ] && continue
	ok=0
	for p in "${patterns[@]}"; do
		# shellcheck disable=SC2053
		[[ $name == $p ]] && { ok=1; break; }
	done
	[ "$ok" = 1 ] && continue
	echo "FAIL: $libc exports $name ($version), which fabsock neither interposes (preload/symbols.def) nor lists as deliberately left alone ($0)"
	fails=$((fails + 1))
done < <(objdump -T "$libc" | awk 'NF >= 6 && $(NF - 3) == ".text" && $(NF - 1) !~ /^\(/ { print $(NF - 1), $NF }')
[ "$relevant" -gt 100 ] || { echo "only $relevant relevant exports found in $libc: the listing changed shape"; exit 1; }
# A listed name glibc does not export (a typo, or gone) is a stale entry.
for n in "${!listed[@]}"; do
	case $n in *'*'*) continue ;; esac
	checked=$((checked + 1))
	[ -n "${seen[$n]:-}" ] || {
		echo "FAIL: $n is listed as left alone, but $libc does not export it"
		fails=$((fails + 1))
	}
	[ -z "${in_def[$n]:-}" ] || {
		echo "FAIL: $n is both interposed and listed as left alone"
		fails=$((fails + 1))
	}
done
# Every interposed name must exist in this libc (real.c aborts otherwise).
for n in "${!in_def[@]}"; do
	checked=$((checked + 1))
	[ -n "${seen[$n]:-}" ] || {
		echo "FAIL: symbols.def names $n, which $libc does not export"
		fails=$((fails + 1))
	}
done
echo "$relevant relevant exports of $libc; $((checked - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
