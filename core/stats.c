/* SPDX-License-Identifier: MIT */
/*
 * The process-wide counters and their printing.
 */
#include "core/stats.h"

#include <stdio.h>
#include <string.h>

#include "config/log.h"

struct fs_stats fs_stats;

/* Logs "stats: offloaded=N kernel=N ..." at warn level, in as many lines
 * as the counters need: a log line holds 1024 bytes and the counters'
 * names alone are more. Each counter is on one line, whole; the tests and
 * the bench read any line that starts "stats:" (per process, per line). */
#define FS_STATS_LINE_BODY 900

static void fs_stats_log(void)
{
	char line[1024], item[128];
	size_t used = 0;
	int n;

#define FS_STAT(name, help)                                                                              \
	n = snprintf(item, sizeof(item), " %s=%llu", #name,                                              \
		     (unsigned long long)__atomic_load_n(&fs_stats.name, __ATOMIC_RELAXED));               \
	if (n > 0 && (size_t)n < sizeof(item)) {                                                         \
		if (used + (size_t)n > FS_STATS_LINE_BODY) {                                             \
			FS_WARN("stats:%s", line);                                                       \
			used = 0;                                                                        \
		}                                                                                        \
		memcpy(line + used, item, (size_t)n + 1);                                                \
		used += (size_t)n;                                                                       \
	}
#include "core/stats.def"
#undef FS_STAT
	if (used)
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
