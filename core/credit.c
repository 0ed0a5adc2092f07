/* SPDX-License-Identifier: MIT */
/* Receive credits and their budget: the rules are in credit.h. */
#include "core/credit.h"

static unsigned fs_credit_clamp(unsigned v)
{
	return v < 1 ? 1 : v > FS_CREDIT_UNREAD_MAX ? FS_CREDIT_UNREAD_MAX : v;
}

/* The limit C offers now: GRANT beyond what the reader consumed, or beyond
 * small unread messages (fs_credit_rx_arrived). */
static uint32_t fs_credit_offer(const struct fs_credit_rx *c, unsigned grant)
{
	uint32_t from = fs_credit_after(c->base, c->freed) ? c->base - c->freed : 0;
	uint32_t ahead = from + grant;

	/* a closing peer's waiting messages (fs_credit_rx_closing) */
	if (c->closing && fs_credit_after(c->closing_to, c->freed + ahead))
		ahead = c->closing_to - c->freed;
	return c->freed + (ahead > FS_CREDIT_UNREAD_MAX ? FS_CREDIT_UNREAD_MAX : ahead);
}

/* Messages C may hold beyond its floor with GRANT offered. */
static uint32_t fs_credit_need(const struct fs_credit_rx *c, unsigned grant)
{
	uint32_t offer = fs_credit_offer(c, grant);
	uint32_t top = fs_credit_after(offer, c->limit) ? offer : c->limit;
	uint32_t most = top - c->freed;

	return most > c->floor ? most - c->floor : 0;
}

/* Whether charging C for GRANT (and BASE) as set now fits the budget. */
static bool fs_credit_fits(const struct fs_credit_rx *c, const struct fs_credit_budget *b, unsigned grant)
{
	uint32_t need = fs_credit_need(c, grant);

	return need <= c->charged || b->used + (uint64_t)(need - c->charged) * c->cost <= b->cap;
}

static void fs_credit_recharge(struct fs_credit_rx *c, struct fs_credit_budget *b)
{
	uint32_t need = fs_credit_need(c, c->grant);

	b->used -= (uint64_t)c->charged * c->cost;
	b->used += (uint64_t)need * c->cost;
	c->charged = need;
}

void fs_credit_rx_init(struct fs_credit_rx *c, unsigned floor, unsigned max, uint32_t cost)
{
	max = fs_credit_clamp(max);
	floor = fs_credit_clamp(floor);
	if (floor > max)
		floor = max;
	*c = (struct fs_credit_rx){
		.limit = floor,
		.cost = cost,
		.grant = (uint16_t)floor,
		.floor = (uint16_t)floor,
		.max = (uint16_t)max,
	};
}

/* The peer used every credit it had (RECEIVED is the limit): it may be
 * waiting for more. Doubles the grant, up to the window, if the budget has
 * room (*DENIED if not). Recharges nothing. */
static bool fs_credit_grow(struct fs_credit_rx *c, const struct fs_credit_budget *b, uint32_t received,
			   bool *denied)
{
	unsigned want;

	if (received != c->limit || c->grant >= c->max)
		return false;
	want = c->grant * 2u > c->max ? c->max : c->grant * 2u;
	if (!fs_credit_fits(c, b, want)) {
		*denied = true;
		return false;
	}
	c->grant = (uint16_t)want;
	return true;
}

/* The small-unread rule (credit.h). */
static bool fs_credit_small(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t received,
			    uint64_t unread_bytes, bool *denied)
{
	uint32_t old = c->base;

	if (received != c->limit || !fs_credit_after(received, c->freed) || unread_bytes >= FS_CREDIT_SMALL_BYTES ||
	    !fs_credit_after(received, c->base))
		return false;
	/* at most FS_CREDIT_UNREAD_MAX messages unread and offered together */
	if (received - c->freed + c->grant > FS_CREDIT_UNREAD_MAX)
		return false;
	c->base = received;
	if (!fs_credit_fits(c, b, c->grant)) {
		c->base = old;
		*denied = true;
		return false;
	}
	fs_credit_recharge(c, b);
	return true;
}

bool fs_credit_rx_consume(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t n, uint32_t received,
			  uint64_t unread_bytes, bool *denied)
{
	bool grew;

	*denied = false;
	c->freed += n;
	grew = fs_credit_grow(c, b, received, denied);
	fs_credit_recharge(c, b);
	/* what is left unread may have become small (a larger grant alone
	 * may not cover what is unread; a refused doubling may leave room
	 * for this) */
	fs_credit_small(c, b, received, unread_bytes, denied);
	return grew;
}

bool fs_credit_rx_arrived(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t received,
			  uint64_t unread_bytes, bool *denied)
{
	bool grew;

	*denied = false;
	grew = fs_credit_grow(c, b, received, denied);
	fs_credit_recharge(c, b);
	/* a larger grant alone may not cover what is unread; a refused
	 * doubling may leave room for this */
	return fs_credit_small(c, b, received, unread_bytes, denied) || grew;
}

bool fs_credit_rx_closing(struct fs_credit_rx *c, struct fs_credit_budget *b, unsigned n, unsigned cap)
{
	uint32_t to, need;

	if (n > cap)
		n = cap;
	to = c->limit + n;
	if (!n || c->closing) /* one per stream: a peer closes once */
		return false;
	c->closing = true;
	c->closing_to = to;
	need = fs_credit_need(c, c->grant);
	if (need > c->charged && b->used + (uint64_t)(need - c->charged) * c->cost > 2 * b->cap) {
		c->closing = false;
		return false;
	}
	fs_credit_recharge(c, b);
	return fs_credit_after(fs_credit_offer(c, c->grant), c->limit);
}

bool fs_credit_rx_due(const struct fs_credit_rx *c, uint32_t received)
{
	uint32_t offer = fs_credit_offer(c, c->grant);
	uint32_t advance, remaining;

	if (!fs_credit_after(offer, c->limit))
		return false;
	/* a closing peer's waiting messages not advertised yet */
	if (c->closing && fs_credit_after(c->closing_to, c->limit))
		return true;
	advance = offer - c->limit;
	remaining = fs_credit_after(c->limit, received) ? c->limit - received : 0;
	return (uint64_t)advance * 2 >= c->grant && (uint64_t)remaining * 2 < c->grant;
}

uint32_t fs_credit_rx_advertise(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t *freed,
				unsigned *grant)
{
	uint32_t old = c->limit;
	uint32_t offer = fs_credit_offer(c, c->grant);

	*freed = c->freed;
	*grant = offer - c->freed; /* <= FS_CREDIT_UNREAD_MAX */
	if (fs_credit_after(offer, c->limit)) {
		c->limit = offer;
		fs_credit_recharge(c, b);
	}
	return old;
}

void fs_credit_rx_undo(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t old_limit)
{
	c->limit = old_limit;
	fs_credit_recharge(c, b);
}

bool fs_credit_rx_idle(struct fs_credit_rx *c, struct fs_credit_budget *b, uint32_t received)
{
	if (received != c->idle_mark) {
		c->idle_mark = received;
		return c->grant > c->floor;
	}
	if (c->grant > c->floor) {
		c->grant = c->floor;
		fs_credit_recharge(c, b);
	}
	return false;
}

void fs_credit_rx_release(struct fs_credit_rx *c, struct fs_credit_budget *b)
{
	b->used -= (uint64_t)c->charged * c->cost;
	c->charged = 0;
}

bool fs_credit_tx_update(uint32_t *limit, uint32_t freed, unsigned grant, uint32_t tx_seq, unsigned max_grant)
{
	if (fs_credit_after(freed, tx_seq) || grant > max_grant || !fs_credit_after(freed + grant, *limit))
		return false;
	*limit = freed + grant;
	return true;
}
