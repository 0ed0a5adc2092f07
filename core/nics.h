/* SPDX-License-Identifier: MIT */
/*
 * The NICs of a provider and which of them a process uses (issue 28, "every
 * NIC"). A NIC is one RDM domain of the provider's fi_getinfo answer (efa:
 * one per device, 4 on a p4d, 32 on a p5; tcp: one per interface; shm: one).
 * This module lists them (one entry per domain name, in the provider's
 * order), reads each one's PCI address from fi_info->nic->bus_attr and its
 * NUMA node from sysfs, ranks them by NUMA distance from the CPUs the
 * process may run on (sched_getaffinity), ties and unknowns in the
 * provider's order, and marks the ones FABSOCK_RAIL_ADDRS allows and the
 * first FABSOCK_RAILS of those as used.
 *
 * No fabric calls and no locks: fabric.c hands it the fi_info list, and the
 * unit test (test_nics) hands it fi_info records it built and a fake sysfs
 * tree. sysfs is trusted, but every read and parse here is bounded, and a
 * file that does not parse makes the ranking fall back to the provider's
 * order, never fail.
 */
#ifndef FS_CORE_NICS_H
#define FS_CORE_NICS_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>

/* NICs kept per provider (a p5 has 32); more are counted in `skipped`. */
#define FS_NICS_MAX 64
/* NUMA nodes looked at: node numbers at or past it count as unknown. */
#define FS_NICS_NODES_MAX 64
/* Entries of FABSOCK_RAIL_ADDRS, and the length of one. */
#define FS_NICS_SPEC_MAX 64
#define FS_NICS_NAME_MAX 64
/* The distance of a NIC whose node, or whose distance from the process's
 * CPUs, is not known: after every known one. */
#define FS_NIC_DISTANCE_UNKNOWN UINT32_MAX

struct fs_nic {
	char name[FS_NICS_NAME_MAX]; /* the domain's name (rdmap16s27-rdm, eth0, shm) */
	char pci[16];                /* "dddd:bb:dd.f"; "" when the provider gives none */
	/* The source addresses the provider gave for it (tcp, net; IPv4 as
	 * ::ffff:a.b.c.d): what a FABSOCK_RAIL_ADDRS address is compared with. */
	uint8_t ip[4][16];
	unsigned ips;
	int node;          /* NUMA node; -1 unknown (or none: a one-node host) */
	uint32_t distance; /* from the nearest node the process may run on */
	unsigned order;    /* place in the provider's answer */
	unsigned rank;     /* 0: nearest (distance, then order) */
	bool allowed;      /* FABSOCK_RAIL_ADDRS names it, or names nothing */
	bool used;         /* one of the first FABSOCK_RAILS allowed, by rank */
	const struct fi_info *info; /* the provider's record (not ours; may be NULL) */
};

struct fs_nics {
	unsigned count, skipped;
	/* Bit N: the process may run on a CPU of node N (0: not known). */
	uint64_t cpu_nodes;
	/* Some NIC's distance is known: the order is by distance. */
	bool ranked;
	/* Why the ranking fell back to the provider's order ("" if it did not,
	 * or if no NIC had a PCI address to look up). */
	char fallback[96];
	/* Bit I: entry I of the FABSOCK_RAIL_ADDRS spec named one of these
	 * NICs (fs_nics_select). */
	uint64_t spec_matched;
	struct fs_nic nic[FS_NICS_MAX];
	unsigned by_rank[FS_NICS_MAX]; /* indices into nic[], nearest first */
};

/* FABSOCK_RAIL_ADDRS, parsed: which NICs a process may use. */
struct fs_nics_spec {
	unsigned count; /* 0: every NIC */
	struct fs_nics_spec_entry {
		enum { FS_NICS_BY_NAME, FS_NICS_BY_PCI, FS_NICS_BY_IP } kind;
		char text[FS_NICS_NAME_MAX]; /* a name, or the PCI address as "dddd:bb:dd.f" */
		uint8_t ip[16];              /* FS_NICS_BY_IP: v4 as ::ffff:a.b.c.d */
	} entry[FS_NICS_SPEC_MAX];
};

/* Adds FI, the provider's record of one RDM domain, unless a NIC of its
 * domain name is listed already (tcp lists an interface once per address
 * and endpoint type). Reads the PCI address and the source address. Returns
 * 0, -EEXIST (listed) or -ENOSPC (FS_NICS_MAX listed; counted in skipped). */
int fs_nics_add(struct fs_nics *nics, const struct fi_info *fi);

/* Reads each NIC's NUMA node under SYSFS (normally "/sys") and ranks the
 * NICs: by distance from the nearest node that holds a CPU of ALLOWED (the
 * process's affinity when NULL), then in the provider's order. Without a PCI
 * address on any NIC, nothing is read and the order is the provider's. */
void fs_nics_rank(struct fs_nics *nics, const char *sysfs, const cpu_set_t *allowed);

/* Parses TEXT (FABSOCK_RAIL_ADDRS: entries separated by commas, blanks
 * around them ignored; each a PCI address "dddd:bb:dd.f" or "bb:dd.f", an
 * IPv4 or IPv6 address, or a domain or interface name of letters, digits and
 * "._-"). Returns 0, or -EINVAL with a reason in ERR (SPEC then allows
 * every NIC). */
int fs_nics_spec_parse(const char *text, struct fs_nics_spec *spec, char *err, size_t errlen);

/* Marks the NICs SPEC allows and the first RAILS of them by rank as used;
 * notes which entries matched (spec_matched). Returns how many are used (0:
 * SPEC names none of these NICs). */
unsigned fs_nics_select(struct fs_nics *nics, const struct fs_nics_spec *spec, unsigned rails);

/* The nearest used NIC, or NULL when none is used. */
const struct fs_nic *fs_nics_first_used(const struct fs_nics *nics);
/* The used NIC of rank NTH among the used ones (0: the nearest), or NULL. */
const struct fs_nic *fs_nics_nth_used(const struct fs_nics *nics, unsigned nth);

/* FABSOCK_RAIL_ADDRS as parsed once for the process (a bad value warns once,
 * naming the variable, and allows every NIC). */
const struct fs_nics_spec *fs_nics_spec_global(void);

/* Writes the nodes of MASK as "0,1" (or "unknown") into OUT. */
void fs_nics_format_nodes(uint64_t mask, char *out, size_t size);

#endif
