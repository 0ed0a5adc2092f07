/* SPDX-License-Identifier: MIT */
/*
 * fabsock-info: the program behind `fabsock info`. It loads the parameters
 * from the environment exactly as the preload library does (so a bad
 * FABSOCK_* value gets the same warning line), then prints what
 * fs_info_print() reports: version, every parameter with its default and
 * current value, and which providers libfabric offers on this machine.
 * It links the engine statically and is never run under LD_PRELOAD itself;
 * its exit status is fs_info_print()'s (1: libfabric could not be loaded).
 */
#include <stdio.h>
#include <string.h>

#include "config/log.h"
#include "config/params.h"
#include "core/info.h"
#include "core/nics.h"
#include "preload/real.h"

static void usage(FILE *out)
{
	fputs("usage: fabsock-info\n"
	      "Prints fabsock's version, every FABSOCK_* parameter (default and value in\n"
	      "force from the environment) and which libfabric providers are usable here.\n"
	      "Exit status: 0, or 1 if libfabric itself could not be loaded.\n",
	      out);
}

int main(int argc, char **argv)
{
	int ret;

	if (argc > 1) {
		if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
			usage(stdout);
			return 0;
		}
		fprintf(stderr, "fabsock-info: unexpected argument '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}

	fs_real_init();
	fs_params_load(); /* rejected values were already reported, one line each */
	fs_log_init();
	/* FABSOCK_RAIL_ADDRS is parsed on first use; here its warning joins
	 * the other parameters' */
	(void)fs_nics_spec_global();

	ret = fs_info_print(stdout);
	if (fflush(stdout) != 0)
		return 2;
	return ret;
}
