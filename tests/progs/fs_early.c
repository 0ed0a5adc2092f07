/* SPDX-License-Identifier: MIT */
/*
 * fs_early: interposed calls at the edges of a process's life, where
 * fabsock's own set-up has not run yet or has already been torn down.
 *  - its library fs_early_lib makes file and socket calls from its
 *    constructor (before fabsock's: LD_PRELOAD) and destructor;
 *  - `fs_early` alone prints the constructor's report and exits;
 *  - `fs_early vfork`: a vfork child closes every descriptor from 3 up and
 *    dup2()s onto 1 before exec, while the parent holds a socket;
 *  - `fs_early signal`: a signal handler makes the same calls as the
 *    constructor while the main thread is blocked in read() on a pipe.
 * Prints one line per check; exits 0 when all hold.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char fs_early_ctor_report[256];

static volatile sig_atomic_t handler_fails = -1;

static void on_alarm(int sig)
{
	int fails = 0, s, p[2];
	char c = 'x';

	(void)sig;
	s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || close(s) != 0)
		fails |= 1;
	if (pipe(p) != 0 || write(p[1], &c, 1) != 1 || read(p[0], &c, 1) != 1 || close(p[0]) || close(p[1]))
		fails |= 2;
	handler_fails = fails;
}

int main(int argc, char **argv)
{
	static int fails; /* static: survives the vfork child (-Wclobbered) */

	printf("%s\n", fs_early_ctor_report);
	if (strstr(fs_early_ctor_report, "FAILED") || !fs_early_ctor_report[0])
		fails++;
	if (argc > 1 && strcmp(argv[1], "vfork") == 0) {
		int sock = socket(AF_INET, SOCK_STREAM, 0), status = 0;
		pid_t pid = vfork();

		if (pid == 0) {
			if (dup2(2, 1) != 1 || close_range(3, ~0u, 0) != 0)
				_exit(126);
			execlp("true", "true", (char *)NULL);
			_exit(127);
		}
		if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
			printf("vfork child: FAILED (status 0x%x)\n", status);
			fails++;
		} else if (fcntl(sock, F_GETFD) < 0 || fcntl(1, F_GETFD) < 0) {
			printf("vfork child: FAILED (the parent lost a descriptor: %s)\n", strerror(errno));
			fails++;
		} else {
			printf("vfork child: ok\n");
		}
		close(sock);
	}
	if (argc > 1 && strcmp(argv[1], "signal") == 0) {
		struct sigaction sa = { .sa_handler = on_alarm };
		int p[2];
		char c;

		sigaction(SIGALRM, &sa, NULL);
		if (pipe(p) != 0)
			return 1;
		alarm(1);
		while (read(p[0], &c, 1) < 0 && errno == EINTR && handler_fails < 0)
			;
		printf("signal handler calls: %s\n", handler_fails == 0 ? "ok" : "FAILED");
		if (handler_fails != 0)
			fails++;
	}
	fflush(stdout);
	return fails ? 1 : 0;
}
