/* SPDX-License-Identifier: MIT */
/*
 * The connection history's notes (core/history.h) as a server that speaks
 * first reads them: no fabric, no network (two unconnected sockets give
 * inodes). The file lives in a private FABSOCK_RECORDS_DIR; the test writes
 * notes through the API and, for hostile or stale content, straight into
 * the mapped file (the layout of history-v2).
 *
 * Checked: an intent noted before connect() reads INTENT, a socket with no
 * note NONE, inode 0 UNKNOWN; a withdrawn intent reads NONE and a withdrawal
 * leaves a newer note in the slot alone; of two notes of one inode the
 * newest counts (TCP after an intent, and the other way); an intent older
 * than 10 s reads NONE while a TCP note of that age still counts (30 s); a
 * note stamped in the future is ignored; after 128 more notes the first is
 * gone (the ring's documented limit); a note whose inode has bits above 32
 * besides the mark never matches. The relearn: never for a short decision;
 * for a step-back's, while relearned connections step back again each next
 * relearn comes twice as late, and a long one over a whole window starts
 * over. A streak saturates at 256 short reports, and a long one still ends
 * it. The time per turn: a TCP connection's, from the kernel's counts at
 * its close, overrules a step-back window only when the fabric's window was
 * faster by 5 %, and makes a window the sleeps kept say "step back" when
 * 10 % slower; at connect() the two averages decide over the step-backs;
 * with the fabric's time alone known, nothing goes to TCP to measure it.
 * A step-back during a spell of lost slices is not counted but dated: while
 * the date is fresh the next connection goes to TCP on a crowded host (busy
 * threads of the test's own), past FABSOCK_HISTORY_BUSY_SEC it negotiates.
 */
#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/params.h"
#include "core/history.h"
#include "core/runq.h"
#include "core/stepback.h"
#include "core/util.h"
#include "preload/real.h"
#include "check.h"

#define NOTES 128u
#define ENTRY 64u
#define FILE_SIZE (16u + 16u * NOTES + ENTRY * 512u)
#define INTENT (1ull << 63)

static uint64_t boot_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t inode_of(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 ? (uint32_t)st.st_ino : 0;
}

static bool hog_stop;

/* A runnable thread until hog_stop (bounded: 5 s at most). */
static void *hog(void *arg)
{
	uint64_t end = fs_now_ns() + 5000000000ull;

	(void)arg;
	while (!__atomic_load_n(&hog_stop, __ATOMIC_RELAXED) && fs_now_ns() < end)
		;
	return NULL;
}

/* Writes note I of the mapped file M. */
static void put_note(uint8_t *m, unsigned i, uint64_t value, uint64_t t)
{
	uint64_t *note = (uint64_t *)(m + 16 + 16 * (i % NOTES));

	note[1] = t;
	note[0] = value;
}

int main(void)
{
	char dir[] = "/tmp/fs-test-history.XXXXXX", path[256];
	struct fs_history_conn h, h2;
	int a, b, c, fd;
	uint32_t ia, ib, ic;
	uint8_t *m;

	if (!mkdtemp(dir))
		return 77;
	setenv("FABSOCK_RECORDS_DIR", dir, 1);
	fs_real_init();
	CHECK(fs_params_load() == 0);
	fs_self_euid_refresh();
	a = socket(AF_INET, SOCK_STREAM, 0);
	b = socket(AF_INET, SOCK_STREAM, 0);
	c = socket(AF_INET, SOCK_STREAM, 0);
	ia = inode_of(a);
	ib = inode_of(b);
	ic = inode_of(c);
	CHECK(ia && ib && ic && ia != ib);

	/* the API's own notes */
	memset(&h, 0, sizeof(h));
	fs_history_note_intent(&h, a);
	CHECK(h.intent == (ia | INTENT));
	CHECK(fs_history_client_note(ia) == FS_HISTORY_NOTE_INTENT);
	CHECK(fs_history_client_note(ib) == FS_HISTORY_NOTE_NONE);
	CHECK(fs_history_client_note(0) == FS_HISTORY_NOTE_UNKNOWN);
	fs_history_withdraw_intent(&h);
	CHECK(h.intent == 0);
	CHECK(fs_history_client_note(ia) == FS_HISTORY_NOTE_NONE);
	fs_history_withdraw_intent(&h); /* twice: nothing */

	snprintf(path, sizeof(path), "%s/fabsock-u%u/history-v2", dir, (unsigned)geteuid());
	fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	if (fd < 0)
		return fs_check_done();
	m = mmap(NULL, FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	CHECK(m != MAP_FAILED);
	if (m == MAP_FAILED)
		return fs_check_done();

	/* a withdrawal leaves a newer note in its slot alone */
	memset(&h2, 0, sizeof(h2));
	fs_history_note_intent(&h2, b);
	CHECK(fs_history_client_note(ib) == FS_HISTORY_NOTE_INTENT);
	put_note(m, h2.intent_slot, ic | INTENT, boot_ns()); /* the slot went round to c */
	fs_history_withdraw_intent(&h2);
	CHECK(fs_history_client_note(ic) == FS_HISTORY_NOTE_INTENT);
	CHECK(fs_history_client_note(ib) == FS_HISTORY_NOTE_NONE);

	/* the newest note of an inode counts */
	memset(m + 16, 0, 16 * NOTES);
	put_note(m, 10, ia | INTENT, boot_ns() - 1000000000ull);
	put_note(m, 11, ia, boot_ns());
	CHECK(fs_history_client_note(ia) == FS_HISTORY_NOTE_TCP);
	put_note(m, 12, ia | INTENT, boot_ns() + 1000);
	CHECK(fs_history_client_note(ia) == FS_HISTORY_NOTE_INTENT);

	/* stale and future notes */
	memset(m + 16, 0, 16 * NOTES);
	put_note(m, 20, ib | INTENT, boot_ns() - 11000000000ull);
	CHECK(fs_history_client_note(ib) == FS_HISTORY_NOTE_NONE);
	put_note(m, 21, ib, boot_ns() - 11000000000ull);
	CHECK(fs_history_client_note(ib) == FS_HISTORY_NOTE_TCP);
	put_note(m, 21, ib, boot_ns() - 31000000000ull);
	CHECK(fs_history_client_note(ib) == FS_HISTORY_NOTE_NONE);
	put_note(m, 22, ic | INTENT, boot_ns() + 5000000000ull);
	CHECK(fs_history_client_note(ic) == FS_HISTORY_NOTE_NONE);
	/* high bits besides the mark: not an inode of ours */
	put_note(m, 23, (uint64_t)ic | (1ull << 40) | INTENT, boot_ns());
	CHECK(fs_history_client_note(ic) == FS_HISTORY_NOTE_NONE);

	/* the ring: 128 later notes push the first out */
	memset(m + 16, 0, 16 * NOTES);
	memset(&h, 0, sizeof(h));
	fs_history_note_intent(&h, a);
	CHECK(fs_history_client_note(ia) == FS_HISTORY_NOTE_INTENT);
	for (unsigned i = 0; i < NOTES; i++) {
		memset(&h2, 0, sizeof(h2));
		fs_history_note_intent(&h2, b);
	}
	CHECK(fs_history_client_note(ia) == FS_HISTORY_NOTE_NONE);
	CHECK(fs_history_client_note(ib) == FS_HISTORY_NOTE_INTENT);

	/* a short decision is never relearnt on the fabric (its TCP
	 * connections report their own counts): of 1024 TCP decisions after
	 * two short connections, none offloads */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(4711) };
		unsigned offloads = 0;

		dst.sin_addr.s_addr = htonl(0x7f000001);
		for (int i = 0; i < 2; i++) {
			memset(&h, 0, sizeof(h));
			CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst));
			fs_history_offloaded_closed(&h, 1, 100, false, 0); /* short */
		}
		for (unsigned i = 1; i <= 1024; i++) {
			memset(&h, 0, sizeof(h));
			if (!fs_history_decide(&h, (struct sockaddr *)&dst))
				offloads++;
		}
		CHECK(offloads == 0);
	}
	/* a step-back's decisions are relearnt, backing off while the
	 * relearns step back again: of 1024 TCP decisions, the 64th, 128th,
	 * 256th, 512th and 1024th offload (not every 64th: 16); a long
	 * connection over a whole window starts over at every 64th */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(4712) };
		unsigned offloads = 0, first_after_long = 0;

		dst.sin_addr.s_addr = htonl(0x7f000001);
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst)); /* no entry: negotiates */
		fs_history_stepped_back(&h);
		for (unsigned i = 1; i <= 1024; i++) {
			memset(&h, 0, sizeof(h));
			if (!fs_history_decide(&h, (struct sockaddr *)&dst)) {
				offloads++;
				fs_history_stepped_back(&h); /* the relearn steps back again */
			}
		}
		CHECK(offloads == 5);
		/* relearns that stay on the fabric for a whole window, long:
		 * each halves the step-backs (six: the first stepped back, then
		 * five relearns), the back-off goes at once; the third clears
		 * them (6 -> 3 -> 1 -> 0) */
		for (unsigned relearns = 1; relearns <= 3; relearns++) {
			unsigned gap = 0;

			for (unsigned i = 1; i <= 2048; i++) {
				memset(&h, 0, sizeof(h));
				if (!fs_history_decide(&h, (struct sockaddr *)&dst))
					break;
				gap = i;
			}
			CHECK(h.relearn && h.tag != 0);
			if (relearns > 1)
				CHECK(gap < 64); /* the back-off went with the first long one */
			fs_history_offloaded_closed(&h, 1000, 100000000, false, 0);
		}
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst)); /* no longer stepped: negotiates */
		fs_history_stepped_back(&h);
		for (unsigned i = 1; i <= 200 && !first_after_long; i++) {
			memset(&h, 0, sizeof(h));
			if (!fs_history_decide(&h, (struct sockaddr *)&dst))
				first_after_long = i;
		}
		/* tcp_decided went on counting: the next multiple of 64 */
		CHECK(first_after_long > 0 && first_after_long <= 64);
	}
	/* several connections of one run (pgbench -c 4, memcslap's threads):
	 * the entry keeps the verdict of the most. Three step back, one
	 * (not a relearn) makes a whole window: the next ones start on TCP;
	 * two more whole windows than step-backs, and they negotiate again */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(4713) };
		struct fs_history_conn run[4];

		dst.sin_addr.s_addr = htonl(0x7f000001);
		for (int i = 0; i < 4; i++) {
			memset(&run[i], 0, sizeof(run[i]));
			CHECK(!fs_history_decide(&run[i], (struct sockaddr *)&dst)); /* no entry: negotiate */
		}
		for (int i = 0; i < 3; i++)
			fs_history_stepped_back(&run[i]);
		fs_history_offloaded_closed(&run[3], 1000, 100000000, false, 0); /* a whole window, long */
		memset(&h, 0, sizeof(h));
		CHECK(fs_history_decide(&h, (struct sockaddr *)&dst) && h.stepped); /* 3 - 1: TCP */
		for (int i = 0; i < 2; i++) {
			memset(&run[i], 0, sizeof(run[i]));
			run[i].tag = h.tag; /* (as a connection the step-back is off for, still offloaded) */
			fs_history_offloaded_closed(&run[i], 1000, 100000000, false, 0);
		}
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst)); /* 3 - 3: negotiates */
	}
	/* a connection that closes while its windows say the fabric loses
	 * (shorter than FABSOCK_STEPBACK_MS of them: wrk's through a proxy,
	 * 1,000 requests) counts as a step-back, not as one the fabric paid
	 * for: the next one starts on TCP; a whole window that did not lose
	 * takes it back */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(4714) };

		dst.sin_addr.s_addr = htonl(0x7f000001);
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst)); /* no entry: negotiates */
		fs_history_offloaded_closed(&h, 1000, 100000, true, 0);
		CHECK(h.tag == 0);
		memset(&h, 0, sizeof(h));
		CHECK(fs_history_decide(&h, (struct sockaddr *)&dst) && h.stepped); /* TCP */
		h.tag = 0;
		memset(&h, 0, sizeof(h));
		dst.sin_port = htons(4715);
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst));
		fs_history_offloaded_closed(&h, 1000, 100000, false, 0); /* paid: no step-back noted */
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst));
	}

	/* a saturated streak: short reports past 256 in a row write only the
	 * entry's second (the streak stays at 256: no cache line written per
	 * close of a connection per request), and one long report still ends
	 * it: the next connection negotiates */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(4716) };
		uint64_t tag = 0;
		uint32_t streak = 0;

		dst.sin_addr.s_addr = htonl(0x7f000001);
		for (int i = 0; i < 300; i++) {
			memset(&h, 0, sizeof(h));
			CHECK(fs_history_decide(&h, (struct sockaddr *)&dst) == (i >= 2));
			tag = h.tag;
			fs_history_offloaded_closed(&h, 1, 100, false, 0); /* short */
		}
		for (unsigned i = 0; i < 512 && tag; i++) {
			const uint8_t *e = m + 16 + 16 * NOTES + ENTRY * i;
			uint64_t t;

			memcpy(&t, e, sizeof(t));
			if (t == tag)
				memcpy(&streak, e + 8, sizeof(streak));
		}
		CHECK(tag != 0 && streak == 256);
		memset(&h, 0, sizeof(h));
		CHECK(fs_history_decide(&h, (struct sockaddr *)&dst));
		fs_history_offloaded_closed(&h, 1000, 100000000, false, 0); /* long */
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst));
	}

	/* the time per turn. A TCP connection the history chose, of 200
	 * request/answer turns on loopback, reports its time per turn at its
	 * close (the kernel's counts); a step-back window on the fabric as
	 * fast as it, or 4 % faster, is not overruled, 6 % faster is; one the
	 * sleeps keep steps back 11 % slower, not 5 %, never for bulk turns.
	 * At connect(), the averages decide over the step-backs: the
	 * fabric's 5 % faster negotiates, 10 % slower goes to TCP (measured) */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET };
		socklen_t len = sizeof(dst);
		struct fs_stepback sb;
		int l = socket(AF_INET, SOCK_STREAM, 0), cl, sv;
		uint32_t tcp;
		char byte = 'x';

		dst.sin_addr.s_addr = htonl(0x7f000001);
		CHECK(l >= 0 && bind(l, (struct sockaddr *)&dst, sizeof(dst)) == 0 && listen(l, 4) == 0 &&
		      getsockname(l, (struct sockaddr *)&dst, &len) == 0);
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst)); /* no entry: negotiates */
		CHECK(fs_history_tcp_ns_turn(&h) == 0);
		fs_history_offloaded_closed(&h, 1000, 100000, true, 0); /* lost: a step-back */
		memset(&h, 0, sizeof(h));
		CHECK(fs_history_decide(&h, (struct sockaddr *)&dst) && h.stepped && !h.measured);
		cl = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(cl >= 0 && connect(cl, (struct sockaddr *)&dst, sizeof(dst)) == 0);
		sv = accept(l, NULL, NULL);
		CHECK(sv >= 0);
		fs_history_track(&h, cl);
		for (int i = 0; i < 200; i++)
			CHECK(write(cl, &byte, 1) == 1 && read(sv, &byte, 1) == 1 && write(sv, &byte, 1) == 1 &&
			      read(cl, &byte, 1) == 1);
		usleep(2000); /* (past FABSOCK_HISTORY_QUICK_US: the kernel's counts are asked) */
		fs_history_fd_closing(cl);
		close(cl);
		close(sv);
		close(l);
		memset(&h, 0, sizeof(h));
		CHECK(fs_history_decide(&h, (struct sockaddr *)&dst) && h.stepped); /* still TCP */
		tcp = fs_history_tcp_ns_turn(&h);
		CHECK(tcp > 0 && tcp < 1000000000u);
		memset(&sb, 0, sizeof(sb));
		/* a server's stream (no history): the sleeps' verdict, either way */
		CHECK(fs_stepback_measure(&sb, true, 1, true));
		CHECK(!fs_stepback_measure(&sb, false, (uint64_t)tcp * 2, true));
		sb.hist = &h;
		CHECK(fs_stepback_measure(&sb, true, tcp, true)); /* as fast: the sleeps' verdict stands */
		CHECK(fs_stepback_measure(&sb, true, (uint64_t)tcp * 96 / 100, true));
		CHECK(!fs_stepback_measure(&sb, true, (uint64_t)tcp * 94 / 100, true)); /* faster: overruled */
		CHECK(fs_stepback_measure(&sb, false, (uint64_t)tcp * 111 / 100, true));
		CHECK(!fs_stepback_measure(&sb, false, (uint64_t)tcp * 105 / 100, true));
		CHECK(!fs_stepback_measure(&sb, false, (uint64_t)tcp * 2, false)); /* bulk */
		/* a relearn (as one) faster by half: the averages say the fabric
		 * (the step-back count stays, the decision does not follow it) */
		fs_history_offloaded_closed(&h, 1000, 100000, false, tcp / 2);
		CHECK(h.tag == 0);
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst));
		/* the fabric's connections now run twice TCP's time a turn: in
		 * two reports the average passes TCP's by 10 %, and the next
		 * connection goes to TCP, measured */
		for (int i = 0; i < 2; i++) {
			fs_history_offloaded_closed(&h, 1000, 100000, false, (uint64_t)tcp * 2);
			memset(&h, 0, sizeof(h));
			CHECK(i == 1 || !fs_history_decide(&h, (struct sockaddr *)&dst)); /* 0.875 of TCP's */
		}
		CHECK(fs_history_decide(&h, (struct sockaddr *)&dst) && h.stepped && h.measured);
		h.tag = 0;
	}
	/* the fabric's time known, TCP's not: nothing is sent to TCP to
	 * measure it */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(4717) };
		unsigned tcp_decided = 0;

		dst.sin_addr.s_addr = htonl(0x7f000001);
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst)); /* no entry */
		fs_history_offloaded_closed(&h, 1000, 100000, false, 50000);
		for (int i = 0; i < 64; i++) {
			memset(&h, 0, sizeof(h));
			tcp_decided += fs_history_decide(&h, (struct sockaddr *)&dst);
		}
		CHECK(tcp_decided == 0);
	}

	/* A step-back during a spell of lost slices (work beside took the
	 * spins' time slices, runq.h) is no verdict, but it is dated: within
	 * FABSOCK_HISTORY_BUSY_SEC the next connection goes to TCP while the
	 * host has more runnable tasks than CPUs (here: busy threads of our
	 * own, one more than the CPUs); past it, it negotiates whatever the
	 * host. (Last: the
	 * spell would make the step-backs above busy ones.) */
	{
		struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(4718) };
		uint8_t *entry = NULL;
		uint64_t want;
		pthread_t hogs[64];
		unsigned nhogs;
		cpu_set_t set;

		dst.sin_addr.s_addr = htonl(0x7f000001);
		memset(&h, 0, sizeof(h));
		CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst)); /* no entry */
		fs_runq_slice_lost(fs_now_ns(), 20000000ull); /* half a window and more: a spell */
		CHECK(fs_runq_spell_lately(fs_now_ns()));
		want = h.tag;
		CHECK(want != 0);
		fs_history_stepped_back(&h);
		for (unsigned i = 0; i < 512 && !entry; i++) {
			uint8_t *e = m + 16 + 16 * NOTES + ENTRY * i;
			uint64_t tag;

			memcpy(&tag, e, sizeof(tag));
			if (tag == want)
				entry = e;
		}
		CHECK(entry != NULL);
		if (entry) {
			uint32_t busy_s, stepped;

			memcpy(&busy_s, entry + 48, 4);
			memcpy(&stepped, entry + 24, 4);
			CHECK(busy_s != 0 && stepped == 0); /* dated, not counted */
			nhogs = sched_getaffinity(0, sizeof(set), &set) == 0 ? (unsigned)CPU_COUNT(&set) + 1 : 2;
			if (nhogs > 64)
				nhogs = 64;
			__atomic_store_n(&hog_stop, false, __ATOMIC_RELAXED);
			for (unsigned i = 0; i < nhogs; i++)
				CHECK(pthread_create(&hogs[i], NULL, hog, NULL) == 0);
			usleep(20000);
			memset(&h, 0, sizeof(h));
			CHECK(fs_history_decide(&h, (struct sockaddr *)&dst) && h.stepped && h.busy);
			__atomic_store_n(&hog_stop, true, __ATOMIC_RELAXED);
			for (unsigned i = 0; i < nhogs; i++)
				pthread_join(hogs[i], NULL);
			/* past FABSOCK_HISTORY_BUSY_SEC: negotiates, busy host or not */
			busy_s -= (uint32_t)fs_params.history_busy_sec + 1;
			memcpy(entry + 48, &busy_s, 4);
			memset(&h, 0, sizeof(h));
			CHECK(!fs_history_decide(&h, (struct sockaddr *)&dst) && !h.busy);
		}
	}

	munmap(m, FILE_SIZE);
	close(a);
	close(b);
	close(c);
	unlink(path);
	snprintf(path, sizeof(path), "%s/fabsock-u%u", dir, (unsigned)geteuid());
	rmdir(path);
	rmdir(dir);
	return fs_check_done();
}
