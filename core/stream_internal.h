/* SPDX-License-Identifier: MIT */
/*
 * Engine internals shared by engine.c and stream.c only. All with the
 * engine lock held.
 */
#ifndef FS_CORE_STREAM_INTERNAL_H
#define FS_CORE_STREAM_INTERNAL_H

#include "core/engine.h"

unsigned fs_stream_credits(const struct fs_stream *s);
void fs_stream_flush(struct fs_engine *e, struct fs_stream *s);
void fs_stream_enqueue(struct fs_engine *e, struct fs_stream *s, struct fs_buf *buf);
int fs_stream_queue_fin(struct fs_engine *e, struct fs_stream *s);
void fs_stream_maybe_credit(struct fs_engine *e, struct fs_stream *s);
void fs_engine_repost(struct fs_engine_rail *er, struct fs_buf *buf);
void fs_engine_add_orphan(struct fs_engine *e, struct fs_stream *s);
void fs_engine_reap(struct fs_engine *e);
struct fs_engine *fs_stream_engine(void);
/* Posts on ER the receive for exactly the payload announced by BUF (an
 * FS_MSG_PULL entry: BUF->pull_tag, BUF->len bytes) into DST, or into BUF's
 * own payload space when DST is NULL. Returns 0 (BUF->pull is
 * FS_PULL_POSTED until the completion) or a negative libfabric error. */
int fs_engine_pull(struct fs_engine_rail *er, struct fs_buf *buf, void *dst);
/* BUF's announcement leaves / rejoins the unpulled set of S. */
void fs_stream_unpulled_dec(struct fs_engine *e, struct fs_stream *s);
void fs_stream_unpulled_inc(struct fs_engine *e, struct fs_stream *s);
/* Asks the provider to cancel that receive; its completion still comes. */
void fs_engine_pull_cancel(struct fs_stream *s, struct fs_buf *buf);
/* A receive buffer S no longer wants: back to the catch-all receives, after
 * draining the payload first if it is an unpulled FS_MSG_PULL entry. */
void fs_engine_rx_discard(struct fs_engine_rail *er, struct fs_buf *buf);

#endif
