/* SPDX-License-Identifier: MIT */
/*
 * Unit test of core/nics.c: listing a provider's NICs from fi_info records
 * (built here, no fabric), ranking them over a fake sysfs tree, and
 * FABSOCK_RAIL_ADDRS. The trees are shaped like the EFA hosts the ranking is
 * for: a p4d (2 NUMA nodes, 4 NICs, 2 per node) and a p5 (2 nodes, 32 NICs,
 * 8 per PCIe switch, 2 switches per node), with the process's affinity on
 * one node, on the other and on both; then what sysfs may hold instead of a
 * clean answer: a NIC without numa_node, one at -1, one whose file does not
 * parse (or is a FIFO, a directory, a node past what is tracked), node files
 * that do not parse (cpulist, distance, larger than a page), no node tree
 * at all. None of those may crash or hang; a NIC without a node ranks after
 * the known ones, and a node file that does not parse gives the provider's
 * order.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "config/log.h"
#include "config/params.h"
#include "core/nics.h"
#include "preload/real.h"
#include "tests/unit/check.h"

static char root[] = "/tmp/fabsock-test-nics-XXXXXX";

/* ---- fake fi_info records ---- */

struct fake_nic {
	struct fi_info info;
	struct fi_domain_attr domain;
	struct fid_nic nic;
	struct fi_bus_attr bus;
	struct sockaddr_in sin;
	char name[64];
};

static struct fake_nic fakes[80];

/* A record of an RDM domain NAME with PCI address DOMAIN:BUS:DEV.FN (BUS
 * < 0: none given) and source address IP (NULL: none). */
static const struct fi_info *fake(unsigned i, const char *name, int bus, int dev, const char *ip)
{
	struct fake_nic *f = &fakes[i];

	memset(f, 0, sizeof(*f));
	snprintf(f->name, sizeof(f->name), "%s", name);
	f->domain.name = f->name;
	f->info.domain_attr = &f->domain;
	if (bus >= 0) {
		f->bus.bus_type = FI_BUS_PCI;
		f->bus.attr.pci.domain_id = 0;
		f->bus.attr.pci.bus_id = (uint8_t)bus;
		f->bus.attr.pci.device_id = (uint8_t)dev;
		f->bus.attr.pci.function_id = 0;
		f->nic.bus_attr = &f->bus;
		f->info.nic = &f->nic;
	}
	if (ip) {
		f->sin.sin_family = AF_INET;
		inet_pton(AF_INET, ip, &f->sin.sin_addr);
		f->info.addr_format = FI_SOCKADDR_IN;
		f->info.src_addr = &f->sin;
		f->info.src_addrlen = sizeof(f->sin);
	}
	return &f->info;
}

/* ---- the fake sysfs tree ---- */

static void put(const char *rel, const char *text)
{
	char path[512], dir[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
		mkdir(dir, 0700);
	}
	unlink(path);
	rmdir(path);
	f = fopen(path, "w");
	if (!f) {
		perror(path);
		exit(2);
	}
	fputs(text, f);
	fclose(f);
}

static void put_nic_node(const char *pci, const char *node)
{
	char rel[256];

	snprintf(rel, sizeof(rel), "bus/pci/devices/%s/numa_node", pci);
	put(rel, node);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void clear_tree(void)
{
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	mkdir(root, 0700);
}

/* Two nodes: 0 has CPUs 0-23,48-71, 1 has 24-47,72-95; distances 10/21. */
static void two_nodes(void)
{
	put("devices/system/node/node0/cpulist", "0-23,48-71\n");
	put("devices/system/node/node1/cpulist", "24-47,72-95\n");
	put("devices/system/node/node0/distance", "10 21\n");
	put("devices/system/node/node1/distance", "21 10\n");
	put("devices/system/node/possible", "0-1\n");
	put("devices/system/node/has_cpu", "0-1\n");
}

static cpu_set_t cpus(int lo, int hi)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	for (int c = lo; c <= hi; c++)
		CPU_SET(c, &set);
	return set;
}

/* The NIC names in rank order, joined by spaces. */
static const char *order(const struct fs_nics *nics)
{
	static char buf[2048];
	size_t used = 0;

	buf[0] = '\0';
	for (unsigned r = 0; r < nics->count && used < sizeof(buf); r++)
		used += (size_t)snprintf(buf + used, sizeof(buf) - used, "%s%s", r ? " " : "",
					 nics->nic[nics->by_rank[r]].name);
	return buf;
}

#define CHECK_ORDER(nics, want)                                                            \
	do {                                                                               \
		const char *got_ = order(nics);                                           \
		CHECK(strcmp(got_, (want)) == 0);                                          \
		if (strcmp(got_, (want)) != 0)                                             \
			fprintf(stderr, "  order: got '%s', want '%s'\n", got_, (want));  \
	} while (0)

/* ---- p4d: 4 NICs, provider order alternating between the nodes ---- */

static void p4d_list(struct fs_nics *nics)
{
	memset(nics, 0, sizeof(*nics));
	CHECK(fs_nics_add(nics, fake(0, "rdmap144s27-rdm", 0x90, 0x1b, NULL)) == 0);
	CHECK(fs_nics_add(nics, fake(1, "rdmap16s27-rdm", 0x10, 0x1b, NULL)) == 0);
	CHECK(fs_nics_add(nics, fake(2, "rdmap160s27-rdm", 0xa0, 0x1b, NULL)) == 0);
	CHECK(fs_nics_add(nics, fake(3, "rdmap32s27-rdm", 0x20, 0x1b, NULL)) == 0);
	CHECK(nics->count == 4);
}

static void p4d_tree(void)
{
	clear_tree();
	two_nodes();
	put_nic_node("0000:90:1b.0", "1\n");
	put_nic_node("0000:10:1b.0", "0\n");
	put_nic_node("0000:a0:1b.0", "1\n");
	put_nic_node("0000:20:1b.0", "0\n");
}

static void test_p4d(void)
{
	struct fs_nics nics;
	cpu_set_t set;

	p4d_tree();
	p4d_list(&nics);
	CHECK(strcmp(nics.nic[0].pci, "0000:90:1b.0") == 0);

	/* affinity on node 0 only: its two NICs first, each in the provider's order */
	set = cpus(0, 23);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.ranked);
	CHECK(nics.cpu_nodes == 1);
	CHECK(nics.fallback[0] == '\0');
	CHECK_ORDER(&nics, "rdmap16s27-rdm rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm");
	CHECK(nics.nic[1].node == 0 && nics.nic[1].distance == 10 && nics.nic[1].rank == 0);
	CHECK(nics.nic[0].node == 1 && nics.nic[0].distance == 21 && nics.nic[0].rank == 2);
	CHECK(fs_nics_select(&nics, NULL, 1) == 1);
	CHECK(fs_nics_first_used(&nics) == &nics.nic[1]);
	CHECK(fs_nics_select(&nics, NULL, 2) == 2);
	CHECK(nics.nic[1].used && nics.nic[3].used && !nics.nic[0].used && !nics.nic[2].used);

	/* the other node's CPUs (one hyperthread of it is enough) */
	set = cpus(72, 72);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.cpu_nodes == 2);
	CHECK_ORDER(&nics, "rdmap144s27-rdm rdmap160s27-rdm rdmap16s27-rdm rdmap32s27-rdm");

	/* both nodes: every NIC is near, the provider's order stands */
	set = cpus(0, 95);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.cpu_nodes == 3 && nics.ranked);
	CHECK_ORDER(&nics, "rdmap144s27-rdm rdmap16s27-rdm rdmap160s27-rdm rdmap32s27-rdm");
	CHECK(nics.nic[0].distance == 10 && nics.nic[1].distance == 10);

	/* the process's own affinity (this machine's CPUs, all on node 0 here) */
	put("devices/system/node/node0/cpulist", "0-1023\n");
	put("devices/system/node/node1/cpulist", "\n"); /* a node without CPUs */
	fs_nics_rank(&nics, root, NULL);
	CHECK(nics.cpu_nodes == 1);
	CHECK_ORDER(&nics, "rdmap16s27-rdm rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm");
}

/* ---- p4d with what sysfs may hold instead ---- */

static void test_p4d_unknown_nodes(void)
{
	struct fs_nics nics;
	cpu_set_t set = cpus(0, 23);
	char path[512];

	/* rdmap16s27-rdm (node 0) at -1: it ranks after those with a distance */
	p4d_tree();
	put_nic_node("0000:10:1b.0", "-1\n");
	p4d_list(&nics);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.ranked);
	CHECK(nics.nic[1].node == -1 && nics.nic[1].distance == FS_NIC_DISTANCE_UNKNOWN);
	CHECK_ORDER(&nics, "rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm rdmap16s27-rdm");

	/* no numa_node file at all */
	snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:10:1b.0/numa_node", root);
	CHECK(unlink(path) == 0);
	fs_nics_rank(&nics, root, &set);
	CHECK_ORDER(&nics, "rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm rdmap16s27-rdm");

	/* what does not parse: each leaves that NIC without a node */
	static const char *const bad[] = { "zero\n", "0x1\n", "1 2\n", "", "\n", "-2\n", "64\n", "99999999999999\n",
					   "+0\n", "0\n0\n" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		put_nic_node("0000:10:1b.0", bad[i]);
		fs_nics_rank(&nics, root, &set);
		CHECK(nics.nic[1].node == -1);
		CHECK_ORDER(&nics, "rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm rdmap16s27-rdm");
	}
	/* a FIFO (must not block) and a directory where the file should be */
	CHECK(unlink(path) == 0);
	CHECK(mkfifo(path, 0600) == 0);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.nic[1].node == -1);
	CHECK(unlink(path) == 0);
	CHECK(mkdir(path, 0700) == 0);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.nic[1].node == -1);
	CHECK_ORDER(&nics, "rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm rdmap16s27-rdm");

	/* every NIC at -1 (a VM that hides the topology): the provider's order */
	p4d_tree();
	put_nic_node("0000:90:1b.0", "-1\n");
	put_nic_node("0000:10:1b.0", "-1\n");
	put_nic_node("0000:a0:1b.0", "-1\n");
	put_nic_node("0000:20:1b.0", "-1\n");
	fs_nics_rank(&nics, root, &set);
	CHECK(!nics.ranked);
	CHECK_ORDER(&nics, "rdmap144s27-rdm rdmap16s27-rdm rdmap160s27-rdm rdmap32s27-rdm");
}

static void test_p4d_bad_node_files(void)
{
	struct fs_nics nics;
	cpu_set_t set = cpus(0, 23);
	char big[8192];
	const char *provider = "rdmap144s27-rdm rdmap16s27-rdm rdmap160s27-rdm rdmap32s27-rdm";

	static const char *const bad_distance[] = { "10 abc\n", "", "10  21\n", "10 21 \n x", "0 21\n", "10 256\n",
						    "-10 21\n", "10,21\n", "99999999999999999999 21\n" };
	for (size_t i = 0; i < sizeof(bad_distance) / sizeof(bad_distance[0]); i++) {
		p4d_tree();
		put("devices/system/node/node0/distance", bad_distance[i]);
		p4d_list(&nics);
		fs_nics_rank(&nics, root, &set);
		CHECK(!nics.ranked);
		CHECK(strstr(nics.fallback, "node0/distance") != NULL);
		CHECK_ORDER(&nics, provider);
		CHECK(fs_nics_select(&nics, NULL, 1) == 1 && fs_nics_first_used(&nics) == &nics.nic[0]);
	}
	/* CPUs on both nodes, node 1's row bad after node 0's was read: no
	 * distance from half a table either */
	p4d_tree();
	put("devices/system/node/node1/distance", "21 ten\n");
	set = cpus(0, 95);
	fs_nics_rank(&nics, root, &set);
	CHECK(!nics.ranked && strstr(nics.fallback, "node1/distance") != NULL);
	CHECK(nics.nic[1].distance == FS_NIC_DISTANCE_UNKNOWN);
	CHECK_ORDER(&nics, provider);
	set = cpus(0, 23);
	/* the other node's distance row is not read when no CPU of ours is there */
	p4d_tree();
	put("devices/system/node/node1/distance", "garbage");
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.ranked);
	CHECK_ORDER(&nics, "rdmap16s27-rdm rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm");

	static const char *const bad_cpulist[] = { "0-\n", "3-1\n", "a\n", "0,,1\n", "0-23,\n", "-1\n", "0 - 3\n",
						   "0-99999999999999999999999\n", "0:1\n" };
	for (size_t i = 0; i < sizeof(bad_cpulist) / sizeof(bad_cpulist[0]); i++) {
		p4d_tree();
		put("devices/system/node/node1/cpulist", bad_cpulist[i]);
		fs_nics_rank(&nics, root, &set);
		CHECK(!nics.ranked);
		CHECK(strstr(nics.fallback, "cpulist") != NULL);
		CHECK_ORDER(&nics, provider);
	}
	/* larger than a page: not read at all */
	p4d_tree();
	memset(big, '0', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	put("devices/system/node/node0/cpulist", big);
	fs_nics_rank(&nics, root, &set);
	CHECK(!nics.ranked);
	CHECK_ORDER(&nics, provider);
	/* a huge range is walked only up to CPU_SETSIZE */
	p4d_tree();
	put("devices/system/node/node1/cpulist", "24-4000000000\n");
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.ranked && nics.cpu_nodes == 1);
	/* no node tree (a kernel without NUMA), no sysfs at all, no CPUs of
	 * ours on any node */
	clear_tree();
	put_nic_node("0000:10:1b.0", "0\n");
	fs_nics_rank(&nics, root, &set);
	CHECK(!nics.ranked && nics.fallback[0]);
	CHECK_ORDER(&nics, provider);
	fs_nics_rank(&nics, "/nonexistent-fabsock-sysfs", &set);
	CHECK(!nics.ranked);
	CHECK_ORDER(&nics, provider);
	p4d_tree();
	set = cpus(500, 501);
	fs_nics_rank(&nics, root, &set);
	CHECK(!nics.ranked && strstr(nics.fallback, "no node") != NULL);
	CHECK_ORDER(&nics, provider);
	/* nodes past what is tracked, and entries that are not nodes */
	p4d_tree();
	put("devices/system/node/node64/cpulist", "0-95\n");
	put("devices/system/node/nodeX/cpulist", "garbage\n");
	put("devices/system/node/node/cpulist", "garbage\n");
	set = cpus(0, 23);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.ranked && nics.cpu_nodes == 1);
	CHECK_ORDER(&nics, "rdmap16s27-rdm rdmap32s27-rdm rdmap144s27-rdm rdmap160s27-rdm");
}

/* ---- p5: 32 NICs, 8 per PCIe switch, two switches per node ---- */

static const int p5_bus[4] = { 0x16, 0x36, 0x96, 0xb6 }; /* the switches' buses */

static void p5_setup(struct fs_nics *nics)
{
	char name[64], pci[32];

	clear_tree();
	two_nodes();
	memset(nics, 0, sizeof(*nics));
	/* provider order: by device name, which follows the bus */
	for (int sw = 0; sw < 4; sw++)
		for (int k = 0; k < 8; k++) {
			int bus = p5_bus[sw] + k;

			snprintf(name, sizeof(name), "rdmap%ds0-rdm", bus);
			CHECK(fs_nics_add(nics, fake((unsigned)(sw * 8 + k), name, bus, 0, NULL)) == 0);
			snprintf(pci, sizeof(pci), "0000:%02x:00.0", bus);
			put_nic_node(pci, sw < 2 ? "0\n" : "1\n");
		}
	CHECK(nics->count == 32);
}

static void test_p5(void)
{
	struct fs_nics nics;
	cpu_set_t set;
	bool ok = true;

	p5_setup(&nics);
	/* node 1's CPUs: the 16 NICs of switches 2 and 3 first, in their order */
	set = cpus(24, 47);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.ranked && nics.cpu_nodes == 2);
	for (unsigned r = 0; r < 32; r++) {
		unsigned want = r < 16 ? 16 + r : r - 16;

		ok &= nics.by_rank[r] == want && nics.nic[want].rank == r;
		ok &= nics.nic[want].distance == (r < 16 ? 10u : 21u);
	}
	CHECK(ok);
	/* FABSOCK_RAILS=8: one switch's NICs, the nearest */
	CHECK(fs_nics_select(&nics, NULL, 8) == 8);
	ok = true;
	for (unsigned i = 0; i < 32; i++)
		ok &= nics.nic[i].used == (i >= 16 && i < 24);
	CHECK(ok);
	CHECK(fs_nics_select(&nics, NULL, 64) == 32);

	/* node 0's CPUs */
	set = cpus(48, 71);
	fs_nics_rank(&nics, root, &set);
	ok = true;
	for (unsigned r = 0; r < 32; r++)
		ok &= nics.by_rank[r] == r;
	CHECK(ok && nics.ranked);
	CHECK(fs_nics_select(&nics, NULL, 1) == 1 && fs_nics_first_used(&nics) == &nics.nic[0]);

	/* a third node's worth of NICs is not there; a NIC of switch 3 moved
	 * to node 0 by a BIOS that says so ranks with node 0's */
	put_nic_node("0000:bd:00.0", "0\n");
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.nic[31].rank == 16 && nics.nic[16].rank == 17);

	/* FABSOCK_RAIL_ADDRS with two far NICs (by PCI address and by name):
	 * only they are allowed, and the nearer order among them stands */
	struct fs_nics_spec spec;
	char err[160];

	CHECK(fs_nics_spec_parse("rdmap150s0-rdm, b6:00.0", &spec, err, sizeof(err)) == 0);
	CHECK(spec.count == 2 && spec.entry[1].kind == FS_NICS_BY_PCI &&
	      strcmp(spec.entry[1].text, "0000:b6:00.0") == 0);
	CHECK(fs_nics_select(&nics, &spec, 1) == 1);
	CHECK(fs_nics_first_used(&nics) == &nics.nic[16]); /* rdmap150s0: bus 0x96, switch 2 */
	CHECK(nics.nic[24].allowed && !nics.nic[24].used && !nics.nic[0].allowed);
	CHECK(nics.spec_matched == 3);
	CHECK(fs_nics_spec_parse("0000:b6:00.0,rdmap150s0-rdm", &spec, err, sizeof(err)) == 0);
	CHECK(fs_nics_select(&nics, &spec, 1) == 1 && fs_nics_first_used(&nics) == &nics.nic[16]);
	CHECK(fs_nics_select(&nics, &spec, 2) == 2 && nics.nic[24].used);

	/* 32 NICs and 40 more: 64 are kept, the rest counted */
	for (unsigned i = 32; i < 80; i++) {
		char name[32];

		snprintf(name, sizeof(name), "extra%u", i);
		fs_nics_add(&nics, fake(i, name, -1, 0, NULL));
	}
	CHECK(nics.count == FS_NICS_MAX && nics.skipped == 80 - FS_NICS_MAX);
	fs_nics_rank(&nics, root, &set);
	CHECK(nics.nic[0].rank == 0 && nics.nic[FS_NICS_MAX - 1].rank == FS_NICS_MAX - 1);
}

/* ---- listing, and providers without PCI addresses ---- */

static void test_listing(void)
{
	struct fs_nics nics;
	struct fi_info bare;
	struct fs_nics_spec spec;
	char err[160];

	memset(&nics, 0, sizeof(nics));
	/* tcp: one interface per address, no PCI address */
	CHECK(fs_nics_add(&nics, fake(0, "eth0", -1, 0, "192.0.2.2")) == 0);
	CHECK(fs_nics_add(&nics, fake(1, "lo", -1, 0, "127.0.0.1")) == 0);
	CHECK(fs_nics_add(&nics, fake(2, "eth0", -1, 0, "198.51.100.7")) == -EEXIST);
	CHECK(nics.count == 2 && nics.nic[0].ips == 2 && nics.nic[0].pci[0] == '\0');
	/* a record without a domain name, or a bus that is not PCI */
	memset(&bare, 0, sizeof(bare));
	CHECK(fs_nics_add(&nics, &bare) == 0 && nics.nic[2].name[0] == '\0');
	fakes[3].bus.bus_type = FI_BUS_UNKNOWN;
	CHECK(fs_nics_add(&nics, fake(3, "odd", -1, 0, NULL)) == 0);
	/* nothing to read: even a sysfs that is not there changes nothing */
	fs_nics_rank(&nics, "/nonexistent-fabsock-sysfs", NULL);
	CHECK(!nics.ranked && nics.fallback[0] == '\0');
	CHECK_ORDER(&nics, "eth0 lo  odd");
	CHECK(fs_nics_select(&nics, NULL, 1) == 1 && fs_nics_first_used(&nics) == &nics.nic[0]);

	/* FABSOCK_RAIL_ADDRS by address: either of eth0's, or lo's */
	CHECK(fs_nics_spec_parse("198.51.100.7", &spec, err, sizeof(err)) == 0);
	CHECK(fs_nics_select(&nics, &spec, 1) == 1 && fs_nics_first_used(&nics) == &nics.nic[0]);
	CHECK(fs_nics_spec_parse(" 127.0.0.1 ", &spec, err, sizeof(err)) == 0);
	CHECK(fs_nics_select(&nics, &spec, 4) == 1 && fs_nics_first_used(&nics) == &nics.nic[1]);
	CHECK(!nics.nic[0].allowed && nics.nic[1].used);
	CHECK(fs_nics_spec_parse("lo,eth0", &spec, err, sizeof(err)) == 0);
	CHECK(fs_nics_select(&nics, &spec, 1) == 1 && fs_nics_first_used(&nics) == &nics.nic[0]);
	/* one that names nothing here */
	CHECK(fs_nics_spec_parse("eth9, 10.9.9.9, ::1, 0000:10:1b.0", &spec, err, sizeof(err)) == 0);
	CHECK(fs_nics_select(&nics, &spec, 1) == 0 && !fs_nics_first_used(&nics));
	CHECK(nics.spec_matched == 0);
	CHECK(fs_nics_spec_parse("eth9,lo", &spec, err, sizeof(err)) == 0);
	CHECK(fs_nics_select(&nics, &spec, 1) == 1 && nics.spec_matched == 2);
}

/* ---- FABSOCK_RAIL_ADDRS parsing ---- */

static void test_spec_parse(void)
{
	struct fs_nics_spec spec;
	char err[160], many[1024];
	size_t used = 0;

	CHECK(fs_nics_spec_parse("", &spec, err, sizeof(err)) == 0 && spec.count == 0);
	CHECK(fs_nics_spec_parse(NULL, &spec, err, sizeof(err)) == 0 && spec.count == 0);
	CHECK(fs_nics_spec_parse("  \t ", &spec, err, sizeof(err)) == 0 && spec.count == 0);
	CHECK(fs_nics_spec_parse("0000:10:1C.0,10:1d.1, fe80::1 ,10.0.0.1,eth0.100,rdmap16s27-rdm,efa_0", &spec, err,
				 sizeof(err)) == 0);
	CHECK(spec.count == 7);
	CHECK(spec.entry[0].kind == FS_NICS_BY_PCI && strcmp(spec.entry[0].text, "0000:10:1c.0") == 0);
	CHECK(spec.entry[1].kind == FS_NICS_BY_PCI && strcmp(spec.entry[1].text, "0000:10:1d.1") == 0);
	CHECK(spec.entry[2].kind == FS_NICS_BY_IP && spec.entry[2].ip[0] == 0xfe && spec.entry[2].ip[15] == 1);
	CHECK(spec.entry[3].kind == FS_NICS_BY_IP && spec.entry[3].ip[10] == 0xff && spec.entry[3].ip[12] == 10);
	CHECK(spec.entry[4].kind == FS_NICS_BY_NAME && strcmp(spec.entry[4].text, "eth0.100") == 0);
	CHECK(spec.entry[6].kind == FS_NICS_BY_NAME);

	static const char *const bad[] = { "eth0,", ",eth0", "eth0,,lo", "eth0;rm", "fe80::1%eth0", "00:20.0",
					   "10:1c.8", "00000:10:1c.0", "0000:100:1c.0", "a b", "eth0/1", "$(x)",
					   "0000:10:1c.0.1", "\xff" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		CHECK(fs_nics_spec_parse(bad[i], &spec, err, sizeof(err)) == -EINVAL);
		CHECK(spec.count == 0 && err[0]);
	}
	/* too long an entry, too many entries, too long a value */
	memset(many, 'a', 64);
	many[64] = '\0';
	CHECK(fs_nics_spec_parse(many, &spec, err, sizeof(err)) == -EINVAL && strstr(err, "longer"));
	many[63] = '\0';
	CHECK(fs_nics_spec_parse(many, &spec, err, sizeof(err)) == 0 && spec.count == 1);
	for (int i = 0; i < FS_NICS_SPEC_MAX + 1; i++)
		used += (size_t)snprintf(many + used, sizeof(many) - used, "%sn%d", i ? "," : "", i);
	CHECK(fs_nics_spec_parse(many, &spec, err, sizeof(err)) == -EINVAL && strstr(err, "more than"));
	*strrchr(many, ',') = '\0';
	CHECK(fs_nics_spec_parse(many, &spec, err, sizeof(err)) == 0 && spec.count == FS_NICS_SPEC_MAX);
	char *huge = malloc(10000);
	memset(huge, 'x', 9999);
	huge[9999] = '\0';
	CHECK(fs_nics_spec_parse(huge, &spec, err, sizeof(err)) == -EINVAL);
	free(huge);

	/* the process's value: a bad one warns and allows every NIC */
	setenv("FABSOCK_RAIL_ADDRS", "eth0,,lo", 1);
	fs_params_load();
	CHECK(fs_nics_spec_global()->count == 0);
	unsetenv("FABSOCK_RAIL_ADDRS");
}

static void test_format_nodes(void)
{
	char buf[96];

	fs_nics_format_nodes(0, buf, sizeof(buf));
	CHECK(strcmp(buf, "unknown") == 0);
	fs_nics_format_nodes(1 | 2 | (1ull << 63), buf, sizeof(buf));
	CHECK(strcmp(buf, "0,1,63") == 0);
	fs_nics_format_nodes(~0ull, buf, 8);
	CHECK(strlen(buf) < 8);
}

int main(void)
{
	fs_real_init();
	fs_params_load();
	fs_log_init();
	if (!mkdtemp(root)) {
		perror("mkdtemp");
		return 2;
	}
	test_p4d();
	test_p4d_unknown_nodes();
	test_p4d_bad_node_files();
	test_p5();
	test_listing();
	test_spec_parse();
	test_format_nodes();
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return fs_check_done();
}
