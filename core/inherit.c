/* SPDX-License-Identifier: MIT */
/* Records that survive exec() (see inherit.h). */
#include "core/inherit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/log.h"
#include "core/fabric.h"
#include "core/fdtable.h"
#include "core/listener.h"
#include "core/sock.h"
#include "preload/real.h"

#define FS_INH_NAME "fabsock-exec-state"
#define FS_INH_MAGIC 0x66734548u /* "fsEH" */
#define FS_INH_FDS 65536u
/* The record file's seals: its size fixed, and no more seals. Other files
 * answer F_GET_SEALS with EINVAL (not shmem) or with other seals, so the
 * scan at start-up reads one fcntl per descriptor and the name of at most
 * the matching one, where reading every descriptor's name (a readlink
 * through /proc each) was most of the cost of every program's start. */
#define FS_INH_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

struct fs_inh_rec {
	uint64_t ino;
	uint32_t kind;
	int32_t table_fd1; /* PENDING: its listener's probe table fd + 1 (0: none) */
};

struct fs_inh_file {
	uint32_t magic;
	int32_t pid; /* the process whose program wrote the records */
	struct fs_inh_rec rec[FS_INH_FDS];
};

static pthread_mutex_t fs_inh_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fs_inh_file *fs_inh;
static int fs_inh_fd = -1;

/* Creates this process's record file. Lock held. */
static struct fs_inh_file *fs_inh_open(void)
{
	int fd = memfd_create(FS_INH_NAME, MFD_ALLOW_SEALING), high;
	void *map;

	if (fd < 0)
		return NULL;
	/* FS_INH_SEALS mark it for the new program's scan (fs_inh_find) */
	if (ftruncate(fd, sizeof(struct fs_inh_file)) || fs_real.fcntl(fd, F_ADD_SEALS, FS_INH_SEALS)) {
		fs_real.close(fd);
		return NULL;
	}
	map = mmap(NULL, sizeof(struct fs_inh_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		fs_real.close(fd);
		return NULL;
	}
	/* Out of the application's way, and it must survive exec: no CLOEXEC. */
	high = fs_internal_fd(fd);
	if (high != fd)
		fs_real.fcntl(high, F_SETFD, 0);
	fs_inh_fd = high;
	((struct fs_inh_file *)map)->magic = FS_INH_MAGIC;
	((struct fs_inh_file *)map)->pid = (int32_t)getpid();
	/* published complete: readers load it without the lock */
	__atomic_store_n(&fs_inh, (struct fs_inh_file *)map, __ATOMIC_RELEASE);
	return map;
}

void fs_inherit_note(int fd, enum fs_inherit_kind kind)
{
	struct fs_inh_file *f = __atomic_load_n(&fs_inh, __ATOMIC_ACQUIRE);
	struct stat st;

	if (fd < 0 || (unsigned)fd >= FS_INH_FDS)
		return;
	if (!f) {
		if (kind == FS_INH_NONE)
			return;
		pthread_mutex_lock(&fs_inh_lock);
		f = __atomic_load_n(&fs_inh, __ATOMIC_ACQUIRE);
		if (!f)
			f = fs_inh_open();
		pthread_mutex_unlock(&fs_inh_lock);
		if (!f)
			return;
	}
	if (kind == FS_INH_NONE) {
		__atomic_store_n(&f->rec[fd].kind, FS_INH_NONE, __ATOMIC_RELEASE);
		return;
	}
	if (fstat(fd, &st))
		return;
	f->rec[fd].ino = st.st_ino;
	f->rec[fd].table_fd1 = 0;
	__atomic_store_n(&f->rec[fd].kind, kind, __ATOMIC_RELEASE);
}

void fs_inherit_note_table(int fd, int table_fd)
{
	struct fs_inh_file *f = __atomic_load_n(&fs_inh, __ATOMIC_ACQUIRE);

	if (f && fd >= 0 && (unsigned)fd < FS_INH_FDS && table_fd >= 0)
		f->rec[fd].table_fd1 = table_fd + 1;
}

void fs_inherit_after_fork(void)
{
	pthread_mutex_init(&fs_inh_lock, NULL);
	if (fs_inh) {
		munmap(fs_inh, sizeof(*fs_inh));
		__atomic_store_n(&fs_inh, NULL, __ATOMIC_RELEASE);
	}
	if (fs_inh_fd >= 0) {
		fs_internal_fd_close(fs_inh_fd);
		fs_inh_fd = -1;
	}
}

/* Sockets adopted so far in this restore: duplicates (inetd's fds 0 and
 * 1) share the first one's state, as before exec. */
#define FS_INH_ADOPT_MAX 64
static struct {
	uint64_t ino;
	int fd;
} fs_inh_adopted[FS_INH_ADOPT_MAX];
static unsigned fs_inh_nadopted;

/* Probe tables of the old program's listeners (by their fd then), attached
 * once each; their fds are closed when the restore is over. */
#define FS_INH_TABLES_MAX 16
static struct {
	int fd;
	struct fs_listener *l;
} fs_inh_tables[FS_INH_TABLES_MAX];
static unsigned fs_inh_ntables;

static struct fs_listener *fs_inh_table(int fd)
{
	struct fs_listener *l;

	for (unsigned i = 0; i < fs_inh_ntables; i++)
		if (fs_inh_tables[i].fd == fd)
			return fs_inh_tables[i].l;
	if (fs_inh_ntables == FS_INH_TABLES_MAX)
		return NULL;
	l = fs_listener_attach(fd);
	fs_inh_tables[fs_inh_ntables].fd = fd;
	fs_inh_tables[fs_inh_ntables++].l = l;
	return l;
}

/* Acts on one record of the previous program. */
static void fs_inh_restore_one(int fd, const struct fs_inh_rec *rec)
{
	struct stat st;

	if (fstat(fd, &st) || !S_ISSOCK(st.st_mode) || st.st_ino != rec->ino)
		return; /* closed at exec (CLOEXEC) or reused since */
	switch (rec->kind) {
	case FS_INH_OFFLOADED:
		FS_WARN("fd %d: an offloaded connection survived exec() but its stream did not; shutting it down "
			"(set FD_CLOEXEC on it, or keep it on kernel TCP with FABSOCK_RULES)", fd);
		fs_real.shutdown(fd, SHUT_RDWR);
		break;
	case FS_INH_ACK_DUE:
	case FS_INH_LISTENING:
	case FS_INH_PENDING:
		for (unsigned i = 0; i < fs_inh_nadopted; i++) {
			struct fs_sock *s;

			if (fs_inh_adopted[i].ino != rec->ino || !(s = fs_sock_get(fs_inh_adopted[i].fd)))
				continue;
			fs_core_dup(s, fd);
			fs_sock_put(s);
			return;
		}
		if (rec->kind == FS_INH_ACK_DUE)
			fs_core_adopt_ack_due(fd);
		else
			fs_core_adopt(fd, rec->kind == FS_INH_LISTENING,
				      rec->kind == FS_INH_PENDING && rec->table_fd1 > 0 ? fs_inh_table(rec->table_fd1 - 1)
											: NULL);
		if (fs_inh_nadopted < FS_INH_ADOPT_MAX) {
			fs_inh_adopted[fs_inh_nadopted].ino = rec->ino;
			fs_inh_adopted[fs_inh_nadopted++].fd = fd;
		}
		break;
	default:
		break;
	}
}

/* The descriptor of the previous program's record file, or -1. The list
 * of descriptors comes from /proc/self/fd read straight into a buffer on
 * the stack (no opendir: its allocation was the first malloc of programs
 * that never make one); only a descriptor with the record file's seals has
 * its name read. */
static int fs_inh_find(void)
{
	char buf[4096];
	int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC), found = -1;
	ssize_t n;

	if (dfd < 0)
		return -1;
	while (found < 0 && (n = getdents64(dfd, buf, sizeof(buf))) > 0) {
		for (ssize_t off = 0; off < n && found < 0;) {
			struct dirent64 *de = (struct dirent64 *)(void *)(buf + off);
			char path[64], link[128];
			ssize_t len;
			int fd;

			off += de->d_reclen;
			if (de->d_name[0] < '0' || de->d_name[0] > '9')
				continue;
			fd = atoi(de->d_name);
			if (fd == dfd || fs_real.fcntl(fd, F_GET_SEALS) != FS_INH_SEALS)
				continue;
			snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
			len = readlink(path, link, sizeof(link) - 1);
			if (len <= 0)
				continue;
			link[len] = 0;
			if (strncmp(link, "/memfd:" FS_INH_NAME, sizeof("/memfd:" FS_INH_NAME) - 1) == 0)
				found = fd;
		}
	}
	fs_real.close(dfd);
	return found;
}

void fs_inherit_restore(void)
{
	int found = fs_inh_find();

	if (found < 0)
		return;
	{
		struct fs_inh_file *f = mmap(NULL, sizeof(*f), PROT_READ, MAP_SHARED, found, 0);

		if (f != MAP_FAILED) {
			if (f->magic == FS_INH_MAGIC && f->pid == (int32_t)getpid()) {
				fs_shm_clean_previous_program();
				for (unsigned fd = 0; fd < FS_INH_FDS; fd++)
					if (__atomic_load_n(&f->rec[fd].kind, __ATOMIC_ACQUIRE) != FS_INH_NONE)
						fs_inh_restore_one((int)fd, &f->rec[fd]);
			}
			munmap(f, sizeof(*f));
		}
	}
	/* The previous program's file (or a parent's, after vfork) is done
	 * with here; this program makes its own when it needs one. So are the
	 * table fds (their listeners hold the mappings). */
	fs_real.close(found);
	for (unsigned i = 0; i < fs_inh_ntables; i++) {
		fs_real.close(fs_inh_tables[i].fd);
		if (fs_inh_tables[i].l)
			fs_listener_put(fs_inh_tables[i].l); /* the adopted sockets hold theirs */
	}
	fs_inh_ntables = 0;
}
