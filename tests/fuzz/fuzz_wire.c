/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer targets for every decoder of what a peer or a stranger sends
 * (core/wire.c): the probe datagram, the HELLO and HELLO-ACK, the doorbell
 * datagram, and the prefix of a fabric message (tag and header). One source,
 * one executable per target (FUZZ_TARGET_* picks it, tests/fuzz/CMakeLists.txt).
 *
 * Besides "no crash, no sanitizer report" each target checks the round trip:
 * whatever decodes re-encodes to exactly the bytes it came from (the
 * encodings are canonical: fixed fields, zero reserved bytes, a CRC), and
 * every decoded number is within the bound its decoder promises. A failed
 * check aborts, which libFuzzer reports as a crash with the input saved.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"

#define FZ_CHECK(cond)                                                                                                 \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                      \
			abort();                                                                                       \
		}                                                                                                      \
	} while (0)

#if defined(FUZZ_TARGET_PROBE)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fs_probe probe;
	uint8_t again[FS_WIRE_PROBE_LEN];

	if (fs_wire_probe_decode(data, size, &probe) != 0)
		return 0;
	FZ_CHECK(size == FS_WIRE_PROBE_LEN);
	FZ_CHECK(probe.type >= FS_PROBE_ASK && probe.type <= FS_PROBE_NO);
	FZ_CHECK(probe.wait_ms <= FS_WIRE_PROBE_WAIT_MAX_MS);
	FZ_CHECK(fs_wire_probe_encode(&probe, again, sizeof(again)) == FS_WIRE_PROBE_LEN);
	FZ_CHECK(memcmp(again, data, FS_WIRE_PROBE_LEN) == 0);
	return 0;
}

#elif defined(FUZZ_TARGET_HELLO)
/* The first input byte picks the magic the receiver expects (a server reads
 * HELLOs, a client HELLO-ACKs); the rest is what came over TCP. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fs_hello hello;
	uint8_t again[FS_WIRE_HELLO_MAX];
	uint32_t magic;
	int len, len2;

	if (size < 1)
		return 0;
	magic = data[0] & 1 ? FS_WIRE_ACK_MAGIC : FS_WIRE_HELLO_MAGIC;
	data++;
	size--;
	memset(&hello, 0, sizeof(hello));
	len = fs_wire_hello_decode(data, size, magic, &hello);
	FZ_CHECK(len == 0 || len == -EBADMSG || (len >= FS_WIRE_HELLO_MIN && len <= FS_WIRE_HELLO_MAX));
	if (len <= 0)
		return 0;
	FZ_CHECK((size_t)len <= size);
	FZ_CHECK(hello.magic == magic);
	FZ_CHECK(hello.provider < FS_PROV_MAX_);
	FZ_CHECK(hello.status < FS_NAK_MAX_);
	FZ_CHECK(hello.addr_len <= FS_WIRE_ADDR_MAX);
	FZ_CHECK(hello.rails >= 1 && hello.rails <= FS_WIRE_RAILS_MAX);
	for (unsigned i = 1; i < hello.rails; i++)
		FZ_CHECK(hello.more[i - 1].len <= FS_WIRE_ADDR_MAX);
	FZ_CHECK(hello.window <= FS_WIRE_WINDOW_MAX && hello.chunk <= FS_WIRE_CHUNK_MAX);
	FZ_CHECK(hello.stream_id <= FS_STREAM_ID_MAX);
	FZ_CHECK(hello.pull_shift == 0 ||
		 (hello.pull_shift >= FS_WIRE_PULL_SHIFT_MIN && hello.pull_shift <= FS_WIRE_PULL_SHIFT_MAX));
	len2 = fs_wire_hello_encode(&hello, again, sizeof(again));
	FZ_CHECK(len2 == len);
	FZ_CHECK(memcmp(again, data, (size_t)len) == 0);
	/* every proper prefix of a whole message asks for more */
	FZ_CHECK(fs_wire_hello_decode(data, (size_t)len - 1, magic, &hello) == 0);
	return 0;
}

#elif defined(FUZZ_TARGET_BELL)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fs_bell_entry ent[FS_WIRE_BELL_MAX];
	uint8_t again[FS_WIRE_BELL_LEN_MAX];
	unsigned count = 0;
	int type = fs_wire_bell_decode(data, size, ent, &count);

	FZ_CHECK(type == -EBADMSG || type == FS_BELL_ARM || type == FS_BELL_RING);
	if (type < 0)
		return 0;
	FZ_CHECK(count <= FS_WIRE_BELL_MAX);
	FZ_CHECK(type != FS_BELL_RING || count == 1); /* a RING names its one stream */
	FZ_CHECK(size == FS_WIRE_BELL_HDR + (size_t)count * FS_WIRE_BELL_ENTRY);
	FZ_CHECK(fs_wire_bell_encode((unsigned)type, ent, count, again, sizeof(again)) == (int)size);
	FZ_CHECK(memcmp(again, data, size) == 0);
	return 0;
}

#elif defined(FUZZ_TARGET_MSG)
/* The prefix every fabric message carries: the control tag copy and the
 * 16-byte header. Fixed-size fields: every input decodes; the check is the
 * round trip and the tag's field split. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fs_wire_msg_hdr hdr;
	uint8_t again[FS_WIRE_MSG_PREFIX];
	uint64_t tag;

	if (size < FS_WIRE_MSG_PREFIX)
		return 0;
	tag = fs_wire_ctrl_tag_decode(data);
	fs_wire_hdr_decode(data + FS_WIRE_CTRL_TAG_LEN, &hdr);
	fs_wire_ctrl_tag_encode(tag, again);
	fs_wire_hdr_encode(&hdr, again + FS_WIRE_CTRL_TAG_LEN);
	FZ_CHECK(memcmp(again, data, FS_WIRE_MSG_PREFIX) == 0);
	FZ_CHECK(fs_tag_class(tag) <= 3);
	FZ_CHECK(fs_tag_stream(tag) <= FS_STREAM_ID_MAX);
	FZ_CHECK(fs_tag_make(fs_tag_class(tag), fs_tag_kind(tag), fs_tag_stream(tag), fs_tag_token(tag)) == tag);
	return 0;
}

#else
#error "define one FUZZ_TARGET_*"
#endif
