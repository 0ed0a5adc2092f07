/* SPDX-License-Identifier: MIT */
/*
 * The vfork() and clone() wrappers. A vfork child (and a clone child with
 * CLONE_VM) runs in its parent's memory with its own descriptor table: a
 * close() or dup2() of it must not touch fabsock's state, which is the
 * parent's (core/engine.h, fs_vfork_child). Knowing that costs a getpid()
 * system call, which every server paid on every close(); now only a
 * process that called vfork() or clone() pays it, and these wrappers say
 * so (fs_vfork_seen) before the child exists.
 *
 * They cannot be C: a function that calls vfork() returns into a stack
 * frame the child has reused. Each marks the process, then jumps to the
 * real call with the caller's return address and arguments exactly as it
 * got them; the call to the marker comes before, with the arguments saved
 * around it, and its frame is gone before the real call runs.
 *
 * Not wrapped here: glibc's __vfork and __clone (its own names; programs
 * call vfork and clone), the internal calls of its posix_spawn, system and
 * popen (their child runs glibc's internal calls only, never an interposed
 * one; the three are interposed in C, to count their child among the
 * holders of our descriptors: fs_fds_spread), and a raw clone system call
 * (syscall(SYS_clone, ...)).
 */
#include <stdbool.h>

#include "core/util.h"
#include "preload/real.h"

/* Called by the assembly below: marks the process, returns the real call. */
__attribute__((visibility("hidden"), used)) void *fs_vfork_target(void);
__attribute__((visibility("hidden"), used)) void *fs_clone_target(void);

void *fs_vfork_target(void)
{
	fs_fds_spread_note();
	__atomic_store_n(&fs_vfork_seen, true, __ATOMIC_SEQ_CST);
	return (void *)FS_REAL(vfork);
}

void *fs_clone_target(void)
{
	fs_fds_spread_note();
	__atomic_store_n(&fs_vfork_seen, true, __ATOMIC_SEQ_CST);
	return (void *)FS_REAL(clone);
}

#if defined(__x86_64__)
/* At entry %rsp is 8 past a 16-byte boundary (the return address): one
 * push or sub of 8 aligns it for the call. clone's six register arguments
 * are kept across the marker's call; the seventh is on the caller's stack,
 * where it stays. */
__asm__(".text\n"
	".globl vfork\n"
	".type vfork, @function\n"
	"vfork:\n"
	"	subq $8, %rsp\n"
	"	call fs_vfork_target\n"
	"	addq $8, %rsp\n"
	"	jmp *%rax\n"
	".size vfork, .-vfork\n"
	".globl clone\n"
	".type clone, @function\n"
	"clone:\n"
	"	pushq %rdi\n"
	"	pushq %rsi\n"
	"	pushq %rdx\n"
	"	pushq %rcx\n"
	"	pushq %r8\n"
	"	pushq %r9\n"
	"	subq $8, %rsp\n"
	"	call fs_clone_target\n"
	"	addq $8, %rsp\n"
	"	popq %r9\n"
	"	popq %r8\n"
	"	popq %rcx\n"
	"	popq %rdx\n"
	"	popq %rsi\n"
	"	popq %rdi\n"
	"	jmp *%rax\n"
	".size clone, .-clone\n");
#elif defined(__aarch64__)
/* The return address is in x30, which the marker's call clobbers: kept in
 * a frame with x29 (and clone's eight argument registers), restored before
 * the branch. x16 is the intra-procedure-call scratch register. */
__asm__(".text\n"
	".globl vfork\n"
	".type vfork, %function\n"
	"vfork:\n"
	"	stp x29, x30, [sp, #-16]!\n"
	"	mov x29, sp\n"
	"	bl fs_vfork_target\n"
	"	mov x16, x0\n"
	"	ldp x29, x30, [sp], #16\n"
	"	br x16\n"
	".size vfork, .-vfork\n"
	".globl clone\n"
	".type clone, %function\n"
	"clone:\n"
	"	stp x29, x30, [sp, #-80]!\n"
	"	mov x29, sp\n"
	"	stp x0, x1, [sp, #16]\n"
	"	stp x2, x3, [sp, #32]\n"
	"	stp x4, x5, [sp, #48]\n"
	"	stp x6, x7, [sp, #64]\n"
	"	bl fs_clone_target\n"
	"	mov x16, x0\n"
	"	ldp x0, x1, [sp, #16]\n"
	"	ldp x2, x3, [sp, #32]\n"
	"	ldp x4, x5, [sp, #48]\n"
	"	ldp x6, x7, [sp, #64]\n"
	"	ldp x29, x30, [sp], #80\n"
	"	br x16\n"
	".size clone, .-clone\n");
#else
#error "fabsock wraps vfork and clone in assembly for x86_64 and aarch64 only (preload/vfork.c)"
#endif
