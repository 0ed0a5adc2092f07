/* SPDX-License-Identifier: MIT */
/*
 * What `fabsock info` prints: version, every parameter with its default and
 * current value, and for each provider fabsock knows (shm, efa, tcp, net)
 * whether libfabric offers it here and, if not, why.
 */
#ifndef FS_CORE_INFO_H
#define FS_CORE_INFO_H

#include <stdio.h>

/* Returns 0, or 1 if libfabric itself could not be loaded. */
int fs_info_print(FILE *out);

#endif
