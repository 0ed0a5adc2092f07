/* SPDX-License-Identifier: MIT */
/*
 * The parameter table at run time: struct fs_params fs_params, its defaults,
 * parsing FABSOCK_* from the environment, and the listing printed by
 * `fabsock info`. Everything here is generated from config/params.def, so a
 * parameter is named exactly once. Parsing is strict (whole string, range
 * checked, never atoi) and forgiving in effect: a bad value costs one warning
 * line naming the variable, the value and the default used, never the
 * application. fs_params_load() is not thread-safe; it runs in the library
 * constructor before any other thread can exist (unit tests call it again).
 */
#include "config/params.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/log.h"

#define FS_ENV_PREFIX "FABSOCK_"

struct fs_params fs_params;

enum fs_param_type { FS_PARAM_TYPE_UINT, FS_PARAM_TYPE_BOOL, FS_PARAM_TYPE_STR, FS_PARAM_TYPE_ENUM };

/* One row of params.def. For BOOL and ENUM the default lives in def_uint
 * (0/1, or the choice index); for STR in def_str. */
struct fs_param_desc {
	const char *env;
	enum fs_param_type type;
	size_t offset;
	uint64_t def_uint, min, max;
	const char *def_str;
	const char *choices; /* ENUM only: "a|b|c" */
	const char *help;
};

static const struct fs_param_desc fs_param_table[] = {
#define FS_PARAM_UINT(field, NAME, def, lo, hi, text)                                          \
	{ .env = FS_ENV_PREFIX #NAME, .type = FS_PARAM_TYPE_UINT,                             \
	  .offset = offsetof(struct fs_params, field), .def_uint = (def), .min = (lo), .max = (hi), \
	  .help = (text) },
#define FS_PARAM_BOOL(field, NAME, def, text)                                                  \
	{ .env = FS_ENV_PREFIX #NAME, .type = FS_PARAM_TYPE_BOOL,                             \
	  .offset = offsetof(struct fs_params, field), .def_uint = (def), .min = 0, .max = 1,   \
	  .help = (text) },
#define FS_PARAM_STR(field, NAME, def, text)                                                   \
	{ .env = FS_ENV_PREFIX #NAME, .type = FS_PARAM_TYPE_STR,                              \
	  .offset = offsetof(struct fs_params, field), .def_str = (def), .help = (text) },
#define FS_PARAM_ENUM(field, NAME, def, list, text)                                            \
	{ .env = FS_ENV_PREFIX #NAME, .type = FS_PARAM_TYPE_ENUM,                             \
	  .offset = offsetof(struct fs_params, field), .def_uint = (def), .choices = (list),    \
	  .help = (text) },
#include "config/params.def"
#undef FS_PARAM_UINT
#undef FS_PARAM_BOOL
#undef FS_PARAM_STR
#undef FS_PARAM_ENUM
};

#define FS_PARAM_COUNT (sizeof(fs_param_table) / sizeof(fs_param_table[0]))

/* FABSOCK_* names that are not parameters but are legitimately set around
 * fabsock by its own tools (the launcher's library and build-tree lookup and
 * verbosity, the bench's mode selection, the info request). They are exempt
 * from the unknown-variable warning. */
static const char *const fs_params_reserved[] = {
	"FABSOCK_LIB", "FABSOCK_INFO", "FABSOCK_BUILD", "FABSOCK_VERBOSE", "FABSOCK_BENCH_MODES",
};

static void *fs_param_field(const struct fs_param_desc *desc)
{
	return (char *)&fs_params + desc->offset;
}

/* ---- enum choices ---- */

static unsigned fs_enum_count(const char *choices)
{
	unsigned n = 1;

	for (const char *p = choices; *p; p++)
		n += *p == '|';
	return n;
}

/* Copies choice INDEX of CHOICES into BUF (always terminated). */
static void fs_enum_name(const char *choices, unsigned index, char *buf, size_t len)
{
	const char *p = choices;

	for (unsigned i = 0; i < index && p; i++) {
		p = strchr(p, '|');
		if (p)
			p++;
	}
	if (!p) {
		snprintf(buf, len, "%u", index);
		return;
	}
	size_t n = strcspn(p, "|");
	snprintf(buf, len, "%.*s", (int)n, p);
}

/* ---- value parsers: each returns 0 and stores *out, or -EINVAL ---- */

/* A whole number: digits only at the front (so no sign, no blanks), strtoull
 * base 0 (so 0x10 and 010 are hex and octal), nothing left over, no overflow,
 * and within [min, max]. */
static int fs_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!isdigit((unsigned char)text[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(text, &end, 0);
	if (errno || *end != '\0')
		return -EINVAL;
	if (v < min || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

static int fs_parse_bool(const char *text, uint64_t *out)
{
	static const char *const yes[] = { "1", "yes", "true", "on" };
	static const char *const no[] = { "0", "no", "false", "off" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (!strcasecmp(text, yes[i])) {
			*out = 1;
			return 0;
		}
		if (!strcasecmp(text, no[i])) {
			*out = 0;
			return 0;
		}
	}
	return -EINVAL;
}

/* A choice name (case-insensitive) or its index in decimal. */
static int fs_parse_enum(const char *text, const char *choices, uint64_t *out)
{
	unsigned count = fs_enum_count(choices);
	const char *p = choices;
	size_t len = strlen(text);

	for (unsigned i = 0; i < count; i++) {
		size_t n = strcspn(p, "|");
		if (n == len && len && !strncasecmp(p, text, n)) {
			*out = i;
			return 0;
		}
		p += n + (p[n] == '|');
	}
	if (text[0] >= '0' && text[0] <= '9') {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(text, &end, 10);
		if (!errno && *end == '\0' && v < count) {
			*out = v;
			return 0;
		}
	}
	return -EINVAL;
}

/* ---- formatting ---- */

static void fs_param_format(const struct fs_param_desc *desc, bool current, char *buf, size_t len)
{
	const void *field = fs_param_field(desc);

	switch (desc->type) {
	case FS_PARAM_TYPE_UINT:
		snprintf(buf, len, "%" PRIu64, current ? *(const uint64_t *)field : desc->def_uint);
		break;
	case FS_PARAM_TYPE_BOOL:
		snprintf(buf, len, "%d", current ? (int)*(const bool *)field : (int)desc->def_uint);
		break;
	case FS_PARAM_TYPE_STR: {
		const char *s = current ? *(const char *const *)field : desc->def_str;
		snprintf(buf, len, "\"%s\"", s ? s : "");
		break;
	}
	case FS_PARAM_TYPE_ENUM:
		fs_enum_name(desc->choices, current ? *(const unsigned *)field : (unsigned)desc->def_uint,
			     buf, len);
		break;
	}
}

static void fs_param_format_range(const struct fs_param_desc *desc, char *buf, size_t len)
{
	switch (desc->type) {
	case FS_PARAM_TYPE_UINT:
		snprintf(buf, len, "%" PRIu64 "..%" PRIu64, desc->min, desc->max);
		break;
	case FS_PARAM_TYPE_BOOL:
		snprintf(buf, len, "0|1");
		break;
	case FS_PARAM_TYPE_STR:
		snprintf(buf, len, "text");
		break;
	case FS_PARAM_TYPE_ENUM:
		snprintf(buf, len, "%s", desc->choices);
		break;
	}
}

/* ---- loading ---- */

static void fs_param_set_default(const struct fs_param_desc *desc)
{
	void *field = fs_param_field(desc);

	switch (desc->type) {
	case FS_PARAM_TYPE_UINT:
		*(uint64_t *)field = desc->def_uint;
		break;
	case FS_PARAM_TYPE_BOOL:
		*(bool *)field = desc->def_uint != 0;
		break;
	case FS_PARAM_TYPE_STR:
		*(const char **)field = desc->def_str;
		break;
	case FS_PARAM_TYPE_ENUM:
		*(unsigned *)field = (unsigned)desc->def_uint;
		break;
	}
}

/* Where text values are copied: a static area, so that the constructor of
 * a process that never opens a socket makes no malloc (the first one sets
 * up the heap: brk and getrandom, e2e_startup); a value that does not fit
 * (a long FABSOCK_RULES) is the heap's. Reset at every load. */
static char fs_param_area[8192];
static size_t fs_param_area_used;

static bool fs_param_in_area(const char *p)
{
	return p >= fs_param_area && p < fs_param_area + sizeof(fs_param_area);
}

static char *fs_param_copy(const char *text)
{
	size_t n = strlen(text) + 1;
	char *copy;

	if (n > sizeof(fs_param_area) - fs_param_area_used)
		return strdup(text);
	copy = fs_param_area + fs_param_area_used;
	memcpy(copy, text, n);
	fs_param_area_used += n;
	return copy;
}

/* Applies TEXT to DESC's field. Returns 0, or -EINVAL after warning (the
 * field then keeps its default, which fs_params_load set beforehand). */
static int fs_param_apply(const struct fs_param_desc *desc, const char *text)
{
	void *field = fs_param_field(desc);
	char def[64];
	uint64_t v;

	switch (desc->type) {
	case FS_PARAM_TYPE_STR: {
		/* A copy, never the environment's own string: glibc never frees
		 * those, but programs that set their process title the classic
		 * way (nginx, PostgreSQL, sendmail: the strings moved away and
		 * the original argv and environ area overwritten with the
		 * title) clobber it, and a value read later (the records
		 * directory, the provider, the rail addresses) would be the
		 * title or empty in every worker. */
		char *copy = fs_param_copy(text);
		if (!copy) {
			FS_WARN("%s: out of memory for its value; using the default", desc->env);
			return -EINVAL;
		}
		*(const char **)field = copy;
		return 0;
	}
	case FS_PARAM_TYPE_UINT:
		if (!fs_parse_uint(text, desc->min, desc->max, &v)) {
			*(uint64_t *)field = v;
			return 0;
		}
		FS_WARN("%s=%s is not a whole number in %" PRIu64 "..%" PRIu64 "; using %" PRIu64,
			desc->env, text, desc->min, desc->max, desc->def_uint);
		return -EINVAL;
	case FS_PARAM_TYPE_BOOL:
		if (!fs_parse_bool(text, &v)) {
			*(bool *)field = v != 0;
			return 0;
		}
		FS_WARN("%s=%s is not a boolean (1/0, yes/no, true/false, on/off); using %d",
			desc->env, text, (int)desc->def_uint);
		return -EINVAL;
	case FS_PARAM_TYPE_ENUM:
		if (!fs_parse_enum(text, desc->choices, &v)) {
			*(unsigned *)field = (unsigned)v;
			return 0;
		}
		fs_param_format(desc, false, def, sizeof(def));
		FS_WARN("%s=%s is not one of %s (or 0..%u); using %s", desc->env, text,
			desc->choices, fs_enum_count(desc->choices) - 1, def);
		return -EINVAL;
	}
	return -EINVAL;
}

static bool fs_params_known(const char *name, size_t len)
{
	for (size_t i = 0; i < FS_PARAM_COUNT; i++)
		if (strlen(fs_param_table[i].env) == len && !memcmp(fs_param_table[i].env, name, len))
			return true;
	for (size_t i = 0; i < sizeof(fs_params_reserved) / sizeof(fs_params_reserved[0]); i++)
		if (strlen(fs_params_reserved[i]) == len && !memcmp(fs_params_reserved[i], name, len))
			return true;
	return false;
}

/* Typo guard: one warning line per load listing every FABSOCK_* variable
 * that is neither a parameter nor reserved. The list is cut short with "..."
 * if it does not fit the line. */
static void fs_params_warn_unknown(void)
{
	extern char **environ;
	char list[512];
	size_t used = 0;
	bool truncated = false;

	list[0] = '\0';
	for (char **env = environ; env && *env; env++) {
		const char *var = *env;
		if (strncmp(var, FS_ENV_PREFIX, sizeof(FS_ENV_PREFIX) - 1))
			continue;
		size_t len = strcspn(var, "=");
		if (fs_params_known(var, len))
			continue;
		int n = snprintf(list + used, sizeof(list) - used, "%s%.*s", used ? ", " : "",
				 (int)len, var);
		if (n < 0 || (size_t)n >= sizeof(list) - used) {
			list[used] = '\0';
			truncated = true;
			break;
		}
		used += (size_t)n;
	}
	if (used || truncated)
		FS_WARN("ignoring unknown variable(s) %s%s (not fabsock parameters; see `fabsock info`)",
			list, truncated ? (used ? ", ..." : "...") : "");
}

int fs_params_load(void)
{
	int rejected = 0;

	for (size_t i = 0; i < FS_PARAM_COUNT; i++) {
		const struct fs_param_desc *desc = &fs_param_table[i];
		/* a copy made by an earlier load (unit tests load again) */
		if (desc->type == FS_PARAM_TYPE_STR) {
			const char **field = fs_param_field(desc);
			if (*field && *field != desc->def_str && !fs_param_in_area(*field))
				free((char *)*field);
		}
		fs_param_set_default(desc);
	}
	fs_param_area_used = 0;
	for (size_t i = 0; i < FS_PARAM_COUNT; i++) {
		const char *text = getenv(fs_param_table[i].env);
		if (text && fs_param_apply(&fs_param_table[i], text) < 0)
			rejected++;
	}
	fs_params_warn_unknown();
	return rejected;
}

/* ---- `fabsock info` listing ---- */

#define FS_HELP_WIDTH 72

/* Prints TEXT word-wrapped at FS_HELP_WIDTH columns, every line indented. */
static void fs_params_print_help(FILE *out, const char *text)
{
	const char *p = text;

	while (*p) {
		size_t len = strlen(p);
		size_t cut = len;
		if (len > FS_HELP_WIDTH) {
			cut = FS_HELP_WIDTH;
			while (cut > 0 && p[cut] != ' ')
				cut--;
			if (cut == 0) /* one word longer than the width */
				cut = strcspn(p, " ");
		}
		fprintf(out, "    %.*s\n", (int)cut, p);
		p += cut;
		while (*p == ' ')
			p++;
	}
}

void fs_params_print(FILE *out)
{
	int w_name = (int)strlen("VARIABLE"), w_value = (int)strlen("VALUE");
	int w_def = (int)strlen("DEFAULT");
	char value[256], def[256], range[128];

	for (size_t i = 0; i < FS_PARAM_COUNT; i++) {
		const struct fs_param_desc *desc = &fs_param_table[i];
		int n;
		fs_param_format(desc, true, value, sizeof(value));
		fs_param_format(desc, false, def, sizeof(def));
		if ((n = (int)strlen(desc->env)) > w_name)
			w_name = n;
		if ((n = (int)strlen(value)) > w_value)
			w_value = n;
		if ((n = (int)strlen(def)) > w_def)
			w_def = n;
	}
	fprintf(out, "%-*s  %-*s  %-*s  %s\n", w_name, "VARIABLE", w_value, "VALUE", w_def,
		"DEFAULT", "RANGE");
	for (size_t i = 0; i < FS_PARAM_COUNT; i++) {
		const struct fs_param_desc *desc = &fs_param_table[i];
		fs_param_format(desc, true, value, sizeof(value));
		fs_param_format(desc, false, def, sizeof(def));
		fs_param_format_range(desc, range, sizeof(range));
		fprintf(out, "%-*s  %-*s  %-*s  %s\n", w_name, desc->env, w_value, value, w_def, def,
			range);
		fs_params_print_help(out, desc->help);
	}
}
