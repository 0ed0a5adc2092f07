/* SPDX-License-Identifier: MIT */
/*
 * Every lock of the core and the order they are taken in: a lock may be
 * taken while one above it is held, never the other way. Each holder's
 * contract is said where it is taken ("Socket lock held", "Engine lock held").
 *
 * Outermost first:
 *  1. fs_service_busy (service.c): the service thread holds it for all its
 *     work, so everything below is taken under it. Nothing is held when it
 *     is taken (a fork's prepare handler: see below).
 *  2. fs_epoll.lock (epoll.c, per instance): its members and kernel set. An
 *     instance nested in another is locked under the outer one's.
 *  3. fs_sock.lock (sock.h, per socket): its state and handshake. Never two
 *     at once.
 *  4. Two chains, neither taken under the other:
 *     - the engine lock (fs_engine.lock, engine.h): rails, the stream table,
 *       every stream. Under it, leaves only: fs_epoll.rlock, fs_sigs_lock
 *       (a rail's opening), fs_diag_lock (the server's rail check),
 *       fs_hb_fork_lock (the exit's shutdown), and libfabric's shm region
 *       spin lock inside provider calls (fs_prov_spin_lock waits for it);
 *     - fs_service_lock (service.c): the watch list, the thread's start;
 *       then fs_listeners_lock (listener.c): the listeners whose twins the
 *       service thread polls, and each twin's state (twin.c binds, swaps
 *       and closes the sockets under it; the twins' timer is armed only
 *       after it is dropped, since arming takes fs_service_lock); then a
 *       shared probe table file's flock.
 *  5. Leaves, under fs_sock.lock or with nothing held; nothing is taken
 *     under them, and no two are held at once:
 *       fs_engine_create_lock (engine.c)  the engine's creation
 *       fs_negcache_lock (negcache.c)     destinations known not fabsock
 *       fs_records_lock (records.c)       the record directory, the published
 *                                         listeners; under it only the record
 *                                         files' flocks (also taken under
 *                                         fs_listeners_lock, by a put)
 *       fs_inh_lock (inherit.c)           the exec record file's creation
 *       fs_bell_lock (bell.c)             the doorbell socket's opening
 *       fs_sock_bg_lock (sock_close.c)    background closes
 *       fs_sock_free_lock (sock.c)        recycled socket records
 *       fs_hb_fork_lock (handback.c)      the children forked since
 *       fs_diag_lock (diag.c)             the sock_diag socket
 *       fs_probe_table.lock (listener.c)  a listener's probe records
 *       the flock of a shared table file  creating, joining, leaving it
 *     fs_sigs_lock (sigs.c: the provider's and the exit's signal handlers)
 *     is taken under the engine lock, or with nothing held (sigaction()),
 *     with every signal blocked in the thread while held: an application
 *     handler calling sigaction() cannot interrupt its holder.
 *  6. Leaves under fs_epoll.lock: fs_epoll.rlock (the ready list; also
 *     under the engine lock, from fs_stream_changed), fs_ep_slot_lock
 *     (member slots). fs_ept_lock (the instance table) is taken with
 *     nothing held and holds nothing.
 *
 * The service thread's callbacks run with fs_service_busy held and
 * fs_service_lock released (fs_service_run_watches drops it first): the
 * watches try fs_sock.lock (fs_sock_watch_lock: never a wait, since an
 * application thread may hold it through a whole handshake; busy, they
 * look again 10 ms later) and may queue themselves again, before they let
 * the socket go (a close() moves s->fd under its lock); the probe twins'
 * READY takes fs_probe_table.lock. The thread takes the engine lock only
 * with a trylock (its look, its progress round, the doorbell and the
 * hand-back requests: those wait for the next look that gets it), never
 * queueing behind the application's threads: the probes it answers would
 * wait with it (service.c). Its watches' handshake steps still take it.
 *
 * fs_probe_table.lock is process-shared and robust: other processes (a
 * shared table, a program exec'd with a connection) hold it too. It is
 * waited for at most FS_PROBE_TABLE_LOCK_MS (then tried only, for a while),
 * and a dead holder's is taken over (EOWNERDEAD). libfabric's spin lock and
 * the table file's flock are other processes' too.
 *
 * Exit (fs_core_exit: atexit, _exit, a fatal signal through the service
 * thread) may run in a thread that a signal stopped inside fabsock, holding
 * anything. It takes fs_sock.lock, the engine lock, fs_sock_bg_lock and
 * fs_listeners_lock with a deadline (fs_mutex_lock_until: -EDEADLK for the
 * caller's own, FABSOCK_LINGER_SEC in all) and leaves what it cannot get.
 *
 * Fork: the prepare handler takes fs_service_busy with a bounded wait (the
 * forking thread may hold, in a signal handler, a lock the service thread
 * waits for). The child re-initialises fs_service_busy, fs_service_lock,
 * fs_listeners_lock, fs_records_lock, fs_diag_lock, fs_bell_lock, fs_inh_lock, fs_sigs_lock,
 * fs_hb_fork_lock, fs_sock_free_lock, fs_sock_bg_lock, and
 * fs_engine_create_lock if the parent had an engine (whose lock the child
 * never takes: it makes its own). fs_sock.lock, the fs_epoll locks,
 * fs_ep_slot_lock, fs_ept_lock and fs_negcache_lock are not re-initialised
 * (there are thousands, and one may be held through a whole handshake, so
 * the prepare handler cannot take them all): they are taken with fs_lock
 * (util.h), which in a forked child takes over a lock whose holder is no
 * thread of this process (a thread of the parent, which the child does not
 * have), within 10 ms; fs_trylock and fs_mutex_lock_until do the same.
 * Test: e2e_semantics fork_mid_connect.
 */
#ifndef FS_CORE_LOCKS_H
#define FS_CORE_LOCKS_H
#endif
