/* SPDX-License-Identifier: MIT */
/*
 * The credit arithmetic alone (core/credit.c): no fabric, no engine.
 *
 * Checked: the first grant is the floor; a request/response exchange never
 * makes a report due (the response carries it); a peer that used every
 * credit gets the grant doubled up to the window, unless the budget is
 * spent; the budget's use is the sum of the streams' charges and goes back
 * to 0 when they go; two idle looks take the grant back to the floor, and
 * the advertised limit never goes back; small unread messages do not run
 * the peer out of credit (the grant counts from the arrivals), large ones
 * do, and no more than FS_CREDIT_UNREAD_MAX are ever offered; the sender's
 * limit moves only forward, across the 2^32 wrap, and ignores numbers a
 * peer cannot mean. Then a randomized model of both ends (random writes,
 * reads, peeks, header order, budget, posts refused after their header was
 * filled, the service thread's looks) checks after every step that the
 * sender never passes the receiver's limit, nothing arrives beyond it, and
 * that once the sender is out of credit and everything has arrived, either
 * the reader holds a large unread backlog or a report is due: no stall.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/credit.h"
#include "check.h"

#define COST (128u * 1024)

static void test_request_response(void)
{
	struct fs_credit_budget b = { .cap = 1ull << 30 };
	struct fs_credit_rx c;
	uint32_t freed, limit;
	unsigned grant;
	bool denied;

	fs_credit_rx_init(&c, 2, 8, COST);
	CHECK(c.limit == 2 && c.grant == 2 && c.floor == 2 && c.max == 8 && c.charged == 0 && b.used == 0);
	limit = c.limit;
	for (uint32_t req = 1; req <= 1000; req++) {
		/* one request arrives, the reader consumes it, the response goes */
		CHECK(fs_credit_rx_allows(&c, req));
		CHECK(!fs_credit_rx_arrived(&c, &b, req, 0, &denied));
		CHECK(!fs_credit_rx_consume(&c, &b, 1, req, 0, &denied) && !denied);
		CHECK(!fs_credit_rx_due(&c, req));
		fs_credit_rx_advertise(&c, &b, &freed, &grant);
		CHECK(freed == req && grant == 2);
		CHECK(fs_credit_tx_update(&limit, freed, grant, req, 256));
		CHECK(limit == req + 2);
	}
	CHECK(c.grant == 2 && b.used == 0);
}

static void test_grow_and_budget(void)
{
	struct fs_credit_budget b = { .cap = 11ull * COST };
	struct fs_credit_rx c, d;
	uint32_t freed, rx = 0;
	unsigned grant;
	bool denied, grew;
	/* what is unread is large here: the small-unread rule stays out */
	const uint64_t BIG = FS_CREDIT_SMALL_BYTES;

	fs_credit_rx_init(&c, 2, 8, COST);
	fs_credit_rx_init(&d, 2, 8, COST);
	/* the peer sends all it may: as its last message arrives, the grant
	 * doubles, whether or not anything was read */
	fs_credit_rx_init(&d, 2, 8, COST);
	CHECK(!fs_credit_rx_arrived(&d, &b, 1, FS_CREDIT_SMALL_BYTES, &denied));
	CHECK(fs_credit_rx_arrived(&d, &b, 2, FS_CREDIT_SMALL_BYTES, &denied) && d.grant == 4);
	CHECK(fs_credit_rx_due(&d, 2) && d.charged == 2 && b.used == 2ull * COST);
	fs_credit_rx_release(&d, &b);
	fs_credit_rx_init(&d, 2, 8, COST);
	CHECK(b.used == 0);
	/* the peer sends all it may; the reader consumes one: the grant doubles */
	rx = 2;
	grew = fs_credit_rx_consume(&c, &b, 1, rx, BIG, &denied);
	CHECK(grew && !denied && c.grant == 4);
	CHECK(fs_credit_rx_due(&c, rx)); /* the peer is out of credit */
	fs_credit_rx_advertise(&c, &b, &freed, &grant);
	CHECK(freed == 1 && grant == 4 && c.limit == 5);
	CHECK(c.charged == 2 && b.used == 2ull * COST); /* 4 - the floor of 2 */
	/* used all again: 8, the window */
	rx = 5;
	CHECK(fs_credit_rx_consume(&c, &b, 4, rx, BIG, &denied) && c.grant == 8);
	fs_credit_rx_advertise(&c, &b, &freed, &grant);
	CHECK(freed == 5 && grant == 8 && c.limit == 13);
	CHECK(c.charged == 6 && b.used == 6ull * COST);
	/* at the window: no further growth */
	CHECK(!fs_credit_rx_consume(&c, &b, 0, 13, BIG, &denied) && !denied && c.grant == 8);
	/* D grows into what is left of the budget (5 of 11), then is refused */
	CHECK(fs_credit_rx_consume(&d, &b, 1, 2, BIG, &denied) && d.grant == 4);
	fs_credit_rx_advertise(&d, &b, &freed, &grant);
	CHECK(b.used == 8ull * COST);
	CHECK(!fs_credit_rx_consume(&d, &b, 4, 5, BIG, &denied) && denied && d.grant == 4);
	CHECK(b.used == (uint64_t)(c.charged + d.charged) * COST);
	/* a refused growth still leaves the stream live: the report is due */
	CHECK(fs_credit_rx_due(&d, 5));
	/* idle looks: the first marks, the second drops to the floor */
	CHECK(fs_credit_rx_idle(&c, &b, 13));
	CHECK(!fs_credit_rx_idle(&c, &b, 13) && c.grant == 2 && c.limit == 13);
	/* what was advertised stays charged until consumed */
	CHECK(c.charged == 6);
	/* all read (freed 13): the peer had used every credit, so it grows */
	CHECK(fs_credit_rx_consume(&c, &b, 8, 13, 0, &denied) && c.grant == 4);
	CHECK(c.charged == 2 && b.used == (uint64_t)(c.charged + d.charged) * COST);
	/* quiet again: back to the floor, nothing charged */
	fs_credit_rx_idle(&c, &b, 14);
	CHECK(!fs_credit_rx_idle(&c, &b, 14) && c.grant == 2);
	CHECK(c.charged == 0 && b.used == (uint64_t)d.charged * COST);
	fs_credit_rx_release(&d, &b);
	fs_credit_rx_release(&c, &b);
	CHECK(b.used == 0);
	/* a budget of 0: never above the floor, and still live */
	b.cap = 0;
	fs_credit_rx_init(&c, 2, 8, COST);
	CHECK(!fs_credit_rx_consume(&c, &b, 2, 2, 0, &denied) && denied && c.grant == 2);
	CHECK(fs_credit_rx_due(&c, 2));
	fs_credit_rx_advertise(&c, &b, &freed, &grant);
	CHECK(c.limit == 4 && b.used == 0);
}

static void test_small_unread(void)
{
	struct fs_credit_budget b = { .cap = 1ull << 40 };
	struct fs_credit_rx c;
	uint32_t freed, rx = 0;
	unsigned grant;
	bool denied;

	/* at its window (2): a reader that only peeks, every message 10 bytes */
	fs_credit_rx_init(&c, 2, 2, COST);
	for (int round = 0; round < 1000; round++) {
		rx = c.limit; /* the peer sent all it may */
		if (!fs_credit_rx_arrived(&c, &b, rx, 10ull * rx, &denied))
			break;
		CHECK(fs_credit_rx_due(&c, rx));
		fs_credit_rx_advertise(&c, &b, &freed, &grant);
		CHECK(freed == 0 && grant == c.limit && c.limit - rx == 2);
	}
	/* stopped by the unread cap, not the bytes: 10 x 254 < 64 KiB */
	CHECK(c.limit <= FS_CREDIT_UNREAD_MAX && c.limit >= FS_CREDIT_UNREAD_MAX - 2);
	CHECK(!fs_credit_rx_due(&c, c.limit));
	/* the reader reads them all: the offer counts from freed again */
	fs_credit_rx_consume(&c, &b, c.limit, c.limit, 0, &denied);
	CHECK(fs_credit_rx_due(&c, c.limit));
	fs_credit_rx_release(&c, &b);
	CHECK(b.used == 0);

	/* large unread messages, at the window: the peer waits for the reader */
	fs_credit_rx_init(&c, 2, 2, COST);
	CHECK(!fs_credit_rx_arrived(&c, &b, 2, FS_CREDIT_SMALL_BYTES, &denied) && !denied);
	CHECK(!fs_credit_rx_due(&c, 2));
	/* small, but the budget is spent: refused, counted */
	b.cap = 0;
	b.used = 0;
	CHECK(!fs_credit_rx_arrived(&c, &b, 2, 100, &denied) && denied);
}

static void test_sender(void)
{
	uint32_t limit = 2;

	CHECK(fs_credit_tx_avail(limit, 0) == 2 && fs_credit_tx_avail(limit, 2) == 0);
	CHECK(!fs_credit_tx_update(&limit, 3, 2, 2, 256)); /* freed beyond what we sent */
	CHECK(!fs_credit_tx_update(&limit, 1, 300, 2, 256)); /* a grant no peer can mean */
	CHECK(fs_credit_tx_update(&limit, 2, 8, 2, 256) && limit == 10);
	CHECK(!fs_credit_tx_update(&limit, 1, 2, 10, 256) && limit == 10); /* an older header */
	CHECK(fs_credit_tx_avail(limit, 4) == 6);
	/* across the wrap */
	limit = 0xfffffffeu;
	CHECK(fs_credit_tx_update(&limit, 0xfffffffdu, 8, 0xfffffffeu, 256) && limit == 5);
	CHECK(fs_credit_tx_avail(limit, 0xffffffffu) == 6);
	CHECK(fs_credit_tx_avail(limit, 5) == 0 && fs_credit_tx_avail(limit, 6) == 0);
}

/* Reports on their way to the sender, as (freed, grant) pairs. */
struct model_wire {
	uint32_t v[64];
	unsigned n;
	uint32_t *tx_limit, *tx_seq;
};

static void model_deliver(struct model_wire *w, unsigned i)
{
	fs_credit_tx_update(w->tx_limit, w->v[i], w->v[i + 1], *w->tx_seq, 256);
	memmove(w->v + i, w->v + i + 2, (w->n - i - 2) * sizeof(w->v[0]));
	w->n -= 2;
}

static void model_report(struct model_wire *w, struct fs_credit_rx *c, struct fs_credit_budget *b)
{
	uint32_t fr;
	unsigned g;

	if (w->n == 64)
		model_deliver(w, 0); /* full: the oldest gets there first */
	fs_credit_rx_advertise(c, b, &fr, &g);
	w->v[w->n++] = fr;
	w->v[w->n++] = g;
}

/* A randomized model of one direction of a stream. */
static void test_model(unsigned seed, uint64_t cap)
{
	struct fs_credit_budget b = { .cap = cap };
	struct fs_credit_rx c;
	uint32_t tx_seq = 0, tx_limit, received = 0;
	uint32_t sizes[1024];
	struct model_wire w = { .tx_limit = &tx_limit, .tx_seq = &tx_seq };
	unsigned stalls = 0, reports = 0, grows = 0, bad = 0;
	bool reported_bad = false, starved = false;
	uint64_t unread = 0;
	bool denied;

	srand(seed);
	fs_credit_rx_init(&c, 1 + (unsigned)rand() % 3, 2 + (unsigned)rand() % 15, COST);
	tx_limit = c.limit;
	for (int step = 0; step < 200000; step++) {
		int op = rand() % 9;

		if (op <= 1 && fs_credit_tx_avail(tx_limit, tx_seq)) {
			/* send and arrive (in order; headers may come late) */
			uint32_t len = rand() % 4 ? 1 + (uint32_t)rand() % 200 : 20000 + (uint32_t)rand() % 100000;

			tx_seq++;
			if (!fs_credit_rx_allows(&c, tx_seq))
				bad++;
			received = tx_seq;
			sizes[received % 1024] = len;
			unread += len;
			if (fs_credit_rx_arrived(&c, &b, received, unread, &denied) && fs_credit_rx_due(&c, received)) {
				model_report(&w, &c, &b);
				reports++;
			}
			starved |= denied;
		} else if (op <= 3 && c.freed != received) {
			/* the reader consumes some */
			uint32_t n = 1 + (uint32_t)rand() % (received - c.freed);

			for (uint32_t i = 1; i <= n; i++)
				unread -= sizes[(c.freed + i) % 1024];
			grows += fs_credit_rx_consume(&c, &b, n, received, unread, &denied);
			starved |= denied;
			if (fs_credit_rx_due(&c, received)) {
				model_report(&w, &c, &b);
				reports++;
			}
		} else if (op == 4 && rand() % 4 == 0) {
			/* a data header of the other direction carries the count */
			model_report(&w, &c, &b);
		} else if (op == 5 && w.n) {
			/* reports reach the sender, in any order */
			model_deliver(&w, ((unsigned)rand() % (w.n / 2)) * 2);
		} else if (op == 6) {
			/* the service thread's look: grants of quiet streams go
			 * back, and a stream the budget refused is looked at again */
			fs_credit_rx_idle(&c, &b, received);
			if (starved && fs_credit_rx_arrived(&c, &b, received, unread, &denied) &&
			    fs_credit_rx_due(&c, received)) {
				model_report(&w, &c, &b);
				reports++;
			}
			starved = denied;
		} else if (op == 7) {
			/* a header filled for a message whose post was refused */
			uint32_t fr, old;
			unsigned g;

			old = fs_credit_rx_advertise(&c, &b, &fr, &g);
			fs_credit_rx_undo(&c, &b, old);
		}
		if (bad && !reported_bad) {
			reported_bad = true;
			fprintf(stderr, "model seed %u step %d op %d: tx_seq %u tx_limit %u received %u | freed %u limit %u base %u "
				"grant %u floor %u max %u charged %u used %llu cap %llu unread %llu\n", seed, step, op, tx_seq,
				tx_limit, received, c.freed, c.limit, c.base, (unsigned)c.grant, (unsigned)c.floor,
				(unsigned)c.max, c.charged, (unsigned long long)b.used, (unsigned long long)b.cap,
				(unsigned long long)unread);
		}
		if (fs_credit_after(tx_seq, tx_limit) || fs_credit_after(tx_limit, c.limit) ||
		    c.limit - c.freed > FS_CREDIT_UNREAD_MAX || c.limit - received > c.max ||
		    b.used != (uint64_t)c.charged * c.cost || b.used > b.cap)
			bad++;
		/* the stall check: the sender is out of credit, every report has
		 * reached it, everything arrived */
		if (!fs_credit_tx_avail(tx_limit, tx_seq) && !w.n && received == tx_seq) {
			stalls++;
			if (!starved && unread < FS_CREDIT_SMALL_BYTES && c.freed != received && !fs_credit_after(c.base, c.freed) &&
			    received - c.freed + c.grant <= FS_CREDIT_UNREAD_MAX && !fs_credit_rx_due(&c, received)) {
				/* small unread: fs_credit_rx_arrived must have moved the offer
				 * unless the budget refused */
				if (b.cap >= b.used + (uint64_t)c.grant * c.cost)
					bad++, fprintf(stderr, "bad: small unread stuck at step %d: freed %u limit %u base %u grant %u "
						       "max %u received %u unread %llu\n", step, c.freed, c.limit, c.base,
						       (unsigned)c.grant, (unsigned)c.max, received, (unsigned long long)unread);
			}
			if (c.freed == received && !fs_credit_rx_due(&c, received))
				bad++, fprintf(stderr, "bad: all read, nothing due at step %d\n", step);
			/* unstick it as a reader would: read everything */
			while (c.freed != received) {
				unread -= sizes[(c.freed + 1) % 1024];
				fs_credit_rx_consume(&c, &b, 1, received, unread, &denied);
			}
			if (!fs_credit_rx_due(&c, received))
				bad++, fprintf(stderr, "bad: read out, nothing due at step %d\n", step);
			model_report(&w, &c, &b);
		}
	}
	fs_credit_rx_release(&c, &b);
	printf("model seed %u cap %llu: sent %u, %u stalls, %u reports, %u grows, final grant %u; %u bad\n", seed,
	       (unsigned long long)cap, tx_seq, stalls, reports, grows, (unsigned)c.grant, bad);
	CHECK(bad == 0);
	CHECK(tx_seq > 10000);
	CHECK(b.used == 0);
}

/* A peer that closed with messages waiting (FS_MSG_CLOSING): the reader
 * never reads; the offer reaches past the limit by the waiting messages
 * (at most CAP), a report is due at once, the overdraft stops at twice the
 * budget's cap, a stream honours one CLOSING only, and a report whose post
 * failed stays due. */
static void test_closing(void)
{
	struct fs_credit_budget b = { .cap = 8ull * COST }, b2 = { .cap = 8ull * COST }, b3 = { .cap = 8ull * COST };
	struct fs_credit_rx c, d, e, f;
	uint32_t freed, limit;
	unsigned grant;
	bool denied;

	fs_credit_rx_init(&c, 2, 8, COST);
	/* the peer uses every credit; the grant grows to the window */
	CHECK(fs_credit_rx_arrived(&c, &b, 2, 1u << 20, &denied) && c.grant == 4);
	fs_credit_rx_advertise(&c, &b, &freed, &grant);
	CHECK(c.limit == 4);
	CHECK(fs_credit_rx_arrived(&c, &b, 4, 1u << 20, &denied) && c.grant == 8);
	fs_credit_rx_advertise(&c, &b, &freed, &grant);
	CHECK(c.limit == 8 && c.charged == 6 && b.used == 6ull * COST);
	CHECK(!fs_credit_rx_due(&c, 8)); /* the reader must read first */
	/* 3 messages wait at the closing peer (2 data and its FIN); CAP 9 */
	CHECK(fs_credit_rx_closing(&c, &b, 3, 9));
	CHECK(fs_credit_rx_due(&c, 8));
	fs_credit_rx_advertise(&c, &b, &freed, &grant);
	CHECK(freed == 0 && grant == 11 && c.limit == 11);
	CHECK(c.charged == 9 && b.used == 9ull * COST); /* beyond the cap: the overdraft */
	CHECK(!fs_credit_rx_due(&c, 8));
	limit = 8;
	CHECK(fs_credit_tx_update(&limit, freed, grant, 8, 256) && limit == 11);
	/* one CLOSING per stream */
	CHECK(!fs_credit_rx_closing(&c, &b, 3, 9) && !fs_credit_rx_due(&c, 11) && c.limit == 11);
	/* at most CAP */
	fs_credit_rx_init(&d, 2, 8, COST);
	CHECK(!fs_credit_rx_closing(&d, &b2, 0, 9));
	CHECK(fs_credit_rx_closing(&d, &b2, 500, 9));
	fs_credit_rx_advertise(&d, &b2, &freed, &grant);
	CHECK(d.limit == 11 && grant == 11 && b2.used == 9ull * COST);
	/* the overdraft stops at twice the cap: 9 more would make 18 of 16 */
	fs_credit_rx_init(&e, 2, 8, COST);
	CHECK(!fs_credit_rx_closing(&e, &b2, 9, 9) && !fs_credit_rx_due(&e, 2) && e.charged == 0);
	CHECK(fs_credit_rx_closing(&e, &b2, 7, 9) && b2.used == 16ull * COST);
	/* a failed post keeps the report due */
	fs_credit_rx_init(&f, 2, 8, COST);
	CHECK(fs_credit_rx_closing(&f, &b3, 2, 9));
	limit = fs_credit_rx_advertise(&f, &b3, &freed, &grant);
	CHECK(f.limit == 4 && !fs_credit_rx_due(&f, 2));
	fs_credit_rx_undo(&f, &b3, limit);
	CHECK(f.limit == 2 && fs_credit_rx_due(&f, 2));
	/* then the reader reads: the grant grows as before, counted from what
	 * it consumed */
	CHECK(fs_credit_rx_consume(&f, &b3, 2, 2, 0, &denied) && f.grant == 4);
	fs_credit_rx_advertise(&f, &b3, &freed, &grant);
	CHECK(freed == 2 && grant == 4 && f.limit == 6);
	fs_credit_rx_release(&c, &b);
	fs_credit_rx_release(&f, &b3);
	CHECK(b.used == 0 && b3.used == 0);
}

int main(void)
{
	test_request_response();
	test_closing();
	test_grow_and_budget();
	test_small_unread();
	test_sender();
	for (unsigned seed = 1; seed <= 6; seed++)
		test_model(seed, seed % 3 == 0 ? 0 : seed % 3 == 1 ? 3ull * COST : 1ull << 40);
	return fs_check_done();
}
