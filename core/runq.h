/* SPDX-License-Identifier: MIT */
/*
 * Whether the host has a core free for a spinning waiter.
 *
 * A waiter that spins while more threads are runnable than there are CPUs
 * takes the core the peer it waits for needs (pgbench -c 4 on 2 cores: the
 * backends and the client's threads queue behind each other's spins). The
 * kernel's waiters block; so do ours then. Two signs, both needed: the
 * host has more runnable tasks than the CPUs we may use (/proc/loadavg's
 * fourth field, "R/T"; spinners count themselves, which is the point: two
 * spinners and a peer on two cores are one too many), and this process
 * itself waited for a CPU more than 5 % of the time since the last sample
 * (/proc/self/schedstat's run delay, of the thread group leader): a third
 * thread passing through a quiet host must not stop a ping-pong's spin.
 * Read through descriptors kept open, by one thread at a time, at most
 * every FS_RUNQ_SAMPLE_MS: two preads of seq files, a few microseconds
 * every 20 ms at worst. Everything else reads a cached bool.
 */
#ifndef FS_CORE_RUNQ_H
#define FS_CORE_RUNQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FS_RUNQ_SAMPLE_MS 20

/* True when the last sample saw more runnable threads than CPUs; samples
 * again if the last one is older than FS_RUNQ_SAMPLE_MS at NOW (ns). False
 * with FABSOCK_SPIN_FREE_CORE=0 or where /proc/loadavg cannot be read. */
bool fs_runq_crowded(uint64_t now);

/* Parses the runnable count out of a /proc/loadavg line ("0.50 0.40 0.30
 * 3/512 1234"): the count, or -1. For the unit test. */
long fs_runq_parse(const char *buf, size_t len);

#endif
