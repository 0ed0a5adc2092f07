/* SPDX-License-Identifier: MIT */
/*
 * The waiting policy alone (core/wait.c): no fabric, no engine, no clock.
 * The test hands it times and checks its decisions.
 *
 * Checked: timeouts become absolute deadlines (negative: none, 0: one look
 * at once); a wait spins until SPIN_US, or FS_SLEEPY_SPIN_US with a short
 * spin (never longer than SPIN_US), while lateness is judged by SPIN_US
 * alone; then it sleeps slices of 10, 20, 40 ... us up to SLEEP_MAX_US,
 * and up to IDLE_SLEEP_US once idle for IDLE_AFTER_MS, counted from the
 * engine's last activity when that is later; a slice never runs past the
 * deadline, and a deadline that has passed (before the spin ended, at the
 * start, or long ago) stops the wait; 0 is no deadline even at time 0;
 * milliseconds until a deadline round up and saturate; what the step-back
 * counts as a sleep (late, or quick after its spin ceded the core); the
 * spells of slices lost to work beside (runq.c).
 */
#include <limits.h>
#include <stdio.h>

#include "config/params.h"
#include "core/wait.h"
#include "check.h"

#define US 1000ull
#define MS 1000000ull
#define T0 (100000 * MS) /* any start: the policy has no epoch */

static void set_params(void)
{
	fs_params.spin_us = 100;
	fs_params.sleep_max_us = 1000;
	fs_params.idle_after_ms = 1000;
	fs_params.idle_sleep_us = 4000;
	fs_params.spin_free_core = 0; /* the host's load must not decide the spins checked here */
}

/* The runnable count of a /proc/loadavg line (core/runq.c). */
static void test_runq_parse(void)
{
	static const char ok[] = "0.50 0.40 0.30 3/512 1234\n";
	static const char big[] = "12.00 8.10 4.00 17/900 99\n";

	CHECK(fs_runq_parse(ok, sizeof(ok) - 1) == 3);
	CHECK(fs_runq_parse(big, sizeof(big) - 1) == 17);
	CHECK(fs_runq_parse("0.50 0.40 0.30", 14) == -1);
	CHECK(fs_runq_parse("0.50 0.40 0.30 x/5 1", 20) == -1);
	CHECK(fs_runq_parse("0.50 0.40 0.30 3", 16) == -1); /* cut before the slash */
	CHECK(fs_runq_parse("", 0) == -1);
}

static void test_deadlines(void)
{
	CHECK(fs_wait_deadline_ms(T0, -1) == 0);
	CHECK(fs_wait_deadline_ms(T0, -5) == 0);
	CHECK(fs_wait_deadline_ms(T0, 0) == T0);
	CHECK(fs_wait_deadline_ms(T0, 250) == T0 + 250 * MS);
	CHECK(fs_wait_deadline_ms(T0, INT_MAX) == T0 + (uint64_t)INT_MAX * MS);
	CHECK(fs_wait_deadline_ns(T0, -1) == 0);
	CHECK(fs_wait_deadline_ns(T0, 0) == T0);
	CHECK(fs_wait_deadline_ns(T0, 1234) == T0 + 1234);
	/* a zero timeout at time 0 still is a deadline, not "none" */
	CHECK(fs_wait_deadline_ms(0, 0) != 0);
	CHECK(fs_wait_deadline_ns(0, 0) != 0);

	CHECK(fs_wait_ms_until(T0, 0) == -1);
	CHECK(fs_wait_ms_until(T0, T0) == 0);
	CHECK(fs_wait_ms_until(T0, T0 - 1) == 0);
	CHECK(fs_wait_ms_until(T0, T0 + 1) == 1);
	CHECK(fs_wait_ms_until(T0, T0 + MS) == 1);
	CHECK(fs_wait_ms_until(T0, T0 + MS + 1) == 2);
	CHECK(fs_wait_ms_until(T0, T0 + ((uint64_t)INT_MAX + 10) * MS) == INT_MAX);
}

static void test_spin(void)
{
	struct fs_wait w;

	set_params();
	fs_wait_init(&w, T0, 0, false);
	CHECK(fs_wait_next(&w, T0) == FS_WAIT_SPIN);
	CHECK(fs_wait_next(&w, T0 + 99 * US) == FS_WAIT_SPIN);
	CHECK(fs_wait_next(&w, T0 + 100 * US) == FS_WAIT_SLEEP);
	CHECK(!fs_wait_late(&w, T0 + 99 * US) && fs_wait_late(&w, T0 + 100 * US));
	/* a sleepy engine spins 10 us, but its waits are judged by SPIN_US */
	fs_wait_init(&w, T0, 0, true);
	CHECK(fs_wait_next(&w, T0 + 9 * US) == FS_WAIT_SPIN);
	CHECK(fs_wait_next(&w, T0 + 10 * US) == FS_WAIT_SLEEP);
	CHECK(!fs_wait_late(&w, T0 + 50 * US) && fs_wait_late(&w, T0 + 100 * US));
	/* the short spin never lengthens a shorter SPIN_US */
	fs_params.spin_us = 5;
	fs_wait_init(&w, T0, 0, true);
	CHECK(fs_wait_next(&w, T0 + 4 * US) == FS_WAIT_SPIN && fs_wait_next(&w, T0 + 5 * US) == FS_WAIT_SLEEP);
	/* SPIN_US=0: sleeps from the first round */
	fs_params.spin_us = 0;
	fs_wait_init(&w, T0, 0, false);
	CHECK(fs_wait_next(&w, T0) == FS_WAIT_SLEEP && fs_wait_late(&w, T0));
	set_params();
}

static void test_slices(void)
{
	static const uint64_t want[] = { 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000 };
	struct fs_wait w;
	uint64_t now = T0 + 100 * US;

	set_params();
	fs_wait_init(&w, T0, 0, false);
	for (unsigned i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		CHECK(fs_wait_next(&w, now) == FS_WAIT_SLEEP);
		CHECK(fs_wait_slice_ns(&w, now) == want[i] * US);
		now += want[i] * US;
	}
	/* idle for IDLE_AFTER_MS: the cap becomes IDLE_SLEEP_US */
	now = T0 + 1000 * MS;
	CHECK(fs_wait_slice_ns(&w, now) == 1000 * US);
	CHECK(fs_wait_slice_ns(&w, now) == 2000 * US);
	CHECK(fs_wait_slice_ns(&w, now) == 4000 * US);
	CHECK(fs_wait_slice_ns(&w, now) == 4000 * US);
	/* activity: the cap counts from it, back to SLEEP_MAX_US */
	fs_wait_note_activity(&w, now - MS);
	CHECK(fs_wait_slice_ns(&w, now) == 4000 * US);
	CHECK(fs_wait_slice_ns(&w, now) == 1000 * US);
	/* activity older than the wait's start changes nothing */
	fs_wait_init(&w, T0, 0, false);
	fs_wait_note_activity(&w, T0 - 10000 * MS);
	CHECK(w.idle_since == T0);
	/* IDLE_AFTER_MS=0: never idle; IDLE_SLEEP_US below SLEEP_MAX_US: ignored */
	CHECK(fs_wait_slice_cap_us(5000 * MS) == 4000);
	fs_params.idle_after_ms = 0;
	CHECK(fs_wait_slice_cap_us(5000 * MS) == 1000);
	fs_params.idle_after_ms = 1000;
	fs_params.idle_sleep_us = 500;
	CHECK(fs_wait_slice_cap_us(5000 * MS) == 1000);
	set_params();
	/* an activity stamp later than the clock the caller read: no wrap */
	fs_wait_init(&w, T0, 0, false);
	w.slice_us = 1000;
	fs_wait_note_activity(&w, T0 + 2000 * MS);
	CHECK(fs_wait_slice_ns(&w, T0 + 1500 * MS) == 1000 * US && w.slice_us == 1000);
}

static void test_deadline_rounds(void)
{
	struct fs_wait w;

	set_params();
	/* no deadline: never over, however late */
	fs_wait_init(&w, T0, 0, false);
	CHECK(fs_wait_next(&w, T0 + 3600000 * MS) == FS_WAIT_SLEEP);
	CHECK(fs_wait_clamp_ns(&w, T0, 50 * MS) == 50 * MS);
	/* a zero timeout: over at the first round (one look, no spin) */
	fs_wait_init(&w, T0, fs_wait_deadline_ms(T0, 0), false);
	CHECK(fs_wait_next(&w, T0) == FS_WAIT_OVER);
	/* a deadline inside the spin ends the spin */
	fs_wait_init(&w, T0, T0 + 50 * US, false);
	CHECK(fs_wait_next(&w, T0 + 49 * US) == FS_WAIT_SPIN);
	CHECK(fs_wait_next(&w, T0 + 50 * US) == FS_WAIT_OVER);
	/* a deadline already passed when the wait starts */
	fs_wait_init(&w, T0, T0 - MS, false);
	CHECK(fs_wait_next(&w, T0) == FS_WAIT_OVER);
	CHECK(fs_wait_clamp_ns(&w, T0, 10 * US) == 0);
	/* slices end at the deadline */
	fs_wait_init(&w, T0, T0 + 100 * US + 25 * US, false);
	CHECK(fs_wait_slice_ns(&w, T0 + 100 * US) == 10 * US);
	CHECK(fs_wait_slice_ns(&w, T0 + 110 * US) == 15 * US);
	CHECK(w.slice_us == 40); /* the clamp does not stop the doubling */
	CHECK(fs_wait_next(&w, T0 + 125 * US) == FS_WAIT_OVER);
	CHECK(fs_wait_clamp_ns(&w, T0 + 120 * US, 250 * MS) == 5 * US);
	CHECK(fs_wait_ms_until(T0 + 120 * US, w.deadline) == 1);
}

/* The step-back's "slept" (fs_wait_slept): late, or quick after the spin's
 * yields ceded the core for FS_CEDED_SLEPT_NS in all; never with many
 * events. */
static void test_slept(void)
{
	struct fs_wait w;

	set_params();
	fs_wait_init(&w, T0, 0, true);
	CHECK(w.ceded_ns == 0);
	CHECK(!fs_wait_slept(&w, T0 + 20 * US, 1));  /* quick, on its own core */
	CHECK(fs_wait_slept(&w, T0 + 100 * US, 1));  /* late: after SPIN_US */
	CHECK(fs_wait_slept(&w, T0 + 100 * US, FS_SLEEPY_EVENTS));
	CHECK(!fs_wait_slept(&w, T0 + 100 * US, FS_SLEEPY_EVENTS + 1));
	w.ceded_ns = FS_CEDED_SLEPT_NS - 1;
	CHECK(!fs_wait_slept(&w, T0 + 50 * US, 1));  /* a short turn of another thread */
	w.ceded_ns = FS_CEDED_SLEPT_NS;
	CHECK(fs_wait_slept(&w, T0 + 50 * US, 1));   /* quick, but the core went elsewhere */
	CHECK(!fs_wait_slept(&w, T0 + 50 * US, FS_SLEEPY_EVENTS + 1));
	fs_wait_init(&w, T0, 0, true);
	CHECK(w.ceded_ns == 0);                       /* a new wait starts at none */
}

/* Spells of slices lost to work beside (runq.c): a lost slice alone is no
 * spell, half of a window's time lost is (10 ms at least); the spell lasts
 * SPIN_LOST_MS, doubles when the next comes within its length after it
 * ended, starts over later; "lately" holds for FS_RUNQ_SPELL_LATELY_MS
 * after its end; SPIN_LOST_MS=0 never starts one. Runs last: the state is
 * the process's, and its spells would make the other tests' waits crowded. */
static void test_spells(void)
{
	uint64_t t = T0, end;

	set_params();
	fs_params.spin_lost_ms = 20;
	CHECK(!fs_runq_crowded(t) && !fs_runq_spell_lately(t));
	fs_runq_slice_lost(t, 2 * MS);            /* 2 of 2 ms: under 10 ms */
	CHECK(!fs_runq_crowded(t));
	t += 50 * MS;
	fs_runq_slice_lost(t, 3 * MS);            /* 5 ms in 52: under half */
	CHECK(!fs_runq_crowded(t));
	t += 200 * MS;                            /* a new window */
	for (int i = 0; i < 3; i++) {
		t += 4 * MS;
		fs_runq_slice_lost(t, 3 * MS);    /* 9 of 12 ms: under 10 ms */
	}
	CHECK(!fs_runq_crowded(t));
	t += 4 * MS;
	fs_runq_slice_lost(t, 3 * MS);            /* 12 of 16 ms */
	CHECK(fs_runq_crowded(t) && fs_runq_spell_lately(t));
	CHECK(fs_runq_crowded(t + 20 * MS - 1));
	CHECK(!fs_runq_crowded(t + 20 * MS));     /* a spell of SPIN_LOST_MS */
	CHECK(fs_runq_spell_lately(t + 20 * MS + FS_RUNQ_SPELL_LATELY_MS * MS - 1));
	CHECK(!fs_runq_spell_lately(t + 20 * MS + FS_RUNQ_SPELL_LATELY_MS * MS));
	/* the next one 5 ms after it ended: twice as long */
	end = t + 20 * MS;
	t = end + 5 * MS;
	fs_runq_slice_lost(t - 3 * MS, 4 * MS);
	fs_runq_slice_lost(t, 8 * MS);            /* 12 of 12 ms */
	CHECK(fs_runq_crowded(t + 40 * MS - 1) && !fs_runq_crowded(t + 40 * MS));
	/* one long after: SPIN_LOST_MS again */
	t += 10000 * MS;
	fs_runq_slice_lost(t, 12 * MS);
	CHECK(fs_runq_crowded(t + 20 * MS - 1) && !fs_runq_crowded(t + 20 * MS));
	/* off */
	fs_params.spin_lost_ms = 0;
	t += 10000 * MS;
	fs_runq_slice_lost(t, 50 * MS);
	CHECK(!fs_runq_crowded(t) && !fs_runq_spell_lately(t));
}

int main(void)
{
	test_slept();
	test_deadlines();
	test_runq_parse();
	test_spin();
	test_slices();
	test_deadline_rounds();
	test_spells();
	return fs_check_done();
}
