/* SPDX-License-Identifier: MIT */
/*
 * fs_stream: a verifying TCP stream generator for the end-to-end tests. The
 * client opens K connections to the server and, per connection, sends and/or
 * receives N bytes of a deterministic pseudo-random stream keyed by (seed,
 * connection index, direction), so the receiver checks every byte, reports the
 * offset of the first mismatch, and requires EOF exactly after N bytes. Writes
 * and reads use random sizes and a random mix of send/write/writev/sendmsg and
 * recv/read/readv/recvmsg with partial-write handling, all on plain blocking
 * sockets (threads, never poll or non-blocking mode). Each connection starts
 * with a 32-byte hello from the client carrying its index and options (after
 * the server's banner line when --banner asks for a server-speaks-first
 * protocol). At the end each side prints one line per connection with byte
 * counts, FNV-1a 64 checksums and the kernel's TCP_INFO byte counters, then
 * wall time, MiB/s, VmHWM and `result ok` or `result FAIL <reason>`.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <grp.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define FS_STREAM_HELLO_MAGIC 0x31535346u /* "FSS1" little-endian */
#define FS_STREAM_HELLO_SIZE 32
#define FS_STREAM_BANNER "FABSOCK-STREAM-BANNER v1 server speaks first\n"
#define FS_STREAM_FLAG_BIDIR 0x1u
#define FS_STREAM_FLAG_ECHO 0x2u
#define FS_STREAM_FLAG_REVERSE 0x4u
#define FS_STREAM_FLAG_BANNER 0x8u
#define FS_STREAM_MAX_STREAMS 1024
#define FS_STREAM_SLOW_CHUNK 16384

enum fs_direction { FS_DIR_CLIENT_TO_SERVER = 0, FS_DIR_SERVER_TO_CLIENT = 1 };

struct fs_stream_options {
	bool is_server;
	const char *host;
	const char *port;
	const char *bind_address;
	unsigned streams;
	uint64_t bytes;
	bool bidir, echo, reverse, banner, ipv6, slow_reader;
	size_t max_write;
	uint64_t seed;
	uint64_t slow_rate; /* bytes per second per connection */
	unsigned hold_ms;
	unsigned runs;
	unsigned timeout_s;
	const char *pidfile;
	const char *ready_file;
	const char *setuid_user; /* server: drop to this user after listen(); client: before connecting */
	size_t read_size;        /* 0: reads of random sizes up to max_write; else exactly this much each */
};

/* What one connection did; filled by its threads, printed by main. */
struct fs_stream_conn {
	int fd;
	unsigned index;
	uint64_t sent, received;
	uint64_t sum_tx, sum_rx;
	uint64_t tcp_bytes_received, tcp_bytes_acked;
	bool done;
};

/* Arguments of one direction's worker thread. */
struct fs_stream_worker {
	struct fs_stream_conn *conn;
	enum fs_direction direction;
	bool sending;
};

static struct fs_stream_options options = {
	.port = "0", .streams = 1, .bytes = 1 << 20, .max_write = 262144,
	.seed = 1, .slow_rate = 32u << 20, .runs = 1, .timeout_s = 600,
};

/* ---- time and deterministic data ---------------------------------------- */

static double fs_now(void)
{
	return harness_now_ms() / 1000;
}

static uint64_t fs_stream_key(unsigned conn_index, enum fs_direction direction)
{
	return harness_splitmix64(options.seed * 0x100000001B3ull ^ ((uint64_t)conn_index << 8) ^ (uint64_t)direction);
}

/* xorshift64* for the sizes and call choices (not the data). */
static uint64_t fs_random_next(uint64_t *state)
{
	uint64_t value = *state;
	value ^= value >> 12;
	value ^= value << 25;
	value ^= value >> 27;
	*state = value;
	return value * 0x2545F4914F6CDD1Dull;
}

static size_t fs_random_size(uint64_t *state, size_t max)
{
	return (size_t)(fs_random_next(state) % max) + 1;
}

/* ---- blocking I/O helpers ---------------------------------------------- */

/* One write call of a randomly chosen kind; returns its result. */
static ssize_t fs_write_some(int fd, const unsigned char *data, size_t length, uint64_t *random_state)
{
	struct iovec parts[3];
	int part_count = 0;
	size_t first, second;

	switch (fs_random_next(random_state) % 4) {
	case 0:
		return send(fd, data, length, MSG_NOSIGNAL);
	case 1:
		return write(fd, data, length);
	default:
		first = length > 2 ? fs_random_size(random_state, length - 1) : length;
		second = length - first > 1 ? fs_random_size(random_state, length - first - 1) : length - first;
		parts[part_count++] = (struct iovec){ (void *)data, first };
		if (second)
			parts[part_count++] = (struct iovec){ (void *)(data + first), second };
		if (length - first - second)
			parts[part_count++] = (struct iovec){ (void *)(data + first + second), length - first - second };
		if (fs_random_next(random_state) & 1)
			return writev(fd, parts, part_count);
		struct msghdr message = { .msg_iov = parts, .msg_iovlen = (size_t)part_count };
		return sendmsg(fd, &message, MSG_NOSIGNAL);
	}
}

/* One read call of a randomly chosen kind into a contiguous buffer. */
static ssize_t fs_read_some(int fd, unsigned char *buffer, size_t length, uint64_t *random_state)
{
	struct iovec parts[3];
	int part_count = 0;
	size_t first, second;

	switch (fs_random_next(random_state) % 4) {
	case 0:
		return recv(fd, buffer, length, 0);
	case 1:
		return read(fd, buffer, length);
	default:
		first = length > 2 ? fs_random_size(random_state, length - 1) : length;
		second = length - first > 1 ? fs_random_size(random_state, length - first - 1) : length - first;
		parts[part_count++] = (struct iovec){ buffer, first };
		if (second)
			parts[part_count++] = (struct iovec){ buffer + first, second };
		if (length - first - second)
			parts[part_count++] = (struct iovec){ buffer + first + second, length - first - second };
		if (fs_random_next(random_state) & 1)
			return readv(fd, parts, part_count);
		struct msghdr message = { .msg_iov = parts, .msg_iovlen = (size_t)part_count };
		return recvmsg(fd, &message, 0);
	}
}

/* Writes all of data, handling partial writes; 0 or -errno. */
static int fs_write_all(int fd, const unsigned char *data, size_t length, uint64_t *random_state)
{
	size_t done = 0;
	while (done < length) {
		ssize_t result = fs_write_some(fd, data + done, length - done, random_state);
		if (result < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (result == 0)
			return -EIO;
		done += (size_t)result;
	}
	return 0;
}

/* ---- per-direction workers --------------------------------------------- */

static void fs_stream_abort_conn(struct fs_stream_conn *conn)
{
	shutdown(conn->fd, SHUT_RDWR); /* wakes the other direction's thread */
}

static const char *fs_direction_name(enum fs_direction direction)
{
	return direction == FS_DIR_CLIENT_TO_SERVER ? "c2s" : "s2c";
}

/* Sends the direction's N pattern bytes, then shutdown(SHUT_WR). */
static void fs_stream_send_direction(struct fs_stream_conn *conn, enum fs_direction direction)
{
	uint64_t key = fs_stream_key(conn->index, direction);
	uint64_t random_state = harness_splitmix64(key ^ 0x5e4d) | 1;
	uint64_t hash = HARNESS_FNV1A_OFFSET;
	unsigned char *buffer = malloc(options.max_write);
	int result;

	if (!buffer) {
		harness_fail("conn %u: out of memory", conn->index);
		return;
	}
	while (conn->sent < options.bytes && !harness_failures()) {
		size_t length = fs_random_size(&random_state, options.max_write);
		if (length > options.bytes - conn->sent)
			length = (size_t)(options.bytes - conn->sent);
		harness_pattern_fill(key, conn->sent, buffer, length);
		hash = harness_fnv1a(hash, buffer, length);
		result = fs_write_all(conn->fd, buffer, length, &random_state);
		if (result < 0) {
			harness_fail("conn %u %s: write failed at offset %" PRIu64 ": %s", conn->index,
				       fs_direction_name(direction), conn->sent, strerror(-result));
			fs_stream_abort_conn(conn);
			break;
		}
		conn->sent += length;
	}
	conn->sum_tx = hash;
	if (shutdown(conn->fd, SHUT_WR) < 0 && !harness_failures())
		harness_fail("conn %u: shutdown(SHUT_WR): %s", conn->index, strerror(errno));
	free(buffer);
}

/* Undoes harness_splitmix64 (each of its steps is invertible). */
static uint64_t fs_unsplitmix64(uint64_t value)
{
	/* multiplicative inverses mod 2^64 of splitmix64's two multipliers */
	const uint64_t inv1 = 0x96DE1B173F119089ull, inv2 = 0x319642B2D24D8EC3ull;

	value ^= value >> 31 ^ value >> 62;
	value *= inv2;
	value ^= value >> 27 ^ value >> 54;
	value *= inv1;
	value ^= value >> 30 ^ value >> 60;
	return value - 0x9E3779B97F4A7C15ull;
}

/* Where the 8 bytes at WORD (a received word at a multiple of 8 in its
 * stream) were written: which connection's stream, which direction, which
 * offset; "zeros" or "no stream's" when none. For a mismatch report: a
 * wrong byte from another offset or another stream tells a misplaced or
 * reused buffer from a lost or never-written one. */
static void fs_stream_locate(const unsigned char *word, char *out, size_t out_len)
{
	uint64_t value = 0, zero = 0;

	for (unsigned i = 0; i < 8; i++) {
		value |= (uint64_t)word[i] << (8 * i);
		zero |= word[i];
	}
	if (!zero) {
		snprintf(out, out_len, "zeros");
		return;
	}
	uint64_t base = fs_unsplitmix64(value);
	for (unsigned c = 0; c < options.streams; c++)
		for (unsigned d = 0; d < 2; d++) {
			uint64_t index = base - harness_splitmix64(fs_stream_key(c, (enum fs_direction)d));
			if (index < (options.bytes + 7) / 8) {
				snprintf(out, out_len, "conn %u %s offset %" PRIu64, c,
					 fs_direction_name((enum fs_direction)d), index * 8);
				return;
			}
		}
	snprintf(out, out_len, "no stream's");
}

/* Reports the mismatch at AT of BUFFER (LENGTH bytes read at stream offset
 * OFFSET): how far the wrong bytes run, and where the whole words among
 * them (up to 4) came from. */
static void fs_stream_report_mismatch(struct fs_stream_conn *conn, enum fs_direction direction, uint64_t key,
				      const unsigned char *buffer, size_t length, size_t at)
{
	uint64_t offset = conn->received;
	size_t end = at;
	char where[4][64];
	unsigned found = 0;

	while (end < length && buffer[end] != harness_pattern_byte(key, offset + end))
		end++;
	for (size_t i = at + (8 - (offset + at) % 8) % 8; i + 8 <= length && i < end && found < 4; i += 8) {
		fs_stream_locate(buffer + i, where[found], sizeof(where[found]));
		found++;
	}
	harness_fail("conn %u %s: data mismatch at offset %" PRIu64 " (got 0x%02x, want 0x%02x; %zu wrong bytes "
		     "from there, in a read of %zu at offset %" PRIu64 "; its words are %s%s%s%s%s%s%s)",
		     conn->index, fs_direction_name(direction), offset + at, buffer[at],
		     harness_pattern_byte(key, offset + at), end - at, length, offset, found ? where[0] : "(none whole)",
		     found > 1 ? ", " : "", found > 1 ? where[1] : "", found > 2 ? ", " : "", found > 2 ? where[2] : "",
		     found > 3 ? ", " : "", found > 3 ? where[3] : "");
}

/* Slow reader pacing: sleeps until `received` bytes are due at the rate. */
static void fs_stream_pace(double start, uint64_t received)
{
	double due = start + (double)received / (double)options.slow_rate;
	harness_sleep_ms((due - fs_now()) * 1000);
}

/* Receives and verifies the direction's N bytes, then requires EOF. */
static void fs_stream_receive_direction(struct fs_stream_conn *conn, enum fs_direction direction)
{
	uint64_t key = fs_stream_key(conn->index, direction);
	uint64_t random_state = harness_splitmix64(key ^ 0x7ead) | 1;
	uint64_t hash = HARNESS_FNV1A_OFFSET;
	size_t max_read = options.read_size ? options.read_size
			  : options.slow_reader && options.max_write > FS_STREAM_SLOW_CHUNK ? FS_STREAM_SLOW_CHUNK
											     : options.max_write;
	unsigned char *buffer = malloc(max_read);
	double start = fs_now();

	if (!buffer) {
		harness_fail("conn %u: out of memory", conn->index);
		goto out;
	}
	for (;;) {
		size_t length = options.read_size ? options.read_size : fs_random_size(&random_state, max_read);
		ssize_t result = fs_read_some(conn->fd, buffer, length, &random_state);
		if (result < 0) {
			if (errno == EINTR)
				continue;
			harness_fail("conn %u %s: read failed at offset %" PRIu64 ": %s", conn->index,
				       fs_direction_name(direction), conn->received, strerror(errno));
			fs_stream_abort_conn(conn);
			goto out;
		}
		if (result == 0)
			break;
		if (conn->received + (uint64_t)result > options.bytes) {
			harness_fail("conn %u %s: %" PRIu64 " bytes beyond the expected %" PRIu64, conn->index,
				       fs_direction_name(direction), conn->received + (uint64_t)result - options.bytes,
				       options.bytes);
			fs_stream_abort_conn(conn);
			goto out;
		}
		size_t at = harness_pattern_mismatch(key, conn->received, buffer, (size_t)result);
		if (at != (size_t)result) {
			fs_stream_report_mismatch(conn, direction, key, buffer, (size_t)result, at);
			fs_stream_abort_conn(conn);
			goto out;
		}
		hash = harness_fnv1a(hash, buffer, (size_t)result);
		conn->received += (uint64_t)result;
		if (options.slow_reader)
			fs_stream_pace(start, conn->received);
	}
	if (conn->received != options.bytes)
		harness_fail("conn %u %s: EOF after %" PRIu64 " bytes, expected %" PRIu64, conn->index,
			       fs_direction_name(direction), conn->received, options.bytes);
out:
	conn->sum_rx = hash;
	free(buffer);
}

/* Server side of --echo: verifies the client's stream and writes it back. */
static void fs_stream_echo(struct fs_stream_conn *conn)
{
	uint64_t key = fs_stream_key(conn->index, FS_DIR_CLIENT_TO_SERVER);
	uint64_t random_state = harness_splitmix64(key ^ 0xec40) | 1;
	uint64_t hash = HARNESS_FNV1A_OFFSET;
	unsigned char *buffer = malloc(options.max_write);
	int result;

	if (!buffer) {
		harness_fail("conn %u: out of memory", conn->index);
		goto out;
	}
	for (;;) {
		ssize_t length = fs_read_some(conn->fd, buffer, fs_random_size(&random_state, options.max_write),
					      &random_state);
		if (length < 0) {
			if (errno == EINTR)
				continue;
			harness_fail("conn %u echo: read failed at offset %" PRIu64 ": %s", conn->index,
				       conn->received, strerror(errno));
			goto out;
		}
		if (length == 0)
			break;
		if (conn->received + (uint64_t)length > options.bytes) {
			harness_fail("conn %u echo: bytes beyond the expected %" PRIu64, conn->index, options.bytes);
			goto out;
		}
		size_t at = harness_pattern_mismatch(key, conn->received, buffer, (size_t)length);
		if (at != (size_t)length) {
			fs_stream_report_mismatch(conn, FS_DIR_CLIENT_TO_SERVER, key, buffer, (size_t)length, at);
			goto out;
		}
		hash = harness_fnv1a(hash, buffer, (size_t)length);
		conn->received += (uint64_t)length;
		result = fs_write_all(conn->fd, buffer, (size_t)length, &random_state);
		if (result < 0) {
			harness_fail("conn %u echo: write failed: %s", conn->index, strerror(-result));
			goto out;
		}
		conn->sent += (uint64_t)length;
	}
	if (conn->received != options.bytes)
		harness_fail("conn %u echo: EOF after %" PRIu64 " bytes, expected %" PRIu64, conn->index,
			       conn->received, options.bytes);
	shutdown(conn->fd, SHUT_WR);
out:
	if (harness_failures())
		fs_stream_abort_conn(conn);
	conn->sum_rx = hash;
	conn->sum_tx = hash;
	free(buffer);
}

static void *fs_stream_worker_main(void *argument)
{
	struct fs_stream_worker *worker = argument;
	if (worker->sending)
		fs_stream_send_direction(worker->conn, worker->direction);
	else
		fs_stream_receive_direction(worker->conn, worker->direction);
	return NULL;
}

/* Runs the data phase of one connection from `is_server`'s point of view. */
static void fs_stream_run_data(struct fs_stream_conn *conn, bool is_server)
{
	bool client_sends = !options.reverse;
	bool server_sends = options.reverse || options.bidir || options.echo;
	bool we_send = is_server ? server_sends : client_sends;
	bool we_receive = is_server ? client_sends : server_sends;
	enum fs_direction send_direction = is_server ? FS_DIR_SERVER_TO_CLIENT : FS_DIR_CLIENT_TO_SERVER;
	enum fs_direction receive_direction = is_server ? FS_DIR_CLIENT_TO_SERVER : FS_DIR_SERVER_TO_CLIENT;

	if (is_server && options.echo) {
		fs_stream_echo(conn);
		return;
	}
	if (!is_server && options.echo)
		receive_direction = FS_DIR_CLIENT_TO_SERVER; /* the echo is our own stream */

	if (we_send && we_receive) {
		struct fs_stream_worker sender = { conn, send_direction, true };
		pthread_t sender_thread;
		if (pthread_create(&sender_thread, NULL, fs_stream_worker_main, &sender) != 0) {
			harness_fail("conn %u: pthread_create failed", conn->index);
			return;
		}
		fs_stream_receive_direction(conn, receive_direction);
		pthread_join(sender_thread, NULL);
	} else if (we_send) {
		fs_stream_send_direction(conn, send_direction);
		/* Wait for the peer's EOF so we close only after it saw everything. */
		unsigned char byte;
		ssize_t result;
		do
			result = recv(conn->fd, &byte, 1, 0);
		while (result < 0 && errno == EINTR);
		if (result > 0)
			harness_fail("conn %u: unexpected data from the receiving side", conn->index);
	} else {
		/* Our EOF tells the sender everything arrived, so it comes last. */
		fs_stream_receive_direction(conn, receive_direction);
		shutdown(conn->fd, SHUT_WR);
	}
}

/* Takes TCP_INFO just before close (after the optional idle hold). */
static void fs_stream_finish_conn(struct fs_stream_conn *conn)
{
	struct tcp_info info;
	socklen_t length = sizeof(info);

	if (options.hold_ms)
		harness_sleep_ms(options.hold_ms);
	memset(&info, 0, sizeof(info));
	if (getsockopt(conn->fd, IPPROTO_TCP, TCP_INFO, &info, &length) == 0) {
		conn->tcp_bytes_received = info.tcpi_bytes_received;
		conn->tcp_bytes_acked = info.tcpi_bytes_acked;
	} else {
		harness_fail("conn %u: getsockopt(TCP_INFO): %s", conn->index, strerror(errno));
	}
	close(conn->fd);
	conn->done = true;
}

static uint32_t fs_stream_flags(void)
{
	return (options.bidir ? FS_STREAM_FLAG_BIDIR : 0) | (options.echo ? FS_STREAM_FLAG_ECHO : 0) |
	       (options.reverse ? FS_STREAM_FLAG_REVERSE : 0) | (options.banner ? FS_STREAM_FLAG_BANNER : 0);
}

static void fs_put_u32(unsigned char *at, uint32_t value)
{
	for (int i = 0; i < 4; i++)
		at[i] = (unsigned char)(value >> (8 * i));
}

static void fs_put_u64(unsigned char *at, uint64_t value)
{
	for (int i = 0; i < 8; i++)
		at[i] = (unsigned char)(value >> (8 * i));
}

static uint32_t fs_get_u32(const unsigned char *at)
{
	uint32_t value = 0;
	for (int i = 3; i >= 0; i--)
		value = (value << 8) | at[i];
	return value;
}

static uint64_t fs_get_u64(const unsigned char *at)
{
	uint64_t value = 0;
	for (int i = 7; i >= 0; i--)
		value = (value << 8) | at[i];
	return value;
}

/*
 * Hello, client to server, little-endian: magic u32, connection index u32,
 * streams u32, flags u32, bytes u64, seed u64 (32 bytes).
 */
static void fs_stream_encode_hello(unsigned char *hello, unsigned conn_index)
{
	fs_put_u32(hello, FS_STREAM_HELLO_MAGIC);
	fs_put_u32(hello + 4, conn_index);
	fs_put_u32(hello + 8, options.streams);
	fs_put_u32(hello + 12, fs_stream_flags());
	fs_put_u64(hello + 16, options.bytes);
	fs_put_u64(hello + 24, options.seed);
}

/* ---- server ------------------------------------------------------------ */

struct fs_server_slot {
	int fd;
	struct fs_stream_conn *conns; /* indexed by the client's connection index */
	pthread_mutex_t *claim_lock;
};

static void *fs_server_conn_main(void *argument)
{
	struct fs_server_slot *slot = argument;
	unsigned char hello[FS_STREAM_HELLO_SIZE];
	int result;

	if (options.banner) {
		uint64_t random_state = 99;
		result = fs_write_all(slot->fd, (const unsigned char *)FS_STREAM_BANNER, strlen(FS_STREAM_BANNER),
				      &random_state);
		if (result < 0) {
			harness_fail("server: banner write failed: %s", strerror(-result));
			goto fail;
		}
	}
	result = harness_read_full(slot->fd, hello, sizeof(hello), NULL);
	if (result < 0) {
		harness_fail("server: reading the hello: %s", result == -ENODATA ? "early EOF" : strerror(-result));
		goto fail;
	}
	uint32_t index = fs_get_u32(hello + 4);
	if (fs_get_u32(hello) != FS_STREAM_HELLO_MAGIC || index >= options.streams) {
		harness_fail("server: bad hello (magic 0x%08x, index %u)", fs_get_u32(hello), index);
		goto fail;
	}
	if (fs_get_u32(hello + 8) != options.streams || fs_get_u32(hello + 12) != fs_stream_flags() ||
	    fs_get_u64(hello + 16) != options.bytes || fs_get_u64(hello + 24) != options.seed) {
		harness_fail("server: client options differ (streams %u flags 0x%x bytes %" PRIu64
			       " seed %" PRIu64 ")",
			       fs_get_u32(hello + 8), fs_get_u32(hello + 12), fs_get_u64(hello + 16),
			       fs_get_u64(hello + 24));
		goto fail;
	}
	struct fs_stream_conn *conn = &slot->conns[index];
	pthread_mutex_lock(slot->claim_lock);
	bool taken = conn->fd >= 0;
	if (!taken)
		conn->fd = slot->fd;
	pthread_mutex_unlock(slot->claim_lock);
	if (taken) {
		harness_fail("server: connection index %u seen twice", index);
		goto fail;
	}
	fs_stream_run_data(conn, true);
	fs_stream_finish_conn(conn);
	return NULL;
fail:
	shutdown(slot->fd, SHUT_RDWR);
	close(slot->fd);
	return NULL;
}

static int fs_server_listen(void)
{
	int family = options.bind_address ? AF_UNSPEC : options.ipv6 ? AF_INET6 : AF_INET;

	return harness_listen(family, options.bind_address, options.port, 0, 256);
}

/* ---- reporting --------------------------------------------------------- */

static void fs_stream_report(const char *role, struct fs_stream_conn *conns, double seconds)
{
	uint64_t total = 0;
	for (unsigned i = 0; i < options.streams; i++) {
		struct fs_stream_conn *conn = &conns[i];
		if (!conn->done && !harness_failures())
			harness_fail("conn %u never completed", i);
		printf("conn %u sent=%" PRIu64 " recv=%" PRIu64 " sum_tx=%016" PRIx64 " sum_rx=%016" PRIx64
		       " tcp_bytes_received=%" PRIu64 " tcp_bytes_acked=%" PRIu64 "\n",
		       i, conn->sent, conn->received, conn->sum_tx, conn->sum_rx, conn->tcp_bytes_received,
		       conn->tcp_bytes_acked);
		total += conn->sent + conn->received;
	}
	printf("%s time_s=%.3f payload_bytes=%" PRIu64 " mib_per_s=%.1f\n", role, seconds, total,
	       seconds > 0 ? (double)total / 1048576.0 / seconds : 0.0);
	printf("%s vm_hwm_kib=%ld vm_rss_kib=%ld\n", role, harness_status_kib("VmHWM"), harness_status_kib("VmRSS"));
}

/* Drops to USER (its primary group, no others), as servers do after they
 * bound their port (nginx workers, memcached -u). */
static int fs_drop_privileges(const char *user)
{
	struct passwd *pw = getpwnam(user);

	if (!pw) {
		harness_fail("no user %s", user);
		return -1;
	}
	if (setgroups(0, NULL) < 0 || setgid(pw->pw_gid) < 0 || setuid(pw->pw_uid) < 0) {
		harness_fail("dropping to user %s: %s", user, strerror(errno));
		return -1;
	}
	return 0;
}

static int fs_server_main(void)
{
	int listen_fd = fs_server_listen();
	pthread_mutex_t claim_lock = PTHREAD_MUTEX_INITIALIZER;
	char text[64];

	if (listen_fd < 0)
		goto result;
	if (options.pidfile) {
		snprintf(text, sizeof(text), "%d\n", (int)getpid());
		if (harness_write_file_atomically(options.pidfile, text) < 0)
			harness_fail("writing %s: %s", options.pidfile, strerror(errno));
	}
	unsigned port = harness_local_port(listen_fd);
	if (options.setuid_user && fs_drop_privileges(options.setuid_user) < 0)
		goto result;
	printf("listening port=%u\n", port);
	fflush(stdout);
	if (options.ready_file) {
		snprintf(text, sizeof(text), "%u\n", port);
		if (harness_write_file_atomically(options.ready_file, text) < 0)
			harness_fail("writing %s: %s", options.ready_file, strerror(errno));
	}

	for (unsigned run = 1; run <= options.runs && !harness_failures(); run++) {
		struct fs_stream_conn *conns = calloc(options.streams, sizeof(*conns));
		struct fs_server_slot *slots = calloc(options.streams, sizeof(*slots));
		pthread_t *threads = calloc(options.streams, sizeof(*threads));
		unsigned started = 0;
		double start = 0;

		if (!conns || !slots || !threads) {
			harness_fail("out of memory");
			break;
		}
		for (unsigned i = 0; i < options.streams; i++) {
			conns[i].fd = -1;
			conns[i].index = i;
		}
		for (; started < options.streams; started++) {
			int fd = accept(listen_fd, NULL, NULL);
			if (fd < 0) {
				if (errno == EINTR) {
					started--;
					continue;
				}
				harness_fail("accept: %s", strerror(errno));
				break;
			}
			if (started == 0)
				start = fs_now();
			slots[started] = (struct fs_server_slot){ fd, conns, &claim_lock };
			if (pthread_create(&threads[started], NULL, fs_server_conn_main, &slots[started]) != 0) {
				harness_fail("pthread_create failed");
				close(fd);
				break;
			}
		}
		for (unsigned i = 0; i < started; i++)
			pthread_join(threads[i], NULL);
		if (options.runs > 1)
			printf("run %u\n", run);
		fs_stream_report("server", conns, fs_now() - start);
		free(conns);
		free(slots);
		free(threads);
	}
	close(listen_fd);
result:
	if (harness_failures())
		printf("result FAIL %s\n", harness_first_failure());
	else
		printf("result ok\n");
	return harness_failures() ? 1 : 0;
}

/* ---- client ------------------------------------------------------------ */

static struct addrinfo *client_address;

static void *fs_client_conn_main(void *argument)
{
	struct fs_stream_conn *conn = argument;
	unsigned char hello[FS_STREAM_HELLO_SIZE];
	int result;

	conn->fd = harness_connect(client_address, 0);
	if (conn->fd < 0)
		return NULL;
	if (options.banner) {
		char banner[sizeof(FS_STREAM_BANNER)] = { 0 };
		result = harness_read_full(conn->fd, (unsigned char *)banner, strlen(FS_STREAM_BANNER), NULL);
		if (result < 0 || strcmp(banner, FS_STREAM_BANNER) != 0) {
			harness_fail("conn %u: bad or missing banner (%s)", conn->index,
				       result == -ENODATA ? "early EOF" : result < 0 ? strerror(-result) : "mismatch");
			close(conn->fd);
			return NULL;
		}
	}
	fs_stream_encode_hello(hello, conn->index);
	uint64_t random_state = 7;
	result = fs_write_all(conn->fd, hello, sizeof(hello), &random_state);
	if (result < 0) {
		harness_fail("conn %u: hello write: %s", conn->index, strerror(-result));
		close(conn->fd);
		return NULL;
	}
	fs_stream_run_data(conn, false);
	fs_stream_finish_conn(conn);
	return NULL;
}

static int fs_client_main(void)
{
	struct fs_stream_conn *conns = calloc(options.streams, sizeof(*conns));
	pthread_t *threads = calloc(options.streams, sizeof(*threads));
	unsigned started = 0;
	double start;

	if (!conns || !threads) {
		harness_fail("out of memory");
		goto result;
	}
	if (options.setuid_user && fs_drop_privileges(options.setuid_user) < 0)
		goto result;
	client_address = harness_resolve(options.host, options.port, options.ipv6 ? AF_INET6 : AF_UNSPEC);
	if (!client_address)
		goto result;
	start = fs_now();
	for (; started < options.streams; started++) {
		conns[started].index = started;
		conns[started].fd = -1;
		if (pthread_create(&threads[started], NULL, fs_client_conn_main, &conns[started]) != 0) {
			harness_fail("pthread_create failed");
			break;
		}
	}
	for (unsigned i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	fs_stream_report("client", conns, fs_now() - start);
	freeaddrinfo(client_address);
result:
	free(conns);
	free(threads);
	if (harness_failures())
		printf("result FAIL %s\n", harness_first_failure());
	else
		printf("result ok\n");
	return harness_failures() ? 1 : 0;
}

/* ---- command line ------------------------------------------------------ */

static void fs_stream_usage(void)
{
	fprintf(stderr,
		"usage: fs_stream server [--port P] [--bind ADDR] [options]\n"
		"       fs_stream client HOST PORT [options]\n"
		"options: --streams K  --bytes N[K|M|G]  --bidir  --echo  --reverse  --banner\n"
		"         --max-write N  --read-size N (each read exactly N)  --seed S  --slow-reader\n"
		"         --rate N[K|M|G] (bytes/s)\n"
		"         --ipv6  --hold-ms N  --pidfile F  --ready-file F  --runs R (server)\n"
		"         --timeout S (watchdog, default 600)\n"
		"         --setuid USER (server: after listen(); client: before connecting)\n");
	exit(2);
}

/* Parses a count with an optional K/M/G (binary) suffix; exits on error. */
static uint64_t fs_parse_size(const char *name, const char *text)
{
	uint64_t value;

	if (harness_parse_size(text, UINT64_MAX, &value) < 0) {
		fprintf(stderr, "fs_stream: %s: bad number '%s'\n", name, text);
		exit(2);
	}
	return value;
}

static void fs_stream_parse(int argc, char **argv)
{
	int i = 2;

	if (argc < 2)
		fs_stream_usage();
	if (strcmp(argv[1], "server") == 0) {
		options.is_server = true;
	} else if (strcmp(argv[1], "client") == 0) {
		if (argc < 4)
			fs_stream_usage();
		options.host = argv[2];
		options.port = argv[3];
		i = 4;
	} else {
		fs_stream_usage();
	}
	for (; i < argc; i++) {
		const char *name = argv[i];
		const char *value = i + 1 < argc ? argv[i + 1] : NULL;
#define FS_NEEDS_VALUE() do { if (!value) fs_stream_usage(); i++; } while (0)
		if (strcmp(name, "--port") == 0 && options.is_server) { FS_NEEDS_VALUE(); options.port = value; }
		else if (strcmp(name, "--bind") == 0) { FS_NEEDS_VALUE(); options.bind_address = value; }
		else if (strcmp(name, "--streams") == 0) { FS_NEEDS_VALUE(); options.streams = (unsigned)fs_parse_size(name, value); }
		else if (strcmp(name, "--bytes") == 0) { FS_NEEDS_VALUE(); options.bytes = fs_parse_size(name, value); }
		else if (strcmp(name, "--max-write") == 0) { FS_NEEDS_VALUE(); options.max_write = (size_t)fs_parse_size(name, value); }
		else if (strcmp(name, "--read-size") == 0) { FS_NEEDS_VALUE(); options.read_size = (size_t)fs_parse_size(name, value); }
		else if (strcmp(name, "--seed") == 0) { FS_NEEDS_VALUE(); options.seed = fs_parse_size(name, value); }
		else if (strcmp(name, "--rate") == 0) { FS_NEEDS_VALUE(); options.slow_rate = fs_parse_size(name, value); }
		else if (strcmp(name, "--hold-ms") == 0) { FS_NEEDS_VALUE(); options.hold_ms = (unsigned)fs_parse_size(name, value); }
		else if (strcmp(name, "--runs") == 0) { FS_NEEDS_VALUE(); options.runs = (unsigned)fs_parse_size(name, value); }
		else if (strcmp(name, "--timeout") == 0) { FS_NEEDS_VALUE(); options.timeout_s = (unsigned)fs_parse_size(name, value); }
		else if (strcmp(name, "--pidfile") == 0) { FS_NEEDS_VALUE(); options.pidfile = value; }
		else if (strcmp(name, "--ready-file") == 0) { FS_NEEDS_VALUE(); options.ready_file = value; }
		else if (strcmp(name, "--setuid") == 0) { FS_NEEDS_VALUE(); options.setuid_user = value; }
		else if (strcmp(name, "--bidir") == 0) options.bidir = true;
		else if (strcmp(name, "--echo") == 0) options.echo = true;
		else if (strcmp(name, "--reverse") == 0) options.reverse = true;
		else if (strcmp(name, "--banner") == 0) options.banner = true;
		else if (strcmp(name, "--ipv6") == 0) options.ipv6 = true;
		else if (strcmp(name, "--slow-reader") == 0) options.slow_reader = true;
		else {
			fprintf(stderr, "fs_stream: unknown option %s\n", name);
			fs_stream_usage();
		}
#undef FS_NEEDS_VALUE
	}
	if (options.streams < 1 || options.streams > FS_STREAM_MAX_STREAMS || options.max_write < 1 ||
	    options.slow_rate < 1 || options.runs < 1 || options.max_write > (1u << 30) ||
	    options.read_size > (1u << 30)) {
		fprintf(stderr, "fs_stream: --streams 1..%d, --max-write, --rate and --runs >= 1\n",
			FS_STREAM_MAX_STREAMS);
		exit(2);
	}
	if ((options.echo && (options.bidir || options.reverse)) || (options.bidir && options.reverse)) {
		fprintf(stderr, "fs_stream: --echo, --bidir and --reverse exclude each other\n");
		exit(2);
	}
}

int main(int argc, char **argv)
{
	fs_stream_parse(argc, argv);
	harness_report_to_stderr("fs_stream");
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (options.timeout_s)
		harness_watchdog_start(options.timeout_s, "result FAIL timeout (watchdog)");
	return options.is_server ? fs_server_main() : fs_client_main();
}
