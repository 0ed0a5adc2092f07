/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for core/wire.c: byte-exact layouts of the probe, HELLO and
 * fabric header against wire.h, round trips, the CRC-32 known answers, the
 * HELLO decoder's prefix contract (every prefix of a stream is "need more"
 * until it is refused or complete, and a refusal never turns back into
 * "need more"), single-byte corruption, named malformed cases, and a
 * fixed-seed fuzz loop over both decoders. No fabric, no network.
 */
#include "core/wire.h"
#include "tests/unit/check.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FS_TEST_FUZZ_ITERATIONS 200000
#define FS_TEST_FUZZ_MAX_LEN 400

/* xorshift64*: a fixed seed makes every run, and every failure, repeatable. */
static uint64_t fs_test_rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t fs_test_rand(void)
{
	uint64_t x = fs_test_rng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	fs_test_rng_state = x;
	return x * 0x2545f4914f6cdd1dull;
}

static void test_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static unsigned fs_test_below(unsigned n)
{
	return (unsigned)(fs_test_rand() % n);
}

/* Bit-at-a-time CRC-32, the definition the table-driven one must match. */
static uint32_t fs_test_crc32_bitwise(const uint8_t *p, size_t len)
{
	uint32_t crc = 0xffffffffu;
	int bit;

	while (len--) {
		crc ^= *p++;
		for (bit = 0; bit < 8; bit++)
			crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
	}
	return ~crc;
}

static void fs_test_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t fs_test_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void fs_test_put_be16(uint8_t *p, unsigned v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

/* Rewrites the CRC of a message of N bytes so only the field under test is wrong. */
static void fs_test_reseal(uint8_t *buf, size_t n)
{
	uint32_t crc = fs_test_crc32_bitwise(buf, n - 4);

	buf[n - 4] = (uint8_t)(crc >> 24);
	buf[n - 3] = (uint8_t)(crc >> 16);
	buf[n - 2] = (uint8_t)(crc >> 8);
	buf[n - 1] = (uint8_t)crc;
}

static void fs_test_fill_hello(struct fs_hello *h, uint32_t magic, uint16_t addr_len)
{
	unsigned i;

	memset(h, 0, sizeof(*h));
	h->magic = magic;
	h->status = magic == FS_WIRE_ACK_MAGIC ? FS_NAK_RESOURCES : FS_NAK_NONE;
	h->token = 0x0102030405060708ull;
	h->nonce = 0xf1e2d3c4b5a69788ull;
	h->stream_id = 0x00abcdefu;
	h->window = 64;
	h->chunk = 1u << 20;
	for (i = 0; i < sizeof(h->host_id); i++)
		h->host_id[i] = (uint8_t)(0xa0 + i);
	h->provider = FS_PROV_EFA;
	h->pull_shift = 14;
	h->addr_len = addr_len;
	h->bell_port = 0xbe11;
	h->sock_fd = 0x12345678;
	for (i = 0; i < addr_len; i++)
		h->addr[i] = (uint8_t)(i * 7 + 3);
}

/* The further rails of A and B (a zero count is one rail). */
static int fs_test_rails_equal(const struct fs_hello *a, const struct fs_hello *b)
{
	unsigned ra = a->rails ? a->rails : 1, rb = b->rails ? b->rails : 1;

	if (ra != rb)
		return 0;
	for (unsigned i = 1; i < ra; i++)
		if (a->more[i - 1].len != b->more[i - 1].len ||
		    memcmp(a->more[i - 1].addr, b->more[i - 1].addr, a->more[i - 1].len))
			return 0;
	return 1;
}

static int fs_test_hello_equal(const struct fs_hello *a, const struct fs_hello *b)
{
	return a->magic == b->magic && a->status == b->status && a->token == b->token &&
	       a->nonce == b->nonce && a->stream_id == b->stream_id && a->window == b->window &&
	       a->chunk == b->chunk && !memcmp(a->host_id, b->host_id, sizeof(a->host_id)) &&
	       a->provider == b->provider && a->pull_shift == b->pull_shift && a->addr_len == b->addr_len &&
	       a->bell_port == b->bell_port && a->sock_fd == b->sock_fd && a->flags == b->flags &&
	       !memcmp(a->addr, b->addr, a->addr_len) && fs_test_rails_equal(a, b);
}

/* Decodes from a heap copy of exactly LEN bytes, so ASan sees any overread. */
static int fs_test_hello_decode_exact(const uint8_t *buf, size_t len, uint32_t magic, struct fs_hello *out)
{
	uint8_t *copy = malloc(len ? len : 1);
	int rc;

	memcpy(copy, buf, len);
	rc = fs_wire_hello_decode(copy, len, magic, out);
	free(copy);
	return rc;
}

/*
 * The prefix contract over every prefix k = 0..LEN of BUF: results run
 * 0, 0, ..., then either -EBADMSG for every longer prefix, or a length n
 * first returned at k == n and returned for every k >= n. True when the
 * sequence obeys that and the verdict for the whole of BUF is EXPECT.
 */
static int fs_test_prefix_contract(const uint8_t *buf, size_t len, uint32_t magic, int expect)
{
	struct fs_hello out;
	int verdict = 0, rc = 0;
	size_t k;

	for (k = 0; k <= len; k++) {
		rc = fs_wire_hello_decode(buf, k, magic, &out);
		if (rc != 0 && rc != -EBADMSG && (rc < 0 || (size_t)rc > k))
			return 0;
		if (verdict == 0) {
			if (rc > 0 && (size_t)rc != k)
				return 0; /* complete earlier than it claimed, or later */
			verdict = rc;
		} else if (rc != verdict) {
			return 0; /* a refusal or a completion must be final */
		}
	}
	return rc == expect;
}

static void test_crc32(void)
{
	static const char fox[] = "The quick brown fox jumps over the lazy dog";
	uint8_t buf[1024];
	unsigned i, n;
	int ok = 1;

	CHECK(fs_wire_crc32("123456789", 9) == 0xcbf43926u);
	CHECK(fs_wire_crc32("", 0) == 0);
	CHECK(fs_wire_crc32("a", 1) == 0xe8b7be43u);
	CHECK(fs_wire_crc32(fox, strlen(fox)) == 0x414fa339u);
	for (i = 0; i < 200; i++) {
		n = fs_test_below(sizeof(buf) + 1);
		for (unsigned j = 0; j < n; j++)
			buf[j] = (uint8_t)fs_test_rand();
		if (fs_wire_crc32(buf, n) != fs_test_crc32_bitwise(buf, n))
			ok = 0;
	}
	CHECK(ok);
}

static void test_probe(void)
{
	static const uint8_t expect[FS_WIRE_PROBE_LEN] = {
		'F', 'S', 'B', 'P', FS_WIRE_VERSION, 2, 0, 0,                /* magic, version, YES, reserved */
		0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, /* nonce */
		0x00, 0x00, 0x01, 0xf4, 0x1f, 0x90, 0, 0,       /* wait 500 ms, port 8080, reserved */
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7, /* ::ffff:10.0.0.7 */
	};
	struct fs_probe p = { .type = FS_PROBE_YES, .nonce = 0x1122334455667788ull, .wait_ms = 500, .client_port = 8080,
			      .client_addr = { [10] = 0xff, [11] = 0xff, [12] = 10, [15] = 7 } };
	struct fs_probe q;
	uint8_t buf[64], bad[FS_WIRE_PROBE_LEN];
	unsigned type, off;

	CHECK(fs_wire_probe_encode(&p, buf, sizeof(buf)) == FS_WIRE_PROBE_LEN);
	CHECK(!memcmp(buf, expect, sizeof(expect)));
	memset(&q, 0, sizeof(q));
	CHECK(fs_wire_probe_decode(expect, sizeof(expect), &q) == 0);
	CHECK(q.type == FS_PROBE_YES && q.nonce == p.nonce && q.wait_ms == 500 && q.client_port == 8080 &&
	      !memcmp(q.client_addr, p.client_addr, 16));

	for (type = FS_PROBE_ASK; type <= FS_PROBE_NO; type++) {
		p.type = (uint8_t)type;
		p.nonce = fs_test_rand();
		p.wait_ms = (uint32_t)fs_test_below(FS_WIRE_PROBE_WAIT_MAX_MS + 1);
		p.client_port = (uint16_t)fs_test_rand();
		memset(&q, 0, sizeof(q));
		CHECK(fs_wire_probe_encode(&p, buf, FS_WIRE_PROBE_LEN) == FS_WIRE_PROBE_LEN);
		CHECK(buf[5] == type);
		CHECK(fs_wire_probe_decode(buf, FS_WIRE_PROBE_LEN, &q) == 0);
		CHECK(q.type == type && q.nonce == p.nonce && q.wait_ms == p.wait_ms &&
		      q.client_port == p.client_port && !memcmp(q.client_addr, p.client_addr, 16));
	}

	/* Encoder refusals. */
	p.type = FS_PROBE_ASK;
	CHECK(fs_wire_probe_encode(&p, buf, FS_WIRE_PROBE_LEN - 1) == -EMSGSIZE);
	CHECK(fs_wire_probe_encode(&p, buf, 0) == -EMSGSIZE);
	p.type = 0;
	CHECK(fs_wire_probe_encode(&p, buf, sizeof(buf)) == -EINVAL);
	p.type = 4;
	CHECK(fs_wire_probe_encode(&p, buf, sizeof(buf)) == -EINVAL);
	p.type = FS_PROBE_ASK;
	p.wait_ms = FS_WIRE_PROBE_WAIT_MAX_MS + 1;
	CHECK(fs_wire_probe_encode(&p, buf, sizeof(buf)) == -EINVAL);

	/* The announced wait is bounded: the maximum passes, one more or the
	 * largest u32 (a server that speaks first would wait ~49 days) not. */
	memcpy(bad, expect, sizeof(bad));
	test_put_be32(bad + 16, FS_WIRE_PROBE_WAIT_MAX_MS);
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == 0 && q.wait_ms == FS_WIRE_PROBE_WAIT_MAX_MS);
	test_put_be32(bad + 16, FS_WIRE_PROBE_WAIT_MAX_MS + 1);
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	test_put_be32(bad + 16, 0xffffffffu);
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);

	/* Decoder refusals: length, magic, version, type, reserved. */
	memcpy(buf, expect, sizeof(expect));
	CHECK(fs_wire_probe_decode(buf, 0, &q) == -EBADMSG);
	CHECK(fs_wire_probe_decode(buf, FS_WIRE_PROBE_LEN - 1, &q) == -EBADMSG);
	CHECK(fs_wire_probe_decode(buf, FS_WIRE_PROBE_LEN + 1, &q) == -EBADMSG);
	for (off = 0; off < 4; off++) {
		memcpy(bad, expect, sizeof(bad));
		bad[off] ^= 0x20;
		CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	}
	memcpy(bad, expect, sizeof(bad));
	memcpy(bad, "FSBH", 4); /* a HELLO's magic is not a probe's */
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	memcpy(bad, expect, sizeof(bad));
	bad[4] = 0;
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	bad[4] = FS_WIRE_VERSION + 1;
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	memcpy(bad, expect, sizeof(bad));
	bad[5] = 0;
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	bad[5] = 4;
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	bad[5] = 0xff;
	CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
	{
		static const unsigned reserved[] = { 6, 7, 22, 23 };
		for (off = 0; off < sizeof(reserved) / sizeof(reserved[0]); off++) {
			memcpy(bad, expect, sizeof(bad));
			bad[reserved[off]] = 1;
			CHECK(fs_wire_probe_decode(bad, sizeof(bad), &q) == -EBADMSG);
		}
	}
}

static void test_hello_layout(void)
{
	struct fs_hello h, d;
	uint8_t buf[FS_WIRE_HELLO_MAX];
	int n;

	fs_test_fill_hello(&h, FS_WIRE_HELLO_MAGIC, 3);
	n = fs_wire_hello_encode(&h, buf, sizeof(buf));
	CHECK(n == FS_WIRE_HELLO_MIN + 3);
	CHECK(!memcmp(buf, "FSBH", 4));
	CHECK(buf[4] == FS_WIRE_VERSION && buf[5] == 0);
	CHECK(buf[6] == 0 && buf[7] == 73);
	CHECK(!memcmp(buf + 8, "\x01\x02\x03\x04\x05\x06\x07\x08", 8));
	CHECK(!memcmp(buf + 16, "\xf1\xe2\xd3\xc4\xb5\xa6\x97\x88", 8));
	CHECK(!memcmp(buf + 24, "\x00\xab\xcd\xef", 4));
	CHECK(!memcmp(buf + 28, "\x00\x00\x00\x40", 4));
	CHECK(!memcmp(buf + 32, "\x00\x10\x00\x00", 4));
	CHECK(buf[36] == 0xa0 && buf[51] == 0xaf);
	CHECK(buf[52] == FS_PROV_EFA && buf[53] == 14);
	CHECK(buf[54] == 1 && buf[55] == 0); /* one rail, reserved */
	CHECK(buf[56] == 0xbe && buf[57] == 0x11 && buf[58] == 0 && buf[59] == 0);
	CHECK(!memcmp(buf + 60, "\x12\x34\x56\x78", 4));
	CHECK(buf[64] == 0 && buf[65] == 3); /* rail 0: its length, then its address */
	CHECK(buf[66] == 3 && buf[67] == 10 && buf[68] == 17);
	CHECK(fs_test_be32(buf + 69) == fs_test_crc32_bitwise(buf, 69));
	CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, &d) == n);
	CHECK(fs_test_hello_equal(&h, &d));
	/* a descriptor number with its top bit set is malformed */
	buf[60] = 0x80;
	fs_test_put_be32(buf + 69, fs_test_crc32_bitwise(buf, 69));
	CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);
	buf[60] = 0x7f;
	fs_test_put_be32(buf + 69, fs_test_crc32_bitwise(buf, 69));
	CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, &d) == n && d.sock_fd == 0x7f345678);
	h.sock_fd = FS_WIRE_FD_MAX + 1u;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	/* the TCP-first flag (wire 11) at offset 58, low byte; it round-trips */
	h.sock_fd = 0x12345678;
	h.flags = FS_HELLO_TCP_FIRST;
	n = fs_wire_hello_encode(&h, buf, sizeof(buf));
	CHECK(n == FS_WIRE_HELLO_MIN + 3 && buf[58] == 0 && buf[59] == 1);
	CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, &d) == n && fs_test_hello_equal(&h, &d));
	h.flags = 0;

	fs_test_fill_hello(&h, FS_WIRE_ACK_MAGIC, FS_WIRE_ADDR_MAX);
	n = fs_wire_hello_encode(&h, buf, sizeof(buf));
	CHECK(n == FS_WIRE_HELLO_MIN + FS_WIRE_ADDR_MAX);
	CHECK(!memcmp(buf, "FSBA", 4) && buf[5] == FS_NAK_RESOURCES);
	CHECK(buf[6] == 0x01 && buf[7] == 0x46 && buf[54] == 1 && buf[64] == 0x01 && buf[65] == 0x00);

	/* wire 12: three rails, each its length then its address, in order */
	fs_test_fill_hello(&h, FS_WIRE_HELLO_MAGIC, 3);
	h.rails = 3;
	h.more[0].len = 2;
	memcpy(h.more[0].addr, "\xaa\xbb", 2);
	h.more[1].len = 0;
	n = fs_wire_hello_encode(&h, buf, sizeof(buf));
	CHECK(n == FS_WIRE_HELLO_FIXED + 2 + 3 + 2 + 2 + 2 + 0 + 4);
	CHECK(buf[54] == 3 && buf[55] == 0);
	CHECK(buf[64] == 0 && buf[65] == 3 && buf[66] == 3);
	CHECK(buf[69] == 0 && buf[70] == 2 && buf[71] == 0xaa && buf[72] == 0xbb);
	CHECK(buf[73] == 0 && buf[74] == 0);
	CHECK(fs_test_be32(buf + 75) == fs_test_crc32_bitwise(buf, 75));
	memset(&d, 0x5a, sizeof(d));
	CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, &d) == n);
	CHECK(d.rails == 3 && fs_test_hello_equal(&h, &d));
	CHECK(fs_test_prefix_contract(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, n));

	/* the largest: every rail with the largest address */
	fs_test_fill_hello(&h, FS_WIRE_ACK_MAGIC, FS_WIRE_ADDR_MAX);
	h.rails = FS_WIRE_RAILS_MAX;
	for (unsigned i = 0; i < FS_WIRE_RAILS_MAX - 1; i++) {
		h.more[i].len = FS_WIRE_ADDR_MAX;
		memset(h.more[i].addr, (int)(i + 1), FS_WIRE_ADDR_MAX);
	}
	n = fs_wire_hello_encode(&h, buf, sizeof(buf));
	CHECK(n == FS_WIRE_HELLO_MAX && buf[54] == FS_WIRE_RAILS_MAX);
	memset(&d, 0, sizeof(d));
	CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_ACK_MAGIC, &d) == n && fs_test_hello_equal(&h, &d));
	CHECK(d.more[FS_WIRE_RAILS_MAX - 2].addr[FS_WIRE_ADDR_MAX - 1] == FS_WIRE_RAILS_MAX - 1);
	/* the encoder refuses 17 rails and a further rail's address over the largest */
	h.rails = FS_WIRE_RAILS_MAX + 1;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.rails = 2;
	h.more[0].len = FS_WIRE_ADDR_MAX + 1;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.more[0].len = 5;
	CHECK(fs_wire_hello_encode(&h, buf, FS_WIRE_HELLO_MIN + FS_WIRE_ADDR_MAX + 2 + 4) == -EMSGSIZE);
	CHECK(fs_wire_hello_encode(&h, buf, FS_WIRE_HELLO_MIN + FS_WIRE_ADDR_MAX + 2 + 5) ==
	      FS_WIRE_HELLO_MIN + FS_WIRE_ADDR_MAX + 2 + 5);
}

static void test_hello_round_trip(void)
{
	static const uint16_t addr_lens[] = { 0, 1, 32, 256 };
	static const uint32_t magics[] = { FS_WIRE_HELLO_MAGIC, FS_WIRE_ACK_MAGIC };
	uint8_t buf[FS_WIRE_HELLO_MAX + 64];
	struct fs_hello h, d;
	unsigned m, a, st, k;
	int n;

	for (m = 0; m < 2; m++) {
		for (a = 0; a < sizeof(addr_lens) / sizeof(addr_lens[0]); a++) {
			fs_test_fill_hello(&h, magics[m], addr_lens[a]);
			h.token = fs_test_rand();
			h.nonce = fs_test_rand();
			h.provider = (uint8_t)fs_test_below(FS_PROV_MAX_);
			n = fs_wire_hello_encode(&h, buf, FS_WIRE_HELLO_MIN + addr_lens[a]);
			CHECK(n == FS_WIRE_HELLO_MIN + addr_lens[a]);
			memset(&d, 0x5a, sizeof(d));
			CHECK(fs_wire_hello_decode(buf, (size_t)n, magics[m], &d) == n);
			CHECK(fs_test_hello_equal(&h, &d));
			/* The other kind's decoder refuses it at the fourth byte. */
			CHECK(fs_wire_hello_decode(buf, 3, magics[!m], &d) == 0);
			CHECK(fs_wire_hello_decode(buf, 4, magics[!m], &d) == -EBADMSG);
			CHECK(fs_wire_hello_decode(buf, (size_t)n, magics[!m], &d) == -EBADMSG);

			/* Every truncation is a valid prefix; the whole is n. */
			for (k = 0; k < (unsigned)n; k++)
				if (fs_test_hello_decode_exact(buf, k, magics[m], &d) != 0)
					break;
			CHECK(k == (unsigned)n);
			CHECK(fs_test_hello_decode_exact(buf, (size_t)n, magics[m], &d) == n);
			/* Trailing bytes are the next message, not part of this one. */
			for (k = (unsigned)n; k < sizeof(buf); k++)
				buf[k] = (uint8_t)fs_test_rand();
			memset(&d, 0, sizeof(d));
			CHECK(fs_wire_hello_decode(buf, sizeof(buf), magics[m], &d) == n);
			CHECK(fs_test_hello_equal(&h, &d));
			CHECK(fs_test_prefix_contract(buf, sizeof(buf), magics[m], n));
		}
	}
	/* Every status is allowed in an ACK. */
	for (st = 0; st < FS_NAK_MAX_; st++) {
		fs_test_fill_hello(&h, FS_WIRE_ACK_MAGIC, 8);
		h.status = (uint8_t)st;
		n = fs_wire_hello_encode(&h, buf, sizeof(buf));
		CHECK(n == FS_WIRE_HELLO_MIN + 8);
		CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_ACK_MAGIC, &d) == n && d.status == st);
	}
}

static void test_hello_encode_errors(void)
{
	uint8_t buf[FS_WIRE_HELLO_MAX];
	struct fs_hello h;

	fs_test_fill_hello(&h, FS_WIRE_HELLO_MAGIC, 32);
	CHECK(fs_wire_hello_encode(&h, buf, FS_WIRE_HELLO_MIN + 31) == -EMSGSIZE);
	CHECK(fs_wire_hello_encode(&h, buf, 0) == -EMSGSIZE);
	CHECK(fs_wire_hello_encode(&h, buf, FS_WIRE_HELLO_MIN + 32) == FS_WIRE_HELLO_MIN + 32);
	h.addr_len = FS_WIRE_ADDR_MAX + 1;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.addr_len = 32;
	h.provider = FS_PROV_MAX_;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.provider = FS_PROV_SHM;
	h.status = FS_NAK_RULE; /* a HELLO carries no verdict */
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.magic = FS_WIRE_ACK_MAGIC;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == FS_WIRE_HELLO_MIN + 32);
	h.status = FS_NAK_MAX_;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.status = 0;
	h.magic = FS_WIRE_PROBE_MAGIC;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.magic = FS_WIRE_HELLO_MAGIC;
	h.stream_id = FS_STREAM_ID_MAX + 1; /* would not fit the fabric tag */
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.stream_id = 1;
	h.window = FS_WIRE_WINDOW_MAX + 1;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	h.window = 8;
	h.chunk = FS_WIRE_CHUNK_MAX + 1;
	CHECK(fs_wire_hello_encode(&h, buf, sizeof(buf)) == -EINVAL);
	/* Decoding for a magic that is neither kind is a caller bug. */
	CHECK(fs_wire_hello_decode(buf, 0, FS_WIRE_PROBE_MAGIC, &h) == -EINVAL);
}

/* The window and chunk a HELLO announces are bounded: the maxima pass, one
 * more (or the largest u32) is refused as soon as the field is whole, with
 * the CRC made right so only the bound can refuse it. */
static void test_hello_bounds(void)
{
	static const struct {
		unsigned off;
		uint32_t max;
	} fields[] = { { 28, FS_WIRE_WINDOW_MAX }, { 32, FS_WIRE_CHUNK_MAX } };
	uint8_t buf[FS_WIRE_HELLO_MAX];
	struct fs_hello h, d;
	int n;

	for (unsigned f = 0; f < 2; f++) {
		static const uint32_t over[] = { 1, 0 };

		fs_test_fill_hello(&h, FS_WIRE_HELLO_MAGIC, 16);
		if (f == 0)
			h.window = FS_WIRE_WINDOW_MAX;
		else
			h.chunk = FS_WIRE_CHUNK_MAX;
		n = fs_wire_hello_encode(&h, buf, sizeof(buf));
		CHECK(n == FS_WIRE_HELLO_MIN + 16);
		CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, &d) == n);
		CHECK(f ? d.chunk == FS_WIRE_CHUNK_MAX : d.window == FS_WIRE_WINDOW_MAX);
		for (unsigned o = 0; o < 2; o++) {
			uint32_t v = over[o] ? fields[f].max + 1 : 0xffffffffu;

			test_put_be32(buf + fields[f].off, v);
			fs_test_reseal(buf, (size_t)n);
			CHECK(fs_wire_hello_decode(buf, (size_t)n, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);
			CHECK(fs_wire_hello_decode(buf, fields[f].off + 4, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);
			CHECK(fs_wire_hello_decode(buf, fields[f].off + 3, FS_WIRE_HELLO_MAGIC, &d) == 0);
		}
	}
}

/* Builds a valid HELLO into BUF and returns its length. */
static size_t fs_test_valid_hello(uint8_t *buf, uint16_t addr_len)
{
	struct fs_hello h;

	fs_test_fill_hello(&h, FS_WIRE_HELLO_MAGIC, addr_len);
	return (size_t)fs_wire_hello_encode(&h, buf, FS_WIRE_HELLO_MAX);
}

static void test_hello_malformed(void)
{
	uint8_t buf[FS_WIRE_HELLO_MAX + 8];
	struct fs_hello d;
	size_t n;

#define FS_TEST_REFUSED(mutation, addr_len)                                           \
	do {                                                                          \
		n = fs_test_valid_hello(buf, (addr_len));                             \
		mutation;                                                             \
		fs_test_reseal(buf, n);                                               \
		CHECK(fs_wire_hello_decode(buf, n, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG); \
		CHECK(fs_test_prefix_contract(buf, n, FS_WIRE_HELLO_MAGIC, -EBADMSG)); \
	} while (0)

	/* First wrong byte refuses at once, with nothing after it. */
	buf[0] = 'X';
	CHECK(fs_wire_hello_decode(buf, 1, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);
	memcpy(buf, "GET / HTTP/1.1\r\n", 16);
	CHECK(fs_wire_hello_decode(buf, 1, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);
	memcpy(buf, "FSX", 3);
	CHECK(fs_wire_hello_decode(buf, 2, FS_WIRE_HELLO_MAGIC, &d) == 0);
	CHECK(fs_wire_hello_decode(buf, 3, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);

	FS_TEST_REFUSED(memcpy(buf, "FSBA", 4), 16);          /* an ACK where a HELLO was due */
	FS_TEST_REFUSED(buf[4] = 0, 16);                      /* version */
	FS_TEST_REFUSED(buf[4] = FS_WIRE_VERSION + 1, 16);
	FS_TEST_REFUSED(buf[5] = FS_NAK_RULE, 16);            /* status in a HELLO */
	FS_TEST_REFUSED(fs_test_put_be16(buf + 6, FS_WIRE_HELLO_MAX + 1), 16); /* oversized length */
	FS_TEST_REFUSED(fs_test_put_be16(buf + 6, 0xffff), 16);
	FS_TEST_REFUSED(fs_test_put_be16(buf + 6, FS_WIRE_HELLO_MIN - 1), 16); /* undersized length */
	FS_TEST_REFUSED(fs_test_put_be16(buf + 6, 0), 16);
	FS_TEST_REFUSED(buf[24] = 0x01, 16);                  /* stream id beyond 24 bits */
	FS_TEST_REFUSED(buf[52] = FS_PROV_MAX_, 16);          /* unknown provider */
	FS_TEST_REFUSED(buf[52] = 0xff, 16);
	FS_TEST_REFUSED(buf[53] = 1, 16);                     /* pull shift below 4 KiB */
	FS_TEST_REFUSED(buf[53] = FS_WIRE_PULL_SHIFT_MIN - 1, 16);
	FS_TEST_REFUSED(buf[53] = FS_WIRE_PULL_SHIFT_MAX + 1, 16); /* above 16 MiB */
	FS_TEST_REFUSED(buf[58] = 1, 16);                     /* flags this version does not know */
	FS_TEST_REFUSED(buf[59] = 0x80, 16);
	FS_TEST_REFUSED(buf[59] = 0x02, 16);
	FS_TEST_REFUSED(buf[54] = 0, 16);                     /* no rail */
	FS_TEST_REFUSED(buf[54] = 2, 16);                     /* more rails than entries */
	FS_TEST_REFUSED(buf[54] = FS_WIRE_RAILS_MAX + 1, 16);
	FS_TEST_REFUSED(buf[54] = 0xff, 16);
	FS_TEST_REFUSED(buf[55] = 1, 16);                     /* reserved */
	FS_TEST_REFUSED(fs_test_put_be16(buf + 64, 17), 16);  /* rail 0's length vs the total */
	FS_TEST_REFUSED(fs_test_put_be16(buf + 64, 15), 16);
	FS_TEST_REFUSED(fs_test_put_be16(buf + 64, 16 + 256), 16);
	/* a length > 256 with a total that agrees with it */
	FS_TEST_REFUSED((fs_test_put_be16(buf + 6, FS_WIRE_HELLO_MIN + 257), fs_test_put_be16(buf + 64, 257)), 16);
	FS_TEST_REFUSED(fs_test_put_be16(buf + 64, 300), FS_WIRE_ADDR_MAX);
	FS_TEST_REFUSED(fs_test_put_be16(buf + 64, 0xffff), FS_WIRE_ADDR_MAX);
	/* 17 rails of empty addresses, the total agreeing: the count refuses */
	FS_TEST_REFUSED((buf[54] = FS_WIRE_RAILS_MAX + 1,
			 fs_test_put_be16(buf + 6, FS_WIRE_HELLO_FIXED + (FS_WIRE_RAILS_MAX + 1) * 2 + 4),
			 memset(buf + 64, 0, (FS_WIRE_RAILS_MAX + 1) * 2),
			 n = FS_WIRE_HELLO_FIXED + (FS_WIRE_RAILS_MAX + 1) * 2 + 4), 16);
	/* two rails whose second length overruns into the CRC */
	FS_TEST_REFUSED((buf[54] = 2, fs_test_put_be16(buf + 64, 10), fs_test_put_be16(buf + 76, 5)), 16);

	/* A bad CRC byte is refused as soon as it arrives. */
	n = fs_test_valid_hello(buf, 16);
	buf[n - 2] ^= 1;
	CHECK(fs_wire_hello_decode(buf, n - 2, FS_WIRE_HELLO_MAGIC, &d) == 0);
	CHECK(fs_wire_hello_decode(buf, n - 1, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);
	CHECK(fs_wire_hello_decode(buf, n, FS_WIRE_HELLO_MAGIC, &d) == -EBADMSG);
#undef FS_TEST_REFUSED
}

/*
 * Every single-byte change of a valid HELLO, at every position with every
 * xor mask, is refused: at once or once complete, never accepted.
 */
static void test_hello_corruption(void)
{
	static const uint16_t addr_lens[] = { 0, 32, 256 };
	uint8_t good[FS_WIRE_HELLO_MAX], bad[FS_WIRE_HELLO_MAX + 4];
	struct fs_hello d;
	unsigned a, pos, mask;
	int all_refused = 1;
	size_t n;

	for (a = 0; a < sizeof(addr_lens) / sizeof(addr_lens[0]); a++) {
		n = fs_test_valid_hello(good, addr_lens[a]);
		for (pos = 0; pos < n; pos++) {
			for (mask = 1; mask < 256; mask++) {
				memcpy(bad, good, n);
				memset(bad + n, 0, 4);
				bad[pos] ^= (uint8_t)mask;
				if (fs_wire_hello_decode(bad, n + 4, FS_WIRE_HELLO_MAGIC, &d) != -EBADMSG)
					all_refused = 0;
				/* The full prefix sweep is quadratic: do it on the small ones. */
				if (addr_lens[a] <= 32 && !fs_test_prefix_contract(bad, n + 4, FS_WIRE_HELLO_MAGIC, -EBADMSG))
					all_refused = 0;
			}
		}
	}
	CHECK(all_refused);
}

/* Result must be -EBADMSG, 0, or a length within LEN whose re-encoding is identical. */
static int fs_test_hello_result_ok(const uint8_t *buf, size_t len, uint32_t magic, int rc, const struct fs_hello *d)
{
	uint8_t again[FS_WIRE_HELLO_MAX];

	if (rc == -EBADMSG || rc == 0)
		return 1;
	if (rc < FS_WIRE_HELLO_MIN || rc > FS_WIRE_HELLO_MAX || (size_t)rc > len || d->magic != magic)
		return 0;
	return fs_wire_hello_encode(d, again, sizeof(again)) == rc && !memcmp(again, buf, (size_t)rc);
}

static void test_fuzz(void)
{
	static const uint32_t magics[] = { FS_WIRE_HELLO_MAGIC, FS_WIRE_ACK_MAGIC };
	uint8_t scratch[FS_TEST_FUZZ_MAX_LEN];
	unsigned long accepted = 0, need_more = 0, refused = 0, probes_ok = 0;
	int ok = 1, contract_ok = 1;
	long i;

	for (i = 0; i < FS_TEST_FUZZ_ITERATIONS; i++) {
		size_t len = fs_test_below(FS_TEST_FUZZ_MAX_LEN + 1), j, n;
		uint32_t magic = magics[fs_test_below(2)];
		unsigned mode = fs_test_below(4), mutations;
		struct fs_hello h, d;
		struct fs_probe p, q;
		uint8_t *buf;
		int rc;

		for (j = 0; j < len; j++)
			scratch[j] = (uint8_t)fs_test_rand();
		if (mode == 1) {
			/* A valid message, then a few random byte changes, sometimes resealed. */
			fs_test_fill_hello(&h, magic, (uint16_t)fs_test_below(FS_WIRE_ADDR_MAX + 1));
			if (magic == FS_WIRE_ACK_MAGIC)
				h.status = (uint8_t)fs_test_below(FS_NAK_MAX_);
			h.provider = (uint8_t)fs_test_below(FS_PROV_MAX_);
			h.token = fs_test_rand();
			n = (size_t)fs_wire_hello_encode(&h, scratch, sizeof(scratch));
			if (len < n && fs_test_below(2))
				len = n + fs_test_below((unsigned)(FS_TEST_FUZZ_MAX_LEN - n + 1));
			for (mutations = fs_test_below(4); mutations; mutations--)
				scratch[fs_test_below((unsigned)n)] ^= (uint8_t)(1u << fs_test_below(8));
			if (fs_test_below(2))
				fs_test_reseal(scratch, n);
		} else if (mode == 2) {
			/* A valid probe, then maybe one change; probes must be exact length. */
			p.type = (uint8_t)(1 + fs_test_below(3));
			p.nonce = fs_test_rand();
			p.wait_ms = (uint32_t)fs_test_below(FS_WIRE_PROBE_WAIT_MAX_MS + 1);
			p.client_port = (uint16_t)fs_test_rand();
			memset(p.client_addr, (int)fs_test_below(256), sizeof(p.client_addr));
			fs_wire_probe_encode(&p, scratch, sizeof(scratch));
			if (fs_test_below(2))
				len = FS_WIRE_PROBE_LEN;
			if (fs_test_below(2))
				scratch[fs_test_below(FS_WIRE_PROBE_LEN)] ^= (uint8_t)(1 + fs_test_below(255));
		} else if (mode == 3 && len >= 4) {
			/* Random bytes behind a right magic reach the deeper checks. */
			scratch[0] = (uint8_t)(magic >> 24);
			scratch[1] = (uint8_t)(magic >> 16);
			scratch[2] = (uint8_t)(magic >> 8);
			scratch[3] = (uint8_t)magic;
			if (len > 4)
				scratch[4] = FS_WIRE_VERSION;
		}

		/* An exact-size heap copy: ASan flags any read past LEN. */
		buf = malloc(len ? len : 1);
		memcpy(buf, scratch, len);

		rc = fs_wire_hello_decode(buf, len, magic, &d);
		if (!fs_test_hello_result_ok(buf, len, magic, rc, &d))
			ok = 0;
		accepted += rc > 0;
		need_more += rc == 0;
		refused += rc == -EBADMSG;
		/* Sampled, being quadratic: the whole prefix sequence obeys the contract. */
		if ((i & 63) == 0 && !fs_test_prefix_contract(buf, len, magic, rc))
			contract_ok = 0;

		rc = fs_wire_probe_decode(buf, len, &q);
		if (rc == 0) {
			uint8_t again[FS_WIRE_PROBE_LEN];
			probes_ok++;
			if (len != FS_WIRE_PROBE_LEN || fs_wire_probe_encode(&q, again, sizeof(again)) != FS_WIRE_PROBE_LEN ||
			    memcmp(again, buf, FS_WIRE_PROBE_LEN))
				ok = 0;
		} else if (rc != -EBADMSG) {
			ok = 0;
		}

		if (len >= FS_WIRE_HDR_LEN) {
			struct fs_wire_msg_hdr hdr;
			uint8_t again[FS_WIRE_HDR_LEN];
			fs_wire_hdr_decode(buf, &hdr);
			fs_wire_hdr_encode(&hdr, again);
			if (memcmp(again, buf, sizeof(again)))
				ok = 0;
		}
		free(buf);
	}
	CHECK(ok);
	CHECK(contract_ok);
	/* The generator must actually reach every outcome. */
	CHECK(accepted > 1000 && need_more > 1000 && refused > 1000 && probes_ok > 1000);
	printf("fuzz: %d iterations: hello accepted %lu, need more %lu, refused %lu; probes accepted %lu\n",
	       FS_TEST_FUZZ_ITERATIONS, accepted, need_more, refused, probes_ok);
}

static void test_tags(void)
{
	static const uint32_t streams[] = { 0, 1, 0x123456, FS_STREAM_ID_MAX };
	static const uint64_t tokens[] = { 0, 1, 0xdeadbeefull, 0xffffffffull, 0xffffffffffffffffull };
	unsigned cls, kind, s, t;
	int ok = 1;

	for (cls = 0; cls < 4; cls++)
		for (kind = 0; kind < 64; kind++)
			for (s = 0; s < 4; s++)
				for (t = 0; t < 5; t++) {
					uint64_t tag = fs_tag_make(cls, kind, streams[s], tokens[t]);
					if (fs_tag_class(tag) != cls || fs_tag_kind(tag) != kind ||
					    fs_tag_stream(tag) != streams[s] || fs_tag_token(tag) != (uint32_t)tokens[t] ||
					    ((tag & FS_TAG_CLASS_MASK) >> FS_TAG_CLASS_SHIFT) != cls)
						ok = 0;
				}
	CHECK(ok);
	/* Oversized fields are masked, never spilled into their neighbours. */
	CHECK(fs_tag_class(fs_tag_make(FS_CLASS_DATA, 0xff, 0, 0)) == FS_CLASS_DATA);
	CHECK(fs_tag_kind(fs_tag_make(FS_CLASS_DATA, 0xff, 0, 0)) == 0x3f);
	CHECK(fs_tag_kind(fs_tag_make(FS_CLASS_CTRL, 0, 0xffffffffu, 0)) == 0);
	CHECK(fs_tag_stream(fs_tag_make(FS_CLASS_CTRL, 0, 0xffffffffu, 0)) == FS_STREAM_ID_MAX);
	CHECK(fs_tag_stream(fs_tag_make(FS_CLASS_DATA, 0, 0, ~0ull)) == 0);
	CHECK(fs_tag_kind(fs_tag_make(FS_CLASS_CTRL, 0, FS_STREAM_ID_MAX, ~0ull)) == 0);
	CHECK(fs_tag_make(FS_CLASS_CTRL, 0, 0, 0) == 1ull << 62);
	CHECK(fs_tag_make(FS_CLASS_DATA, FS_MSG_FIN, 0, 0) == 2ull << 56);
	CHECK(fs_tag_make(FS_CLASS_CTRL, FS_MSG_CREDIT, 0x10203, 0xaabbccdd) == 0x43010203aabbccddull);
	/* a pulled payload's tag: low 16 bits of the seq, then of the token */
	CHECK(fs_tag_pull(0x10203, 0x12345, 0x11aabbccddull) == 0x810102032345ccddull);
	CHECK(fs_tag_class(fs_tag_pull(1, 1, 1)) == FS_CLASS_PULL);
	CHECK((fs_tag_make(FS_CLASS_DATA, 0x3f, FS_STREAM_ID_MAX, ~0ull) & FS_TAG_CLASS_MASK) == 0);
	{
		/* a control message carries its tag in front, little-endian */
		uint8_t tb[9] = { 0 };

		fs_wire_ctrl_tag_encode(0x43010203aabbccddull, tb + 1); /* unaligned */
		CHECK(tb[1] == 0xdd && tb[4] == 0xaa && tb[5] == 0x03 && tb[8] == 0x43);
		CHECK(fs_wire_ctrl_tag_decode(tb + 1) == 0x43010203aabbccddull);
	}
}

static void test_hdr(void)
{
	/* the last word: len in its low 24 bits, grant - 1 in its top byte */
	struct fs_wire_msg_hdr h = { .seq = 0x04030201u, .freed = 0x08070605u, .ctrl_ack = 0x0c0b0a09u, .len = 0x0f0e0du,
				     .grant = 0x11 };
	struct fs_wire_msg_hdr d;
	uint8_t buf[17] = { 0 };
	unsigned i;
	int ok = 1;

	fs_wire_hdr_encode(&h, buf + 1); /* unaligned on purpose */
	for (i = 0; i < 16; i++)
		if (buf[1 + i] != i + 1)
			ok = 0;
	CHECK(ok);
	CHECK(buf[0] == 0);
	memset(&d, 0, sizeof(d));
	fs_wire_hdr_decode(buf + 1, &d);
	CHECK(d.seq == h.seq && d.freed == h.freed && d.ctrl_ack == h.ctrl_ack && d.len == h.len && d.grant == h.grant);
	/* the extremes of a grant: 1 and FS_WIRE_WINDOW_MAX */
	h.grant = 1;
	h.len = FS_WIRE_CHUNK_MAX;
	fs_wire_hdr_encode(&h, buf + 1);
	CHECK(buf[16] == 0);
	fs_wire_hdr_decode(buf + 1, &d);
	CHECK(d.grant == 1 && d.len == FS_WIRE_CHUNK_MAX);
	h.grant = FS_WIRE_WINDOW_MAX;
	fs_wire_hdr_encode(&h, buf + 1);
	CHECK(buf[16] == 0xff);
	fs_wire_hdr_decode(buf + 1, &d);
	CHECK(d.grant == FS_WIRE_WINDOW_MAX && d.len == FS_WIRE_CHUNK_MAX);
}

static void test_names(void)
{
	CHECK(!strcmp(fs_wire_provider_name(FS_PROV_NONE), "none"));
	CHECK(!strcmp(fs_wire_provider_name(FS_PROV_SHM), "shm"));
	CHECK(!strcmp(fs_wire_provider_name(FS_PROV_EFA), "efa"));
	CHECK(!strcmp(fs_wire_provider_name(FS_PROV_TCP), "tcp"));
	CHECK(!strcmp(fs_wire_provider_name(FS_PROV_NET), "net"));
	CHECK(!strcmp(fs_wire_provider_name(FS_PROV_MAX_), "unknown"));
	CHECK(!strcmp(fs_wire_provider_name(~0u), "unknown"));
	CHECK(!strcmp(fs_nak_name(FS_NAK_NONE), "none"));
	CHECK(!strcmp(fs_nak_name(FS_NAK_PROVIDER), "provider"));
	CHECK(!strcmp(fs_nak_name(FS_NAK_RESOURCES), "resources"));
	CHECK(!strcmp(fs_nak_name(FS_NAK_RULE), "rule"));
	CHECK(!strcmp(fs_nak_name(FS_NAK_VERSION), "version"));
	CHECK(!strcmp(fs_nak_name(FS_NAK_HOST), "host"));
	CHECK(!strcmp(fs_nak_name(FS_NAK_MAX_), "unknown"));
	CHECK(!strcmp(fs_nak_name(~0u), "unknown"));
}

/* Doorbell datagrams: layout, round trip, and refusal of anything else. */
static void test_bell(void)
{
	struct fs_bell_entry ent[FS_WIRE_BELL_MAX], out[FS_WIRE_BELL_MAX];
	uint8_t buf[FS_WIRE_BELL_LEN_MAX + 8];
	unsigned count = 99;
	int n;

	for (unsigned i = 0; i < FS_WIRE_BELL_MAX; i++) {
		ent[i].stream_id = 0x00abcd00u + i;
		ent[i].token = 0xdeadbeefu ^ i;
		ent[i].data_seen = 1000u * i;
		ent[i].ctrl_seen = 7u * i;
	}
	/* a RING names the one stream it rings for */
	n = fs_wire_bell_encode(FS_BELL_RING, ent, 1, buf, sizeof(buf));
	CHECK(n == FS_WIRE_BELL_HDR + FS_WIRE_BELL_ENTRY);
	CHECK(!memcmp(buf, "FSBB", 4) && buf[4] == FS_WIRE_VERSION && buf[5] == FS_BELL_RING);
	CHECK(buf[6] == 0 && buf[7] == 1);
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == FS_BELL_RING && count == 1);
	CHECK(!memcmp(ent, out, sizeof(ent[0])));
	buf[7] = 0; /* a RING without its stream (version 5's) */
	CHECK(fs_wire_bell_decode(buf, FS_WIRE_BELL_HDR, out, &count) == -EBADMSG);

	n = fs_wire_bell_encode(FS_BELL_ARM, ent, 1, buf, sizeof(buf));
	CHECK(n == FS_WIRE_BELL_HDR + FS_WIRE_BELL_ENTRY);
	CHECK(buf[5] == FS_BELL_ARM && buf[6] == 0 && buf[7] == 1);
	CHECK(!memcmp(buf + 8, "\x00\xab\xcd\x00\xde\xad\xbe\xef\x00\x00\x00\x00\x00\x00\x00\x00", 16));
	n = fs_wire_bell_encode(FS_BELL_ARM, ent, FS_WIRE_BELL_MAX, buf, sizeof(buf));
	CHECK(n == FS_WIRE_BELL_LEN_MAX);
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == FS_BELL_ARM && count == FS_WIRE_BELL_MAX);
	CHECK(!memcmp(ent, out, sizeof(ent)));

	/* encoder refusals */
	CHECK(fs_wire_bell_encode(3, NULL, 0, buf, sizeof(buf)) == -EINVAL);
	CHECK(fs_wire_bell_encode(FS_BELL_RING, NULL, 0, buf, sizeof(buf)) == -EINVAL);
	CHECK(fs_wire_bell_encode(FS_BELL_RING, ent, 2, buf, sizeof(buf)) == -EINVAL);
	CHECK(fs_wire_bell_encode(FS_BELL_ARM, ent, FS_WIRE_BELL_MAX + 1, buf, sizeof(buf)) == -EINVAL);
	CHECK(fs_wire_bell_encode(FS_BELL_ARM, ent, 2, buf, FS_WIRE_BELL_HDR + FS_WIRE_BELL_ENTRY) == -EMSGSIZE);

	/* decoder refusals: length, magic, version, type, count */
	n = fs_wire_bell_encode(FS_BELL_ARM, ent, 2, buf, sizeof(buf));
	CHECK(fs_wire_bell_decode(buf, (size_t)n - 1, out, &count) == -EBADMSG);
	CHECK(fs_wire_bell_decode(buf, (size_t)n + 1, out, &count) == -EBADMSG);
	CHECK(fs_wire_bell_decode(buf, 7, out, &count) == -EBADMSG);
	buf[0] ^= 1;
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == -EBADMSG);
	buf[0] ^= 1;
	buf[4]++;
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == -EBADMSG);
	buf[4]--;
	buf[5] = 0;
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == -EBADMSG);
	buf[5] = FS_BELL_RING; /* a RING with two entries */
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == -EBADMSG);
	buf[5] = FS_BELL_ARM;
	buf[7] = 3; /* count disagrees with the length */
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == -EBADMSG);
	buf[7] = 2;
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == FS_BELL_ARM && count == 2);
	/* a probe is not a bell */
	memcpy(buf, "FSBP", 4);
	CHECK(fs_wire_bell_decode(buf, (size_t)n, out, &count) == -EBADMSG);
}

int main(void)
{
	test_crc32();
	test_probe();
	test_hello_layout();
	test_hello_round_trip();
	test_hello_encode_errors();
	test_hello_bounds();
	test_hello_malformed();
	test_hello_corruption();
	test_fuzz();
	test_tags();
	test_hdr();
	test_names();
	test_bell();
	return fs_check_done();
}
