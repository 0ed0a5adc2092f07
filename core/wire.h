/* SPDX-License-Identifier: MIT */
/*
 * fabsock's wire formats, all in one place: the UDP capability probe, the
 * in-band HELLO / HELLO-ACK on the TCP stream, the tag and header of every
 * fabric message. Multi-byte fields are big-endian (network order) in the
 * probe and HELLO, little-endian in fabric message headers. Decoders never
 * trust a length they have not checked against the buffer they were given.
 *
 * Probe (UDP, client -> same port on the server host; reply same size):
 *   0  u32 magic 'FSBP'        4  u8 version   5  u8 type (ASK/YES/NO)
 *   6  u16 reserved (0)        8  u64 nonce   16  u32 wait_ms
 *  20  u16 client TCP port    22  u16 reserved (0)
 *  24  u8[16] client TCP address (IPv6 or v4-mapped IPv4)      = 40 bytes
 *
 * HELLO (client -> server, first bytes of the TCP stream) and HELLO-ACK
 * (server -> client) share one layout:
 *   0  u32 magic 'FSBH' (HELLO) or 'FSBA' (ACK)
 *   4  u8 version              5  u8 status (HELLO: 0; ACK: enum fs_nak)
 *   6  u16 total length of the message, crc included
 *   8  u64 token (chosen by the client, echoed by the server)
 *  16  u64 probe nonce (0 when the probe was skipped by a rule)
 *  24  u32 stream id the sender receives on (peer tags its data with it)
 *  28  u32 window: messages the sender lets the peer send before its first
 *      header says more (the first grant, core/credit.h)
 *  32  u32 chunk: largest payload the sender accepts per message
 *  36  u8[16] host id (boot id) of the sender
 *  52  u8 provider (enum fs_wire_provider)
 *  53  u8 pull shift: the sender wants data payloads of at least 2^shift
 *      bytes announced and pulled (FS_MSG_PULL below); 0 = never,
 *      else FS_WIRE_PULL_SHIFT_MIN..FS_WIRE_PULL_SHIFT_MAX
 *  54  u8 rails: how many fabric addresses follow (1..FS_WIRE_RAILS_MAX),
 *      rail 0 the stream's home endpoint, rail i (i >= 1) the endpoint on
 *      the sender's i-th further NIC it offers for striping (wire 12)
 *  55  u8 reserved (0)
 *  56  u16 doorbell port: the sender's UDP doorbell (core/bell.h) listens
 *      on it at the address of this TCP connection; 0 = none
 *  58  u16 flags: FS_HELLO_TCP_FIRST (bit 0), the others 0
 *  60  u32 the sender's descriptor of this TCP connection (<= FS_WIRE_FD_MAX):
 *      with the pid in a shm address, the kernel confirms that this process
 *      holds this connection (/proc/PID/fd/FD names its socket)
 *  64  per rail, in rail order: u16 len (<= FS_WIRE_ADDR_MAX; 0 in a
 *      refusal or a HELLO that declines), then u8[len] the fabric address
 *      of the sender's endpoint on that rail
 *  64 + sum(2 + len) u32 CRC-32 (IEEE, as zlib) of every byte before it
 * The total length (offset 6) must be exactly 64 + sum(2 + len) + 4: the
 * decoder walks the lengths as they arrive and refuses a count out of
 * range, a length over FS_WIRE_ADDR_MAX or a sum that overruns the total
 * (or falls short of it) before it looks at the CRC. Both ends use the
 * first min(rails, peer's rails) rails, rail i to the peer's rail i
 * (docs/design.md, "Every NIC: striping one stream").
 */
#ifndef FS_CORE_WIRE_H
#define FS_CORE_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* 2: control messages untagged, tag in front; 3: doorbell port; 4: pull shift;
 * 5: SWITCH, RETURN, RETURN_END (handing a stream back to TCP);
 * 6: a RING names its stream (one entry); 7: the sender's descriptor in HELLOs;
 * 8: FS_MSG_ARM, an ARM carried by a message;
 * 9: a header's grant (credits move like a window, core/credit.h); the
 *    HELLO's window is the first grant;
 * 10: FS_MSG_CLOSING;
 * 11: the HELLO's flags (FS_HELLO_TCP_FIRST) and FS_MSG_ONTO (TCP first,
 *     docs/design.md "TCP first: the switch to the fabric");
 * 12: the HELLO carries one fabric address per rail (striping) */
#define FS_WIRE_VERSION 12
#define FS_WIRE_PROBE_MAGIC 0x46534250u /* "FSBP" */
#define FS_WIRE_HELLO_MAGIC 0x46534248u /* "FSBH" */
#define FS_WIRE_ACK_MAGIC 0x46534241u   /* "FSBA" */

#define FS_WIRE_PROBE_LEN 40
#define FS_WIRE_ADDR_MAX 256
/* The most rails a HELLO may offer (one address each). */
#define FS_WIRE_RAILS_MAX 16
/* A rail's entry: its u16 length, then the address. */
#define FS_WIRE_RAIL_HDR 2
/* The largest window (messages) and chunk (bytes) a HELLO may announce: the
 * upper bounds of FABSOCK_WINDOW and FABSOCK_CHUNK_SIZE; a HELLO with more
 * is malformed. */
#define FS_WIRE_WINDOW_MAX 256u
#define FS_WIRE_CHUNK_MAX (1u << 20)
#define FS_WIRE_HELLO_FIXED 64
/* A HELLO's descriptor number: a non-negative int. */
#define FS_WIRE_FD_MAX 0x7fffffffu
/* The shortest: one rail with an empty address; the longest: every rail
 * with the largest. A one-rail HELLO is FS_WIRE_HELLO_MIN + its address. */
#define FS_WIRE_HELLO_MIN (FS_WIRE_HELLO_FIXED + FS_WIRE_RAIL_HDR + 4)
#define FS_WIRE_HELLO_MAX (FS_WIRE_HELLO_FIXED + FS_WIRE_RAILS_MAX * (FS_WIRE_RAIL_HDR + FS_WIRE_ADDR_MAX) + 4)
#define FS_WIRE_PULL_SHIFT_MIN 12 /* 4 KiB */
#define FS_WIRE_PULL_SHIFT_MAX 24 /* 16 MiB */

enum fs_probe_type { FS_PROBE_ASK = 1, FS_PROBE_YES = 2, FS_PROBE_NO = 3 };

/* The largest wait a probe may announce: FABSOCK_PROBE_TIMEOUT_MS's upper
 * bound. A server that speaks first waits that long, at most, for the
 * client's HELLO; a probe that asks for more is refused (probes_bad). */
#define FS_WIRE_PROBE_WAIT_MAX_MS 10000u

struct fs_probe {
	uint8_t type;         /* enum fs_probe_type */
	uint64_t nonce;
	uint32_t wait_ms;     /* the client's probe timeout, <= FS_WIRE_PROBE_WAIT_MAX_MS */
	uint16_t client_port; /* host order */
	uint8_t client_addr[16];
};

enum fs_wire_provider {
	FS_PROV_NONE = 0,
	FS_PROV_SHM = 1,
	FS_PROV_EFA = 2,
	FS_PROV_TCP = 3,
	FS_PROV_NET = 4,
	FS_PROV_MAX_ = 5,
};

/* Why a server answered a HELLO with a refusal; both ends then stay on TCP. */
enum fs_nak {
	FS_NAK_NONE = 0,
	FS_NAK_PROVIDER = 1,  /* no common provider / provider failed to open */
	FS_NAK_RESOURCES = 2, /* buffer pool or address vector full */
	FS_NAK_RULE = 3,      /* never sent (a server rule commits to TCP first): the number stays taken */
	FS_NAK_VERSION = 4,
	FS_NAK_HOST = 5,      /* shm offered but the hosts differ */
	FS_NAK_EVENT_LOOP = 6, /* no longer sent (event loops are offloaded): the number stays taken */
	FS_NAK_USER = 7,      /* shm offered but the peers run as different users */
	FS_NAK_PEER = 8,      /* the kernel says the shm address's process does not hold this connection */
	FS_NAK_MAX_ = 9,
};

/* HELLO flags. TCP_FIRST in a HELLO: "after the handshake my bytes come on
 * TCP, unframed, until my ONTO"; echoed in the ACK by a server that does the
 * same. Only when both carry it does either side start on TCP. */
#define FS_HELLO_TCP_FIRST 0x1u
#define FS_HELLO_FLAGS_KNOWN FS_HELLO_TCP_FIRST

struct fs_hello {
	uint32_t magic; /* FS_WIRE_HELLO_MAGIC or FS_WIRE_ACK_MAGIC */
	uint8_t status; /* enum fs_nak; 0 in a HELLO */
	uint64_t token;
	uint64_t nonce;
	uint32_t stream_id;
	uint32_t window;
	uint32_t chunk;
	uint8_t host_id[16];
	uint8_t provider;
	uint8_t pull_shift; /* 0 or FS_WIRE_PULL_SHIFT_MIN..MAX */
	/* Rails offered, 1..FS_WIRE_RAILS_MAX (the encoder takes 0 as 1): rail
	 * 0's address is addr (the stream's home endpoint), rail i's more[i - 1]. */
	uint8_t rails;
	uint16_t addr_len;
	uint16_t bell_port; /* host order; 0: the sender has no doorbell */
	uint32_t sock_fd;   /* the sender's descriptor of the connection */
	uint16_t flags;     /* FS_HELLO_* */
	uint8_t addr[FS_WIRE_ADDR_MAX];
	struct fs_hello_rail {
		uint16_t len;
		uint8_t addr[FS_WIRE_ADDR_MAX];
	} more[FS_WIRE_RAILS_MAX - 1];
};

/* Encodes into BUF (LEN bytes). Returns bytes written, or -EMSGSIZE if LEN
 * is too small, -EINVAL for an invalid field (bad type, addr_len too big). */
int fs_wire_probe_encode(const struct fs_probe *probe, uint8_t *buf, size_t len);
/* Returns 0, or -EBADMSG for anything that is not exactly one well-formed
 * probe of this version (wrong length, magic, version, type, nonzero
 * reserved bytes). */
int fs_wire_probe_decode(const uint8_t *buf, size_t len, struct fs_probe *probe);

int fs_wire_hello_encode(const struct fs_hello *hello, uint8_t *buf, size_t len);
/* Decodes a HELLO (MAGIC = FS_WIRE_HELLO_MAGIC) or ACK from the start of BUF.
 * Returns the message length (> 0) when a whole valid message is there;
 * 0 when the LEN bytes present are a valid prefix and more are needed;
 * -EBADMSG when the bytes cannot be such a message (magic, version, length
 * out of range, addr_len inconsistent, provider unknown, status out of
 * range, rail count or an address length out of range, lengths that do not
 * add up to the total, CRC mismatch). */
int fs_wire_hello_decode(const uint8_t *buf, size_t len, uint32_t magic, struct fs_hello *hello);

uint32_t fs_wire_crc32(const void *buf, size_t len);

/*
 * Doorbell datagrams (UDP, between the doorbell sockets of two processes
 * that share offloaded streams; core/bell.h has the protocol):
 *   0  u32 magic 'FSBB'   4  u8 version   5  u8 type (ARM/RING)
 *   6  u16 count of entries (RING: exactly 1, the stream it rings for)
 *   8  count x 16 bytes:  u32 stream id at the receiver of the datagram
 *                         u32 low 32 bits of the connection token
 *                         u32 data-class messages the sender received on it
 *                         u32 control messages the sender processed on it
 */
#define FS_WIRE_BELL_MAGIC 0x46534242u /* "FSBB" */
#define FS_WIRE_BELL_HDR 8
#define FS_WIRE_BELL_ENTRY 16
#define FS_WIRE_BELL_MAX 64 /* entries per datagram */
#define FS_WIRE_BELL_LEN_MAX (FS_WIRE_BELL_HDR + FS_WIRE_BELL_MAX * FS_WIRE_BELL_ENTRY)

enum fs_bell_type { FS_BELL_ARM = 1, FS_BELL_RING = 2 };

struct fs_bell_entry {
	uint32_t stream_id;
	uint32_t token;
	uint32_t data_seen;
	uint32_t ctrl_seen;
};

/* Encodes TYPE with COUNT entries into BUF. Returns bytes, or -EINVAL /
 * -EMSGSIZE. */
int fs_wire_bell_encode(unsigned type, const struct fs_bell_entry *ent, unsigned count, uint8_t *buf, size_t len);
/* Decodes one datagram of LEN bytes: the type (> 0) with *COUNT entries
 * copied to ENT (room for FS_WIRE_BELL_MAX), or -EBADMSG. */
int fs_wire_bell_decode(const uint8_t *buf, size_t len, struct fs_bell_entry *ent, unsigned *count);

const char *fs_wire_provider_name(unsigned provider);
const char *fs_nak_name(unsigned nak);

/*
 * Every fabric message of ours starts with a 64-bit tag (little-endian) and
 * the 16-byte header, then the payload: FS_WIRE_MSG_PREFIX bytes before it.
 * Tag bits:
 *   63..62 class: FS_CLASS_DATA (large pooled buffers), FS_CLASS_CTRL
 *          (small buffers), FS_CLASS_PULL (below)
 *   61..56 kind (enum fs_msg_kind)
 *   55..32 stream id at the receiver (24 bits)
 *   31..0  low 32 bits of the connection token
 * How they travel (wire version 4):
 *  - data-class messages are untagged sends (fi_send/fi_inject) into
 *    untagged catch-all receives;
 *  - control-class messages are tagged sends carrying the one tag
 *    FS_TAG_CTRL_ALL, into tagged catch-all receives for exactly that tag;
 *  - the payload of an FS_MSG_PULL announcement is a tagged send of the
 *    bare payload (no prefix) with fs_tag_pull(), which waits unexpected
 *    (on shm: at the sender) until the reader posts a receive for exactly
 *    that tag, straight into the application's buffer when it can.
 * So every receive is a catch-all of its own queue, posting order never
 * matters, and no message but a pulled payload arrives unexpected while
 * credits are kept. Every tagged receive we post ignores no tag bit: shm
 * in libfabric 1.17 matches a newly posted tagged receive against its
 * unexpected messages with a stale ignore mask left in a recycled entry
 * by an earlier receive, so a catch-all mask (as wire versions 2 and 3
 * posted for data) makes any pulled payload match any other.
 * (Version 2 moved control messages out of the data's queue: a provider
 * walks its posted receives of one queue in order on every arrival, and
 * the rarely consumed control receives drifted to the head of a shared one.)
 */
#define FS_TAG_CLASS_SHIFT 62
#define FS_TAG_KIND_SHIFT 56
#define FS_TAG_STREAM_SHIFT 32
#define FS_TAG_CLASS_MASK (3ull << FS_TAG_CLASS_SHIFT)
#define FS_STREAM_ID_MAX 0xffffffu

enum fs_msg_class { FS_CLASS_DATA = 0, FS_CLASS_CTRL = 1, FS_CLASS_PULL = 2 };
enum fs_msg_kind {
	FS_MSG_DATA = 1,   /* class DATA: payload bytes, seq numbered */
	FS_MSG_FIN = 2,    /* class DATA: end of stream, takes a seq and a credit */
	FS_MSG_CREDIT = 3, /* class CTRL: header only, for its freed and grant */
	FS_MSG_PULL = 4,   /* class DATA, header only: hdr.len payload bytes wait, tagged
			    * fs_tag_pull(), for the reader to pull; takes a seq and a credit */
	/* Handing the stream back to TCP (core/handback.h); class DATA, each
	 * takes a seq and a credit: */
	FS_MSG_SWITCH = 5,     /* header only: my bytes after this come over TCP */
	FS_MSG_RETURN = 6,     /* payload: bytes of yours my reader will not read, for you to
				* write to TCP before anything else */
	FS_MSG_RETURN_END = 7, /* header only: no more RETURN */
	/* class CTRL, header only: the sender closed (or its process is
	 * ending) with hdr.len messages (its FIN among them) waiting for
	 * credit; the receiver may grant them beyond its budget (credit.h) */
	FS_MSG_CLOSING = 8,
	/* TCP first (docs/design.md): class DATA, takes a seq and a credit;
	 * payload a u64 (little-endian) N: "I wrote exactly N bytes to this
	 * TCP connection after the handshake; the rest of mine comes over the
	 * fabric". The first data-class message of its direction. */
	FS_MSG_ONTO = 9,
};
#define FS_WIRE_ONTO_LEN 8
/* The control-class kinds: no sequence number, no credit, not in flight
 * as data (their completions and failures concern no byte). */
static inline int fs_msg_is_ctrl(unsigned kind)
{
	return kind == FS_MSG_CREDIT || kind == FS_MSG_CLOSING;
}

/* Or-ed into the kind of a DATA- or CTRL-class message: the sender asks to
 * be rung after the receiver's next message on the stream, as a doorbell
 * ARM whose "seen" counts are the header's freed and ctrl_ack. */
#define FS_MSG_ARM 0x20u

/* Encoded in FS_WIRE_HDR_LEN bytes, little-endian: seq, freed, ctrl_ack
 * (u32 each), then len in the low 24 bits and grant - 1 in the high 8 bits
 * of the last u32. */
struct fs_wire_msg_hdr {
	uint32_t seq;      /* DATA/FIN: per-stream message number from 1; CREDIT: ctrl number from 1 */
	uint32_t freed;    /* messages of the opposite direction consumed by the sender's reader */
	uint32_t ctrl_ack; /* CREDIT messages of the opposite direction processed */
	uint32_t len;      /* payload bytes following the header (< 2^24) */
	uint32_t grant;    /* 1..256: the sender's peer may send up to seq freed + grant */
};
#define FS_WIRE_HDR_LEN 16
#define FS_WIRE_HDR_LEN_MAX 0xffffffu
_Static_assert(FS_WIRE_CHUNK_MAX <= FS_WIRE_HDR_LEN_MAX, "a chunk's length fits the header");
_Static_assert(FS_WIRE_WINDOW_MAX <= 256, "a grant fits the header");

static inline uint64_t fs_tag_make(unsigned cls, unsigned kind, uint32_t stream, uint64_t token)
{
	return ((uint64_t)cls << FS_TAG_CLASS_SHIFT) | ((uint64_t)(kind & 0x3f) << FS_TAG_KIND_SHIFT) |
	       ((uint64_t)(stream & FS_STREAM_ID_MAX) << FS_TAG_STREAM_SHIFT) | (token & 0xffffffffull);
}
/* The tag of the payload announced by FS_MSG_PULL number SEQ on STREAM. */
static inline uint64_t fs_tag_pull(uint32_t stream, uint32_t seq, uint64_t token)
{
	return fs_tag_make(FS_CLASS_PULL, FS_MSG_DATA, stream, ((uint64_t)(seq & 0xffff) << 16) | (token & 0xffff));
}
static inline unsigned fs_tag_class(uint64_t tag) { return (unsigned)(tag >> FS_TAG_CLASS_SHIFT); }
static inline unsigned fs_tag_kind(uint64_t tag) { return (unsigned)(tag >> FS_TAG_KIND_SHIFT) & 0x3f; }
static inline uint32_t fs_tag_stream(uint64_t tag) { return (uint32_t)(tag >> FS_TAG_STREAM_SHIFT) & FS_STREAM_ID_MAX; }
static inline uint32_t fs_tag_token(uint64_t tag) { return (uint32_t)tag; }

#define FS_WIRE_CTRL_TAG_LEN 8
#define FS_WIRE_MSG_PREFIX (FS_WIRE_CTRL_TAG_LEN + FS_WIRE_HDR_LEN) /* tag, header */
/* The provider tag of every control message (the real one is in front). */
#define FS_TAG_CTRL_ALL ((uint64_t)FS_CLASS_CTRL << FS_TAG_CLASS_SHIFT)

void fs_wire_hdr_encode(const struct fs_wire_msg_hdr *hdr, void *buf);
void fs_wire_ctrl_tag_encode(uint64_t tag, void *buf);
uint64_t fs_wire_ctrl_tag_decode(const void *buf);
void fs_wire_hdr_decode(const void *buf, struct fs_wire_msg_hdr *hdr);

#endif
