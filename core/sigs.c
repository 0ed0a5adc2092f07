/* SPDX-License-Identifier: MIT */
/* Signal handlers and EINTR (see sigs.h). */
#include "core/sigs.h"

#include "config/log.h"
#include "core/guard.h"
#include "preload/real.h"

#include <pthread.h>
#include <string.h>

static pthread_mutex_t fs_sigs_lock = PTHREAD_MUTEX_INITIALIZER;
/* Per signal: the handler a provider installed (0: none), and the
 * application's action it replaced. */
static void *fs_sigs_provider[NSIG];
static struct sigaction fs_sigs_app[NSIG];

static void *fs_sigs_handler(const struct sigaction *sa)
{
	return (sa->sa_flags & SA_SIGINFO) ? (void *)sa->sa_sigaction : (void *)sa->sa_handler;
}

static bool fs_sigs_is_handler(const struct sigaction *sa)
{
	return !(sa->sa_flags & SA_SIGINFO) ? sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN
					     : sa->sa_sigaction != NULL;
}

void fs_sigs_before(struct fs_sigs_snapshot *snap)
{
	for (int sig = 1; sig < NSIG; sig++)
		snap->ok[sig] = sigaction(sig, NULL, &snap->act[sig]) == 0;
}

void fs_sigs_after(const struct fs_sigs_snapshot *snap)
{
	pthread_mutex_lock(&fs_sigs_lock);
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction now;

		if (!snap->ok[sig] || sigaction(sig, NULL, &now))
			continue;
		if (fs_sigs_handler(&now) == fs_sigs_handler(&snap->act[sig]))
			continue;
		__atomic_store_n(&fs_sigs_provider[sig], fs_sigs_handler(&now), __ATOMIC_RELEASE);
		fs_sigs_app[sig] = snap->act[sig];
	}
	pthread_mutex_unlock(&fs_sigs_lock);
}

bool fs_sigs_restart(void)
{
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction sa;
		void *provider;

		/* Fault signals are delivered to the thread that faulted, not to
		 * one asleep in ppoll: their handlers (sanitizers', a provider's)
		 * cannot be what interrupted it. */
		if (sig == SIGKILL || sig == SIGSTOP || sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE ||
		    sig == SIGILL || sig == SIGTRAP || sig == SIGSYS || sigaction(sig, NULL, &sa))
			continue;
		if (!fs_sigs_is_handler(&sa))
			continue;
		provider = __atomic_load_n(&fs_sigs_provider[sig], __ATOMIC_ACQUIRE);
		if (provider && provider == fs_sigs_handler(&sa)) {
			/* the provider's: the application's own action decides */
			sa = fs_sigs_app[sig];
			if (!fs_sigs_is_handler(&sa))
				continue;
		}
		if (!(sa.sa_flags & SA_RESTART)) {
			FS_DBG("EINTR: signal %d has a handler without SA_RESTART", sig);
			return false;
		}
	}
	return true;
}

void fs_sigs_after_fork(void)
{
	pthread_mutex_init(&fs_sigs_lock, NULL);
	for (int sig = 1; sig < NSIG; sig++) {
		void *provider = fs_sigs_provider[sig];
		struct sigaction now;

		if (!provider)
			continue;
		fs_sigs_provider[sig] = NULL;
		if (sigaction(sig, NULL, &now) == 0 && fs_sigs_handler(&now) == provider)
			sigaction(sig, &fs_sigs_app[sig], NULL);
	}
}

int fs_thread_start(void *(*fn)(void *), size_t stack)
{
	pthread_t tid;
	pthread_attr_t attr;
	sigset_t all, old;
	int ret;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, stack);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	FS_GUARD_ENTER();
	ret = fs_real.pthread_create(&tid, &attr, fn, NULL);
	FS_GUARD_LEAVE();
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	return ret;
}
