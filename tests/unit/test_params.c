/* SPDX-License-Identifier: MIT */
/*
 * Unit test of config/params.c and config/log.c: defaults, every accepted
 * spelling of every parameter type, every kind of bad value (each must keep
 * the default, count as rejected, and leave exactly one warning line naming
 * the variable, the value and the default), the unknown-variable typo guard,
 * the `fabsock info` listing, and the log sink (file, fallback, level,
 * truncation, errno, re-initialisation closing the old file).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "preload/real.h"
#include "tests/unit/check.h"

static const char *const all_names[] = {
#define FS_PARAM_UINT(field, NAME, def, min, max, help) "FABSOCK_" #NAME,
#define FS_PARAM_BOOL(field, NAME, def, help) "FABSOCK_" #NAME,
#define FS_PARAM_STR(field, NAME, def, help) "FABSOCK_" #NAME,
#define FS_PARAM_ENUM(field, NAME, def, choices, help) "FABSOCK_" #NAME,
#include "config/params.def"
#undef FS_PARAM_UINT
#undef FS_PARAM_BOOL
#undef FS_PARAM_STR
#undef FS_PARAM_ENUM
};
#define NAME_COUNT (sizeof(all_names) / sizeof(all_names[0]))

static char log_path[] = "/tmp/fabsock-test-params-XXXXXX";

/* Removes every FABSOCK_* variable except FABSOCK_LOG_FILE. */
static void clear_env(void)
{
	extern char **environ;
	char name[256];
	bool again = true;

	while (again) {
		again = false;
		for (char **env = environ; *env; env++) {
			size_t len = strcspn(*env, "=");
			if (strncmp(*env, "FABSOCK_", 8) || len >= sizeof(name))
				continue;
			memcpy(name, *env, len);
			name[len] = '\0';
			if (!strcmp(name, "FABSOCK_LOG_FILE"))
				continue;
			unsetenv(name);
			again = true; /* environ changed under us */
			break;
		}
	}
}

/* Returns what the log file holds (static buffer) and empties it. */
static const char *take_log(void)
{
	static char buf[8192];
	FILE *f = fopen(log_path, "r");
	size_t n = 0;

	if (f) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
	if (truncate(log_path, 0))
		perror("truncate");
	return buf;
}

static int count_lines(const char *s)
{
	int n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* Loads with NAME=VALUE (the only FABSOCK_ variable besides the log file);
 * returns fs_params_load's count. */
static int load_with(const char *name, const char *value)
{
	clear_env();
	if (value)
		setenv(name, value, 1);
	take_log();
	return fs_params_load();
}

/* A rejected value: count 1, exactly one line, exactly the expected text. */
static void check_rejected(const char *name, const char *value, const char *expect_tail)
{
	char expect[512];
	const char *log;

	int rc = load_with(name, value);
	log = take_log();
	snprintf(expect, sizeof(expect), "fabsock[%d]: warn: %s=%s %s\n", (int)getpid(), name,
		 value, expect_tail);
	CHECK(rc == 1);
	CHECK(count_lines(log) == 1);
	CHECK(!strcmp(log, expect));
	if (strcmp(log, expect))
		fprintf(stderr, "  expected: %s  got:      %s", expect, log);
}

static void test_defaults(void)
{
	clear_env();
	unsetenv("FABSOCK_LOG_FILE");
	CHECK(fs_params_load() == 0);
	CHECK(fs_params.enable == true);
	CHECK(!strcmp(fs_params.provider, ""));
	CHECK(fs_params.shm == true);
	CHECK(!strcmp(fs_params.rules, ""));
	CHECK(fs_params.log_level == FS_LOG_WARN);
	CHECK(!strcmp(fs_params.log_file, ""));
	CHECK(fs_params.probe_timeout_ms == 250);
	CHECK(fs_params.neg_cache_sec == 60);
	CHECK(fs_params.hello_timeout_ms == 5000);
	CHECK(fs_params.chunk_size == 131072);
	CHECK(fs_params.window == 8);
	CHECK(fs_params.send_queue == 8);
	CHECK(fs_params.pool_max_mb == 512);
	CHECK(fs_params.spin_us == 100);
	CHECK(fs_params.sleep_max_us == 1000);
	CHECK(fs_params.linger_sec == 10);
	CHECK(fs_params.peer_grace_ms == 1000);
	CHECK(fs_params.stats == false);
}

static void test_uint(void)
{
	static const char tail[] = "is not a whole number in 2..256; using 8";

	CHECK(load_with("FABSOCK_WINDOW", "2") == 0 && fs_params.window == 2);
	CHECK(load_with("FABSOCK_WINDOW", "256") == 0 && fs_params.window == 256);
	CHECK(load_with("FABSOCK_WINDOW", "0x10") == 0 && fs_params.window == 16);
	CHECK(load_with("FABSOCK_WINDOW", "010") == 0 && fs_params.window == 8);
	CHECK(load_with("FABSOCK_WINDOW", "100") == 0 && fs_params.window == 100);
	CHECK(!strcmp(take_log(), ""));
	CHECK(load_with("FABSOCK_SPIN_US", "0") == 0 && fs_params.spin_us == 0);
	CHECK(load_with("FABSOCK_SPIN_US", "10000000") == 0 && fs_params.spin_us == 10000000);
	CHECK(load_with("FABSOCK_NEG_CACHE_SEC", "86400") == 0 && fs_params.neg_cache_sec == 86400);
	CHECK(load_with("FABSOCK_CHUNK_SIZE", "1048576") == 0 && fs_params.chunk_size == 1048576);
	/* Setting one parameter leaves the others at their defaults. */
	CHECK(fs_params.window == 8 && fs_params.probe_timeout_ms == 250);

	static const char *const bad[] = {
		"",	 "abc",	  "12abc", "12 ",  " 12", "-1",	 "-0", "+5",	"1.5", "0x",
		"1e3",	 "0x1g",  "08",	   "1",	   "0",	  "257", "0x101",
		"18446744073709551615",	 /* UINT64_MAX: in uint64, above max */
		"18446744073709551616",	 /* 2^64: overflows */
		"99999999999999999999999", /* far past overflow */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		check_rejected("FABSOCK_WINDOW", bad[i], tail);
		CHECK(fs_params.window == 8);
	}

	/* Below min where min is not 0, and a range whose min is 0. */
	check_rejected("FABSOCK_CHUNK_SIZE", "4095",
		       "is not a whole number in 4096..1048576; using 131072");
	CHECK(fs_params.chunk_size == 131072);
	check_rejected("FABSOCK_SPIN_US", "10000001", "is not a whole number in 0..10000000; using 100");
	CHECK(fs_params.spin_us == 100);
}

static void test_bool(void)
{
	static const char *const yes[] = { "1", "yes", "true", "on", "YES", "True", "oN" };
	static const char *const no[] = { "0", "no", "false", "off", "NO", "False", "OFF" };
	static const char *const bad[] = { "", "2", "maybe", "yess", "on ", " 1", "00", "y", "-1" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		CHECK(load_with("FABSOCK_STATS", yes[i]) == 0);
		CHECK(fs_params.stats == true);
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		CHECK(load_with("FABSOCK_ENABLE", no[i]) == 0);
		CHECK(fs_params.enable == false);
	}
	CHECK(!strcmp(take_log(), ""));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		check_rejected("FABSOCK_ENABLE", bad[i],
			       "is not a boolean (1/0, yes/no, true/false, on/off); using 1");
		CHECK(fs_params.enable == true);
		check_rejected("FABSOCK_STATS", bad[i],
			       "is not a boolean (1/0, yes/no, true/false, on/off); using 0");
		CHECK(fs_params.stats == false);
	}
}

static void test_enum(void)
{
	static const struct {
		const char *text;
		unsigned value;
	} good[] = {
		{ "error", 0 }, { "warn", 1 }, { "info", 2 }, { "debug", 3 }, { "ERROR", 0 },
		{ "Debug", 3 }, { "0", 0 },    { "2", 2 },    { "3", 3 },
	};
	static const char *const bad[] = { "", "loud", "4", "-1", "war", "warning", "1x", " info",
					   "info ", "error|warn", "0x1", "99999999999999999999999" };

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		CHECK(load_with("FABSOCK_LOG", good[i].text) == 0);
		CHECK(fs_params.log_level == good[i].value);
	}
	CHECK(!strcmp(take_log(), ""));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		check_rejected("FABSOCK_LOG", bad[i],
			       "is not one of error|warn|info|debug (or 0..3); using warn");
		CHECK(fs_params.log_level == FS_LOG_WARN);
	}
}

static void test_str(void)
{
	CHECK(load_with("FABSOCK_PROVIDER", "efa") == 0);
	CHECK(!strcmp(fs_params.provider, "efa"));
	CHECK(load_with("FABSOCK_RULES", "  offload client 10.0.0.0/8 ; # x") == 0);
	CHECK(!strcmp(fs_params.rules, "  offload client 10.0.0.0/8 ; # x"));
	CHECK(load_with("FABSOCK_PROVIDER", "") == 0);
	CHECK(!strcmp(fs_params.provider, ""));
	CHECK(!strcmp(take_log(), ""));

	/* A program that sets its process title the classic way (nginx,
	 * PostgreSQL) overwrites the environment's strings in place after
	 * the load: the values read later must be fabsock's own copies. */
	CHECK(load_with("FABSOCK_RECORDS_DIR", "/run/fabsock-test-records") == 0);
	CHECK(setenv("FABSOCK_PROVIDER", "tcp", 1) == 0);
	CHECK(fs_params_load() == 0);
	char *env_dir = getenv("FABSOCK_RECORDS_DIR");
	char *env_prov = getenv("FABSOCK_PROVIDER");
	CHECK(env_dir && env_prov);
	if (env_dir && env_prov) {
		memset(env_dir, 'x', strlen(env_dir));
		memset(env_prov, 0, strlen(env_prov));
	}
	CHECK(!strcmp(fs_params.records_dir, "/run/fabsock-test-records"));
	CHECK(!strcmp(fs_params.provider, "tcp"));
	CHECK(unsetenv("FABSOCK_RECORDS_DIR") == 0 && unsetenv("FABSOCK_PROVIDER") == 0);
	/* a value longer than the static area is copied to the heap */
	{
		static char longv[9001];
		memset(longv, ';', sizeof(longv) - 1);
		CHECK(load_with("FABSOCK_RULES", longv) == 0);
		CHECK(strlen(fs_params.rules) == sizeof(longv) - 1 && fs_params.rules != getenv("FABSOCK_RULES"));
		CHECK(unsetenv("FABSOCK_RULES") == 0);
	}
	CHECK(fs_params_load() == 0); /* frees the copies: the defaults again */
	CHECK(!strcmp(fs_params.records_dir, "/dev/shm"));
	CHECK(!strcmp(fs_params.provider, ""));
}

static void test_several(void)
{
	const char *log;

	clear_env();
	setenv("FABSOCK_WINDOW", "abc", 1);
	setenv("FABSOCK_SHM", "maybe", 1);
	setenv("FABSOCK_LOG", "loud", 1);
	setenv("FABSOCK_SEND_QUEUE", "16", 1);
	take_log();
	CHECK(fs_params_load() == 3);
	log = take_log();
	CHECK(count_lines(log) == 3);
	CHECK(strstr(log, "FABSOCK_WINDOW=abc ") != NULL);
	CHECK(strstr(log, "FABSOCK_SHM=maybe ") != NULL);
	CHECK(strstr(log, "FABSOCK_LOG=loud ") != NULL);
	CHECK(fs_params.window == 8 && fs_params.shm == true && fs_params.log_level == 1);
	CHECK(fs_params.send_queue == 16);

	/* Loading again resets to defaults first. */
	clear_env();
	CHECK(fs_params_load() == 0);
	CHECK(fs_params.send_queue == 8);
}

static void test_unknown(void)
{
	const char *log;
	char expect[256];

	/* A typo: one line naming it; not counted as rejected; no effect. */
	CHECK(load_with("FABSOCK_WINDWO", "4") == 0);
	log = take_log();
	snprintf(expect, sizeof(expect),
		 "fabsock[%d]: warn: ignoring unknown variable(s) FABSOCK_WINDWO (not fabsock "
		 "parameters; see `fabsock info`)\n",
		 (int)getpid());
	CHECK(!strcmp(log, expect));
	CHECK(fs_params.window == 8);

	/* Several unknown ones still make a single line. */
	clear_env();
	setenv("FABSOCK_A", "1", 1);
	setenv("FABSOCK_B", "2", 1);
	take_log();
	CHECK(fs_params_load() == 0);
	log = take_log();
	CHECK(count_lines(log) == 1);
	CHECK(strstr(log, "FABSOCK_A") && strstr(log, "FABSOCK_B"));

	/* Reserved names and non-FABSOCK names are not warned about. */
	clear_env();
	setenv("FABSOCK_LIB", "/x/libfabsock.so", 1);
	setenv("FABSOCK_INFO", "1", 1);
	setenv("FABSOCKX", "1", 1);
	take_log();
	CHECK(fs_params_load() == 0);
	CHECK(!strcmp(take_log(), ""));
	unsetenv("FABSOCKX");
	clear_env();
}

static void test_print(void)
{
	char *text = NULL;
	size_t size = 0;
	FILE *out;

	CHECK(load_with("FABSOCK_WINDOW", "16") == 0);
	out = open_memstream(&text, &size);
	CHECK(out != NULL);
	if (!out)
		return;
	fs_params_print(out);
	fclose(out);
	for (size_t i = 0; i < NAME_COUNT; i++) {
		char padded[64];
		snprintf(padded, sizeof(padded), "\n%s ", all_names[i]);
		CHECK(strstr(text, padded) != NULL);
	}
	CHECK(!strncmp(text, "VARIABLE ", 9));
	/* The WINDOW row shows the current value, the default and the range. */
	const char *row = strstr(text, "\nFABSOCK_WINDOW ");
	CHECK(row != NULL);
	if (row) {
		char line[256];
		size_t len = strcspn(row + 1, "\n");
		snprintf(line, sizeof(line), "%.*s", (int)len, row + 1);
		char *v = line + strlen("FABSOCK_WINDOW");
		unsigned long cur = 0, def = 0, lo = 0, hi = 0;
		CHECK(sscanf(v, " %lu %lu %lu..%lu", &cur, &def, &lo, &hi) == 4);
		CHECK(cur == 16 && def == 8 && lo == 2 && hi == 256);
	}
	CHECK(strstr(text, "error|warn|info|debug") != NULL);
	CHECK(strstr(text, "Most receive credits per stream") != NULL);
	/* Help is wrapped: no line is absurdly long. */
	for (const char *p = text; *p;) {
		size_t len = strcspn(p, "\n");
		CHECK(len < 120);
		p += len + (p[len] == '\n');
	}
	free(text);
}

static int count_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	int n = 0;

	if (!dir)
		return -1;
	while (readdir(dir))
		n++;
	closedir(dir);
	return n;
}

static void test_log(void)
{
	char big[5000];
	const char *log;
	char expect[128];

	/* Level comes from FABSOCK_LOG; FS_INFO is filtered at warn. */
	CHECK(load_with("FABSOCK_LOG", "warn") == 0);
	fs_log_init();
	CHECK(fs_log_level == FS_LOG_WARN);
	FS_INFO("hidden %d", 1);
	FS_WARN("shown %d", 2);
	log = take_log();
	snprintf(expect, sizeof(expect), "fabsock[%d]: warn: shown 2\n", (int)getpid());
	CHECK(!strcmp(log, expect));

	CHECK(load_with("FABSOCK_LOG", "debug") == 0);
	fs_log_init();
	CHECK(fs_log_level == FS_LOG_DEBUG);
	FS_DBG("dbg");
	FS_ERR("err");
	log = take_log();
	CHECK(strstr(log, ": debug: dbg\n") != NULL);
	CHECK(strstr(log, ": error: err\n") != NULL);
	CHECK(count_lines(log) == 2);

	/* errno survives logging. */
	errno = EAGAIN;
	FS_WARN("errno test");
	CHECK(errno == EAGAIN);
	take_log();

	/* A long message is cut to one line of at most 4095 bytes ending "...\n"
	 * (config/log.c's FS_LOG_LINE_MAX, room for the exit's stats line). */
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	FS_WARN("%s", big);
	log = take_log();
	size_t len = strlen(log);
	CHECK(len == 4095);
	CHECK(count_lines(log) == 1);
	CHECK(len >= 4 && !strcmp(log + len - 4, "...\n"));

	/* A trailing newline in the message is not doubled. */
	FS_WARN("newline\n");
	log = take_log();
	CHECK(count_lines(log) == 1);

	/* FS_WARN_ONCE logs once per call site. */
	for (int i = 0; i < 3; i++)
		FS_WARN_ONCE("once");
	CHECK(count_lines(take_log()) == 1);

	/* Re-initialising closes the previous file; no descriptor leaks. */
	int before = count_fds();
	for (int i = 0; i < 5; i++) {
		CHECK(load_with("FABSOCK_LOG", NULL) == 0);
		fs_log_init();
	}
	CHECK(count_fds() == before);

	/* An unopenable file: one warning on stderr, then stderr is the sink. */
	char err_path[] = "/tmp/fabsock-test-stderr-XXXXXX";
	int err_fd = mkstemp(err_path);
	int saved_stderr = dup(2);
	CHECK(err_fd >= 0 && saved_stderr >= 0);
	fflush(stderr);
	dup2(err_fd, 2);
	setenv("FABSOCK_LOG_FILE", "/nonexistent-dir/fabsock.log", 1);
	CHECK(load_with("FABSOCK_LOG", NULL) == 0);
	fs_log_init();
	FS_WARN("after fallback");
	dup2(saved_stderr, 2);
	close(saved_stderr);
	char got[1024] = "";
	ssize_t n = pread(err_fd, got, sizeof(got) - 1, 0);
	got[n > 0 ? n : 0] = '\0';
	CHECK(strstr(got, "warn: FABSOCK_LOG_FILE=/nonexistent-dir/fabsock.log cannot be opened") != NULL);
	CHECK(strstr(got, "warn: after fallback\n") != NULL);
	CHECK(count_lines(got) == 2);
	close(err_fd);
	unlink(err_path);

	/* Back to the test's log file for anything that follows. */
	setenv("FABSOCK_LOG_FILE", log_path, 1);
	CHECK(load_with("FABSOCK_LOG", NULL) == 0);
	fs_log_init();
	FS_WARN("back");
	CHECK(strstr(take_log(), "warn: back\n") != NULL);
}

int main(void)
{
	int fd;

	fs_real_init();
	test_defaults();

	fd = mkstemp(log_path);
	CHECK(fd >= 0);
	close(fd);
	setenv("FABSOCK_LOG_FILE", log_path, 1);
	CHECK(load_with("FABSOCK_LOG", NULL) == 0);
	CHECK(!strcmp(fs_params.log_file, log_path));
	fs_log_init();

	test_uint();
	test_bool();
	test_enum();
	test_str();
	test_several();
	test_unknown();
	test_print();
	test_log();

	unlink(log_path);
	return fs_check_done();
}
