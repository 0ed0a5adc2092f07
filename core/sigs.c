/* SPDX-License-Identifier: MIT */
/* Signal handlers and EINTR (see sigs.h). */
#include "core/sigs.h"

#include "config/log.h"
#include "core/guard.h"
#include "core/util.h"
#include "preload/real.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t fs_sigs_lock = PTHREAD_MUTEX_INITIALIZER;
/* Per signal: the handler a provider installed (0: none), and the
 * application's action it replaced. */
static void *fs_sigs_provider[NSIG];
static struct sigaction fs_sigs_app[NSIG];
/* Per signal: fabsock's exit handler stands in for the application's
 * default action (atomic), and the action it hands on to after its flush. */
static int fs_exit_managed[NSIG];
static struct sigaction fs_exit_then[NSIG];
/* fs_sigs_exit_install ran in this process (atomic). */
static int fs_exit_armed;

static void *fs_sigs_handler(const struct sigaction *sa)
{
	return (sa->sa_flags & SA_SIGINFO) ? (void *)sa->sa_sigaction : (void *)sa->sa_handler;
}

/* fs_sigs_lock with every signal blocked in this thread while it is held:
 * an application's handler that calls sigaction() (through
 * fs_sigs_app_sigaction) cannot run in a thread that holds it. */
static void fs_sigs_lock_take(sigset_t *old)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, old);
	pthread_mutex_lock(&fs_sigs_lock);
}

static void fs_sigs_lock_give(const sigset_t *old)
{
	pthread_mutex_unlock(&fs_sigs_lock);
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

static bool fs_sigs_is_handler(const struct sigaction *sa)
{
	return !(sa->sa_flags & SA_SIGINFO) ? sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN
					     : sa->sa_sigaction != NULL;
}

void fs_sigs_before(struct fs_sigs_snapshot *snap)
{
	for (int sig = 1; sig < NSIG; sig++)
		snap->ok[sig] = fs_real.sigaction(sig, NULL, &snap->act[sig]) == 0;
}

void fs_sigs_after(const struct fs_sigs_snapshot *snap)
{
	sigset_t old;

	fs_sigs_lock_take(&old);
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction now;

		if (!snap->ok[sig] || fs_real.sigaction(sig, NULL, &now))
			continue;
		if (fs_sigs_handler(&now) == fs_sigs_handler(&snap->act[sig]))
			continue;
		__atomic_store_n(&fs_sigs_provider[sig], fs_sigs_handler(&now), __ATOMIC_RELEASE);
		fs_sigs_app[sig] = snap->act[sig];
	}
	fs_sigs_lock_give(&old);
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
		    sig == SIGILL || sig == SIGTRAP || sig == SIGSYS || fs_real.sigaction(sig, NULL, &sa))
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
		if (fs_real.sigaction(sig, NULL, &now) == 0 && fs_sigs_handler(&now) == provider)
			fs_real.sigaction(sig, &fs_sigs_app[sig], NULL);
		/* our exit handler stays; what it hands on to after its flush is
		 * the application's action again, not the parent's provider */
		if (fs_exit_managed[sig])
			fs_exit_then[sig] = fs_sigs_app[sig];
	}
}

/* ---- delivering what was written when a signal ends the process -------
 *
 * Signals whose default action ends the process without a crash. A fault
 * (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS) or abort() is a crash:
 * nothing is promised then, the peers see a reset. */
static const int fs_exit_signals[] = {
	SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, SIGTERM, SIGSTKFLT,
	SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
};

static void fs_exit_signal(int sig, siginfo_t *info, void *ucontext)
{
	int saved = errno;
	struct sigaction then;
	sigset_t one;

	/* the process is ending by SIG: from now on its action is the real one */
	__atomic_store_n(&fs_exit_managed[sig], 0, __ATOMIC_RELEASE);
	/* everything is delivered first (bounded), by a thread that may take
	 * locks: this one may hold any of them */
	fs_sigs_exit_hook();
	then = fs_exit_then[sig];
	/* The pid cache names another process: this is a vfork child, or a
	 * forked child that SIG reached on its way out of the clone system
	 * call, before fork()'s child handlers ran (fs_sigs_after_fork). THEN
	 * may be the parent's provider handler, and shm's unlinks the regions
	 * it lists: the parent's. The application's action is the default
	 * (fs_exit_managed), so take that. Seen: e2e_semantics fork_children,
	 * a child SIGTERM'ed 50 ms after its fork on a loaded host (load 17)
	 * removed its parent's region. */
	if (getpid() != fs_self_pid())
		then.sa_flags = 0, then.sa_handler = SIG_DFL;
	if (fs_sigs_is_handler(&then)) {
		/* a provider's handler (shm's unlinks its region), which puts the
		 * application's action (the default) back and raises: its calls
		 * are the provider's own, straight to the real functions */
		fs_real.sigaction(sig, &then, NULL);
		FS_GUARD_ENTER();
		if (then.sa_flags & SA_SIGINFO)
			then.sa_sigaction(sig, info, ucontext);
		else
			then.sa_handler(sig);
		FS_GUARD_LEAVE();
	} else {
		struct sigaction dfl = { .sa_handler = SIG_DFL };

		fs_real.sigaction(sig, &dfl, NULL);
		raise(sig); /* pending until this handler returns: then the default */
	}
	sigemptyset(&one);
	sigaddset(&one, sig);
	pthread_sigmask(SIG_UNBLOCK, &one, NULL);
	errno = saved;
}

static bool fs_exit_signal_wanted(int sig)
{
	for (size_t i = 0; i < sizeof(fs_exit_signals) / sizeof(fs_exit_signals[0]); i++)
		if (fs_exit_signals[i] == sig)
			return true;
	return sig >= SIGRTMIN && sig <= SIGRTMAX;
}

/* Puts fabsock's exit handler in for SIG, handing on to THEN. Lock held. */
static void fs_exit_take(int sig, const struct sigaction *then)
{
	struct sigaction ours = { .sa_sigaction = fs_exit_signal };

	ours.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
	sigfillset(&ours.sa_mask);
	fs_exit_then[sig] = *then;
	if (fs_real.sigaction(sig, &ours, NULL) == 0)
		__atomic_store_n(&fs_exit_managed[sig], 1, __ATOMIC_RELEASE);
}

static bool fs_action_is_default(const struct sigaction *sa)
{
	return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_DFL;
}

void fs_sigs_exit_install(void)
{
	sigset_t old;

	fs_sigs_lock_take(&old);
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction now;
		void *provider = __atomic_load_n(&fs_sigs_provider[sig], __ATOMIC_ACQUIRE);

		if (fs_exit_managed[sig] || !fs_exit_signal_wanted(sig) || fs_real.sigaction(sig, NULL, &now))
			continue;
		/* The application's action must be the default: either it is in
		 * place, or a provider's handler replaced it and ends with it. */
		if (fs_action_is_default(&now) ||
		    (provider && provider == fs_sigs_handler(&now) && fs_action_is_default(&fs_sigs_app[sig])))
			fs_exit_take(sig, &now);
	}
	/* from now on the application's sigaction() calls come through here */
	__atomic_store_n(&fs_exit_armed, 1, __ATOMIC_RELEASE);
	fs_sigs_lock_give(&old);
}

bool fs_sigs_exit_watched(int sig)
{
	return __atomic_load_n(&fs_exit_armed, __ATOMIC_ACQUIRE) && sig > 0 && sig < NSIG && fs_exit_signal_wanted(sig);
}

int fs_sigs_app_sigaction(int sig, const struct sigaction *act, struct sigaction *oldact)
{
	sigset_t old;
	int ret = 0;

	fs_sigs_lock_take(&old);
	if (!fs_exit_managed[sig]) {
		/* the application's own action is in place; one that sets the
		 * default gets fabsock's exit handler in its stead */
		if (fs_real.sigaction(sig, act, oldact))
			ret = -errno;
		else if (act && fs_action_is_default(act))
			fs_exit_take(sig, act);
		fs_sigs_lock_give(&old);
		return ret;
	}
	if (oldact) {
		/* the application's view: the default it had */
		memset(oldact, 0, sizeof(*oldact));
		oldact->sa_handler = SIG_DFL;
	}
	if (act && ((act->sa_flags & SA_SIGINFO) || act->sa_handler != SIG_DFL)) {
		/* its own handler, or SIG_IGN: ours (and a provider's under it)
		 * step aside, as they would never have been there */
		if (fs_real.sigaction(sig, act, NULL))
			ret = -errno;
		else
			__atomic_store_n(&fs_exit_managed[sig], 0, __ATOMIC_RELEASE);
	}
	fs_sigs_lock_give(&old);
	return ret;
}

