/* SPDX-License-Identifier: MIT */
/*
 * A shared library whose constructor and destructor make socket and file
 * calls, the way libcap-ng's constructor reads a file in postgres and sshd.
 * The program that links it (fs_early) is started with LD_PRELOAD, so these
 * run before fabsock's constructor, and the destructor after fabsock's exit
 * handlers. Each call's outcome is kept for fs_early to print.
 */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

__attribute__((visibility("default"))) char fs_early_ctor_report[256];

/* Every interposed call a library might make early, on files and sockets. */
static int fs_early_calls(void)
{
	char buf[64];
	struct pollfd p;
	int fd, sock, dup_fd, fails = 0;

	fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, buf, sizeof(buf)) <= 0)
		fails |= 1;
	dup_fd = fd >= 0 ? dup(fd) : -1;
	if (dup_fd < 0 || dup2(dup_fd, 200) != 200 || close(200) != 0 || close(dup_fd) != 0)
		fails |= 2;
	if (fd >= 0 && (fcntl(fd, F_GETFD) < 0 || close(fd) != 0))
		fails |= 4;
	sock = socket(AF_INET, SOCK_STREAM, 0);
	if (sock < 0 || setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &(int){ 1 }, sizeof(int)) != 0)
		fails |= 8;
	p.fd = sock;
	p.events = POLLOUT;
	if (poll(&p, 1, 0) < 0 || close(sock) != 0)
		fails |= 16;
	if (write(-1, buf, 1) != -1)
		fails |= 32;
	return fails;
}

__attribute__((constructor)) static void fs_early_ctor(void)
{
	int fails = fs_early_calls();

	snprintf(fs_early_ctor_report, sizeof(fs_early_ctor_report), "constructor calls: %s (mask %d)",
		 fails ? "FAILED" : "ok", fails);
}

__attribute__((destructor)) static void fs_early_dtor(void)
{
	int fails = fs_early_calls();
	const char *msg = fails ? "destructor calls: FAILED\n" : "destructor calls: ok\n";

	if (write(STDOUT_FILENO, msg, strlen(msg)) < 0)
		_exit(3);
}
