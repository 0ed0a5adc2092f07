/* SPDX-License-Identifier: MIT */
/*
 * The process-wide counters and their printing.
 */
#include "core/stats.h"

#include <stdio.h>
#include <string.h>

#include "config/log.h"

struct fs_stats fs_stats;

void fs_stats_log(void)
{
	char line[1024];
	size_t used = 0;

#define FS_STAT(name, help)                                                                  \
	if (used < sizeof(line))                                                             \
		used += (size_t)snprintf(line + used, sizeof(line) - used, " %s=%llu", #name, \
					 (unsigned long long)__atomic_load_n(&fs_stats.name, __ATOMIC_RELAXED));
#include "core/stats.def"
#undef FS_STAT
	FS_WARN("stats:%s", line);
}

void fs_stats_print(FILE *out)
{
#define FS_STAT(name, help)                                                                       \
	fprintf(out, "  %-24s %12llu  %s\n", #name,                                               \
		(unsigned long long)__atomic_load_n(&fs_stats.name, __ATOMIC_RELAXED), help);
#include "core/stats.def"
#undef FS_STAT
}

void fs_stats_log_once(void)
{
	static int done;

	if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		fs_stats_log();
}
