/* SPDX-License-Identifier: MIT */
/*
 * The NICs of a provider, ranked by NUMA distance from the CPUs the process
 * may run on, and FABSOCK_RAIL_ADDRS (see nics.h). What is read, per
 * NIC with a PCI address in its fi_info (efa; tcp, net and shm give none):
 *
 *   SYSFS/bus/pci/devices/DDDD:BB:DD.F/numa_node   "-1" (none) or the node
 *   SYSFS/devices/system/node/nodeN/cpulist        "0-23,48-71": N's CPUs
 *   SYSFS/devices/system/node/nodeN/distance       "10 21": N to node 0, 1
 *
 * A NIC's distance is the smallest one from a node that holds a CPU of the
 * process's affinity mask to the NIC's node. A NIC whose node is missing,
 * -1 or does not parse has no distance and ranks after those that have one;
 * a node file (cpulist, distance) that does not parse leaves every NIC
 * without one, so the order is the provider's, as before NICs were ranked.
 * Every file read is at most a page (a sysfs attribute is no more), every
 * list bounded (FS_NICS_*), and nothing here can fail the rail's opening.
 */
#include "core/nics.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/log.h"
#include "config/params.h"
#include "preload/real.h"

/* The largest file read: a sysfs attribute is at most a page. */
#define FS_NICS_FILE_MAX 4096
/* Entries of devices/system/node looked at (cpu, node0..., power...). */
#define FS_NICS_DIRENTS_MAX 1024
#define FS_NICS_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- listing ------------------------------------------------------------ */

/* The IP address of a sockaddr of FORMAT as 16 bytes (IPv4 mapped). */
static bool fs_nics_sockaddr_ip(uint32_t format, const void *addr, size_t len, uint8_t out[16])
{
	const struct sockaddr *sa = addr;

	if (!addr || len < sizeof(sa_family_t))
		return false;
	if ((format == FI_SOCKADDR_IN || format == FI_SOCKADDR) && sa->sa_family == AF_INET &&
	    len >= sizeof(struct sockaddr_in)) {
		memset(out, 0, 10);
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &((const struct sockaddr_in *)addr)->sin_addr, 4);
		return true;
	}
	if ((format == FI_SOCKADDR_IN6 || format == FI_SOCKADDR) && sa->sa_family == AF_INET6 &&
	    len >= sizeof(struct sockaddr_in6)) {
		memcpy(out, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
		return true;
	}
	return false;
}

int fs_nics_add(struct fs_nics *nics, const struct fi_info *fi)
{
	char name[FS_NICS_NAME_MAX];
	struct fs_nic *nic = NULL;
	uint8_t ip[16];
	bool has_ip;

	snprintf(name, sizeof(name), "%s", fi->domain_attr && fi->domain_attr->name ? fi->domain_attr->name : "");
	has_ip = fs_nics_sockaddr_ip(fi->addr_format, fi->src_addr, fi->src_addrlen, ip);
	for (unsigned i = 0; i < nics->count; i++) {
		if (strcmp(nics->nic[i].name, name) != 0)
			continue;
		nic = &nics->nic[i];
		/* another address of the same interface */
		if (has_ip && nic->ips < FS_NICS_LEN(nic->ip)) {
			memcpy(nic->ip[nic->ips], ip, 16);
			nic->ips++;
		}
		return -EEXIST;
	}
	if (nics->count >= FS_NICS_MAX) {
		nics->skipped++;
		return -ENOSPC;
	}
	nic = &nics->nic[nics->count];
	memset(nic, 0, sizeof(*nic));
	memcpy(nic->name, name, sizeof(name));
	if (fi->nic && fi->nic->bus_attr && fi->nic->bus_attr->bus_type == FI_BUS_PCI) {
		const struct fi_pci_attr *pci = &fi->nic->bus_attr->attr.pci;

		snprintf(nic->pci, sizeof(nic->pci), "%04x:%02x:%02x.%x", pci->domain_id, pci->bus_id,
			 pci->device_id & 0x1f, pci->function_id & 0x7);
	}
	if (has_ip) {
		memcpy(nic->ip[0], ip, 16);
		nic->ips = 1;
	}
	nic->node = -1;
	nic->distance = FS_NIC_DISTANCE_UNKNOWN;
	nic->order = nics->count;
	nic->rank = nics->count;
	nic->info = fi;
	nics->by_rank[nics->count] = nics->count;
	nics->count++;
	return 0;
}

/* ---- reading sysfs -------------------------------------------------------- */

/* Reads the file at PATH into BUF (SIZE bytes, terminated; trailing blanks
 * and newlines cut). Returns its length, or a negative errno (-EFBIG: it
 * does not fit). Never blocks: a FIFO where a file should be opens
 * nonblocking and reads as empty. */
static ssize_t fs_nics_read(const char *path, char *buf, size_t size)
{
	size_t len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	int err = 0;
	char more;

	if (fd < 0)
		return -errno;
	for (int tries = 0; tries < 64 && len < size - 1; tries++) {
		ssize_t n = pread(fd, buf + len, size - 1 - len, (off_t)len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			err = errno == EAGAIN ? 0 : -errno;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	if (!err && len == size - 1 && pread(fd, &more, 1, (off_t)len) > 0)
		err = -EFBIG;
	fs_real.close(fd);
	if (err)
		return err;
	while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ' || buf[len - 1] == '\t'))
		len--;
	buf[len] = '\0';
	return (ssize_t)len;
}

/* A whole decimal number in LO..HI (a leading '-' allowed), nothing else. */
static int fs_nics_parse_long(const char *text, long lo, long hi, long *out)
{
	const char *digits = text[0] == '-' ? text + 1 : text;
	char *end;
	long v;

	if (!isdigit((unsigned char)digits[0]) || strlen(digits) > 9)
		return -EINVAL;
	v = strtol(text, &end, 10);
	if (*end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Whether the CPU list TEXT ("0-3,8,10-11"; empty: a node without CPUs)
 * names a CPU of ALLOWED, in *HIT. Returns 0, or -EINVAL when it does not
 * parse. CPUs past CPU_SETSIZE cannot be in a cpu_set_t and are skipped. */
static int fs_nics_cpulist_hits(const char *text, const cpu_set_t *allowed, bool *hit)
{
	const char *p = text;

	*hit = false;
	for (unsigned pieces = 0; *p; pieces++) {
		unsigned long lo, hi;
		char *end;

		if (pieces >= CPU_SETSIZE || !isdigit((unsigned char)*p))
			return -EINVAL;
		errno = 0;
		lo = hi = strtoul(p, &end, 10);
		if (*end == '-') {
			p = end + 1;
			if (!isdigit((unsigned char)*p))
				return -EINVAL;
			hi = strtoul(p, &end, 10);
		}
		if (errno || hi < lo)
			return -EINVAL;
		for (unsigned long cpu = lo; cpu <= hi && cpu < CPU_SETSIZE && !*hit; cpu++)
			*hit = CPU_ISSET(cpu, allowed);
		p = end;
		if (*p == ',' && p[1])
			p++;
		else if (*p)
			return -EINVAL;
	}
	return 0;
}

/* Parses a node's distance row ("10 21 21 10") into ROW (FS_NICS_NODES_MAX,
 * missing ones FS_NIC_DISTANCE_UNKNOWN). Returns 0 or -EINVAL. */
static int fs_nics_distance_row(const char *text, uint32_t row[FS_NICS_NODES_MAX])
{
	const char *p = text;
	unsigned n = 0;

	for (unsigned i = 0; i < FS_NICS_NODES_MAX; i++)
		row[i] = FS_NIC_DISTANCE_UNKNOWN;
	while (*p) {
		char *end;
		unsigned long v;

		if (!isdigit((unsigned char)*p))
			return -EINVAL;
		errno = 0;
		v = strtoul(p, &end, 10);
		/* the kernel's distances are a byte (10: local) */
		if (errno || v == 0 || v > 255)
			return -EINVAL;
		if (n < FS_NICS_NODES_MAX)
			row[n] = (uint32_t)v;
		n++;
		p = end;
		if (*p == ' ' && p[1])
			p++;
		else if (*p)
			return -EINVAL;
	}
	return n ? 0 : -EINVAL;
}

/* Sets bit N of *NODES for every node N that holds a CPU of ALLOWED.
 * Returns 0, or -EINVAL with WHY when the node tree is missing or a cpulist
 * does not parse. */
static int fs_nics_cpu_nodes(const char *sysfs, const cpu_set_t *allowed, uint64_t *nodes, char *why,
			     size_t whylen)
{
	char path[512], buf[FS_NICS_FILE_MAX + 1];
	struct dirent *de;
	DIR *dir;
	int ret = 0;

	*nodes = 0;
	snprintf(path, sizeof(path), "%s/devices/system/node", sysfs);
	dir = opendir(path);
	if (!dir) {
		snprintf(why, whylen, "no NUMA nodes under %.48s", sysfs);
		return -EINVAL;
	}
	for (unsigned seen = 0; ret == 0 && seen < FS_NICS_DIRENTS_MAX && (de = readdir(dir)); seen++) {
		long node;
		bool hit;

		if (strncmp(de->d_name, "node", 4) != 0 ||
		    fs_nics_parse_long(de->d_name + 4, 0, FS_NICS_NODES_MAX - 1, &node) != 0)
			continue; /* not a node, or one past what we track */
		snprintf(path, sizeof(path), "%s/devices/system/node/%s/cpulist", sysfs, de->d_name);
		if (fs_nics_read(path, buf, sizeof(buf)) < 0 || fs_nics_cpulist_hits(buf, allowed, &hit) != 0) {
			snprintf(why, whylen, "node%ld/cpulist unreadable or malformed", node);
			ret = -EINVAL;
		} else if (hit) {
			*nodes |= 1ull << node;
		}
	}
	closedir(dir);
	if (ret == 0 && !*nodes) {
		snprintf(why, whylen, "the process's CPUs are on no node listed in sysfs");
		ret = -EINVAL;
	}
	return ret;
}

/* Reads NIC's node from its PCI device (stays -1 when unknown). */
static void fs_nics_read_node(const char *sysfs, struct fs_nic *nic)
{
	char path[512], buf[64];
	long node;

	snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/numa_node", sysfs, nic->pci);
	if (fs_nics_read(path, buf, sizeof(buf)) < 0 ||
	    fs_nics_parse_long(buf, -1, FS_NICS_NODES_MAX - 1, &node) != 0) {
		FS_DBG("NIC %s (%s): no NUMA node in %s", nic->name, nic->pci, path);
		return;
	}
	nic->node = (int)node;
}

/* The distances from the nodes of CPU_NODES to each NIC's node (the
 * smallest). Returns 0, or -EINVAL with WHY when a distance row does not
 * parse (no NIC then has one). */
static int fs_nics_distances(struct fs_nics *nics, const char *sysfs, char *why, size_t whylen)
{
	char path[512], buf[FS_NICS_FILE_MAX + 1];
	uint32_t row[FS_NICS_NODES_MAX];

	for (unsigned node = 0; node < FS_NICS_NODES_MAX; node++) {
		if (!(nics->cpu_nodes & (1ull << node)))
			continue;
		snprintf(path, sizeof(path), "%s/devices/system/node/node%u/distance", sysfs, node);
		if (fs_nics_read(path, buf, sizeof(buf)) < 0 || fs_nics_distance_row(buf, row) != 0) {
			snprintf(why, whylen, "node%u/distance unreadable or malformed", node);
			for (unsigned i = 0; i < nics->count; i++)
				nics->nic[i].distance = FS_NIC_DISTANCE_UNKNOWN;
			return -EINVAL;
		}
		for (unsigned i = 0; i < nics->count; i++) {
			struct fs_nic *nic = &nics->nic[i];

			if (nic->node >= 0 && row[nic->node] < nic->distance)
				nic->distance = row[nic->node];
		}
	}
	return 0;
}

/* ---- ranking ---------------------------------------------------------------- */

static bool fs_nics_before(const struct fs_nic *a, const struct fs_nic *b)
{
	return a->distance != b->distance ? a->distance < b->distance : a->order < b->order;
}

void fs_nics_rank(struct fs_nics *nics, const char *sysfs, const cpu_set_t *allowed)
{
	cpu_set_t mine;
	bool any_pci = false, any_node = false;

	nics->ranked = false;
	nics->cpu_nodes = 0;
	nics->fallback[0] = '\0';
	for (unsigned i = 0; i < nics->count; i++) {
		nics->nic[i].node = -1;
		nics->nic[i].distance = FS_NIC_DISTANCE_UNKNOWN;
		any_pci |= nics->nic[i].pci[0] != '\0';
	}
	/* shm, tcp, net and a host without PCI NICs: nothing to read, and a
	 * process's first rail pays nothing for the ranking */
	if (any_pci) {
		if (!allowed) {
			CPU_ZERO(&mine);
			if (sched_getaffinity(0, sizeof(mine), &mine) == 0) {
				allowed = &mine;
			} else {
				snprintf(nics->fallback, sizeof(nics->fallback), "sched_getaffinity: %s",
					 strerror(errno));
			}
		}
		if (!sysfs || !sysfs[0])
			sysfs = "/sys";
		if (allowed && fs_nics_cpu_nodes(sysfs, allowed, &nics->cpu_nodes, nics->fallback,
						 sizeof(nics->fallback)) == 0) {
			for (unsigned i = 0; i < nics->count; i++) {
				if (nics->nic[i].pci[0])
					fs_nics_read_node(sysfs, &nics->nic[i]);
				any_node |= nics->nic[i].node >= 0;
			}
			if (any_node)
				(void)fs_nics_distances(nics, sysfs, nics->fallback, sizeof(nics->fallback));
		}
	}
	/* insertion sort: at most FS_NICS_MAX, and stable by the order key */
	for (unsigned i = 0; i < nics->count; i++) {
		unsigned j = i, idx = i;

		while (j > 0 && fs_nics_before(&nics->nic[idx], &nics->nic[nics->by_rank[j - 1]])) {
			nics->by_rank[j] = nics->by_rank[j - 1];
			j--;
		}
		nics->by_rank[j] = idx;
	}
	for (unsigned r = 0; r < nics->count; r++) {
		nics->nic[nics->by_rank[r]].rank = r;
		nics->ranked |= nics->nic[nics->by_rank[r]].distance != FS_NIC_DISTANCE_UNKNOWN;
	}
}

/* ---- FABSOCK_RAIL_ADDRS ------------------------------------------------------- */

/* A PCI address "dddd:bb:dd.f" or "bb:dd.f" (hex), written the kernel's way
 * into OUT. */
static bool fs_nics_parse_pci(const char *text, char out[16])
{
	unsigned long part[4] = { 0, 0, 0, 0 };
	const unsigned widths[4] = { 4, 2, 2, 1 };
	const char seps[4] = { ':', ':', '.', '\0' };
	unsigned colons = 0, first;
	const char *p = text;

	for (const char *c = text; *c; c++)
		colons += *c == ':';
	if (colons < 1 || colons > 2)
		return false;
	first = colons == 2 ? 0 : 1; /* without the domain: 0000 */
	for (unsigned i = first; i < 4; i++) {
		unsigned n = 0;

		while (isxdigit((unsigned char)p[n]) && n <= widths[i])
			n++;
		if (n == 0 || n > widths[i] || p[n] != seps[i])
			return false;
		part[i] = strtoul(p, NULL, 16);
		p += n + (seps[i] != '\0');
	}
	if (part[2] > 0x1f || part[3] > 7)
		return false;
	snprintf(out, 16, "%04lx:%02lx:%02lx.%lx", part[0], part[1], part[2], part[3]);
	return true;
}

/* Letters, digits and "._-": a domain or interface name. */
static bool fs_nics_name_ok(const char *text)
{
	for (const char *c = text; *c; c++)
		if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' && *c != '-')
			return false;
	return text[0] != '\0';
}

int fs_nics_spec_parse(const char *text, struct fs_nics_spec *spec, char *err, size_t errlen)
{
	const char *p = text ? text : "";
	bool blank = true;

	memset(spec, 0, sizeof(*spec));
	for (const char *c = p; *c && blank; c++)
		blank = *c == ' ' || *c == '\t';
	if (blank)
		return 0; /* every NIC */
	if (strnlen(p, 4097) > 4096) {
		snprintf(err, errlen, "longer than 4096 characters");
		return -EINVAL;
	}
	for (;;) {
		size_t len = strcspn(p, ",");
		const char *start = p, *end = p + len;
		struct fs_nics_spec_entry *e;
		struct in6_addr six;
		struct in_addr four;
		char tok[FS_NICS_NAME_MAX];

		while (start < end && (*start == ' ' || *start == '\t'))
			start++;
		while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if (end == start) {
			snprintf(err, errlen, "an empty entry");
			goto bad;
		}
		if ((size_t)(end - start) >= sizeof(tok)) {
			snprintf(err, errlen, "an entry longer than %d characters", FS_NICS_NAME_MAX - 1);
			goto bad;
		}
		if (spec->count >= FS_NICS_SPEC_MAX) {
			snprintf(err, errlen, "more than %d entries", FS_NICS_SPEC_MAX);
			goto bad;
		}
		memcpy(tok, start, (size_t)(end - start));
		tok[end - start] = '\0';
		e = &spec->entry[spec->count];
		if (fs_nics_parse_pci(tok, e->text)) {
			e->kind = FS_NICS_BY_PCI;
		} else if (inet_pton(AF_INET, tok, &four) == 1) {
			e->kind = FS_NICS_BY_IP;
			memset(e->ip, 0, 10);
			e->ip[10] = e->ip[11] = 0xff;
			memcpy(e->ip + 12, &four, 4);
			snprintf(e->text, sizeof(e->text), "%s", tok);
		} else if (inet_pton(AF_INET6, tok, &six) == 1) {
			e->kind = FS_NICS_BY_IP;
			memcpy(e->ip, &six, 16);
			snprintf(e->text, sizeof(e->text), "%s", tok);
		} else if (fs_nics_name_ok(tok)) {
			e->kind = FS_NICS_BY_NAME;
			snprintf(e->text, sizeof(e->text), "%s", tok);
		} else {
			snprintf(err, errlen, "'%s' is not a PCI address, an IP address or a NIC name", tok);
			goto bad;
		}
		spec->count++;
		if (!p[len])
			return 0;
		p += len + 1;
	}
bad:
	memset(spec, 0, sizeof(*spec));
	return -EINVAL;
}

static bool fs_nics_matches(const struct fs_nic *nic, const struct fs_nics_spec_entry *e)
{
	switch (e->kind) {
	case FS_NICS_BY_NAME:
		return strcmp(nic->name, e->text) == 0;
	case FS_NICS_BY_PCI:
		return nic->pci[0] && strcmp(nic->pci, e->text) == 0;
	case FS_NICS_BY_IP:
		for (unsigned i = 0; i < nic->ips; i++)
			if (memcmp(nic->ip[i], e->ip, 16) == 0)
				return true;
		return false;
	}
	return false;
}

unsigned fs_nics_select(struct fs_nics *nics, const struct fs_nics_spec *spec, unsigned rails)
{
	unsigned used = 0;

	nics->spec_matched = 0;
	for (unsigned r = 0; r < nics->count; r++) {
		struct fs_nic *nic = &nics->nic[nics->by_rank[r]];

		nic->allowed = !spec || spec->count == 0;
		for (unsigned i = 0; spec && i < spec->count; i++) {
			if (fs_nics_matches(nic, &spec->entry[i])) {
				nic->allowed = true;
				nics->spec_matched |= 1ull << i;
			}
		}
		nic->used = nic->allowed && used < rails;
		used += nic->used;
	}
	return used;
}

const struct fs_nic *fs_nics_first_used(const struct fs_nics *nics)
{
	return fs_nics_nth_used(nics, 0);
}

const struct fs_nic *fs_nics_nth_used(const struct fs_nics *nics, unsigned nth)
{
	for (unsigned r = 0; r < nics->count; r++)
		if (nics->nic[nics->by_rank[r]].used && nth-- == 0)
			return &nics->nic[nics->by_rank[r]];
	return NULL;
}

static struct fs_nics_spec fs_nics_spec_value;
static pthread_once_t fs_nics_spec_once = PTHREAD_ONCE_INIT;

static void fs_nics_spec_load(void)
{
	char err[160];

	if (fs_nics_spec_parse(fs_params.rail_addrs, &fs_nics_spec_value, err, sizeof(err)))
		FS_WARN("FABSOCK_RAIL_ADDRS=%s: %s; using every NIC", fs_params.rail_addrs, err);
}

const struct fs_nics_spec *fs_nics_spec_global(void)
{
	pthread_once(&fs_nics_spec_once, fs_nics_spec_load);
	return &fs_nics_spec_value;
}

void fs_nics_format_nodes(uint64_t mask, char *out, size_t size)
{
	size_t used = 0;

	out[0] = '\0';
	for (unsigned node = 0; node < FS_NICS_NODES_MAX && used < size; node++) {
		if (!(mask & (1ull << node)))
			continue;
		int n = snprintf(out + used, size - used, "%s%u", used ? "," : "", node);

		if (n < 0)
			break;
		used += (size_t)n;
	}
	if (!mask)
		snprintf(out, size, "unknown");
}
