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

#endif
