/* SPDX-License-Identifier: MIT */
/*
 * `fabsock info`: the parameters, and which providers this host offers and
 * why the others are not usable.
 */
#include "core/info.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/params.h"
#include "config/rules.h"
#include "core/fabric.h"
#include "core/nics.h"
#include "core/stats.h"

/* Provider KIND's NICs, nearest first, and the ones a process uses. */
static void fs_info_nics(FILE *out, unsigned kind)
{
	struct fs_nics *nics = calloc(1, sizeof(*nics));
	const struct fs_nics_spec *spec = fs_nics_spec_global();
	char why[200] = "", nodes[96];

	if (!nics)
		return;
	if (fs_fabric_nics(kind, nics, why, sizeof(why)) && !nics->count) {
		fprintf(out, "       NICs: %s\n", why);
		free(nics);
		return;
	}
	fs_nics_format_nodes(nics->cpu_nodes, nodes, sizeof(nodes));
	if (nics->ranked)
		fprintf(out, "       NICs, nearest first (this process may run on CPUs of node %s):\n", nodes);
	else
		fprintf(out, "       NICs, in the provider's order (%s):\n",
			nics->fallback[0] ? nics->fallback : "no PCI address, so no NUMA distance");
	fprintf(out, "         %-4s  %-24s  %-12s  %4s  %8s  %s\n", "rank", "domain", "PCI", "node", "distance",
		"used");
	for (unsigned r = 0; r < nics->count; r++) {
		const struct fs_nic *nic = &nics->nic[nics->by_rank[r]];
		char dist[16];

		if (nic->distance == FS_NIC_DISTANCE_UNKNOWN)
			snprintf(dist, sizeof(dist), "-");
		else
			snprintf(dist, sizeof(dist), "%u", nic->distance);
		fprintf(out, "         %4u  %-24s  %-12s  %4d  %8s  %s\n", nic->rank, nic->name,
			nic->pci[0] ? nic->pci : "-", nic->node, dist,
			nic->used ? "yes" : nic->allowed ? "no (FABSOCK_RAILS)" : "no (FABSOCK_RAIL_ADDRS)");
	}
	if (nics->skipped)
		fprintf(out, "         (%u more not listed: at most %d)\n", nics->skipped, FS_NICS_MAX);
	for (unsigned i = 0; kind != FS_PROV_SHM && i < spec->count; i++)
		if (!(nics->spec_matched & (1ull << i)))
			fprintf(out, "         FABSOCK_RAIL_ADDRS entry %s names none of these\n", spec->entry[i].text);
	free(nics);
}

static void fs_info_provider(FILE *out, unsigned kind)
{
	struct fs_rail rail;
	char why[200] = "";
	int ret = fs_rail_open(&rail, kind, NULL, 0, why, sizeof(why));

	if (ret == 0) {
		fprintf(out, "  %-4s usable: domain %s, inject %zu B, tx depth %zu, rx depth %zu, iov %zu%s%s\n",
			fs_fabric_prov_name(kind), rail.info->domain_attr->name, rail.inject_size, rail.tx_depth,
			rail.rx_depth, rail.iov_limit, rail.mr_local ? ", FI_MR_LOCAL" : "",
			rail.source ? ", FI_SOURCE" : "");
		if (kind == FS_PROV_SHM && fs_params.shm_depth)
			fprintf(out, "       (a server's; a rail opened for a connection the process made asks for "
				     "tx and rx depth %u: FABSOCK_SHM_DEPTH)\n",
				(unsigned)fs_params.shm_depth);
		fs_rail_close(&rail);
		fs_info_nics(out, kind);
	} else {
		fprintf(out, "  %-4s not usable: %s\n", fs_fabric_prov_name(kind), why);
	}
}

int fs_info_print(FILE *out)
{
	char why[200] = "";

	fprintf(out, "fabsock %s\n\nParameters (environment variable, value, default, range):\n", FABSOCK_VERSION);
	fs_params_print(out);
	fprintf(out, "\nRules in force: %zu\n", fs_rules_global.count);
	if (fs_fabric_load(why, sizeof(why))) {
		fprintf(out, "\nlibfabric: not loadable: %s\n", why);
		return 1;
	}
	fprintf(out, "\nlibfabric %u.%u (API asked: %u.%u)\nProviders:\n", FI_MAJOR(fs_fi.version()),
		FI_MINOR(fs_fi.version()), FI_MAJOR(fs_fabric_api_version()), FI_MINOR(fs_fabric_api_version()));
	for (unsigned kind = FS_PROV_SHM; kind < FS_PROV_MAX_; kind++)
		fs_info_provider(out, kind);
	fprintf(out, "  EFA device on this host: %s\n", fs_fabric_host_has_efa() ? "yes" : "no");
	fprintf(out, "\nNICs: a process may use %u per provider (FABSOCK_RAILS), nearest first, of %s; "
		"it opens a rail on each NIC marked used (tcp, net: on the connection's own interface and "
		"each other one FABSOCK_RAIL_ADDRS names) and spreads its streams over them; a stream whose "
		"send queue holds %llu bytes or more (FABSOCK_STRIPE_MIN; 0: never) is striped over them.\n",
		(unsigned)fs_params.rails, fs_nics_spec_global()->count ? "those FABSOCK_RAIL_ADDRS names" : "every NIC",
		(unsigned long long)fs_params.stripe_min);
	fprintf(out, "\nSame-host peers use shm%s; remote peers use %s.\n", fs_params.shm ? "" : " (disabled)",
		fs_params.provider[0] ? fs_params.provider
				      : "efa when this host has it, otherwise kernel TCP");
	return 0;
}
