/* SPDX-License-Identifier: MIT */
/*
 * fabsock's parameters, generated from config/params.def. fs_params holds the
 * values in force; fs_params_load() fills it from the environment once, in
 * the library constructor (unit tests call it after setenv()). A bad value
 * never stops the application: it gets one warning line naming the variable
 * and the default used instead.
 */
#ifndef FS_CONFIG_PARAMS_H
#define FS_CONFIG_PARAMS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct fs_params {
#define FS_PARAM_UINT(field, NAME, def, min, max, help) uint64_t field;
#define FS_PARAM_BOOL(field, NAME, def, help) bool field;
#define FS_PARAM_STR(field, NAME, def, help) const char *field;
#define FS_PARAM_ENUM(field, NAME, def, choices, help) unsigned field;
#include "config/params.def"
#undef FS_PARAM_UINT
#undef FS_PARAM_BOOL
#undef FS_PARAM_STR
#undef FS_PARAM_ENUM
};

extern struct fs_params fs_params;

/* Resets every parameter to its default, then applies FABSOCK_* from the
 * environment. Returns the number of variables that were rejected. */
int fs_params_load(void);

/* Prints one row per parameter: variable, current value, default, range or
 * choices, help. Used by `fabsock info`. */
void fs_params_print(FILE *out);

#endif
