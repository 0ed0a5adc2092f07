/* SPDX-License-Identifier: MIT */
/*
 * Which signal handlers decide EINTR. A blocking call that fabsock emulates
 * sleeps in ppoll(), which a signal always interrupts; the kernel would
 * have restarted the call if the handler had SA_RESTART. fabsock cannot
 * tell which signal arrived, so it restarts only if every installed
 * handler has SA_RESTART (EINTR is always a legal answer otherwise), leaving
 * out the synchronous fault signals (SIGSEGV, SIGBUS, ...), which go to the
 * thread that faulted, never to one asleep.
 *
 * Providers install handlers of their own when they open (libfabric's shm
 * catches SIGINT, SIGTERM, SIGBUS and SIGSEGV to unlink its region, without
 * SA_RESTART). Those are not the application's: for a signal whose handler
 * is still the one a provider put there, the application's handler from
 * before (the one the provider chains to) decides instead.
 */
#ifndef FS_CORE_SIGS_H
#define FS_CORE_SIGS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

struct fs_sigs_snapshot {
	struct sigaction act[NSIG];
	bool ok[NSIG];
};

/* Around a provider's initialisation: remember what it changed. */
void fs_sigs_before(struct fs_sigs_snapshot *snap);
void fs_sigs_after(const struct fs_sigs_snapshot *snap);

/* In a forked child: the parent's provider handlers act on the parent's
 * objects (libfabric's shm one unlinks the shm regions it knows, which are
 * the parent's): put the application's handlers back. */
void fs_sigs_after_fork(void);

/* After EINTR in an emulated blocking call: restart it? */
bool fs_sigs_restart(void);

/*
 * Death by a signal whose action is the default. The kernel delivers what a
 * process wrote to its sockets however it ends; fabsock's unsent bytes live
 * in the process. So once a process offloads, fabsock installs a handler of
 * its own for every signal that ends the process by default without a crash
 * (SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGUSR1, ..., real-time signals) and
 * whose action is still the default: it has every stream delivered (bounded
 * by FABSOCK_LINGER_SEC, by a thread that may take locks) and then lets the
 * default action happen, so the process still dies by that signal. The
 * application never sees the handler: sigaction() and signal() report the
 * default for such a signal, and installing its own handler (or SIG_IGN)
 * puts fabsock's aside.
 */
/* After the first rail opened (and its provider's handlers went in). */
void fs_sigs_exit_install(void);
/* Whether the application's sigaction() for SIG must come through
 * fs_sigs_app_sigaction (the exit handlers are in, and SIG is one of
 * theirs). */
bool fs_sigs_exit_watched(int sig);
/* The application's sigaction() for such a signal: 0 or -errno. */
int fs_sigs_app_sigaction(int sig, const struct sigaction *act, struct sigaction *oldact);
/* Called by the exit handler: delivers every stream (core/sock.c). */
void fs_sigs_exit_hook(void);


#endif
