/* SPDX-License-Identifier: MIT */
/*
 * Shared by fabric.c (libfabric, rails) and fabric_shm.c (the shm
 * provider's regions) only.
 */
#ifndef FS_CORE_FABRIC_INTERNAL_H
#define FS_CORE_FABRIC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

/* In fabric.c: FI_SHM_DISABLE_CMA was on when libfabric was loaded. */
extern bool fs_fabric_cma_off;

/* In fabric_shm.c. */

/* Writes "fabsock-<pid namespace>-" into OUT: what our region names start
 * with. Returns its length. */
size_t fs_shm_prefix(char *out, size_t size);
/* Removes dead processes' regions, once per process. */
void fs_shm_clean_stale(void);
/* Our shm rail is open: finds its region's lock and, if found, starts the
 * watchdog that releases a lock a dead peer left taken. */
void fs_shm_watch_lock(void);

#endif
