/* SPDX-License-Identifier: MIT */
/*
 * Offload rules (FABSOCK_RULES), in the spirit of libvma.conf. A rule is
 *
 *     ACTION SIDE ADDRESS[/PREFIX][:PORT[-PORT]]
 *
 * ACTION  offload  the peer is known to run fabsock: skip the UDP probe
 *                  (client) / accept its HELLO without a probe (server)
 *         probe    the default behaviour (useful to carve exceptions)
 *         kernel   never offload: plain kernel TCP
 * SIDE    client | server | any
 * ADDRESS *, an IPv4 address, or an IPv6 address in brackets ([::1]),
 *         with an optional prefix length; v4-mapped IPv6 addresses match
 *         IPv4 rules. PORT is *, N or N-M (default *).
 *
 * For the client side a rule matches the destination (server) address and
 * port; for the server side it matches the client's address and the local
 * listening port. The first matching rule wins; no match means probe.
 * Rules are separated by ';' or newlines; '#' starts a comment. A value
 * starting with '@' names a file holding the rules.
 */
#ifndef FS_CONFIG_RULES_H
#define FS_CONFIG_RULES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

enum fs_rule_action { FS_RULE_PROBE = 0, FS_RULE_OFFLOAD = 1, FS_RULE_KERNEL = 2 };
enum fs_rule_side { FS_SIDE_CLIENT = 1, FS_SIDE_SERVER = 2, FS_SIDE_ANY = 3 };

struct fs_rule {
	enum fs_rule_action action;
	enum fs_rule_side side;
	uint8_t addr[16];    /* IPv6 or v4-mapped IPv4, network order */
	unsigned prefix;     /* 0..128, counted on the 128-bit form */
	uint16_t port_lo, port_hi; /* host order; 0-65535 means any */
};

struct fs_rules {
	struct fs_rule *rule;
	size_t count;
};

/* Parses TEXT (rules or @FILE). On error returns -EINVAL and writes a
 * one-line reason naming the bad rule into ERR; OUT is then empty. */
int fs_rules_parse(const char *text, struct fs_rules *out, char *err, size_t errlen);
void fs_rules_free(struct fs_rules *rules);

/* First matching rule's action for SIDE (FS_SIDE_CLIENT or FS_SIDE_SERVER),
 * ADDR (AF_INET or AF_INET6 sockaddr; NULL means "any address": only rules
 * whose address is * match) and PORT in host order. No match: FS_RULE_PROBE. */
enum fs_rule_action fs_rules_match(const struct fs_rules *rules, enum fs_rule_side side,
				   const struct sockaddr *addr, uint16_t port);

const char *fs_rule_action_name(enum fs_rule_action action);

/* The process-wide rules parsed from fs_params.rules by fs_rules_load_global()
 * (a parse error is logged once and leaves no rules in force). */
extern struct fs_rules fs_rules_global;
void fs_rules_load_global(void);

#endif
