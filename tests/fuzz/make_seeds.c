/* SPDX-License-Identifier: MIT */
/*
 * Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/TARGET/):
 * well-formed messages as fabsock sends them, so that the fuzzer starts
 * past the magic, version and CRC checks. Run once to make the committed
 * files: make_seeds DIR.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"

static void put(const char *dir, const char *target, const char *name, const void *buf, size_t len)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/%s", dir, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
}

/* Writes the CRC of the LEN-byte HELLO at BUF over what precedes it. */
static void seal(uint8_t *buf, size_t len)
{
	uint32_t crc = fs_wire_crc32(buf, len - 4);

	buf[len - 4] = (uint8_t)(crc >> 24);
	buf[len - 3] = (uint8_t)(crc >> 16);
	buf[len - 2] = (uint8_t)(crc >> 8);
	buf[len - 1] = (uint8_t)crc;
}

int main(int argc, char **argv)
{
	uint8_t buf[FS_WIRE_HELLO_MAX + 8];
	const char *dir = argc > 1 ? argv[1] : "corpus";
	int len;

	for (unsigned type = FS_PROBE_ASK; type <= FS_PROBE_NO; type++) {
		struct fs_probe p = { .type = (uint8_t)type, .nonce = 0x0123456789abcdefull * type, .wait_ms = 250,
				      .client_port = 40000, .client_addr = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 1 } };
		char name[32];

		snprintf(name, sizeof(name), "type%u", type);
		if (fs_wire_probe_encode(&p, buf, sizeof(buf)) != FS_WIRE_PROBE_LEN)
			return 1;
		put(dir, "probe", name, buf, FS_WIRE_PROBE_LEN);
	}
	{
		static const char shm[] = "fi_shm://fabsock-4026531836-1234-0badcafe:0:0";
		struct fs_hello h = { .magic = FS_WIRE_HELLO_MAGIC, .token = 0x1111222233334444ull, .nonce = 42,
				      .stream_id = 1, .window = 8, .chunk = 131072, .provider = FS_PROV_SHM,
				      .pull_shift = 16, .bell_port = 45000, .sock_fd = 7 };

		h.addr_len = sizeof(shm);
		memcpy(h.addr, shm, sizeof(shm));
		/* the first byte picks the magic (even: HELLO, odd: ACK) */
		buf[0] = 0;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		if (len <= 0)
			return 1;
		put(dir, "hello", "hello_shm", buf, (size_t)len + 1);
		h.magic = FS_WIRE_ACK_MAGIC;
		h.status = FS_NAK_NONE;
		buf[0] = 1;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		put(dir, "hello", "ack_shm", buf, (size_t)len + 1);
		h.status = FS_NAK_USER;
		h.provider = FS_PROV_NONE;
		h.addr_len = 0;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		put(dir, "hello", "nak_user", buf, (size_t)len + 1);
		h.magic = FS_WIRE_HELLO_MAGIC;
		h.status = 0;
		h.provider = FS_PROV_TCP;
		h.addr_len = 16;
		memset(h.addr, 0x5a, 16);
		buf[0] = 0;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		put(dir, "hello", "hello_tcp", buf, (size_t)len + 1);
		/* wire 12: one address per rail; 1 and 16 rails as sent, then
		 * what no encoder writes (0 and 17 rails, a length that runs
		 * into the CRC), so the fuzzer starts at each bound */
		h.rails = 1;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		put(dir, "hello", "rails1", buf, (size_t)len + 1);
		h.rails = FS_WIRE_RAILS_MAX;
		for (unsigned i = 0; i < FS_WIRE_RAILS_MAX - 1; i++) {
			h.more[i].len = 16;
			memset(h.more[i].addr, (int)(0x10 + i), 16);
		}
		buf[0] = 1;
		h.magic = FS_WIRE_ACK_MAGIC;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		put(dir, "hello", "rails16", buf, (size_t)len + 1);
		h.magic = FS_WIRE_HELLO_MAGIC;
		buf[0] = 0;
		h.rails = 2;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		/* the second length one past the message's end, CRC made right */
		buf[1 + FS_WIRE_HELLO_FIXED + 2 + 16] = 0;
		buf[1 + FS_WIRE_HELLO_FIXED + 2 + 16 + 1] = 17;
		seal(buf + 1, (size_t)len);
		put(dir, "hello", "rails_overrun", buf, (size_t)len + 1);
		/* 0 and 17 rails: the count byte changed, the CRC made right */
		h.rails = 1;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		buf[1 + 54] = 0;
		seal(buf + 1, (size_t)len);
		put(dir, "hello", "rails0", buf, (size_t)len + 1);
		h.rails = FS_WIRE_RAILS_MAX;
		len = fs_wire_hello_encode(&h, buf + 1, sizeof(buf) - 1);
		/* a 17th entry: an empty address, the total grown by its length */
		memmove(buf + 1 + len - 4 + 2, buf + 1 + len - 4, 4);
		buf[1 + len - 4] = 0;
		buf[1 + len - 3] = 0;
		len += 2;
		buf[1 + 54] = FS_WIRE_RAILS_MAX + 1;
		buf[1 + 6] = (uint8_t)(len >> 8);
		buf[1 + 7] = (uint8_t)len;
		seal(buf + 1, (size_t)len);
		put(dir, "hello", "rails17", buf, (size_t)len + 1);
	}
	{
		struct fs_bell_entry ent[3] = { { 1, 0xdeadbeef, 10, 2 }, { 2, 0x12345678, 0, 0 }, { 77, 1, 5, 5 } };

		len = fs_wire_bell_encode(FS_BELL_ARM, ent, 3, buf, sizeof(buf));
		put(dir, "bell", "arm3", buf, (size_t)len);
		len = fs_wire_bell_encode(FS_BELL_RING, ent, 1, buf, sizeof(buf));
		put(dir, "bell", "ring", buf, (size_t)len);
	}
	{
		struct fs_wire_msg_hdr hdr = { .seq = 7, .freed = 3, .ctrl_ack = 1, .len = 65536 };

		fs_wire_ctrl_tag_encode(fs_tag_make(FS_CLASS_CTRL, FS_MSG_CREDIT, 5, 0xabcdef01), buf);
		fs_wire_hdr_encode(&hdr, buf + FS_WIRE_CTRL_TAG_LEN);
		put(dir, "msg", "credit", buf, FS_WIRE_MSG_PREFIX);
		fs_wire_ctrl_tag_encode(fs_tag_pull(9, 300, 0x77), buf);
		put(dir, "msg", "pull", buf, FS_WIRE_MSG_PREFIX);
	}
	return 0;
}
