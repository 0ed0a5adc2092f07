/* SPDX-License-Identifier: MIT */
/* The negative cache of destinations that are not fabsock listeners (see
 * negcache.h): a hash of address and port, bounded in size. */
#include "core/negcache.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "config/params.h"
#include "core/engine.h"
#include "core/udp.h"

struct fs_negcache_entry {
	uint8_t key[18];
	uint64_t expires_ns;
	UT_hash_handle hh;
};

static pthread_mutex_t fs_negcache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_negcache_entry *fs_negcache;
static unsigned fs_negcache_count;

static void fs_negcache_key(const struct sockaddr *peer, uint8_t key[18])
{
	uint16_t port;

	fs_sockaddr_key(peer, key, &port);
	key[16] = (uint8_t)(port >> 8);
	key[17] = (uint8_t)port;
}

bool fs_negcache_hit(const struct sockaddr *peer)
{
	uint8_t key[18];
	struct fs_negcache_entry *ent;
	bool hit = false;

	if (!fs_params.neg_cache_sec)
		return false;
	fs_negcache_key(peer, key);
	fs_lock(&fs_negcache_lock);
	HASH_FIND(hh, fs_negcache, key, sizeof(key), ent);
	if (ent && ent->expires_ns > fs_now_ns())
		hit = true;
	pthread_mutex_unlock(&fs_negcache_lock);
	return hit;
}

void fs_negcache_add(const struct sockaddr *peer, bool refused)
{
	uint8_t key[18];
	struct fs_negcache_entry *ent;
	uint64_t sec = fs_params.neg_cache_sec;

	if (!refused && sec > FS_NEGCACHE_TIMEOUT_SEC)
		sec = FS_NEGCACHE_TIMEOUT_SEC;
	if (!sec)
		return;
	fs_negcache_key(peer, key);
	fs_lock(&fs_negcache_lock);
	HASH_FIND(hh, fs_negcache, key, sizeof(key), ent);
	if (!ent && fs_negcache_count < 65536 && (ent = calloc(1, sizeof(*ent)))) {
		memcpy(ent->key, key, sizeof(key));
		HASH_ADD(hh, fs_negcache, key, sizeof(ent->key), ent);
		fs_negcache_count++;
	}
	if (ent)
		ent->expires_ns = fs_now_ns() + sec * 1000000000ull;
	pthread_mutex_unlock(&fs_negcache_lock);
}
