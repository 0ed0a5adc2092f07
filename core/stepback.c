/* SPDX-License-Identifier: MIT */
/*
 * Stepping back from the fabric: the window's judgement and the hand-back
 * it starts (stepback.h for the rule and why). The counting itself is
 * inline in stepback.h, called by the data entry points (sock_io.c).
 */
#include "core/stepback.h"

#include <errno.h>

#include "config/log.h"
#include "core/engine.h"
#include "core/handback.h"
#include "core/history.h"
#include "core/sock.h"
#include "core/stats.h"
#include "core/stream_internal.h"

bool fs_stepback_small(uint32_t turns, uint32_t measured, uint64_t bytes)
{
	if (!turns || bytes / turns > fs_params.stepback_bytes)
		return false; /* bulk: the fabric's copies pay even when its waits sleep */
	return measured * 2ull >= turns; /* else too few turns judged (answers read by other threads) */
}

bool fs_stepback_judge(bool small, uint32_t measured, uint32_t slept)
{
	return small && slept * 100ull >= (uint64_t)fs_params.stepback_slept_pct * measured;
}

bool fs_stepback_measure(struct fs_stepback *sb, bool over, uint64_t ns_turn, bool small)
{
	uint32_t tcp = (over || small) && sb->hist ? fs_history_tcp_ns_turn(sb->hist) : 0;
	int cmp = tcp ? fs_stepback_compare(ns_turn, tcp) : 0;

	if (over && cmp < 0) {
		FS_STAT_INC(stepback_overruled);
		return false;
	}
	if (!over && small && cmp > 0) {
		FS_STAT_INC(stepback_measured_slower);
		return true;
	}
	return over;
}

void fs_stepback_fire(struct fs_sock *s)
{
	struct fs_engine *e = fs_engine_peek();
	struct fs_stream *st = s->stream;
	static bool logged;
	int ret = -EALREADY;

	__atomic_store_n(&s->sb.done, true, __ATOMIC_RELAXED); /* once: a stream that could not go back stays */
	if (!e || !st)
		return;
	pthread_mutex_lock(&e->lock);
	/* Not on the way back already (a fork's, or the peer stepping back
	 * first), not broken, not ending: those need no help. A FIN we queued
	 * is no obstacle (it becomes the kernel socket's shutdown). */
	if (st->state == FS_STREAM_OPEN && st->hb == FS_HB_NONE && !st->error && !st->peer_fin && !st->peer_gone)
		ret = fs_handback_start(e, st, s->fd);
	fs_engine_unlock(e);
	if (ret)
		return;
	FS_STAT_INC(handback_fabric_slower);
	if (!__atomic_exchange_n(&logged, true, __ATOMIC_RELAXED))
		FS_INFO("fd %d: small request/response turns whose answers mostly came after a sleep: the fabric is "
			"slower than the kernel here, handing the stream back to TCP (FABSOCK_STEPBACK=0 keeps it; "
			"logged once)",
			s->fd);
	/* the fabric's time where it lost: with TCP's, the next connections
	 * go where the program ran faster (fs_history_decide) */
	fs_history_fabric_time(&s->hist, fs_stepback_ns_turn(&s->sb));
	fs_history_stepped_back(&s->hist);
}
