/* SPDX-License-Identifier: MIT */
/*
 * Level-checked logging. Lines go to stderr, or to FABSOCK_LOG_FILE, as
 * "fabsock[pid]: level: message". Logging never changes errno and never
 * calls an interposed function by name (it writes with fs_real.write).
 */
#ifndef FS_CONFIG_LOG_H
#define FS_CONFIG_LOG_H

enum fs_log_level { FS_LOG_ERROR = 0, FS_LOG_WARN = 1, FS_LOG_INFO = 2, FS_LOG_DEBUG = 3 };

extern int fs_log_level;

/* Applies fs_params.log_level and opens fs_params.log_file (falls back to
 * stderr with a warning if it cannot be opened). Call after fs_params_load. */
void fs_log_init(void);

void fs_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Called with every FABSOCK_LOG_FILE descriptor the sink opens (core marks
 * it as fabsock's own). Set before fs_log_init. */
extern void (*fs_log_fd_hook)(int fd);

#define FS_LOG(level, ...)                                 \
	do {                                               \
		if ((level) <= fs_log_level)               \
			fs_log_write((level), __VA_ARGS__); \
	} while (0)
#define FS_ERR(...) FS_LOG(FS_LOG_ERROR, __VA_ARGS__)
#define FS_WARN(...) FS_LOG(FS_LOG_WARN, __VA_ARGS__)
#define FS_INFO(...) FS_LOG(FS_LOG_INFO, __VA_ARGS__)
#define FS_DBG(...) FS_LOG(FS_LOG_DEBUG, __VA_ARGS__)

/* Logs at most once per call site for the life of the process. */
#define FS_WARN_ONCE(...)                                               \
	do {                                                            \
		static int fs_once_;                                    \
		if (!__atomic_exchange_n(&fs_once_, 1, __ATOMIC_RELAXED)) \
			FS_WARN(__VA_ARGS__);                           \
	} while (0)

#endif
