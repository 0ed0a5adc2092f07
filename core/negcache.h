/* SPDX-License-Identifier: MIT */
/*
 * The negative cache: destinations (address and port) whose probe said they
 * are not fabsock listeners, or went unanswered. A connection to one skips
 * the probe and stays plain TCP while its entry lasts.
 */
#ifndef FS_CORE_NEGCACHE_H
#define FS_CORE_NEGCACHE_H

#include <stdbool.h>
#include <sys/socket.h>

/* Negative cache of destinations that are not fabsock listeners. */
bool fs_negcache_hit(const struct sockaddr *peer);
/* Remembers PEER as plain TCP: for FABSOCK_NEG_CACHE_SEC when it said so
 * (probe port unreachable: no fabsock listener), for at most
 * FS_NEGCACHE_TIMEOUT_SEC when it only did not answer in time (a flood may
 * have used up its probe budget: a legitimate client is kept off the
 * fabric only that long). */
#define FS_NEGCACHE_TIMEOUT_SEC 10u
void fs_negcache_add(const struct sockaddr *peer, bool refused);

#endif
