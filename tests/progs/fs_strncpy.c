/* SPDX-License-Identifier: MIT */
/*
 * fs_strncpy: strncpy() keeps the C library's semantics under fabsock,
 * which interposes it to skip one zero-fill inside libfabric (see the
 * strncpy wrapper in preload/wrappers.c): for lengths below, at and well
 * above the wrapper's threshold, into memory filled with 0xAA, the string
 * is copied and every byte after it up to the length is zero, and nothing
 * beyond the length is written. Prints "ok" and exits 0, or names the
 * first difference and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
	static const size_t lens[] = { 1, 16, 4095, 4096, 4097, 8192, 1u << 20, 4u << 20 };
	static const char src[] = "fabsock-strncpy";

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		size_t len = lens[i], n = strlen(src) < len ? strlen(src) : len;
		unsigned char *buf = malloc(len + 64);

		if (!buf) {
			printf("no memory for %zu bytes\n", len);
			return 1;
		}
		memset(buf, 0xAA, len + 64);
		/* through a volatile pointer: the compiler may not expand it inline */
		char *(*volatile copy)(char *, const char *, size_t) = strncpy;
		if (copy((char *)buf, src, len) != (char *)buf) {
			printf("length %zu: strncpy did not return its destination\n", len);
			return 1;
		}
		if (memcmp(buf, src, n)) {
			printf("length %zu: the string was not copied\n", len);
			return 1;
		}
		for (size_t j = n; j < len + 64; j++) {
			unsigned char want = j < len ? 0 : 0xAA;

			if (buf[j] != want) {
				printf("length %zu: byte %zu is 0x%02x, want 0x%02x\n", len, j, buf[j], want);
				return 1;
			}
		}
		free(buf);
	}
	printf("ok\n");
	return 0;
}
