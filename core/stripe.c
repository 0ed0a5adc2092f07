/* SPDX-License-Identifier: MIT */
/*
 * Striping one stream over several rails (issue 28 item 2; wire 12;
 * docs/design.md, "Every NIC: striping one stream"): which of our NICs a
 * stream offers its peer beside its home (the HELLO's rail list), how a
 * server pairs its NICs with the client's (rail i with rail i), the peer's
 * address on each further rail (inserted at the join, released when the
 * stream is freed), and which rail a data message goes on when its buffer
 * is taken (fs_stripe_pick: a pool's registration belongs to its domain,
 * so the rail is fixed then, not at the post).
 *
 * Nothing here orders or counts messages: every data-class message takes a
 * per-stream sequence number and a credit whatever rail it goes on, the
 * receiver delivers by sequence (rxq.c) and takes a stream's message on any
 * of its rails. Engine lock held throughout.
 */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "config/log.h"
#include "config/params.h"
#include "core/engine.h"
#include "core/stats.h"
#include "core/stream_internal.h"

/* Whether H, a NIC's first endpoint, may carry a stripe. */
static bool fs_stripe_usable(const struct fs_engine_rail *h)
{
	return h && h->open && !h->nic_failed;
}

/* The NIC after H's in the chain of KIND, wrapping to the first. */
static struct fs_engine_rail *fs_stripe_nic_after(struct fs_engine *e, unsigned kind, struct fs_engine_rail *h)
{
	return h->next_nic ? h->next_nic : &e->rails[kind];
}

/* How many rails a stream of ER's kind may offer: FABSOCK_RAILS, never
 * above the wire's bound; 1 where striping is off (STRIPE_MIN 0) or the
 * kind has one domain (shm). */
static unsigned fs_stripe_want(const struct fs_engine_rail *er)
{
	unsigned want = (unsigned)fs_params.rails;

	if (!fs_params.stripe_min || er->rail.kind == FS_PROV_SHM || !er->head)
		return 1;
	return want < FS_WIRE_RAILS_MAX ? want : FS_WIRE_RAILS_MAX;
}

/* Rail N of S is H: its data receives are topped up (a NIC that is no
 * stream's home may have none posted yet). */
static void fs_stripe_add(struct fs_stream *s, unsigned n, struct fs_engine_rail *h)
{
	s->rail_ep[n] = h;
	s->rail_peer[n] = FI_ADDR_UNSPEC;
	(void)fs_post_more(h, &h->rx_data, &h->posted_data, fs_data_want(h));
}

void fs_stripe_init(struct fs_engine *e, struct fs_stream *s)
{
	struct fs_engine_rail *home = s->erail, *h;
	unsigned want = fs_stripe_want(home), kind = home->rail.kind;

	for (unsigned i = 0; i < FS_WIRE_RAILS_MAX; i++) {
		s->rail_ep[i] = NULL;
		s->rail_peer[i] = FI_ADDR_UNSPEC;
	}
	s->rail_ep[0] = home;
	s->nrails = 1;
	if (want < 2 || !home->head || !e->rails[kind].next_nic)
		return; /* one NIC (a home on the last one has no next_nic, but others) */
	/* the NICs after the home's, in rank order, wrapping */
	for (h = fs_stripe_nic_after(e, kind, home->head); h != home->head && s->nrails < want;
	     h = fs_stripe_nic_after(e, kind, h))
		if (fs_stripe_usable(h))
			fs_stripe_add(s, s->nrails++, h);
}

/* A server pairs its NICs with the rails its client offered (PEER's rail
 * list): on tcp and net, for the client's rail i, the unused NIC whose
 * address shares the most leading bits with that rail's (the same link, as
 * fs_engine_pick_nic pairs the homes); elsewhere (efa: any NIC reaches
 * any) the next unused one after the home, in rank order. */
static void fs_stripe_match(struct fs_engine *e, struct fs_stream *s, const struct fs_hello *peer)
{
	struct fs_engine_rail *home = s->erail;
	unsigned kind = home->rail.kind, want = fs_stripe_want(home);
	bool by_ip = kind == FS_PROV_TCP || kind == FS_PROV_NET;

	for (unsigned i = 1; i < FS_WIRE_RAILS_MAX; i++) {
		s->rail_ep[i] = NULL;
		s->rail_peer[i] = FI_ADDR_UNSPEC;
	}
	s->nrails = 1;
	if (want < 2 || !home->head || !e->rails[kind].next_nic)
		return; /* one NIC (a home on the last one has no next_nic, but others) */
	for (unsigned i = 1; i < peer->rails && s->nrails < want; i++) {
		struct fs_engine_rail *best = NULL, *h;
		uint8_t pip[16], rip[16];
		bool pknown = by_ip && fs_fabric_addr_ip(kind, peer->more[i - 1].addr, peer->more[i - 1].len, pip);
		int best_bits = -1;

		for (h = fs_stripe_nic_after(e, kind, home->head); h != home->head; h = fs_stripe_nic_after(e, kind, h)) {
			bool used = false;
			int bits = 0;

			for (unsigned k = 1; k < s->nrails; k++)
				used |= s->rail_ep[k] == h;
			if (used || !fs_stripe_usable(h))
				continue;
			if (pknown && fs_fabric_addr_ip(kind, h->rail.addr, h->rail.addr_len, rip))
				bits = (int)fs_ip_common_bits(pip, rip);
			if (bits > best_bits) {
				best = h;
				best_bits = bits;
			}
		}
		if (!best)
			break;
		fs_stripe_add(s, s->nrails++, best);
	}
}

void fs_stripe_join(struct fs_engine *e, struct fs_stream *s, const struct fs_hello *peer, bool server)
{
	unsigned peer_rails = peer->rails ? peer->rails : 1;

	if (server)
		fs_stripe_match(e, s, peer);
	else if (s->nrails > peer_rails)
		s->nrails = peer_rails; /* (the rails beyond stay in rail_ep: a buffer kept there goes back) */
	for (unsigned i = 1; i < s->nrails; i++) {
		struct fs_engine_rail *er = s->rail_ep[i];
		int ret = fs_rail_av_insert(&er->rail, peer->more[i - 1].addr, peer->more[i - 1].len, &s->rail_peer[i]);

		if (ret) {
			/* nothing goes there from us; the peer's messages there are taken */
			s->rail_peer[i] = FI_ADDR_UNSPEC;
			FS_INFO("stream %u: the peer's address on rail %u (%s NIC %u) cannot be inserted: %s; "
				"not sending there", s->id, i, fs_fabric_prov_name(er->rail.kind), er->nic_index,
				strerror(-ret));
		}
	}
	if (s->nrails > 1)
		FS_STAT_INC(streams_striped);
}

void fs_stripe_release(struct fs_stream *s)
{
	for (unsigned i = 1; i < FS_WIRE_RAILS_MAX; i++) {
		if (s->rail_ep[i] && s->rail_peer[i] != FI_ADDR_UNSPEC)
			fs_rail_av_release(&s->rail_ep[i]->rail, s->rail_peer[i]);
		s->rail_peer[i] = FI_ADDR_UNSPEC;
	}
}

unsigned fs_stripe_disown(struct fs_stream *s)
{
	unsigned n = 0;

	for (unsigned i = 1; i < FS_WIRE_RAILS_MAX; i++)
		if (s->rail_ep[i])
			n += fs_pool_disown(&s->rail_ep[i]->tx_data, s);
	return n;
}

bool fs_stripe_uses(const struct fs_stream *s, const struct fs_engine_rail *head)
{
	for (unsigned i = 0; i < s->nrails || i == 0; i++)
		if (fs_stream_rail(s, i)->head == head)
			return true;
	return false;
}

int fs_stripe_rail_of(const struct fs_stream *s, const struct fs_engine_rail *er)
{
	for (unsigned i = 0; i < s->nrails || i == 0; i++)
		if (fs_stream_rail(s, i) == er)
			return (int)i;
	return -1;
}

unsigned fs_stripe_pick(struct fs_stream *s, unsigned queued)
{
	struct fs_engine *e = fs_engine_peek();
	unsigned best = 0, best_load = UINT_MAX, others;

	/* one rail carries a short queue (a request, an answer: striping it
	 * would only reorder it), and a peer that grants one message at a
	 * time has nothing to overlap */
	if (s->nrails < 2 || !fs_params.stripe_min || s->peer_grant < 2 ||
	    (uint64_t)queued * s->peer_chunk < fs_params.stripe_min)
		return 0;
	/* Other streams with a backlog of their own (engine.pending, S among
	 * them) fill the other rails already, each homed on the NIC with the
	 * fewest streams: striping them too only reorders. Measured, eight
	 * iperf3 streams over two 1 Gbit/s links: 1.49 Gbit/s striped against
	 * 1.79 spread (docs/design.md). */
	others = e && e->pending_tx ? e->pending_tx - 1 : 0;
	if (others >= s->nrails - 1)
		return 0;
	for (unsigned k = 0; k < s->nrails; k++) {
		unsigned i = (s->stripe_next + k) % s->nrails;
		struct fs_engine_rail *er = fs_stream_rail(s, i);

		if (fs_stream_rail_peer(s, i) == FI_ADDR_UNSPEC || !fs_stripe_usable(er->head))
			continue;
		if (er->tx_posted < best_load) {
			best = i;
			best_load = er->tx_posted;
		}
	}
	s->stripe_next = best + 1;
	if (best)
		FS_STAT_INC(stripe_msgs);
	return best;
}
