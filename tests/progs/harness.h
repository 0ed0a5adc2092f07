/* SPDX-License-Identifier: MIT */
/*
 * The harness every test program in tests/progs/ shares: the FAIL/info
 * reporter, the watchdog that ends a hung program with a clear line, time
 * and sleep, the deterministic test pattern and the FNV-1a checksum, full
 * reads and writes that retry EINTR and partial transfers (and wait, bounded,
 * on a nonblocking socket's EAGAIN), listen/accept/connect on loopback, the
 * wait for a child, and the scenario table with its command line
 * (`PROGRAM list | server PORT SCENARIO | client HOST PORT SCENARIO`).
 * What one program alone checks stays in that program.
 *
 * Output the scripts parse: `FAIL <name>: <detail>` and `info <name>: ...`
 * lines on stdout (a forked child adds ` [pid N]` after the name), and from
 * harness_scenario_main `listening port=N`, `PASS <name>` and
 * `connections=N`. The harness installs no signal handler and starts no
 * thread unless a function here is called: fs_passthrough checks that its
 * process has none.
 */
#ifndef FS_TESTS_HARNESS_H
#define FS_TESTS_HARNESS_H

#include <netdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Bound for any wait on the peer in the full I/O below and in accept/connect
 * on nonblocking sockets (blocking calls are bounded by the watchdog). */
#define HARNESS_PEER_WAIT_MS 20000

/* ---- reporting ----------------------------------------------------------- */

/* Names the scenario (or role) in FAIL and info lines; kept, not copied. */
void harness_set_name(const char *name);
const char *harness_name(void);
/* Sends FAIL lines as `<program>: error: <detail>` to stderr instead (a
 * program whose stdout is a report of its own, fs_stream). */
void harness_report_to_stderr(const char *program);
/* Prints the FAIL line, counts it, keeps the first one's detail; -1. */
int harness_fail(const char *format, ...) __attribute__((format(printf, 1, 2)));
void harness_info(const char *format, ...) __attribute__((format(printf, 1, 2)));
/* How many failures this process reported (any thread). */
int harness_failures(void);
/* The first failure's detail, "" while there is none. */
const char *harness_first_failure(void);
/* `PASS <name>` and `connections=N`, flushed: what harness_scenario_main
 * prints, for a scenario side that leaves before returning to it. */
void harness_print_pass(void);

/* ---- watchdog, signals and time ----------------------------------------- */

/* After SECONDS prints LINE (NULL: `FAIL <name>: watchdog: still running
 * after N s`) and ends the process with status 3. SIGALRM's handler is
 * installed with SA_RESTART: it never makes another call fail with EINTR. */
void harness_watchdog_start(unsigned seconds, const char *line);
/* Re-installs the watchdog with what is left of its time, after a test
 * borrowed SIGALRM. */
void harness_watchdog_rearm(void);
/* sigaction with an empty mask; FLAGS e.g. SA_RESTART. */
int harness_set_handler(int signal_number, void (*handler)(int), int flags);
/* A handler that counts SIGPIPEs into harness_sigpipe_count. */
void harness_count_sigpipe(int signal_number);
extern volatile sig_atomic_t harness_sigpipe_count;

double harness_now_ms(void); /* CLOCK_MONOTONIC */
/* Milliseconds left until DEADLINE (from harness_now_ms), rounded up, >= 0. */
int harness_remaining_ms(double deadline);
/* Sleeps the whole time (fractions of a millisecond too), resuming after signals. */
void harness_sleep_ms(double milliseconds);
/* A field of /proc/self/status in KiB (VmHWM, VmRSS), -1 if missing. */
long harness_status_kib(const char *field);

/* ---- files and numbers ------------------------------------------------------ */

/* Writes TEXT to PATH.tmp.PID and renames it to PATH, so a script polling
 * PATH (a ready file) never reads it half written. 0, or -1 with errno. */
int harness_write_file_atomically(const char *path, const char *text);
/* A decimal count with an optional K, M or G (binary; "KiB" etc. too), at
 * most MAX: 0, or -1 for anything else (a sign, junk, overflow). */
int harness_parse_size(const char *text, uint64_t max, uint64_t *value);

/* ---- test pattern and checksum ------------------------------------------ */

/*
 * The test stream of KEY: byte at offset o is byte (o % 8) of
 * splitmix64(splitmix64(KEY) + o / 8), so any range is generated on its own
 * and streams of different keys never line up, however shifted.
 */
uint64_t harness_splitmix64(uint64_t value);
unsigned char harness_pattern_byte(uint64_t key, uint64_t offset);
void harness_pattern_fill(uint64_t key, uint64_t offset, void *buffer, size_t length);
/* Index of the first byte of BUFFER that is not the stream's at OFFSET on, or
 * LENGTH: reports nothing (safe in a sandboxed child). */
size_t harness_pattern_mismatch(uint64_t key, uint64_t offset, const void *buffer, size_t length);
/* 0, or fails with `WHAT: byte N is 0xAA, expected 0xBB` (N: stream offset). */
int harness_pattern_check(uint64_t key, uint64_t offset, const void *buffer, size_t length, const char *what);

#define HARNESS_FNV1A_OFFSET 0xcbf29ce484222325ull
uint64_t harness_fnv1a(uint64_t hash, const void *data, size_t length);

/* ---- full reads and writes ---------------------------------------------- */

/*
 * recv/send(MSG_NOSIGNAL) until LENGTH bytes moved, retrying EINTR; on a
 * nonblocking socket's EAGAIN, polls (at most HARNESS_PEER_WAIT_MS in all).
 * 0, -ENODATA at EOF before LENGTH (read), -EIO if send returned 0,
 * -ETIMEDOUT, or -errno. *DONE (if not NULL) says how many bytes moved.
 * They report nothing; the functions after them do.
 */
int harness_read_full(int fd, void *buffer, size_t length, size_t *done);
int harness_write_full(int fd, const void *data, size_t length, size_t *done);

int harness_recv_exact(int fd, void *buffer, size_t length);
int harness_send_all(int fd, const void *data, size_t length);
int harness_send_byte(int fd, char byte);
/* Reads one byte and requires EXPECTED (the scenarios' sync bytes). */
int harness_expect_byte(int fd, char expected);
/* The next read must be 0: the peer's orderly EOF. */
int harness_expect_eof(int fd);
/* The client's end of a scenario: the byte 'a' ("all done"), then the
 * server closes and the client reads its EOF. */
int harness_finish_client(int fd);
/* Bytes [FROM, FROM + LENGTH) of KEY's stream: sent, or received and checked. */
int harness_send_pattern(int fd, uint64_t key, uint64_t from, size_t length);
int harness_recv_pattern(int fd, uint64_t key, uint64_t from, size_t length, const char *what);
/* poll() for EVENTS, resuming after EINTR: the revents, 0 at the timeout,
 * -1 (reported) on an error. */
int harness_wait_fd(int fd, short events, int timeout_ms);
/* The fd's O_NONBLOCK must be NONBLOCKING (WHAT names it). */
int harness_expect_nonblocking(int fd, bool nonblocking, const char *what);

/* ---- connections ---------------------------------------------------------- */

/* TCP connections this process opened or accepted through the harness. */
extern int harness_connections;

/* A listening socket (SO_REUSEADDR) on HOST (NULL: any address of FAMILY;
 * with a HOST, FAMILY may be AF_UNSPEC) and PORT ("0": the kernel picks);
 * TYPE_FLAGS: SOCK_NONBLOCK, SOCK_CLOEXEC. The fd, or -1 (reported). */
int harness_listen(int family, const char *host, const char *port, int type_flags, int backlog);
/* The port FD is bound to (IPv4 or IPv6), 0 if unknown. */
unsigned harness_local_port(int fd);
/* HOST PORT for connect (FAMILY: AF_UNSPEC, AF_INET6...), NULL (reported). */
struct addrinfo *harness_resolve(const char *host, const char *port, int family);
/*
 * TIMEOUT_MS < 0: a plain blocking accept(); else polls at most that long,
 * then accept4(FLAGS). PEER/PEER_LENGTH may be NULL. Counts the connection.
 * The fd, or -1 (reported).
 */
int harness_accept(int listen_fd, int timeout_ms, int flags, struct sockaddr_storage *peer, socklen_t *peer_length);
/* socket(TYPE_FLAGS) + connect; a nonblocking connect is waited for
 * (bounded) and its SO_ERROR checked. Counts it. The fd, or -1 (reported). */
int harness_connect(const struct addrinfo *address, int type_flags);

/* ---- children --------------------------------------------------------------- */

/* Waits for PID (a failed fork's -1 included): it must have exited 0, or
 * with EXPECTED_SIGNAL != 0, died by that signal. 0, or -1 (reported). */
int harness_wait_child(pid_t pid, const char *what, int expected_signal);

/* ---- scenario programs -------------------------------------------------- */

enum harness_scenario_flags {
	HARNESS_CLIENT_CONNECTS_ITSELF = 1 << 0, /* the client opens and closes its own connections */
	HARNESS_SERVER_ACCEPTS_ITSELF = 1 << 1,  /* the server accepts and closes its own connections */
	HARNESS_CLIENT_CLOSES_FD = 1 << 2,       /* the client closes the connection it is given */
	HARNESS_SERVER_CLOSES_FD = 1 << 3,       /* the server closes the connection it is given */
};

/* One semantic: each side gets the connected socket (or -1 with the flags
 * above) and returns 0, or -1 having reported why. */
struct harness_scenario {
	const char *name;
	int (*server)(int fd);
	int (*client)(int fd);
	unsigned flags;
};

struct harness_program {
	const char *name; /* for the usage text */
	const struct harness_scenario *scenarios;
	size_t count;
	unsigned watchdog_seconds;
	bool nonblocking;   /* every socket nonblocking: listener, accept4, connect */
	bool sigpipe_fails; /* every send uses MSG_NOSIGNAL: a SIGPIPE is a failure */
	void (*setup)(void); /* after the scenario is chosen, before any socket (NULL: none) */
};

/* The server's listening socket, the client's target, and the address
 * accept returned for the server's first connection. */
extern int harness_listen_fd;
extern struct addrinfo *harness_server_address;
extern struct sockaddr_storage harness_accepted_peer;
extern socklen_t harness_accepted_peer_length;

/*
 * `list` prints the scenario names; `server PORT SCENARIO` listens on PORT
 * of every IPv4 address, prints `listening port=N`, accepts one connection
 * and runs the server side; `client HOST PORT SCENARIO` connects and runs
 * the client side. A counting SIGPIPE handler and the watchdog are
 * installed first. Prints `PASS <scenario>` when the side returned 0 and
 * reported nothing, then `connections=N`; the exit status is 1 on any
 * failure, 2 on a usage error.
 */
int harness_scenario_main(const struct harness_program *program, int argc, char **argv);
/* The same for the usual program: blocking sockets, the default watchdog. */
#define HARNESS_WATCHDOG_SECONDS 40
int harness_scenario_run(const char *name, const struct harness_scenario *scenarios, size_t count, int argc,
			 char **argv);
#define HARNESS_COUNT(table) (sizeof(table) / sizeof((table)[0]))
/* Another connection of the scenario, the program's way (blocking or not). */
int harness_scenario_accept(void);
int harness_scenario_connect(void);

#endif
