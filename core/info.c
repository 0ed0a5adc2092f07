/* SPDX-License-Identifier: MIT */
/*
 * `fabsock info`: the parameters, and which providers this host offers and
 * why the others are not usable.
 */
#include "core/info.h"

#include <stdio.h>
#include <string.h>

#include "config/params.h"
#include "config/rules.h"
#include "core/fabric.h"
#include "core/stats.h"

static void fs_info_provider(FILE *out, unsigned kind)
{
	struct fs_rail rail;
	char why[200] = "";
	int ret = fs_rail_open(&rail, kind, NULL, why, sizeof(why));

	if (ret == 0) {
		fprintf(out, "  %-4s usable: domain %s, inject %zu B, tx depth %zu, rx depth %zu, iov %zu%s%s\n",
			fs_fabric_prov_name(kind), rail.info->domain_attr->name, rail.inject_size, rail.tx_depth,
			rail.rx_depth, rail.iov_limit, rail.mr_local ? ", FI_MR_LOCAL" : "",
			rail.source ? ", FI_SOURCE" : "");
		fs_rail_close(&rail);
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
	fprintf(out, "\nSame-host peers use shm%s; remote peers use %s.\n", fs_params.shm ? "" : " (disabled)",
		fs_params.provider[0] ? fs_params.provider
				      : "efa when this host has it, otherwise kernel TCP");
	return 0;
}
