/* SPDX-License-Identifier: MIT */
/*
 * The step-back measure alone (core/stepback.h): no fabric, no engine. The
 * test plays a thread's waits (fs_wait_thread, as fs_wait_done leaves it)
 * and a stream's sends and receives, and checks when the rule fires.
 *
 * Checked: the judgement (average bytes per turn above STEPBACK_BYTES never
 * steps back; fewer than half the turns judged never; SLEPT_PCT of the
 * judged ones does, one fewer does not); a turn is a receive after a send,
 * the rest of an answer is not another; an answer read with no wait since
 * the request is quick; a stream a second thread reads on is never judged
 * (the first thread owns the counts); the first
 * window (the warm-up) is never judged, and two windows in a row must say
 * "step back" (a quick window between clears the first); a close is
 * losing after a window that said so, or when most judged windows did;
 * FABSOCK_STEPBACK=0
 * never fires; after it fired, nothing more is counted (done); the
 * stream's totals (the history's turns and bytes) count every thread's
 * calls; bytes held before the HELLO-ACK start a request but claim no
 * owner, and their answer is no turn of the window.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "config/params.h"
#include "core/stepback.h"
#include "check.h"

/* One turn on SB: a send of N bytes, a wait ending SLEPT or not (none if
 * !WAITED), a receive of N bytes. Returns what the receive said. */
static bool turn(struct fs_stepback *sb, uint64_t n, bool waited, bool slept)
{
	fs_stepback_sent(sb, n);
	if (waited) {
		fs_wait_thread.waits++;
		fs_wait_thread.last_slept = slept;
	}
	return fs_stepback_received(sb, n);
}

/* WINDOWS windows of turns on SB, each turn slept SLEPT_OF out of 4;
 * returns the turn (1-based) that fired, 0 if none. */
static unsigned windows(struct fs_stepback *sb, unsigned count, unsigned slept_of_4, uint64_t n)
{
	unsigned t = 0;

	for (unsigned w = 0; w < count; w++)
		for (unsigned i = 0; i < fs_params.stepback_turns; i++) {
			t++;
			if (turn(sb, n, true, (i % 4) < slept_of_4))
				return t;
		}
	return 0;
}

/* The judgement of a window as the measure makes it: its kind, then its
 * sleeps. */
static bool judge(uint32_t turns, uint32_t measured, uint32_t slept, uint64_t bytes)
{
	return fs_stepback_judge(fs_stepback_small(turns, measured, bytes), measured, slept);
}

static void *other_thread_receives(void *arg)
{
	struct fs_stepback *sb = arg;

	fs_wait_thread.waits++;
	fs_wait_thread.last_slept = true;
	fs_stepback_received(sb, 10);
	return NULL;
}

int main(void)
{
	struct fs_stepback sb;
	pthread_t t;

	fs_params.stepback = true;
	fs_params.stepback_turns = 128;
	fs_params.stepback_slept_pct = 75;
	fs_params.stepback_bytes = 16384;
	fs_params.stepback_ms = 0; /* two windows are enough: the time floor is tested last */

	/* the judgement */
	CHECK(judge(128, 128, 96, 128 * 100));
	CHECK(!judge(128, 128, 95, 128 * 100));
	CHECK(judge(128, 128, 128, 128ull * 16384));
	CHECK(!judge(128, 128, 128, 128ull * 16384 + 128));
	CHECK(!judge(128, 63, 63, 128 * 100));
	CHECK(judge(128, 64, 48, 128 * 100));
	CHECK(!judge(0, 0, 0, 0));
	/* the time rule's margins: 5 % faster, 10 % slower */
	CHECK(fs_stepback_compare(94, 100) == -1 && fs_stepback_compare(96, 100) == 0);
	CHECK(fs_stepback_compare(109, 100) == 0 && fs_stepback_compare(111, 100) == 1);

	/* all slept: warm-up, a strike, then the third window fires at its end */
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 5, 4, 64) == 3 * 128);
	CHECK(sb.done == false); /* fs_stepback_fire sets it */
	sb.done = true;
	CHECK(windows(&sb, 3, 4, 64) == 0);
	CHECK(sb.turns == 0);

	/* 3 of 4 slept (75 %): fires; 2 of 4 never */
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 5, 3, 64) == 3 * 128);
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 10, 2, 64) == 0);

	/* a quick window between two sleepy ones clears the strike; a close
	 * in a strike is a losing one (the history's step-back), not after
	 * the quick window, nor once the stream went back (done) */
	memset(&sb, 0, sizeof(sb));
	CHECK(!fs_stepback_losing(&sb));
	CHECK(windows(&sb, 1, 4, 64) == 0); /* warm-up: not judged */
	CHECK(!fs_stepback_losing(&sb));
	CHECK(windows(&sb, 1, 4, 64) == 0); /* strike */
	CHECK(fs_stepback_losing(&sb));
	CHECK(windows(&sb, 1, 0, 64) == 0); /* quick: strike gone */
	CHECK(!fs_stepback_losing(&sb));
	CHECK(windows(&sb, 1, 4, 64) == 0); /* strike again */
	CHECK(fs_stepback_losing(&sb));
	CHECK(windows(&sb, 1, 4, 64) == 128);
	sb.done = true; /* (fs_stepback_fire) */
	CHECK(!fs_stepback_losing(&sb));
	/* a close after a quick window still loses when most of the judged
	 * windows said so: with a streak that must last long (STEPBACK_MS),
	 * strike, strike (no step-back yet), quick: two of three; strike,
	 * quick, strike, quick: half, not most */
	fs_params.stepback_ms = 1000000;
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 1, 4, 64) == 0); /* warm-up */
	CHECK(windows(&sb, 2, 4, 64) == 0); /* a streak, not long enough */
	CHECK(windows(&sb, 1, 0, 64) == 0); /* quick */
	CHECK(sb.judged == 3 && sb.judged_over == 2);
	CHECK(!sb.strike && fs_stepback_losing(&sb));
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 1, 4, 64) == 0); /* warm-up */
	for (int i = 0; i < 2; i++) {
		CHECK(windows(&sb, 1, 4, 64) == 0); /* strike */
		CHECK(windows(&sb, 1, 0, 64) == 0); /* quick */
	}
	CHECK(sb.judged == 4 && sb.judged_over == 2);
	CHECK(!fs_stepback_losing(&sb));
	fs_params.stepback_ms = 0;
	CHECK(!fs_stepback_losing(&sb));
	fs_params.stepback = false;
	sb.done = false;
	CHECK(!fs_stepback_losing(&sb)); /* the step-back off: never */
	fs_params.stepback = true;

	/* bulk turns never fire, however they sleep */
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 10, 4, 65536) == 0);

	/* off */
	fs_params.stepback = false;
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 10, 4, 64) == 0);
	fs_params.stepback = true;

	/* answers there without a wait since the request are quick */
	memset(&sb, 0, sizeof(sb));
	for (unsigned i = 0; i < 10 * 128; i++)
		CHECK(!turn(&sb, 64, false, false));

	/* a wait before the request does not count for its answer */
	memset(&sb, 0, sizeof(sb));
	fs_wait_thread.waits++;
	fs_wait_thread.last_slept = true;
	fs_stepback_sent(&sb, 64);
	fs_stepback_received(&sb, 64);
	CHECK(sb.turns == 1 && sb.measured == 1 && sb.slept == 0);

	/* the rest of an answer is not another turn; a send after it is */
	fs_stepback_received(&sb, 64);
	CHECK(sb.turns == 1);
	CHECK(sb.bytes == 3 * 64);
	turn(&sb, 64, true, true);
	CHECK(sb.turns == 2 && sb.slept == 1);

	/* a stream a second thread reads on is never judged again: the first
	 * thread owns the counts, the second gives the measure up */
	memset(&sb, 0, sizeof(sb));
	fs_stepback_sent(&sb, 10);
	CHECK(pthread_create(&t, NULL, other_thread_receives, &sb) == 0);
	pthread_join(t, NULL);
	CHECK(sb.turns == 0 && sb.measured == 0 && sb.slept == 0 && sb.done);
	for (unsigned i = 0; i < 10 * 128; i++)
		CHECK(!turn(&sb, 64, true, true));
	CHECK(sb.turns == 0);
	{
		/* ...but its totals, the history's, still count every thread's
		 * calls: one request and 20 bytes, then the 1280 turns */
		uint64_t turns, bytes;

		fs_stepback_totals(&sb, &turns, &bytes);
		CHECK(turns == 1 + 10 * 128 && bytes == 20 + 10 * 128 * 128);
	}

	/* bytes held before the HELLO-ACK start the first request and claim
	 * no owner: the thread that reads the answer owns the measure */
	memset(&sb, 0, sizeof(sb));
	fs_stepback_sent_held(&sb, 100);
	CHECK(sb.owner == 0 && sb.requests == 1 && sb.bytes == 100);
	/* ...and its answer is no turn of the window (the first window of a
	 * client ends at the same turn as its server's) */
	fs_stepback_received(&sb, 50);
	CHECK(sb.turns == 0 && sb.owner == (uintptr_t)pthread_self() && sb.bytes == 150);
	turn(&sb, 10, true, true);
	CHECK(sb.turns == 1 && sb.requests == 2);
	/* the history's turns are the requests: a send after a receive, and
	 * the first; the rest of a request is none */
	fs_stepback_sent(&sb, 10);
	fs_stepback_sent(&sb, 10);
	CHECK(sb.requests == 3);
	CHECK(fs_stepback_whole_window(128) && !fs_stepback_whole_window(127));

	/* FABSOCK_STEPBACK_MS: sleepy windows in a row must span it. Fast
	 * windows (no time between them) never fire however many; once the
	 * streak is old enough, the next sleepy window does. */
	fs_params.stepback_ms = 50;
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 8, 4, 64) == 0); /* warm-up, then 7 sleepy in a few ms */
	{
		struct timespec ts = { 0, 60 * 1000000L };
		nanosleep(&ts, NULL);
	}
	CHECK(windows(&sb, 1, 4, 64) == 128); /* the streak began > 50 ms ago */
	/* a quick window ends the streak: the time counts from the next one */
	memset(&sb, 0, sizeof(sb));
	CHECK(windows(&sb, 3, 4, 64) == 0);
	{
		struct timespec ts = { 0, 60 * 1000000L };
		nanosleep(&ts, NULL);
	}
	CHECK(windows(&sb, 1, 0, 64) == 0); /* quick */
	CHECK(windows(&sb, 4, 4, 64) == 0); /* a new streak, only ms old */
	fs_params.stepback_ms = 0;
	return fs_check_done();
}
