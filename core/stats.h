/* SPDX-License-Identifier: MIT */
/*
 * Process-wide offload counters (core/stats.def): the answer to "was my
 * socket offloaded, and if not, why?". Relaxed atomics: they are counters,
 * not synchronisation.
 */
#ifndef FS_CORE_STATS_H
#define FS_CORE_STATS_H

#include <stdint.h>
#include <stdio.h>

struct fs_stats {
#define FS_STAT(name, help) uint64_t name;
#include "core/stats.def"
#undef FS_STAT
};

extern struct fs_stats fs_stats;

#define FS_STAT_ADD(name, n) __atomic_fetch_add(&fs_stats.name, (n), __ATOMIC_RELAXED)
#define FS_STAT_INC(name) FS_STAT_ADD(name, 1)

/* Logs one line "stats: offloaded=N kernel=N ..." at warn level, at most
 * once per process (exit paths). */
void fs_stats_log_once(void);
/* In a forked child: start from zero (each process reports its own). */
void fs_stats_after_fork(void);

#endif
