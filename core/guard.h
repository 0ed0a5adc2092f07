/* SPDX-License-Identifier: MIT */
/*
 * The "inside fabsock" guard. While a thread is inside fabsock (or inside
 * libfabric called by fabsock), every interposed call it makes goes straight
 * to the real function. Threads that libfabric creates while the guard is
 * held are marked internal for their whole life (see the pthread_create
 * wrapper), so a provider's progress thread is never mistaken for the
 * application.
 */
#ifndef FS_CORE_GUARD_H
#define FS_CORE_GUARD_H

extern __thread int fs_guard_depth;

#define FS_GUARD_ENTER() (fs_guard_depth++)
#define FS_GUARD_LEAVE() (fs_guard_depth--)
#define FS_GUARDED() (fs_guard_depth > 0)

#endif
