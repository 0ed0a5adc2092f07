/* SPDX-License-Identifier: MIT */
/*
 * The process-wide counters and their printing.
 */
#include "core/stats.h"

#include <stdio.h>
#include <string.h>

#include "config/log.h"

struct fs_stats fs_stats;

/* Logs one line "stats: offloaded=N kernel=N ..." at warn level. */
static void fs_stats_log(void)
{
	/* every counter, about 1,200 bytes at zero and growing with stats.def;
	 * a shorter line lost the last ones. It stays below config/log.c's
	 * line (4,096) with room for the prefix. */
	char line[3800];
	size_t used = 0;

#define FS_STAT(name, help)                                                                  \
	if (used < sizeof(line))                                                             \
		used += (size_t)snprintf(line + used, sizeof(line) - used, " %s=%llu", #name, \
					 (unsigned long long)__atomic_load_n(&fs_stats.name, __ATOMIC_RELAXED));
#include "core/stats.def"
#undef FS_STAT
	FS_WARN("stats:%s", line);
}

static int fs_stats_logged;

void fs_stats_log_once(void)
{
	if (!__atomic_exchange_n(&fs_stats_logged, 1, __ATOMIC_ACQ_REL))
		fs_stats_log();
}

void fs_stats_after_fork(void)
{
	/* the child counts its own work: summed over a prefork server's
	 * processes, the parent's counts must appear once */
	memset(&fs_stats, 0, sizeof(fs_stats));
	fs_stats_logged = 0;
}
