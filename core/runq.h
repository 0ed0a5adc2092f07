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

/* True while a spin lost a slice lately (fs_runq_slice_lost), or when the
 * last sample saw more runnable threads than CPUs; samples again if the
 * last one is older than FS_RUNQ_SAMPLE_MS at NOW (ns). The sample is
 * taken only with FABSOCK_SPIN_FREE_CORE=1 (false where /proc/loadavg
 * cannot be read). False with FABSOCK_SPIN_US=0. */
bool fs_runq_crowded(uint64_t now);

/* A yield of a spinning waiter gave the core away for LOST_NS, a whole
 * time slice of other work (FS_YIELD_SLICE_NS, wait.h), ending at NOW.
 * When such losses add up to half the time of a window of
 * FS_RUNQ_LOST_WINDOW_MS (and FS_RUNQ_LOST_MIN_MS at least), the process
 * is crowded for a spell, whatever FABSOCK_SPIN_FREE_CORE says: its waits
 * sleep at once. A sleeping waiter is woken when its answer comes and
 * preempts such work; a yielding one waits for the slice to end (64 B
 * ping-pong beside two busy loops at nice 19: 70 % of the run). The spell
 * is FABSOCK_SPIN_LOST_MS, and twice the last one (up to
 * FS_RUNQ_TAKEN_MAX_MS) when it starts within one spell's length after
 * the last ended: busy work beside (a build) makes the spells long. A
 * program's own threads that share the cores lose slices too (nginx's
 * workers and wrk's threads, wrk -c 4 on 2 cores: 1-4 ms, a hundred a
 * second per process, 10-20 % of the time), and their waits must keep
 * spinning: sleeping ones made nginx 0.55-0.65x as fast. */
#define FS_RUNQ_LOST_WINDOW_MS 100
#define FS_RUNQ_LOST_MIN_MS 10
#define FS_RUNQ_TAKEN_MAX_MS 1000
void fs_runq_slice_lost(uint64_t now, uint64_t lost_ns);
/* Whether a spell is on at NOW or ended less than FS_RUNQ_SPELL_LATELY_MS
 * ago: a step-back then is the host's doing, and the connection history
 * does not keep it (history.c). */
#define FS_RUNQ_SPELL_LATELY_MS 1000
bool fs_runq_spell_lately(uint64_t now);

/* Whether the host has more runnable tasks than the CPUs we may run on
 * (/proc/loadavg's "R/T", the caller counted among them) at NOW (ns): one
 * pread, its answer kept for FS_RUNQ_SAMPLE_MS (a program making
 * thousands of connections a second reads it 50 times). For a decision
 * made per connection where a verdict of a crowded host is at stake
 * (history.c, FABSOCK_HISTORY_BUSY_SEC); false where /proc/loadavg cannot
 * be read. */
bool fs_runq_host_busy_now(uint64_t now);

/* Parses the runnable count out of a /proc/loadavg line ("0.50 0.40 0.30
 * 3/512 1234"): the count, or -1. For the unit test. */
long fs_runq_parse(const char *buf, size_t len);

#endif
