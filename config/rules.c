/* SPDX-License-Identifier: MIT */
/*
 * Offload rules: the parser for the grammar in config/rules.h, the
 * first-match-wins matcher, and fs_rules_global, the process-wide set parsed
 * from FABSOCK_RULES. Every address is kept in its 128-bit form (IPv4 as
 * v4-mapped ::ffff:a.b.c.d with prefix + 96), so one comparison serves both
 * families and a v4-mapped AF_INET6 peer matches IPv4 rules by construction.
 * Host bits beyond the prefix are cleared when parsing, so matching compares
 * only masked bytes. fs_rules_global is written once, in the constructor
 * (and by tests), before any reader exists; readers take no lock.
 */
#include "config/rules.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "preload/real.h"

/* A rules file larger than this is surely not a rules file. */
#define FS_RULES_FILE_MAX (1 << 20)
/* How much of an offending rule an error message quotes. */
#define FS_RULES_QUOTE_MAX 80

struct fs_rules fs_rules_global;

static const uint8_t fs_v4_mapped_prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

const char *fs_rule_action_name(enum fs_rule_action action)
{
	switch (action) {
	case FS_RULE_PROBE:
		return "probe";
	case FS_RULE_OFFLOAD:
		return "offload";
	case FS_RULE_KERNEL:
		return "kernel";
	}
	return "unknown";
}

void fs_rules_free(struct fs_rules *rules)
{
	free(rules->rule);
	rules->rule = NULL;
	rules->count = 0;
}

/* ---- errors ---- */

/* Writes "rule 'TEXT': REASON" into ERR and returns -EINVAL. */
__attribute__((format(printf, 4, 5)))
static int fs_rules_fail(char *err, size_t errlen, const char *rule, const char *fmt, ...)
{
	va_list ap;
	int n = 0;

	if (!err || !errlen)
		return -EINVAL;
	if (rule) {
		size_t len = strlen(rule);
		n = snprintf(err, errlen, "rule '%.*s%s': ", FS_RULES_QUOTE_MAX, rule,
			     len > FS_RULES_QUOTE_MAX ? "..." : "");
		if (n < 0 || (size_t)n >= errlen)
			return -EINVAL;
	}
	va_start(ap, fmt);
	vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* ---- @FILE ---- */

/* Reads PATH whole into a NUL-terminated malloc'd buffer. Returns 0 and
 * *text, or a negative errno (-EFBIG past FS_RULES_FILE_MAX). */
static int fs_rules_read_file(const char *path, char **text)
{
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	int fd, rc = 0;

	if (!buf)
		return -ENOMEM;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		goto err_free;
	}
	for (;;) {
		if (cap - len < 2) {
			if (cap >= FS_RULES_FILE_MAX) {
				rc = -EFBIG;
				goto err_close;
			}
			char *bigger = realloc(buf, cap * 2);
			if (!bigger) {
				rc = -ENOMEM;
				goto err_close;
			}
			buf = bigger;
			cap *= 2;
		}
		ssize_t n = fs_real_or_sys_read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			goto err_close;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	fs_real_or_sys_close(fd);
	buf[len] = '\0';
	*text = buf;
	return 0;

err_close:
	fs_real_or_sys_close(fd);
err_free:
	free(buf);
	return rc;
}

/* ---- one rule ---- */

/* Parses decimal digits only (no sign, no blanks, no base prefix) into
 * *out, which must not exceed MAX. */
static bool fs_rules_number(const char *s, size_t len, unsigned long max, unsigned long *out)
{
	unsigned long v = 0;

	if (len == 0)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (unsigned long)(s[i] - '0');
		if (v > max)
			return false;
	}
	*out = v;
	return true;
}

/* PORT: "*", "N" or "N-M" with N <= M <= 65535. */
static int fs_rules_parse_port(const char *rule, const char *s, struct fs_rule *r, char *err,
			       size_t errlen)
{
	unsigned long lo, hi;
	const char *dash;

	if (!strcmp(s, "*")) {
		r->port_lo = 0;
		r->port_hi = 65535;
		return 0;
	}
	dash = strchr(s, '-');
	if (!dash) {
		if (!fs_rules_number(s, strlen(s), 65535, &lo))
			return fs_rules_fail(err, errlen, rule,
					     "port '%s' is not *, N or N-M with 0 <= N <= M <= 65535", s);
		r->port_lo = r->port_hi = (uint16_t)lo;
		return 0;
	}
	if (!fs_rules_number(s, (size_t)(dash - s), 65535, &lo) ||
	    !fs_rules_number(dash + 1, strlen(dash + 1), 65535, &hi))
		return fs_rules_fail(err, errlen, rule,
				     "port range '%s' is not N-M with 0 <= N <= M <= 65535", s);
	if (lo > hi)
		return fs_rules_fail(err, errlen, rule, "port range '%s' starts above its end", s);
	r->port_lo = (uint16_t)lo;
	r->port_hi = (uint16_t)hi;
	return 0;
}

/* Clears the bits of ADDR beyond PREFIX. */
static void fs_rules_mask(uint8_t addr[16], unsigned prefix)
{
	for (unsigned i = 0; i < 16; i++) {
		unsigned bits = prefix > i * 8 ? prefix - i * 8 : 0;
		if (bits < 8)
			addr[i] &= (uint8_t)(0xff00u >> bits);
	}
}

/* ADDRESS[/PREFIX][:PORT[-PORT]] where ADDRESS is *, a.b.c.d or [v6]. The
 * prefix of an IPv6 address may be written inside or after the brackets. */
static int fs_rules_parse_target(const char *rule, char *s, struct fs_rule *r, char *err,
				 size_t errlen)
{
	char *addr_text, *prefix_text = NULL, *port_text = NULL;
	unsigned long prefix;
	unsigned max_prefix;
	bool v6;

	r->port_lo = 0;
	r->port_hi = 65535;
	memset(r->addr, 0, sizeof(r->addr));

	if (s[0] == '*') {
		if (s[1] == ':') {
			port_text = s + 2;
		} else if (s[1] != '\0') {
			return fs_rules_fail(err, errlen, rule,
					     "address '%s': '*' takes no prefix, only an optional :PORT", s);
		}
		r->prefix = 0;
		return port_text ? fs_rules_parse_port(rule, port_text, r, err, errlen) : 0;
	}

	if (s[0] == '[') {
		char *close = strchr(s, ']');
		if (!close)
			return fs_rules_fail(err, errlen, rule, "address '%s' lacks its closing ']'", s);
		*close = '\0';
		addr_text = s + 1;
		char *slash = strchr(addr_text, '/');
		if (slash) {
			*slash = '\0';
			prefix_text = slash + 1;
		}
		char *rest = close + 1;
		if (*rest == '/') {
			if (prefix_text)
				return fs_rules_fail(err, errlen, rule, "IPv6 address has two prefixes");
			rest++;
			prefix_text = rest;
			rest += strcspn(rest, ":");
			if (*rest == ':')
				*rest++ = '\0', port_text = rest;
		} else if (*rest == ':') {
			port_text = rest + 1;
		} else if (*rest != '\0') {
			return fs_rules_fail(err, errlen, rule,
					     "unexpected '%s' after the IPv6 address", rest);
		}
		struct in6_addr a6;
		if (inet_pton(AF_INET6, addr_text, &a6) != 1)
			return fs_rules_fail(err, errlen, rule, "'%s' is not an IPv6 address",
					     addr_text);
		memcpy(r->addr, &a6, 16);
		v6 = true;
		max_prefix = 128;
	} else {
		addr_text = s;
		char *end = s + strcspn(s, "/:");
		if (*end == ':' && strchr(end + 1, ':'))
			return fs_rules_fail(err, errlen, rule,
					     "'%s' has more than one ':'; IPv6 addresses go in brackets, e.g. [::1]:80",
					     s);
		if (*end == '/') {
			*end = '\0';
			prefix_text = end + 1;
			char *colon = strchr(prefix_text, ':');
			if (colon)
				*colon = '\0', port_text = colon + 1;
		} else if (*end == ':') {
			*end = '\0';
			port_text = end + 1;
		}
		struct in_addr a4;
		if (inet_pton(AF_INET, addr_text, &a4) != 1)
			return fs_rules_fail(err, errlen, rule,
					     "'%s' is not *, an IPv4 address or a bracketed IPv6 address",
					     addr_text);
		memcpy(r->addr, fs_v4_mapped_prefix, 12);
		memcpy(r->addr + 12, &a4, 4);
		v6 = false;
		max_prefix = 32;
	}

	prefix = max_prefix;
	if (prefix_text && !fs_rules_number(prefix_text, strlen(prefix_text), max_prefix, &prefix))
		return fs_rules_fail(err, errlen, rule, "prefix '/%s' is not a number in 0..%u for %s",
				     prefix_text, max_prefix, v6 ? "IPv6" : "IPv4");
	r->prefix = (unsigned)prefix + (v6 ? 0 : 96);
	fs_rules_mask(r->addr, r->prefix);
	return port_text ? fs_rules_parse_port(rule, port_text, r, err, errlen) : 0;
}

/* One rule: exactly three blank-separated fields. RULE is the trimmed text,
 * modified in place. */
/* A rule's first two words and their values. */
static const char *const fs_rule_actions[] = { "offload", "probe", "kernel" };
static const int fs_rule_action_values[] = { FS_RULE_OFFLOAD, FS_RULE_PROBE, FS_RULE_KERNEL };
static const char *const fs_rule_sides[] = { "client", "server", "any" };
static const int fs_rule_side_values[] = { FS_SIDE_CLIENT, FS_SIDE_SERVER, FS_SIDE_ANY };

/* The value of WORD (any case) among the three NAMES, or -1. */
static int fs_rules_word(const char *word, const char *const names[3], const int values[3])
{
	for (int i = 0; i < 3; i++)
		if (!strcasecmp(word, names[i]))
			return values[i];
	return -1;
}

static int fs_rules_parse_one(char *rule, struct fs_rule *r, char *err, size_t errlen)
{
	char quote[FS_RULES_QUOTE_MAX + 4];
	char *field[4];
	int count = 0, v;
	char *p = rule;

	/* Keep the original text for messages: fields are cut in place. */
	snprintf(quote, sizeof(quote), "%s", rule);
	if (strlen(rule) >= sizeof(quote))
		strcpy(quote + sizeof(quote) - 4, "...");

	while (*p && count < 4) {
		while (isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		field[count++] = p;
		while (*p && !isspace((unsigned char)*p))
			p++;
		if (*p)
			*p++ = '\0';
	}
	if (count != 3)
		return fs_rules_fail(err, errlen, quote,
				     "expected ACTION SIDE ADDRESS[/PREFIX][:PORT[-PORT]], found %s fields",
				     count > 3 ? "more than 3" : count == 2 ? "2" : "1");

	if ((v = fs_rules_word(field[0], fs_rule_actions, fs_rule_action_values)) < 0)
		return fs_rules_fail(err, errlen, quote,
				     "action '%s' is not offload, probe or kernel", field[0]);
	r->action = (enum fs_rule_action)v;
	if ((v = fs_rules_word(field[1], fs_rule_sides, fs_rule_side_values)) < 0)
		return fs_rules_fail(err, errlen, quote, "side '%s' is not client, server or any",
				     field[1]);
	r->side = (enum fs_rule_side)v;

	return fs_rules_parse_target(quote, field[2], r, err, errlen);
}

static char *fs_rules_trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/* Parses rule text (no '@'), splitting lines, dropping comments, splitting
 * on ';'. TEXT is modified in place. */
static int fs_rules_parse_text(char *text, struct fs_rules *out, char *err, size_t errlen)
{
	size_t cap = 0;
	char *line = text;

	while (line) {
		char *next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		line[strcspn(line, "#")] = '\0';

		char *save = NULL;
		for (char *piece = strtok_r(line, ";", &save); piece;
		     piece = strtok_r(NULL, ";", &save)) {
			piece = fs_rules_trim(piece);
			if (!*piece)
				continue;
			if (out->count == cap) {
				size_t bigger = cap ? cap * 2 : 8;
				struct fs_rule *grown = realloc(out->rule, bigger * sizeof(*grown));
				if (!grown)
					return fs_rules_fail(err, errlen, NULL, "out of memory");
				out->rule = grown;
				cap = bigger;
			}
			int rc = fs_rules_parse_one(piece, &out->rule[out->count], err, errlen);
			if (rc < 0)
				return rc;
			out->count++;
		}
		line = next;
	}
	return 0;
}

int fs_rules_parse(const char *text, struct fs_rules *out, char *err, size_t errlen)
{
	char *copy = NULL;
	int rc;

	out->rule = NULL;
	out->count = 0;
	if (err && errlen)
		err[0] = '\0';
	if (!text)
		return 0;
	while (isspace((unsigned char)*text))
		text++;

	if (text[0] == '@') {
		char *path = strdup(text + 1);
		if (!path)
			return fs_rules_fail(err, errlen, NULL, "out of memory");
		char *trimmed = fs_rules_trim(path);
		if (!*trimmed) {
			free(path);
			return fs_rules_fail(err, errlen, NULL, "'@' must be followed by a file name");
		}
		rc = fs_rules_read_file(trimmed, &copy);
		if (rc < 0) {
			fs_rules_fail(err, errlen, NULL, "cannot read rules file %s: %s", trimmed,
				      strerror(-rc));
			free(path);
			return -EINVAL;
		}
		free(path);
	} else {
		copy = strdup(text);
		if (!copy)
			return fs_rules_fail(err, errlen, NULL, "out of memory");
	}

	rc = fs_rules_parse_text(copy, out, err, errlen);
	free(copy);
	if (rc < 0)
		fs_rules_free(out);
	return rc;
}

/* ---- matching ---- */

static bool fs_rule_addr_match(const struct fs_rule *r, const uint8_t addr[16])
{
	unsigned full = r->prefix / 8, bits = r->prefix % 8;

	if (memcmp(r->addr, addr, full))
		return false;
	if (bits && ((r->addr[full] ^ addr[full]) & (uint8_t)(0xff00u >> bits)))
		return false;
	return true;
}

enum fs_rule_action fs_rules_match(const struct fs_rules *rules, enum fs_rule_side side,
				   const struct sockaddr *addr, uint16_t port)
{
	uint8_t a[16];
	bool have_addr = false;

	if (addr && addr->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
		memcpy(a, fs_v4_mapped_prefix, 12);
		memcpy(a + 12, &in->sin_addr, 4);
		have_addr = true;
	} else if (addr && addr->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
		memcpy(a, &in6->sin6_addr, 16);
		have_addr = true;
	}

	for (size_t i = 0; rules && i < rules->count; i++) {
		const struct fs_rule *r = &rules->rule[i];
		if (r->side != side && r->side != FS_SIDE_ANY)
			continue;
		if (port < r->port_lo || port > r->port_hi)
			continue;
		/* Without an address (or with a family we do not know), only
		 * rules for any address can match. */
		if (have_addr ? !fs_rule_addr_match(r, a) : r->prefix != 0)
			continue;
		return r->action;
	}
	return FS_RULE_PROBE;
}

void fs_rules_load_global(void)
{
	char err[256];
	struct fs_rules parsed;

	fs_rules_free(&fs_rules_global);
	/* No rules (the default): nothing to copy. Parsing copies the text,
	 * and that strdup was the first malloc, with its heap set-up, of
	 * every program that makes none (every process pays the constructor) */
	if (!fs_params.rules || !fs_params.rules[strspn(fs_params.rules, " \t\r\n;")])
		return;
	if (fs_rules_parse(fs_params.rules, &parsed, err, sizeof(err)) < 0) {
		FS_WARN("FABSOCK_RULES: %s; no rules in force", err);
		return;
	}
	fs_rules_global = parsed;
	if (parsed.count)
		FS_INFO("FABSOCK_RULES: %zu rule(s) in force", parsed.count);
}
