/* SPDX-License-Identifier: MIT */
/*
 * Unit test of config/rules.c: parsing of valid rule sets (separators,
 * comments, @FILE, every address and port form) down to the stored fields,
 * matching (first match wins, sides, IPv4 / IPv6 / v4-mapped, prefixes,
 * port ranges, no address), malformed rules rejected with -EINVAL and a
 * message naming the rule, and fs_rules_load_global.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "config/rules.h"
#include "preload/real.h"
#include "tests/unit/check.h"

static struct sockaddr_storage make_addr(const char *text)
{
	struct sockaddr_storage ss;

	memset(&ss, 0, sizeof(ss));
	if (strchr(text, ':')) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		in6->sin6_family = AF_INET6;
		if (inet_pton(AF_INET6, text, &in6->sin6_addr) != 1)
			fprintf(stderr, "bad test address %s\n", text);
	} else {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		in->sin_family = AF_INET;
		if (inet_pton(AF_INET, text, &in->sin_addr) != 1)
			fprintf(stderr, "bad test address %s\n", text);
	}
	return ss;
}

/* Match RULES against SIDE, address TEXT (NULL: no address) and PORT. */
static enum fs_rule_action match(const struct fs_rules *rules, enum fs_rule_side side,
				 const char *text, uint16_t port)
{
	struct sockaddr_storage ss;

	if (!text)
		return fs_rules_match(rules, side, NULL, port);
	ss = make_addr(text);
	return fs_rules_match(rules, side, (struct sockaddr *)&ss, port);
}

static int parse(const char *text, struct fs_rules *rules)
{
	char err[256];
	int rc = fs_rules_parse(text, rules, err, sizeof(err));

	if (rc)
		fprintf(stderr, "unexpected parse error for '%s': %s\n", text, err);
	return rc;
}

static void test_fields(void)
{
	struct fs_rules r;
	static const uint8_t v4_10[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 0 };
	static const uint8_t v4_host[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 7 };
	static const uint8_t zero[16] = { 0 };
	uint8_t v6[16];

	CHECK(parse("offload client 10.1.2.3/8:80-90; kernel server [fe80::1]/64:22 ;"
		    "probe any *; offload any 192.168.1.7:443; kernel client [::1]; "
		    "offload server [2001:db8::/32]:*",
		    &r) == 0);
	CHECK(r.count == 6);
	if (r.count != 6) {
		fs_rules_free(&r);
		return;
	}
	CHECK(r.rule[0].action == FS_RULE_OFFLOAD && r.rule[0].side == FS_SIDE_CLIENT);
	CHECK(!memcmp(r.rule[0].addr, v4_10, 16)); /* host bits cleared */
	CHECK(r.rule[0].prefix == 104);
	CHECK(r.rule[0].port_lo == 80 && r.rule[0].port_hi == 90);

	CHECK(r.rule[1].action == FS_RULE_KERNEL && r.rule[1].side == FS_SIDE_SERVER);
	inet_pton(AF_INET6, "fe80::", v6);
	CHECK(!memcmp(r.rule[1].addr, v6, 16));
	CHECK(r.rule[1].prefix == 64);
	CHECK(r.rule[1].port_lo == 22 && r.rule[1].port_hi == 22);

	CHECK(r.rule[2].action == FS_RULE_PROBE && r.rule[2].side == FS_SIDE_ANY);
	CHECK(!memcmp(r.rule[2].addr, zero, 16) && r.rule[2].prefix == 0);
	CHECK(r.rule[2].port_lo == 0 && r.rule[2].port_hi == 65535);

	CHECK(!memcmp(r.rule[3].addr, v4_host, 16) && r.rule[3].prefix == 128);
	CHECK(r.rule[3].port_lo == 443 && r.rule[3].port_hi == 443);

	inet_pton(AF_INET6, "::1", v6);
	CHECK(!memcmp(r.rule[4].addr, v6, 16) && r.rule[4].prefix == 128);
	CHECK(r.rule[4].port_lo == 0 && r.rule[4].port_hi == 65535);

	inet_pton(AF_INET6, "2001:db8::", v6);
	CHECK(!memcmp(r.rule[5].addr, v6, 16) && r.rule[5].prefix == 32);
	CHECK(r.rule[5].side == FS_SIDE_SERVER);
	fs_rules_free(&r);
	CHECK(r.rule == NULL && r.count == 0);
}

static void test_separators(void)
{
	struct fs_rules r;

	/* Empty, blank, and comment-only texts are valid and hold no rules. */
	CHECK(parse("", &r) == 0 && r.count == 0);
	fs_rules_free(&r);
	CHECK(parse(NULL, &r) == 0 && r.count == 0);
	CHECK(parse("  \n\t ;; ; \n", &r) == 0 && r.count == 0);
	fs_rules_free(&r);
	CHECK(parse("# nothing here\n   # nor here; offload any *\n", &r) == 0 && r.count == 0);
	fs_rules_free(&r);

	/* Newlines, ';', tabs, CRLF, a comment that swallows the ';' after it. */
	CHECK(parse("offload client 10.0.0.0/8:5000\r\n"
		    "\tkernel\tany\t* # comment; probe any *\n"
		    "probe server 1.2.3.4 ; offload server 1.2.3.5",
		    &r) == 0);
	CHECK(r.count == 4);
	if (r.count == 4) {
		CHECK(r.rule[0].action == FS_RULE_OFFLOAD && r.rule[0].port_lo == 5000);
		CHECK(r.rule[1].action == FS_RULE_KERNEL && r.rule[1].prefix == 0);
		CHECK(r.rule[2].action == FS_RULE_PROBE && r.rule[2].side == FS_SIDE_SERVER);
		CHECK(r.rule[3].action == FS_RULE_OFFLOAD);
	}
	fs_rules_free(&r);

	/* Keywords are case-insensitive. */
	CHECK(parse("OFFLOAD Client *", &r) == 0 && r.count == 1);
	fs_rules_free(&r);
}

static void test_match(void)
{
	struct fs_rules r;

	CHECK(parse("kernel client 10.1.0.0/16:22;"  /* carve-out before the wider rule */
		    "offload client 10.0.0.0/8;"
		    "offload server 192.168.0.0/12:5000-5010;"
		    "kernel any [2001:db8::1];"
		    "offload any [2001:db8::]/32:80;"
		    "probe any [fe80::]/10;"
		    "offload any [fe80::]/0:7000;"
		    "kernel server *:9000",
		    &r) == 0);
	CHECK(r.count == 8);

	/* First match wins. */
	CHECK(match(&r, FS_SIDE_CLIENT, "10.1.2.3", 22) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "10.1.2.3", 23) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "10.2.2.3", 22) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "10.255.255.255", 1) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "11.0.0.1", 1) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, "9.255.255.255", 1) == FS_RULE_PROBE);
	/* Side: client rules do not apply to the server side. */
	CHECK(match(&r, FS_SIDE_SERVER, "10.1.2.3", 23) == FS_RULE_PROBE);

	/* v4-mapped IPv6 addresses match IPv4 rules. */
	CHECK(match(&r, FS_SIDE_CLIENT, "::ffff:10.1.2.3", 22) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "::ffff:10.9.9.9", 80) == FS_RULE_OFFLOAD);
	/* ...but a v4-compatible or unrelated v6 address does not. */
	CHECK(match(&r, FS_SIDE_CLIENT, "::10.9.9.9", 80) == FS_RULE_PROBE);

	/* /12 (192.160.0.0 - 192.175.255.255) and the port range. */
	CHECK(match(&r, FS_SIDE_SERVER, "192.160.0.1", 5000) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_SERVER, "192.175.255.255", 5010) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_SERVER, "192.168.1.1", 5005) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_SERVER, "192.176.0.0", 5005) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_SERVER, "192.159.255.255", 5005) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_SERVER, "192.168.1.1", 4999) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_SERVER, "192.168.1.1", 5011) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, "192.168.1.1", 5005) == FS_RULE_PROBE);

	/* IPv6: /128 before /32, side any applies to both sides. */
	CHECK(match(&r, FS_SIDE_CLIENT, "2001:db8::1", 80) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_SERVER, "2001:db8::1", 1) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_SERVER, "2001:db8::2", 80) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "2001:db8:ffff::2", 80) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "2001:db8::2", 81) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, "2001:db9::2", 80) == FS_RULE_PROBE);
	/* /10: fe80:: - febf:ffff:... */
	CHECK(match(&r, FS_SIDE_CLIENT, "febf::1", 7000) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, "fec0::1", 7000) == FS_RULE_OFFLOAD);
	/* [x]/0 matches every address of both families, including IPv4. */
	CHECK(match(&r, FS_SIDE_CLIENT, "8.8.8.8", 7000) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_SERVER, "::", 7000) == FS_RULE_OFFLOAD);

	/* '*' matches IPv4, IPv6, and no address. */
	CHECK(match(&r, FS_SIDE_SERVER, "1.2.3.4", 9000) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_SERVER, "1::2", 9000) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_SERVER, NULL, 9000) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "1.2.3.4", 9000) == FS_RULE_PROBE);

	/* No address: only prefix-0 rules ([fe80::]/0:7000 and *:9000) can match. */
	CHECK(match(&r, FS_SIDE_CLIENT, NULL, 22) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, NULL, 80) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, NULL, 7000) == FS_RULE_OFFLOAD);

	/* Unknown family behaves like no address. */
	struct sockaddr unix_addr = { .sa_family = AF_UNIX };
	CHECK(fs_rules_match(&r, FS_SIDE_SERVER, &unix_addr, 9000) == FS_RULE_KERNEL);
	CHECK(fs_rules_match(&r, FS_SIDE_CLIENT, &unix_addr, 22) == FS_RULE_PROBE);
	fs_rules_free(&r);

	/* No rules, NULL rules: always probe. */
	struct fs_rules none = { 0 };
	CHECK(match(&none, FS_SIDE_CLIENT, "10.0.0.1", 1) == FS_RULE_PROBE);
	CHECK(fs_rules_match(NULL, FS_SIDE_CLIENT, NULL, 1) == FS_RULE_PROBE);
}

static void test_prefixes(void)
{
	struct fs_rules r;

	/* IPv4 /0 matches IPv4 (and v4-mapped) only, unlike '*'. */
	CHECK(parse("offload any 0.0.0.0/0", &r) == 0 && r.count == 1);
	CHECK(r.count == 1 && r.rule[0].prefix == 96);
	CHECK(match(&r, FS_SIDE_CLIENT, "255.255.255.255", 1) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "::ffff:1.1.1.1", 1) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "2001::1", 1) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, NULL, 1) == FS_RULE_PROBE);
	fs_rules_free(&r);

	/* /32 is one host; the default prefix is /32. */
	CHECK(parse("offload any 1.2.3.4/32; kernel any 1.2.3.6", &r) == 0 && r.count == 2);
	CHECK(match(&r, FS_SIDE_CLIENT, "1.2.3.4", 1) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "1.2.3.5", 1) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, "1.2.3.6", 1) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "1.2.3.7", 1) == FS_RULE_PROBE);
	fs_rules_free(&r);

	/* /31 and /1, odd bit boundaries. */
	CHECK(parse("offload any 1.2.3.4/31; kernel any 128.0.0.0/1", &r) == 0 && r.count == 2);
	CHECK(match(&r, FS_SIDE_CLIENT, "1.2.3.5", 1) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "1.2.3.6", 1) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, "200.0.0.1", 1) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "127.255.255.255", 1) == FS_RULE_PROBE);
	fs_rules_free(&r);

	/* IPv6 /128 and /127, /0 written after the brackets. */
	CHECK(parse("offload any [::2]/127; kernel any [2001:db8::5]/128; probe any [::]/0", &r) == 0);
	CHECK(r.count == 3 && r.rule[2].prefix == 0);
	CHECK(match(&r, FS_SIDE_CLIENT, "::3", 1) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "::4", 1) == FS_RULE_PROBE);
	CHECK(match(&r, FS_SIDE_CLIENT, "2001:db8::5", 1) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "2001:db8::4", 1) == FS_RULE_PROBE);
	fs_rules_free(&r);
}

static void test_ports(void)
{
	struct fs_rules r;

	CHECK(parse("offload any *:0; kernel any *:65535; offload any 1.1.1.1:0-65535; "
		    "kernel any *:100-100; offload any *:*",
		    &r) == 0);
	CHECK(r.count == 5);
	if (r.count == 5) {
		CHECK(r.rule[0].port_lo == 0 && r.rule[0].port_hi == 0);
		CHECK(r.rule[1].port_lo == 65535 && r.rule[1].port_hi == 65535);
		CHECK(r.rule[2].port_lo == 0 && r.rule[2].port_hi == 65535);
		CHECK(r.rule[3].port_lo == 100 && r.rule[3].port_hi == 100);
		CHECK(r.rule[4].port_lo == 0 && r.rule[4].port_hi == 65535);
	}
	CHECK(match(&r, FS_SIDE_CLIENT, "2.2.2.2", 0) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_CLIENT, "2.2.2.2", 65535) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "2.2.2.2", 100) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "2.2.2.2", 101) == FS_RULE_OFFLOAD);
	fs_rules_free(&r);
}

static void test_file(void)
{
	char path[] = "/tmp/fabsock-test-rules-XXXXXX";
	char text[300];
	struct fs_rules r;
	char err[256];
	int fd = mkstemp(path);
	static const char body[] = "# fabsock rules\n"
				   "kernel client 10.0.0.1:22   # ssh stays on TCP\n"
				   "offload client 10.0.0.0/8\n"
				   "\n"
				   "offload server [fd00::]/8:5000-6000; probe any *\n";

	CHECK(fd >= 0);
	CHECK(write(fd, body, sizeof(body) - 1) == (ssize_t)(sizeof(body) - 1));
	close(fd);

	snprintf(text, sizeof(text), "@%s", path);
	CHECK(parse(text, &r) == 0 && r.count == 4);
	CHECK(match(&r, FS_SIDE_CLIENT, "10.0.0.1", 22) == FS_RULE_KERNEL);
	CHECK(match(&r, FS_SIDE_CLIENT, "10.0.0.1", 23) == FS_RULE_OFFLOAD);
	CHECK(match(&r, FS_SIDE_SERVER, "fd12::1", 5500) == FS_RULE_OFFLOAD);
	fs_rules_free(&r);

	/* Blanks around '@' and the name are ignored. */
	snprintf(text, sizeof(text), "  @ %s \n", path);
	CHECK(parse(text, &r) == 0 && r.count == 4);
	fs_rules_free(&r);

	/* A bad rule inside the file is reported like any other. */
	fd = open(path, O_WRONLY | O_TRUNC);
	CHECK(fd >= 0);
	CHECK(write(fd, "offload client *\nofload client *\n", 34) == 34);
	close(fd);
	snprintf(text, sizeof(text), "@%s", path);
	CHECK(fs_rules_parse(text, &r, err, sizeof(err)) == -EINVAL);
	CHECK(r.count == 0 && r.rule == NULL);
	CHECK(strstr(err, "'ofload client *'") != NULL);

	/* A file larger than FS_RULES_FILE_MAX (1 MiB) of comments is refused. */
	fd = open(path, O_WRONLY | O_TRUNC);
	char junk[4096];
	memset(junk, '#', sizeof(junk));
	for (int i = 0; i < 300; i++)
		CHECK(write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
	close(fd);
	CHECK(fs_rules_parse(text, &r, err, sizeof(err)) == -EINVAL);
	CHECK(strstr(err, "cannot read rules file") != NULL);
	unlink(path);

	/* A missing file and a missing name. */
	CHECK(fs_rules_parse("@/nonexistent/fabsock.rules", &r, err, sizeof(err)) == -EINVAL);
	CHECK(!strcmp(err, "cannot read rules file /nonexistent/fabsock.rules: "
			   "No such file or directory"));
	CHECK(fs_rules_parse("@", &r, err, sizeof(err)) == -EINVAL);
	CHECK(err[0] != '\0');
	CHECK(fs_rules_parse("@  ", &r, err, sizeof(err)) == -EINVAL);
}

static void test_malformed(void)
{
	static const struct {
		const char *text;
		const char *in_message; /* must appear in the error */
	} bad[] = {
		{ "ofload client *", "action 'ofload'" },
		{ "offload clients *", "side 'clients'" },
		{ "offload client", "fields" },
		{ "offload", "fields" },
		{ "offload client * extra", "fields" },
		{ "offload client 10.0.0.256", "'10.0.0.256' is not" },
		{ "offload client 10.0.0", "'10.0.0' is not" },
		{ "offload client host.example", "'host.example' is not" },
		{ "offload client 10.0.0.0/33", "prefix '/33'" },
		{ "offload client 10.0.0.0/", "prefix '/'" },
		{ "offload client 10.0.0.0/-1", "prefix '/-1'" },
		{ "offload client 10.0.0.0/8x", "prefix '/8x'" },
		{ "offload client [::1]/129", "prefix '/129'" },
		{ "offload client [::1/64]/64", "two prefixes" },
		{ "offload client [::1", "closing ']'" },
		{ "offload client [::g]", "'::g' is not an IPv6" },
		{ "offload client [::1]x", "unexpected 'x'" },
		{ "offload client ::1", "brackets" },
		{ "offload client *:65536", "port '65536'" },
		{ "offload client *:", "port ''" },
		{ "offload client *:-1", "port range '-1'" },
		{ "offload client *:http", "port 'http'" },
		{ "offload client *:90-80", "starts above its end" },
		{ "offload client *:81-80", "starts above its end" },
		{ "offload client *:80-", "port range '80-'" },
		{ "offload client *:1-70000", "port range '1-70000'" },
		{ "offload client 1.2.3.4:+80", "port '+80'" },
		{ "offload client */8", "'*' takes no prefix" },
		{ "offload client **", "'*' takes no prefix" },
		{ "!!! garbage !!!", "action '!!!'" },
	};
	struct fs_rules r;
	char err[256];
	char expect[128];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(err, 0, sizeof(err));
		r.rule = (struct fs_rule *)&r; /* must be reset by the parser */
		r.count = 99;
		int rc = fs_rules_parse(bad[i].text, &r, err, sizeof(err));
		CHECK(rc == -EINVAL);
		CHECK(r.rule == NULL && r.count == 0);
		/* The message names the rule, then says what is wrong. */
		snprintf(expect, sizeof(expect), "rule '%s': ", bad[i].text);
		CHECK(!strncmp(err, expect, strlen(expect)));
		CHECK(strstr(err, bad[i].in_message) != NULL);
		CHECK(strchr(err, '\n') == NULL);
		if (rc != -EINVAL || !strstr(err, bad[i].in_message))
			fprintf(stderr, "  input '%s' gave rc %d, message '%s'\n", bad[i].text, rc, err);
	}

	/* A bad rule after good ones discards all of them; the message names
	 * the bad one only. */
	CHECK(fs_rules_parse("offload client *; kernel server *:70000; probe any *", &r, err,
			     sizeof(err)) == -EINVAL);
	CHECK(r.count == 0 && r.rule == NULL);
	CHECK(!strncmp(err, "rule 'kernel server *:70000': ", 30));

	/* A tiny or absent error buffer is not overrun. */
	char tiny[8];
	memset(tiny, 'z', sizeof(tiny));
	CHECK(fs_rules_parse("bogus any *", &r, tiny, 4) == -EINVAL);
	CHECK(tiny[3] == '\0' && tiny[4] == 'z');
	CHECK(fs_rules_parse("bogus any *", &r, NULL, 0) == -EINVAL);

	/* A very long rule is quoted shortened. */
	char longrule[400];
	snprintf(longrule, sizeof(longrule), "offload client %0300d", 1);
	CHECK(fs_rules_parse(longrule, &r, err, sizeof(err)) == -EINVAL);
	CHECK(strlen(err) <= 255 && strstr(err, "...': ") != NULL);
}

static void test_names(void)
{
	CHECK(!strcmp(fs_rule_action_name(FS_RULE_PROBE), "probe"));
	CHECK(!strcmp(fs_rule_action_name(FS_RULE_OFFLOAD), "offload"));
	CHECK(!strcmp(fs_rule_action_name(FS_RULE_KERNEL), "kernel"));
	CHECK(!strcmp(fs_rule_action_name((enum fs_rule_action)42), "unknown"));
}

static void test_global(void)
{
	char log_path[] = "/tmp/fabsock-test-rules-log-XXXXXX";
	int fd = mkstemp(log_path);
	char buf[1024] = "";
	char expect[256];

	CHECK(fd >= 0);
	setenv("FABSOCK_LOG_FILE", log_path, 1);
	setenv("FABSOCK_RULES", "offload client 10.0.0.0/8; kernel any *:22", 1);
	CHECK(fs_params_load() == 0);
	fs_log_init();
	fs_rules_load_global();
	CHECK(fs_rules_global.count == 2);
	CHECK(match(&fs_rules_global, FS_SIDE_CLIENT, "10.3.3.3", 80) == FS_RULE_OFFLOAD);
	CHECK(match(&fs_rules_global, FS_SIDE_SERVER, "10.3.3.3", 22) == FS_RULE_KERNEL);

	/* A bad set: a warning, and no rules (not the previous ones). */
	setenv("FABSOCK_RULES", "offload client 10.0.0.0/8; kernel any *:99999", 1);
	CHECK(fs_params_load() == 0);
	fs_rules_load_global();
	CHECK(fs_rules_global.count == 0 && fs_rules_global.rule == NULL);
	CHECK(match(&fs_rules_global, FS_SIDE_CLIENT, "10.3.3.3", 80) == FS_RULE_PROBE);
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	snprintf(expect, sizeof(expect),
		 "fabsock[%d]: warn: FABSOCK_RULES: rule 'kernel any *:99999': port '99999' is not "
		 "*, N or N-M with 0 <= N <= M <= 65535; no rules in force\n",
		 (int)getpid());
	CHECK(!strcmp(buf, expect));
	if (strcmp(buf, expect))
		fprintf(stderr, "  expected: %s  got:      %s", expect, buf);

	/* Unset: empty. */
	unsetenv("FABSOCK_RULES");
	CHECK(fs_params_load() == 0);
	fs_rules_load_global();
	CHECK(fs_rules_global.count == 0);

	unsetenv("FABSOCK_LOG_FILE");
	CHECK(fs_params_load() == 0);
	fs_log_init();
	close(fd);
	unlink(log_path);
	fs_rules_free(&fs_rules_global);
}

int main(void)
{
	fs_real_init();
	test_fields();
	test_separators();
	test_match();
	test_prefixes();
	test_ports();
	test_file();
	test_malformed();
	test_names();
	test_global();
	return fs_check_done();
}
