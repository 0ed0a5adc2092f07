/* SPDX-License-Identifier: MIT */
/*
 * A tiny assertion helper shared by the unit tests: CHECK counts, reports
 * the failing expression with file:line, and keeps going; fs_check_done()
 * prints the closing "N passed, M failed" line and gives the exit status.
 */
#ifndef FS_TESTS_CHECK_H
#define FS_TESTS_CHECK_H

#include <stdio.h>

static int fs_check_passed, fs_check_failed;

#define CHECK(cond)                                                                  \
	do {                                                                         \
		if (cond) {                                                          \
			fs_check_passed++;                                           \
		} else {                                                             \
			fs_check_failed++;                                           \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                    \
	} while (0)

static inline int fs_check_done(void)
{
	printf("%d passed, %d failed\n", fs_check_passed, fs_check_failed);
	return fs_check_failed ? 1 : 0;
}

#endif
