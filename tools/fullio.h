/* SPDX-License-Identifier: MIT */
/*
 * Whole-buffer blocking socket I/O for the benchmark tool and the test
 * programs (tools/fabsock_netbench.c, tests/progs/): retries EINTR and
 * partial transfers. Returns 0 when all LEN bytes moved, -1 on an error
 * (errno set) or at EOF (errno 0).
 */
#ifndef FABSOCK_TOOLS_FULLIO_H
#define FABSOCK_TOOLS_FULLIO_H

#include <errno.h>
#include <stddef.h>
#include <sys/socket.h>

static inline int fullio_read(int fd, void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = recv(fd, (char *)buf + done, len - done, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			errno = 0;
		if (n <= 0)
			return -1;
		done += (size_t)n;
	}
	return 0;
}

static inline int fullio_write(int fd, const void *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = send(fd, (const char *)buf + done, len - done, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		done += (size_t)n;
	}
	return 0;
}

#endif
