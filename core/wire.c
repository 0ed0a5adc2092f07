/* SPDX-License-Identifier: MIT */
/*
 * Encoders and decoders for every fabsock wire format declared in wire.h:
 * the UDP capability probe, the HELLO / HELLO-ACK that opens a TCP stream,
 * the 16-byte header of each fabric message, and the CRC-32 that guards the
 * HELLO. Buffers are read and written one byte at a time with explicit
 * shifts, so nothing here depends on host byte order or buffer alignment.
 * Decoders are strict: a field that is not exactly what this version
 * writes is an error, and the HELLO decoder rejects a stream as soon as the
 * bytes seen so far cannot start a valid message, because its caller reads
 * "0 = need more" as a promise that waiting can still succeed.
 */
#include "core/wire.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

/* Byte offsets of the probe (see the diagram in wire.h). */
enum {
	FS_PROBE_OFF_MAGIC = 0,
	FS_PROBE_OFF_VERSION = 4,
	FS_PROBE_OFF_TYPE = 5,
	FS_PROBE_OFF_RESERVED1 = 6,
	FS_PROBE_OFF_NONCE = 8,
	FS_PROBE_OFF_WAIT_MS = 16,
	FS_PROBE_OFF_PORT = 20,
	FS_PROBE_OFF_RESERVED2 = 22,
	FS_PROBE_OFF_ADDR = 24,
};
_Static_assert(FS_PROBE_OFF_ADDR + 16 == FS_WIRE_PROBE_LEN, "probe layout is 40 bytes");

/* Byte offsets of the HELLO / HELLO-ACK (see the diagram in wire.h). */
enum {
	FS_HELLO_OFF_MAGIC = 0,
	FS_HELLO_OFF_VERSION = 4,
	FS_HELLO_OFF_STATUS = 5,
	FS_HELLO_OFF_LENGTH = 6,
	FS_HELLO_OFF_TOKEN = 8,
	FS_HELLO_OFF_NONCE = 16,
	FS_HELLO_OFF_STREAM_ID = 24,
	FS_HELLO_OFF_WINDOW = 28,
	FS_HELLO_OFF_CHUNK = 32,
	FS_HELLO_OFF_HOST_ID = 36,
	FS_HELLO_OFF_PROVIDER = 52,
	FS_HELLO_OFF_PULL_SHIFT = 53,
	FS_HELLO_OFF_RAILS = 54,
	FS_HELLO_OFF_RESERVED = 55,
	FS_HELLO_OFF_BELL_PORT = 56,
	FS_HELLO_OFF_FLAGS = 58,
	FS_HELLO_OFF_SOCK_FD = 60,
	FS_HELLO_OFF_RAIL_LIST = 64,
};
_Static_assert(FS_HELLO_OFF_RAIL_LIST == FS_WIRE_HELLO_FIXED, "HELLO fixed part is 64 bytes");
_Static_assert(FS_WIRE_RAILS_MAX <= UINT8_MAX, "the rail count fits its u8 field");
_Static_assert(FS_WIRE_ADDR_MAX <= UINT16_MAX, "an address length fits its u16 field");
_Static_assert(FS_WIRE_HELLO_MAX <= UINT16_MAX, "HELLO length must fit its u16 field");
_Static_assert(FS_WIRE_HELLO_MAX <= INT_MAX, "HELLO length must fit the int return");
_Static_assert(sizeof(((struct fs_hello *)0)->addr) == FS_WIRE_ADDR_MAX, "addr holds the largest address");

static inline void fs_put_be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline void fs_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline void fs_put_be64(uint8_t *p, uint64_t v)
{
	fs_put_be32(p, (uint32_t)(v >> 32));
	fs_put_be32(p + 4, (uint32_t)v);
}

static inline uint16_t fs_get_be16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

static inline uint32_t fs_get_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t fs_get_be64(const uint8_t *p)
{
	return ((uint64_t)fs_get_be32(p) << 32) | fs_get_be32(p + 4);
}

static inline void fs_put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t fs_get_le32(const uint8_t *p)
{
	return p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/*
 * CRC-32 as in IEEE 802.3 and zlib's crc32(): reflected polynomial
 * 0xEDB88320, register preset to all ones, result complemented. The table
 * is entry i = the register after shifting byte i through eight rounds; it
 * is a constant so there is no initialisation to race on. The unit test
 * recomputes it bit by bit.
 */
static const uint32_t fs_crc32_table[256] = {
	0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
	0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
	0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
	0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
	0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
	0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
	0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
	0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
	0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
	0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
	0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
	0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
	0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
	0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
	0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
	0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
	0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
	0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
	0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
	0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
	0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
	0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
	0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
	0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
	0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
	0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
	0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
	0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
	0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
	0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
	0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
	0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
	0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
	0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
	0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
	0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
	0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
	0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
	0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
	0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
	0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
	0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
	0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

uint32_t fs_wire_crc32(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint32_t crc = 0xffffffffu;

	while (len--)
		crc = fs_crc32_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc ^ 0xffffffffu;
}

/* ---- probe ------------------------------------------------------------ */

static int fs_probe_type_valid(unsigned type)
{
	return type >= FS_PROBE_ASK && type <= FS_PROBE_NO;
}

int fs_wire_probe_encode(const struct fs_probe *probe, uint8_t *buf, size_t len)
{
	if (!fs_probe_type_valid(probe->type) || probe->wait_ms > FS_WIRE_PROBE_WAIT_MAX_MS)
		return -EINVAL;
	if (len < FS_WIRE_PROBE_LEN)
		return -EMSGSIZE;

	fs_put_be32(buf + FS_PROBE_OFF_MAGIC, FS_WIRE_PROBE_MAGIC);
	buf[FS_PROBE_OFF_VERSION] = FS_WIRE_VERSION;
	buf[FS_PROBE_OFF_TYPE] = probe->type;
	fs_put_be16(buf + FS_PROBE_OFF_RESERVED1, 0);
	fs_put_be64(buf + FS_PROBE_OFF_NONCE, probe->nonce);
	fs_put_be32(buf + FS_PROBE_OFF_WAIT_MS, probe->wait_ms);
	fs_put_be16(buf + FS_PROBE_OFF_PORT, probe->client_port);
	fs_put_be16(buf + FS_PROBE_OFF_RESERVED2, 0);
	memcpy(buf + FS_PROBE_OFF_ADDR, probe->client_addr, sizeof(probe->client_addr));
	return FS_WIRE_PROBE_LEN;
}

int fs_wire_probe_decode(const uint8_t *buf, size_t len, struct fs_probe *probe)
{
	/* A datagram is all of the message: a short or long one is foreign. */
	if (len != FS_WIRE_PROBE_LEN)
		return -EBADMSG;
	if (fs_get_be32(buf + FS_PROBE_OFF_MAGIC) != FS_WIRE_PROBE_MAGIC ||
	    buf[FS_PROBE_OFF_VERSION] != FS_WIRE_VERSION || !fs_probe_type_valid(buf[FS_PROBE_OFF_TYPE]) ||
	    fs_get_be16(buf + FS_PROBE_OFF_RESERVED1) != 0 || fs_get_be16(buf + FS_PROBE_OFF_RESERVED2) != 0)
		return -EBADMSG;

	probe->type = buf[FS_PROBE_OFF_TYPE];
	probe->nonce = fs_get_be64(buf + FS_PROBE_OFF_NONCE);
	probe->wait_ms = fs_get_be32(buf + FS_PROBE_OFF_WAIT_MS);
	if (probe->wait_ms > FS_WIRE_PROBE_WAIT_MAX_MS)
		return -EBADMSG;
	probe->client_port = fs_get_be16(buf + FS_PROBE_OFF_PORT);
	memcpy(probe->client_addr, buf + FS_PROBE_OFF_ADDR, sizeof(probe->client_addr));
	return 0;
}

/* ---- HELLO / HELLO-ACK ------------------------------------------------ */

static int fs_hello_magic_valid(uint32_t magic)
{
	return magic == FS_WIRE_HELLO_MAGIC || magic == FS_WIRE_ACK_MAGIC;
}

/* A HELLO carries no verdict, so its status is always FS_NAK_NONE. */
static int fs_hello_status_valid(uint32_t magic, unsigned status)
{
	return status < FS_NAK_MAX_ && (magic == FS_WIRE_ACK_MAGIC || status == FS_NAK_NONE);
}

static int fs_pull_shift_valid(unsigned shift)
{
	return shift == 0 || (shift >= FS_WIRE_PULL_SHIFT_MIN && shift <= FS_WIRE_PULL_SHIFT_MAX);
}

/* Rail I's address in HELLO: rail 0's is addr, the others' more[]. */
static void fs_hello_rail(const struct fs_hello *hello, unsigned i, const uint8_t **addr, uint16_t *len)
{
	*addr = i ? hello->more[i - 1].addr : hello->addr;
	*len = i ? hello->more[i - 1].len : hello->addr_len;
}

int fs_wire_hello_encode(const struct fs_hello *hello, uint8_t *buf, size_t len)
{
	unsigned rails = hello->rails ? hello->rails : 1;
	size_t total = FS_WIRE_HELLO_FIXED + 4, off;

	if (rails > FS_WIRE_RAILS_MAX)
		return -EINVAL;
	for (unsigned i = 0; i < rails; i++) {
		const uint8_t *addr;
		uint16_t alen;

		fs_hello_rail(hello, i, &addr, &alen);
		if (alen > FS_WIRE_ADDR_MAX)
			return -EINVAL;
		total += FS_WIRE_RAIL_HDR + (size_t)alen;
	}
	if (!fs_hello_magic_valid(hello->magic) || !fs_hello_status_valid(hello->magic, hello->status) ||
	    hello->provider >= FS_PROV_MAX_ ||
	    hello->stream_id > FS_STREAM_ID_MAX || !fs_pull_shift_valid(hello->pull_shift) ||
	    hello->window > FS_WIRE_WINDOW_MAX || hello->chunk > FS_WIRE_CHUNK_MAX || hello->sock_fd > FS_WIRE_FD_MAX ||
	    (hello->flags & ~FS_HELLO_FLAGS_KNOWN))
		return -EINVAL;
	if (len < total)
		return -EMSGSIZE;

	fs_put_be32(buf + FS_HELLO_OFF_MAGIC, hello->magic);
	buf[FS_HELLO_OFF_VERSION] = FS_WIRE_VERSION;
	buf[FS_HELLO_OFF_STATUS] = hello->status;
	fs_put_be16(buf + FS_HELLO_OFF_LENGTH, (uint16_t)total);
	fs_put_be64(buf + FS_HELLO_OFF_TOKEN, hello->token);
	fs_put_be64(buf + FS_HELLO_OFF_NONCE, hello->nonce);
	fs_put_be32(buf + FS_HELLO_OFF_STREAM_ID, hello->stream_id);
	fs_put_be32(buf + FS_HELLO_OFF_WINDOW, hello->window);
	fs_put_be32(buf + FS_HELLO_OFF_CHUNK, hello->chunk);
	memcpy(buf + FS_HELLO_OFF_HOST_ID, hello->host_id, sizeof(hello->host_id));
	buf[FS_HELLO_OFF_PROVIDER] = hello->provider;
	buf[FS_HELLO_OFF_PULL_SHIFT] = hello->pull_shift;
	buf[FS_HELLO_OFF_RAILS] = (uint8_t)rails;
	buf[FS_HELLO_OFF_RESERVED] = 0;
	fs_put_be16(buf + FS_HELLO_OFF_BELL_PORT, hello->bell_port);
	fs_put_be32(buf + FS_HELLO_OFF_SOCK_FD, hello->sock_fd);
	fs_put_be16(buf + FS_HELLO_OFF_FLAGS, hello->flags);
	off = FS_HELLO_OFF_RAIL_LIST;
	for (unsigned i = 0; i < rails; i++) {
		const uint8_t *addr;
		uint16_t alen;

		fs_hello_rail(hello, i, &addr, &alen);
		fs_put_be16(buf + off, alen);
		memcpy(buf + off + FS_WIRE_RAIL_HDR, addr, alen);
		off += FS_WIRE_RAIL_HDR + (size_t)alen;
	}
	fs_put_be32(buf + total - 4, fs_wire_crc32(buf, total - 4));
	return (int)total;
}

/*
 * The rail list of a HELLO of TOTAL bytes whose first LEN are in BUF (the
 * count, at FS_HELLO_OFF_RAILS, checked already): each length, as soon as
 * its bytes are there, is at most FS_WIRE_ADDR_MAX, and the entries never
 * reach into the CRC; once the last length is read they must end exactly
 * where the CRC begins. Returns TOTAL, or -EBADMSG.
 */
static int fs_hello_check_rails(const uint8_t *buf, size_t len, size_t total)
{
	size_t off = FS_HELLO_OFF_RAIL_LIST, end = total - 4;
	unsigned rails;

	if (len <= FS_HELLO_OFF_RAILS)
		return (int)total;
	rails = buf[FS_HELLO_OFF_RAILS];
	for (unsigned i = 0; i < rails; i++) {
		size_t alen;

		if (off + FS_WIRE_RAIL_HDR > end)
			return -EBADMSG; /* the lengths overrun the message */
		if (len <= off)
			return (int)total;
		/* the length's high byte alone can be out of range */
		if (buf[off] > (FS_WIRE_ADDR_MAX >> 8))
			return -EBADMSG;
		if (len <= off + 1)
			return (int)total;
		alen = fs_get_be16(buf + off);
		if (alen > FS_WIRE_ADDR_MAX || off + FS_WIRE_RAIL_HDR + alen > end)
			return -EBADMSG;
		off += FS_WIRE_RAIL_HDR + alen;
	}
	return off == end ? (int)total : -EBADMSG;
}

/*
 * Checks every field the first LEN bytes already hold, so that a stream
 * which cannot become a valid message is refused at the first wrong byte
 * rather than after the peer has sent (or failed to send) the rest.
 * Returns the total length once it is known and consistent, 0 while the
 * length field is still incomplete, -EBADMSG on the first violation.
 * Fields are visited in wire order; each check needs only bytes before
 * LEN. The stream id is limited to the 24 bits a fabric tag carries.
 */
static int fs_hello_check_prefix(const uint8_t *buf, size_t len, uint32_t magic)
{
	size_t i, total = 0;

	for (i = 0; i < 4 && i < len; i++)
		if (buf[FS_HELLO_OFF_MAGIC + i] != (uint8_t)(magic >> (24 - 8 * i)))
			return -EBADMSG;
	if (len > FS_HELLO_OFF_VERSION && buf[FS_HELLO_OFF_VERSION] != FS_WIRE_VERSION)
		return -EBADMSG;
	if (len > FS_HELLO_OFF_STATUS && !fs_hello_status_valid(magic, buf[FS_HELLO_OFF_STATUS]))
		return -EBADMSG;
	/* The length's high byte alone can already be out of range. */
	if (len > FS_HELLO_OFF_LENGTH && buf[FS_HELLO_OFF_LENGTH] > (FS_WIRE_HELLO_MAX >> 8))
		return -EBADMSG;
	if (len <= FS_HELLO_OFF_LENGTH + 1)
		return 0;
	total = fs_get_be16(buf + FS_HELLO_OFF_LENGTH);
	if (total < FS_WIRE_HELLO_MIN || total > FS_WIRE_HELLO_MAX)
		return -EBADMSG;
	/* Stream id: its top byte must be clear, so the first byte decides. */
	if (len > FS_HELLO_OFF_STREAM_ID && buf[FS_HELLO_OFF_STREAM_ID] != 0)
		return -EBADMSG;
	if (len >= FS_HELLO_OFF_WINDOW + 4 && fs_get_be32(buf + FS_HELLO_OFF_WINDOW) > FS_WIRE_WINDOW_MAX)
		return -EBADMSG;
	if (len >= FS_HELLO_OFF_CHUNK + 4 && fs_get_be32(buf + FS_HELLO_OFF_CHUNK) > FS_WIRE_CHUNK_MAX)
		return -EBADMSG;
	if (len > FS_HELLO_OFF_PROVIDER && buf[FS_HELLO_OFF_PROVIDER] >= FS_PROV_MAX_)
		return -EBADMSG;
	if (len > FS_HELLO_OFF_PULL_SHIFT && !fs_pull_shift_valid(buf[FS_HELLO_OFF_PULL_SHIFT]))
		return -EBADMSG;
	/* the rail count, and room in the total for that many lengths */
	if (len > FS_HELLO_OFF_RAILS &&
	    (buf[FS_HELLO_OFF_RAILS] < 1 || buf[FS_HELLO_OFF_RAILS] > FS_WIRE_RAILS_MAX ||
	     total < FS_WIRE_HELLO_FIXED + (size_t)buf[FS_HELLO_OFF_RAILS] * FS_WIRE_RAIL_HDR + 4))
		return -EBADMSG;
	if (len > FS_HELLO_OFF_RESERVED && buf[FS_HELLO_OFF_RESERVED] != 0)
		return -EBADMSG;
	/* flags: only the ones this version knows */
	if ((len > FS_HELLO_OFF_FLAGS && buf[FS_HELLO_OFF_FLAGS] != 0) ||
	    (len > FS_HELLO_OFF_FLAGS + 1 && (buf[FS_HELLO_OFF_FLAGS + 1] & ~FS_HELLO_FLAGS_KNOWN) != 0))
		return -EBADMSG;
	/* a descriptor number: its top bit must be clear (FS_WIRE_FD_MAX) */
	if (len > FS_HELLO_OFF_SOCK_FD && buf[FS_HELLO_OFF_SOCK_FD] > (FS_WIRE_FD_MAX >> 24))
		return -EBADMSG;
	return fs_hello_check_rails(buf, len, total);
}

int fs_wire_hello_decode(const uint8_t *buf, size_t len, uint32_t magic, struct fs_hello *hello)
{
	uint8_t crc_bytes[4];
	size_t total, have, i;
	int rc;

	if (!fs_hello_magic_valid(magic))
		return -EINVAL;
	rc = fs_hello_check_prefix(buf, len, magic);
	if (rc <= 0)
		return rc;
	total = (size_t)rc;
	if (len < total - 4)
		return 0;

	/* Everything the CRC covers is here: compare whatever CRC bytes are. */
	fs_put_be32(crc_bytes, fs_wire_crc32(buf, total - 4));
	have = len - (total - 4) < 4 ? len - (total - 4) : 4;
	for (i = 0; i < have; i++)
		if (buf[total - 4 + i] != crc_bytes[i])
			return -EBADMSG;
	if (have < 4)
		return 0;

	/* Bytes past TOTAL belong to whatever follows on the stream. */
	memset(hello, 0, sizeof(*hello));
	hello->magic = magic;
	hello->status = buf[FS_HELLO_OFF_STATUS];
	hello->token = fs_get_be64(buf + FS_HELLO_OFF_TOKEN);
	hello->nonce = fs_get_be64(buf + FS_HELLO_OFF_NONCE);
	hello->stream_id = fs_get_be32(buf + FS_HELLO_OFF_STREAM_ID);
	hello->window = fs_get_be32(buf + FS_HELLO_OFF_WINDOW);
	hello->chunk = fs_get_be32(buf + FS_HELLO_OFF_CHUNK);
	memcpy(hello->host_id, buf + FS_HELLO_OFF_HOST_ID, sizeof(hello->host_id));
	hello->provider = buf[FS_HELLO_OFF_PROVIDER];
	hello->pull_shift = buf[FS_HELLO_OFF_PULL_SHIFT];
	hello->rails = buf[FS_HELLO_OFF_RAILS];
	hello->bell_port = fs_get_be16(buf + FS_HELLO_OFF_BELL_PORT);
	hello->sock_fd = fs_get_be32(buf + FS_HELLO_OFF_SOCK_FD);
	hello->flags = fs_get_be16(buf + FS_HELLO_OFF_FLAGS);
	/* (fs_hello_check_rails bounded every length and their sum) */
	for (size_t r = 0, off = FS_HELLO_OFF_RAIL_LIST; r < hello->rails; r++) {
		uint16_t alen = fs_get_be16(buf + off);
		uint8_t *dst = r ? hello->more[r - 1].addr : hello->addr;

		if (r)
			hello->more[r - 1].len = alen;
		else
			hello->addr_len = alen;
		memcpy(dst, buf + off + FS_WIRE_RAIL_HDR, alen);
		off += FS_WIRE_RAIL_HDR + alen;
	}
	return (int)total;
}

/* ---- doorbell ---------------------------------------------------------- */

int fs_wire_bell_encode(unsigned type, const struct fs_bell_entry *ent, unsigned count, uint8_t *buf, size_t len)
{
	size_t total = FS_WIRE_BELL_HDR + (size_t)count * FS_WIRE_BELL_ENTRY;

	if ((type != FS_BELL_ARM && type != FS_BELL_RING) || count > FS_WIRE_BELL_MAX ||
	    (type == FS_BELL_RING && count != 1))
		return -EINVAL;
	if (len < total)
		return -EMSGSIZE;
	fs_put_be32(buf, FS_WIRE_BELL_MAGIC);
	buf[4] = FS_WIRE_VERSION;
	buf[5] = (uint8_t)type;
	fs_put_be16(buf + 6, (uint16_t)count);
	for (unsigned i = 0; i < count; i++) {
		uint8_t *p = buf + FS_WIRE_BELL_HDR + i * FS_WIRE_BELL_ENTRY;

		fs_put_be32(p, ent[i].stream_id);
		fs_put_be32(p + 4, ent[i].token);
		fs_put_be32(p + 8, ent[i].data_seen);
		fs_put_be32(p + 12, ent[i].ctrl_seen);
	}
	return (int)total;
}

int fs_wire_bell_decode(const uint8_t *buf, size_t len, struct fs_bell_entry *ent, unsigned *count)
{
	unsigned type, n;

	if (len < FS_WIRE_BELL_HDR || fs_get_be32(buf) != FS_WIRE_BELL_MAGIC || buf[4] != FS_WIRE_VERSION)
		return -EBADMSG;
	type = buf[5];
	n = fs_get_be16(buf + 6);
	if ((type != FS_BELL_ARM && type != FS_BELL_RING) || (type == FS_BELL_RING && n != 1) ||
	    n > FS_WIRE_BELL_MAX || len != FS_WIRE_BELL_HDR + (size_t)n * FS_WIRE_BELL_ENTRY)
		return -EBADMSG;
	for (unsigned i = 0; i < n; i++) {
		const uint8_t *p = buf + FS_WIRE_BELL_HDR + i * FS_WIRE_BELL_ENTRY;

		ent[i].stream_id = fs_get_be32(p);
		ent[i].token = fs_get_be32(p + 4);
		ent[i].data_seen = fs_get_be32(p + 8);
		ent[i].ctrl_seen = fs_get_be32(p + 12);
	}
	*count = n;
	return (int)type;
}

/* ---- names ------------------------------------------------------------ */

/* by FS_PROV_*: libfabric's names for the providers (fs_fabric_prov_name) */
static const char fs_provider_names[FS_PROV_MAX_][5] = { "none", "shm", "efa", "tcp", "net" };
_Static_assert(FS_PROV_NONE == 0 && FS_PROV_SHM == 1 && FS_PROV_EFA == 2 && FS_PROV_TCP == 3 &&
		       FS_PROV_NET == 4 && FS_PROV_MAX_ == 5,
	       "fs_provider_names follows FS_PROV_*");

static const char *const fs_nak_names[FS_NAK_MAX_] = {
	[FS_NAK_NONE] = "none",
	[FS_NAK_PROVIDER] = "provider",
	[FS_NAK_RESOURCES] = "resources",
	[FS_NAK_RULE] = "rule",
	[FS_NAK_VERSION] = "version",
	[FS_NAK_HOST] = "host",
	[FS_NAK_EVENT_LOOP] = "event-loop",
	[FS_NAK_USER] = "another user",
	[FS_NAK_PEER] = "a fabric address not of the connection's process",
};

const char *fs_wire_provider_name(unsigned provider)
{
	return provider < FS_PROV_MAX_ ? fs_provider_names[provider] : "unknown";
}

const char *fs_nak_name(unsigned nak)
{
	return nak < FS_NAK_MAX_ ? fs_nak_names[nak] : "unknown";
}

/* ---- fabric message header -------------------------------------------- */

void fs_wire_hdr_encode(const struct fs_wire_msg_hdr *hdr, void *buf)
{
	uint8_t *p = buf;

	fs_put_le32(p + 0, hdr->seq);
	fs_put_le32(p + 4, hdr->freed);
	fs_put_le32(p + 8, hdr->ctrl_ack);
	fs_put_le32(p + 12, (hdr->len & FS_WIRE_HDR_LEN_MAX) | ((uint32_t)((hdr->grant - 1) & 0xff) << 24));
}

void fs_wire_hdr_decode(const void *buf, struct fs_wire_msg_hdr *hdr)
{
	const uint8_t *p = buf;

	hdr->seq = fs_get_le32(p + 0);
	hdr->freed = fs_get_le32(p + 4);
	hdr->ctrl_ack = fs_get_le32(p + 8);
	hdr->len = fs_get_le32(p + 12) & FS_WIRE_HDR_LEN_MAX;
	hdr->grant = (fs_get_le32(p + 12) >> 24) + 1;
}

void fs_wire_ctrl_tag_encode(uint64_t tag, void *buf)
{
	uint8_t *p = buf;

	fs_put_le32(p + 0, (uint32_t)tag);
	fs_put_le32(p + 4, (uint32_t)(tag >> 32));
}

uint64_t fs_wire_ctrl_tag_decode(const void *buf)
{
	const uint8_t *p = buf;

	return (uint64_t)fs_get_le32(p + 0) | (uint64_t)fs_get_le32(p + 4) << 32;
}
