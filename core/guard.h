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

/* initial-exec: read with one instruction, never through __tls_get_addr,
 * which a sanitizer runtime intercepts and cannot serve before it has
 * initialised (a wrapper called from another library's constructor: TSan
 * died there in ssh, sshd and postgres). libfabsock.so is preloaded, so its
 * TLS is in the static block. */
extern __thread int fs_guard_depth __attribute__((tls_model("initial-exec")));

/* Set by core/fabric.c while the shm provider builds its region in a file
 * it has just created, so all zeros (see the strncpy wrapper). */
extern __thread int fs_fresh_region __attribute__((tls_model("initial-exec")));

#define FS_GUARD_ENTER() (fs_guard_depth++)
#define FS_GUARD_LEAVE() (fs_guard_depth--)
#define FS_GUARDED() (fs_guard_depth > 0)

#endif
