/* SPDX-License-Identifier: MIT */
/*
 * Loading libfabric and opening rails (see fabric.h). All limits the data
 * path depends on are read here from the fi_info the provider returned, not
 * assumed: inject size, queue depths, iov limit, MR mode. The hints ask only
 * for what fabsock uses (RDM, tagged messages, local MRs) and offer every MR
 * mode bit fabsock can honour, so the same code opens shm, tcp;ofi_rxm, net
 * and efa (which needs FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
 * FI_MR_VIRT_ADDR and FI_CONTEXT2).
 */
#include "core/fabric.h"
#include "core/sigs.h"

#include <ctype.h>
#include <dirent.h>
#include <netinet/in.h>
#include <dlfcn.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <uthash.h>

#include "config/log.h"
#include "preload/real.h"
#include "core/engine.h"
#include "core/guard.h"
#include "core/stats.h"

#define FS_FI_VERSION FI_VERSION(1, 17)

struct fs_fabric_api fs_fi;

struct fs_av_peer {
	UT_hash_handle hh;
	fi_addr_t fi_addr;
	unsigned refs;
	size_t len;
	uint8_t addr[FS_WIRE_ADDR_MAX];
};


static pthread_once_t fs_fabric_once = PTHREAD_ONCE_INIT;
static int fs_fabric_status = -ENOENT;
static char fs_fabric_why[160];
static void (*fs_fabric_exit_teardown)(void);
/* FI_SHM_DISABLE_CMA was on when libfabric was loaded (fs_fabric_do_load). */
static bool fs_fabric_cma_off;

static bool fs_env_true(const char *name)
{
	const char *v = getenv(name);

	return v && (!strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "true") || !strcasecmp(v, "on"));
}

/* The PSM stand-ins (CMakeLists.txt, tools/gen-psm-stubs.sh): the file
 * next to libfabsock.so and the soname it stands in for. */
static const struct {
	const char *file, *soname;
} fs_psm_stubs[] = {
	{ "libfabsock-psm.so", "libpsm_infinipath.so.1" },
	{ "libfabsock-psm2.so", "libpsm2.so.2" },
};
static void *fs_psm_stub_handles[sizeof(fs_psm_stubs) / sizeof(fs_psm_stubs[0])];

/* Loads the stand-ins found next to this library, before libfabric: the
 * dynamic linker then satisfies libfabric's dependencies on the PSM
 * libraries with them, by soname, and the real ones (whose constructors
 * calibrate the clock for ~100 ms each) never load. Not when the process has
 * the real library loaded already (it is the application's). */
static void fs_fabric_load_stubs(void)
{
	Dl_info self;
	char dir[PATH_MAX], path[PATH_MAX + 64];
	char *slash;

	if (!fs_params.stub_psm || !dladdr((void *)fs_fabric_load, &self) || !self.dli_fname)
		return;
	snprintf(dir, sizeof(dir), "%s", self.dli_fname);
	slash = strrchr(dir, '/');
	if (!slash)
		return;
	*slash = '\0';
	for (size_t i = 0; i < sizeof(fs_psm_stubs) / sizeof(fs_psm_stubs[0]); i++) {
		void *real = dlopen(fs_psm_stubs[i].soname, RTLD_NOW | RTLD_NOLOAD);

		if (real) {
			dlclose(real);
			continue;
		}
		snprintf(path, sizeof(path), "%s/%s", dir, fs_psm_stubs[i].file);
		if (access(path, R_OK) == 0)
			fs_psm_stub_handles[i] = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	}
}

/* Unloads the stand-ins; true if there were any. */
static bool fs_fabric_drop_stubs(void)
{
	bool any = false;

	for (size_t i = 0; i < sizeof(fs_psm_stubs) / sizeof(fs_psm_stubs[0]); i++) {
		if (!fs_psm_stub_handles[i])
			continue;
		dlclose(fs_psm_stub_handles[i]);
		fs_psm_stub_handles[i] = NULL;
		any = true;
	}
	return any;
}

static void fs_fabric_do_load(void)
{
	static const char *const names[] = { "libfabric.so.1", "libfabric.so" };
	void *lib = NULL;

	/* Debian's libfabric pulls in libinfinipath, whose constructor installs
	 * signal handlers unless told not to; EFA aborts on fork() unless it was
	 * made fork safe before it initialised. Respect what the user set. */
	setenv("IPATH_NO_BACKTRACE", "1", 0);
	setenv("FI_EFA_FORK_SAFE", "1", 0);
	/* shm moves large messages with process_vm_readv: the receiver reads
	 * the sender's memory, which the kernel allows only into a dumpable
	 * process. One that changed user (a worker that dropped root, memcached
	 * -u) is not, so its peers' reads would fail with EIO; it must send
	 * through the shared segments instead. The provider reads this when it
	 * initialises, which is now, in the process that offloads. */
	if (!fs_self_dumpable())
		setenv("FI_SHM_DISABLE_CMA", "1", 0);
	fs_fabric_cma_off = fs_env_true("FI_SHM_DISABLE_CMA");

	fs_fabric_load_stubs();
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++)
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!lib && fs_fabric_drop_stubs()) {
		/* a libfabric that needs more of PSM than the stand-ins have */
		FS_INFO("libfabric did not load with the PSM stand-ins (%s); loading it without them", dlerror());
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++)
			lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	}
	if (!lib) {
		snprintf(fs_fabric_why, sizeof(fs_fabric_why), "cannot load libfabric: %s", dlerror());
		return;
	}
#define FS_FI_SYM(field, name)                                                                \
	do {                                                                                  \
		void *sym = dlsym(lib, name);                                                 \
		if (!sym) {                                                                   \
			snprintf(fs_fabric_why, sizeof(fs_fabric_why), "libfabric lacks %s", name); \
			return;                                                       \
		}                                                                             \
		memcpy(&fs_fi.field, &sym, sizeof(sym));                                      \
	} while (0)
	FS_FI_SYM(getinfo, "fi_getinfo");
	FS_FI_SYM(freeinfo, "fi_freeinfo");
	FS_FI_SYM(dupinfo, "fi_dupinfo");
	FS_FI_SYM(fabric, "fi_fabric");
	FS_FI_SYM(version, "fi_version");
	FS_FI_SYM(strerror, "fi_strerror");
#undef FS_FI_SYM
	fs_fabric_status = 0;
	if (fs_fabric_exit_teardown && dlsym(RTLD_DEFAULT, "__tsan_init"))
		atexit(fs_fabric_exit_teardown);
}

void fs_fabric_set_exit_teardown(void (*fn)(void))
{
	fs_fabric_exit_teardown = fn;
}

int fs_fabric_load(char *why, size_t whylen)
{
	FS_GUARD_ENTER();
	pthread_once(&fs_fabric_once, fs_fabric_do_load);
	FS_GUARD_LEAVE();
	if (fs_fabric_status && why)
		snprintf(why, whylen, "%s", fs_fabric_why);
	return fs_fabric_status;
}

uint32_t fs_fabric_api_version(void)
{
	uint32_t have = fs_fi.version ? fs_fi.version() : FS_FI_VERSION;

	return have < FS_FI_VERSION ? have : FS_FI_VERSION;
}

const char *fs_fabric_prov_name(unsigned kind)
{
	switch (kind) {
	case FS_PROV_SHM: return "shm";
	case FS_PROV_EFA: return "efa";
	case FS_PROV_TCP: return "tcp";
	case FS_PROV_NET: return "net";
	default: return NULL;
	}
}

unsigned fs_fabric_prov_parse(const char *name)
{
	for (unsigned kind = FS_PROV_SHM; kind < FS_PROV_MAX_; kind++)
		if (name && strcmp(name, fs_fabric_prov_name(kind)) == 0)
			return kind;
	return FS_PROV_NONE;
}

bool fs_fabric_host_has_efa(void)
{
	DIR *dir = opendir("/sys/class/infiniband");
	struct dirent *de;
	bool found = false;

	if (!dir)
		return false;
	while (!found && (de = readdir(dir))) {
		char path[512], vendor[32] = "";
		int fd;
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/vendor", de->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = pread(fd, vendor, sizeof(vendor) - 1, 0);
		fs_real.close(fd);
		/* Amazon's PCI vendor id */
		if (n > 0 && strncmp(vendor, "0x1d0f", 6) == 0)
			found = true;
	}
	closedir(dir);
	return found;
}

/* shm regions are named after the endpoint; the default name (the pid)
 * collides across PID namespaces and cannot be told apart from other
 * programs' regions. Ours: fabsock-<pid namespace>-<pid>-<random>. */
static unsigned long fs_pid_namespace(void)
{
	/* A process's pid namespace is fixed (unshare(CLONE_NEWPID) and setns
	 * move only its later children): read once per process, as every
	 * HELLO both sides check asks for it. */
	static unsigned long cached_ns;
	static pid_t cached_pid;
	char link[64] = "";
	unsigned long ns = 0;
	ssize_t n;

	if (__atomic_load_n(&cached_pid, __ATOMIC_ACQUIRE) == fs_self_pid())
		return __atomic_load_n(&cached_ns, __ATOMIC_RELAXED);
	n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
	if (n > 0 && sscanf(link, "pid:[%lu]", &ns) == 1 && ns) {
		__atomic_store_n(&cached_ns, ns, __ATOMIC_RELAXED);
		__atomic_store_n(&cached_pid, fs_self_pid(), __ATOMIC_RELEASE);
	}
	return ns;
}

/* Writes "fabsock-<pid namespace>-" into OUT: what our region names start
 * with. Returns its length. */
static size_t fs_shm_prefix(char *out, size_t size)
{
	return (size_t)snprintf(out, size, "fabsock-%lu-", fs_pid_namespace());
}

/* The owner pid in NAME if NAME is one of our region names: PREFIX (from
 * fs_shm_prefix, PLEN bytes), then <pid>-. Else 0. */
static long fs_shm_name_pid(const char *name, const char *prefix, size_t plen)
{
	char *end;
	long pid;

	if (strncmp(name, prefix, plen) != 0)
		return 0;
	pid = strtol(name + plen, &end, 10);
	return end != name + plen && *end == '-' && pid > 0 ? pid : 0;
}

bool fs_pid_alive(long pid)
{
	return pid > 0 && !(kill((pid_t)pid, 0) && errno == ESRCH);
}

/* Removes the shm regions of our PID namespace whose owner pid is not
 * alive (OWN false), or that carry this process's pid (OWN true: the
 * previous program's, after exec). Only files of our effective uid: a
 * root process does not remove what another user put there under a name
 * like ours (that user's own processes clean theirs). */
static void fs_shm_clean(bool own)
{
	char prefix[64];
	size_t plen = fs_shm_prefix(prefix, sizeof(prefix));
	DIR *dir = opendir("/dev/shm");
	struct dirent *de;

	if (!dir)
		return;
	while ((de = readdir(dir))) {
		char path[512];
		long pid = fs_shm_name_pid(de->d_name, prefix, plen);
		struct stat st;

		if (!pid || (own ? pid != getpid() : pid == getpid() || fs_pid_alive(pid)))
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", de->d_name);
		if (lstat(path, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
			continue;
		if (unlink(path) == 0)
			FS_INFO("removed shm region %s of %s", de->d_name,
				own ? "this process's previous program (exec)" : "a dead process");
	}
	closedir(dir);
}

static void fs_shm_clean_stale(void)
{
	static int done;

	if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		fs_shm_clean(false);
}

void fs_shm_clean_previous_program(void)
{
	/* This pid's regions can only be the previous program's: this one has
	 * opened no rail yet. */
	fs_shm_clean(true);
}

/* The region name in a shm address "fi_shm://NAME" (NUL-terminated, LEN
 * bytes with the NUL), or NULL when ADDR is not one. */
static const char *fs_shm_addr_name(const void *addr, size_t len)
{
	const char *text = addr;

	if (len < 10 || len > FS_WIRE_ADDR_MAX || text[len - 1] != '\0' || strlen(text) != len - 1 ||
	    strncmp(text, "fi_shm://", 9) != 0)
		return NULL;
	for (size_t i = 9; i < len - 1; i++)
		if (text[i] == '/' || text[i] < 0x21 || text[i] > 0x7e)
			return NULL;
	return text + 9;
}

/* Whether NAME is a region name fabsock gives (fs_rail_hints): our pid
 * namespace's prefix, a pid, '-', 8 hex digits, then only the ":<number>"
 * fields the shm provider appends (libfabric 1.17: ":<uid>:<index>"). A HELLO
 * that names any other file in /dev/shm (another program's segment, which
 * libfabric would map as a peer region and crash on) is refused. */
static bool fs_shm_region_name_ours(const char *name)
{
	char prefix[64];
	size_t plen = fs_shm_prefix(prefix, sizeof(prefix));
	long pid = fs_shm_name_pid(name, prefix, plen);
	const char *tail;

	if (!pid) /* (no kill(pid, 0) here: a seccomp sandbox may forbid it) */
		return false;
	tail = strchr(name + plen, '-') + 1; /* fs_shm_name_pid saw the '-' */
	for (unsigned i = 0; i < 8; i++)
		if (!isxdigit((unsigned char)tail[i]))
			return false;
	/* then what the shm provider appends: ":<number>" fields */
	for (tail += 8; *tail; ) {
		if (*tail++ != ':' || !isdigit((unsigned char)*tail))
			return false;
		while (isdigit((unsigned char)*tail))
			tail++;
	}
	return true;
}

/* The owner of the shm region NAME: a regular file in /dev/shm, not a
 * link. Returns 0 with *UID set, or -EADDRNOTAVAIL. */
static int fs_shm_region_owner(const char *name, uid_t *uid)
{
	char path[300];
	struct stat st;

	if ((size_t)snprintf(path, sizeof(path), "/dev/shm/%s", name) >= sizeof(path) || lstat(path, &st) ||
	    !S_ISREG(st.st_mode))
		return -EADDRNOTAVAIL;
	*uid = st.st_uid;
	return 0;
}

bool fs_self_dumpable(void)
{
	return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1;
}

int fs_rail_self_check(const struct fs_rail *rail, const char **why)
{
	const char *own;
	uid_t own_uid, euid;

	*why = NULL;
	if (rail->kind != FS_PROV_SHM)
		return 0;
	euid = geteuid();
	if (__atomic_load_n(&((struct fs_rail *)rail)->self_region_euid, __ATOMIC_RELAXED) != (uint64_t)euid + 1) {
		own = fs_shm_addr_name(rail->addr, rail->addr_len);
		if (!own || fs_shm_region_owner(own, &own_uid) || own_uid != euid) {
			*why = "this process changed user after opening its shm rail: new peers cannot map its region";
			return -EPERM;
		}
		__atomic_store_n(&((struct fs_rail *)rail)->self_region_euid, (uint64_t)euid + 1, __ATOMIC_RELAXED);
	}
	if (!fs_fabric_cma_off && !fs_self_dumpable()) {
		*why = "this process became non-dumpable (it changed user) after loading libfabric: "
		       "its peers cannot read its memory";
		return -EPERM;
	}
	return 0;
}

int fs_rail_peer_check(const struct fs_rail *rail, const void *addr, size_t len)
{
	const char *peer, *why;
	uid_t peer_uid;

	if (!len)
		return -EADDRNOTAVAIL;
	if (rail->kind != FS_PROV_SHM)
		return 0; /* the provider's own insert checks the rest */
	/* In the address vector: its region passed the checks below when it
	 * was inserted, and only its owner, which is our user, could have
	 * replaced the file since (/dev/shm is sticky). */
	if (fs_rail_av_knows(rail, addr, len))
		return fs_rail_self_check(rail, &why);
	peer = fs_shm_addr_name(addr, len);
	if (!peer || !fs_shm_region_name_ours(peer) || fs_shm_region_owner(peer, &peer_uid))
		return -EADDRNOTAVAIL;
	/* Each side maps the other's region with the rights it has now, and
	 * regions are 0600: both must belong to the user this process runs as
	 * (root could map the other's, the other could not map root's, and
	 * libfabric 1.17 then crashes in its progress on the missing region). */
	if (peer_uid != geteuid())
		return -EPERM;
	return fs_rail_self_check(rail, &why);
}

static struct fi_info *fs_rail_hints(unsigned kind, const struct sockaddr *local, bool source)
{
	struct fi_info *hints = fs_fi.dupinfo(NULL);

	if (!hints)
		return NULL;
	hints->caps = FI_TAGGED | FI_MSG | FI_SEND | FI_RECV | (source ? FI_SOURCE : 0);
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
	hints->fabric_attr->prov_name = strdup(fs_fabric_prov_name(kind));
	if (kind == FS_PROV_SHM) {
		char name[96];
		uint32_t nonce = (uint32_t)(fs_now_ns() ^ ((uint64_t)getpid() << 16));

		size_t plen = (size_t)snprintf(name, sizeof(name), "fi_shm://");

		plen += fs_shm_prefix(name + plen, sizeof(name) - plen);
		snprintf(name + plen, sizeof(name) - plen, "%d-%08x", (int)getpid(), nonce);
		hints->addr_format = FI_ADDR_STR;
		hints->src_addr = strdup(name);
		hints->src_addrlen = hints->src_addr ? strlen(name) + 1 : 0;
	}
	if (local && kind != FS_PROV_SHM && kind != FS_PROV_EFA) {
		size_t len = local->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
							  : sizeof(struct sockaddr_in);
		struct sockaddr_storage *src = calloc(1, sizeof(*src));

		if (src) {
			memcpy(src, local, len);
			/* any free port: only the interface matters */
			if (local->sa_family == AF_INET6)
				((struct sockaddr_in6 *)src)->sin6_port = 0;
			else
				((struct sockaddr_in *)src)->sin_port = 0;
			hints->src_addr = src;
			hints->src_addrlen = len;
			hints->addr_format = local->sa_family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
		}
	}
	return hints;
}

/* Picks the first returned info that is really what we asked for (EFA also
 * lists its datagram domains; tcp lists the layered rxm one first). */
static struct fi_info *fs_rail_pick(struct fi_info *list, unsigned kind)
{
	for (struct fi_info *fi = list; fi; fi = fi->next) {
		if (fi->ep_attr->type != FI_EP_RDM)
			continue;
		if (kind == FS_PROV_EFA && fi->domain_attr->name &&
		    strstr(fi->domain_attr->name, "-dgrm"))
			continue;
		return fi;
	}
	return NULL;
}

static int fs_rail_open_inner(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, char *why,
			      size_t whylen);

/* ---- a peer that died holding its shm lock ------------------------------
 *
 * libfabric's shm provider guards each process's region with a spin lock in
 * that region, taken by the owner while it progresses and by every sender.
 * A process SIGKILLed while holding it leaves every sender to it spinning
 * inside fi_tsend forever (libfabric 1.17 has no robust lock). fabsock
 * cannot avoid entering that call, so it undoes the damage: every shm post
 * and completion-queue read is announced (fs_prov_call_begin/end); a
 * watchdog thread, seeing one call stuck for FS_STUCK_CALL_MS while a peer
 * is dead, releases a lock that stays taken: the dead peer's, and our own
 * region's (a dead receiver was writing a completion back to us: the case
 * seen in e2e_peerkill), through this process's own mapping of the region.
 *
 * Where the lock is in a region differs between libfabric versions; in all
 * of them it follows the region's base_addr field (the owner's mapping
 * address). At rail open we look for that field in our own region, so the
 * lock's offset is learnt from the running library, not assumed; if the
 * search fails (another layout) the release is simply not done. */
long fs_prov_call_pid;
uint64_t fs_prov_calls;
static size_t fs_shm_lock_off; /* 0: unknown */
_Static_assert(sizeof(pthread_spinlock_t) == sizeof(int), "a spin lock is one int");

/* The start of this process's mapping of the shm region of process PID
 * (deleted or not), or 0. */
static uintptr_t fs_shm_mapping(long pid)
{
	char line[512], prefix[64];
	size_t plen = fs_shm_prefix(prefix, sizeof(prefix));
	uintptr_t addr = 0;
	FILE *maps = fs_real.fopen("/proc/self/maps", "re");

	if (!maps)
		return 0;
	while (!addr && fgets(line, sizeof(line), maps)) {
		const char *name = strstr(line, "/dev/shm/");
		unsigned long start, off;

		if (name && fs_shm_name_pid(name + strlen("/dev/shm/"), prefix, plen) == pid &&
		    sscanf(line, "%lx-%*[0-9a-f] %*s %lx", &start, &off) == 2 && off == 0)
			addr = start;
	}
	fclose(maps);
	return addr;
}

/* The word of a free pthread spin lock (glibc's choice, learnt once): what
 * the region lock holds when free, and what fs_prov_spin_lock waits for. */
static int fs_spin_free_word(void)
{
	static int word, known;

	if (!__atomic_load_n(&known, __ATOMIC_ACQUIRE)) {
		pthread_spinlock_t fresh;
		int w;

		pthread_spin_init(&fresh, PTHREAD_PROCESS_SHARED);
		memcpy(&w, (const void *)&fresh, sizeof(w));
		pthread_spin_destroy(&fresh);
		__atomic_store_n(&word, w, __ATOMIC_RELAXED);
		__atomic_store_n(&known, 1, __ATOMIC_RELEASE);
	}
	return __atomic_load_n(&word, __ATOMIC_RELAXED);
}

static void fs_shm_find_lock(void)
{
	const int free_word = fs_spin_free_word();
	uintptr_t base;

	if (fs_shm_lock_off)
		return;
	base = fs_shm_mapping(getpid());
	if (!base)
		return;
	for (size_t off = 0; off + sizeof(uintptr_t) + sizeof(free_word) <= 256; off += sizeof(uintptr_t)) {
		uintptr_t v;
		int w;

		memcpy(&v, (const void *)(base + off), sizeof(v));
		memcpy(&w, (const void *)(base + off + sizeof(v)), sizeof(w));
		if (v == base && w == free_word) {
			fs_shm_lock_off = off + sizeof(v);
			break;
		}
	}
	if (!fs_shm_lock_off)
		FS_INFO("shm region layout not recognised: a peer killed inside libfabric may hang its senders");
}

bool fs_pid_dead(long pid)
{
	char path[64], stat[256], *paren;
	int fd;
	ssize_t n;

	if (!fs_pid_alive(pid))
		return true;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = pread(fd, stat, sizeof(stat) - 1, 0);
	fs_real.close(fd);
	if (n <= 0)
		return false;
	stat[n] = 0;
	paren = strrchr(stat, ')');
	return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* The lock word is libfabric's. A thread sanitizer models the provider's
 * pthread_spin_* calls on it as mutex operations and reports our look at
 * the word as a race with them, so these two, the only places fabsock
 * touches it, are not instrumented. (x86 stores are release stores.) */
__attribute__((no_sanitize("thread"), noinline)) static int fs_lock_word_load(const volatile int *w)
{
	return *w;
}

__attribute__((no_sanitize("thread"), noinline)) static void fs_lock_word_store(volatile int *w, int v)
{
	__atomic_thread_fence(__ATOMIC_RELEASE);
	*w = v;
}

/* True if the spin lock at ADDR is taken at every one of SAMPLES looks
 * 1 ms apart. A live holder keeps it for microseconds, but one that the
 * scheduler has set aside may keep it for tens of milliseconds on a loaded
 * machine: a lock is only ever released when a peer is known dead, and our
 * own region's (which live peers take too) only after a long look. */
static bool fs_lock_stuck(int *lock, int samples)
{
	for (int i = 0; i < samples; i++) {
		if (fs_lock_word_load(lock) == fs_spin_free_word())
			return false;
		usleep(1000);
	}
	return true;
}

/* Releases the lock of the region mapped at BASE if it stays taken. */
static bool fs_shm_unlock_if_stuck(uintptr_t base, const char *whose, int samples)
{
	int *lock = (int *)(base + fs_shm_lock_off);

	if (!base || !fs_lock_stuck(lock, samples))
		return false;
	/* What pthread_spin_unlock does, without telling a thread sanitizer
	 * that this thread unlocks a lock it never took. */
	fs_lock_word_store(lock, fs_spin_free_word());
	FS_WARN("the shm lock of %s stayed taken while a peer process was gone; released it", whose);
	return true;
}

/* The last FS_PEER_RING peers that provider calls were made to: written
 * under the engine lock, read by the watchdog (a stale read only delays a
 * release to its next look). */
#define FS_PEER_RING 16
long fs_prov_last_peer;
static long fs_prov_peer_ring[FS_PEER_RING];
static unsigned fs_prov_peer_next;

void fs_prov_note_peer(long pid)
{
	__atomic_store_n(&fs_prov_last_peer, pid, __ATOMIC_RELAXED);
	for (unsigned i = 0; i < FS_PEER_RING; i++)
		if (__atomic_load_n(&fs_prov_peer_ring[i], __ATOMIC_RELAXED) == pid)
			return;
	__atomic_store_n(&fs_prov_peer_ring[fs_prov_peer_next++ % FS_PEER_RING], pid, __ATOMIC_RELAXED);
}

/* A recent peer that is gone, or 0. */
static long fs_recent_peer_dead(void)
{
	for (unsigned i = 0; i < FS_PEER_RING; i++) {
		long pid = __atomic_load_n(&fs_prov_peer_ring[i], __ATOMIC_RELAXED);

		if (pid > 0 && pid != getpid() && fs_pid_dead(pid))
			return pid;
	}
	return 0;
}

bool fs_shm_release_dead(long pid)
{
	char whose[64];
	bool done = false;
	long gone;

	if (!fs_shm_lock_off)
		return false;
	/* Only a dead process can hold a lock for good. Without one, the call
	 * is slow, not stuck (its thread, or the lock's holder, waits for a
	 * core), and releasing a lock a live process holds would corrupt the
	 * region under it. */
	gone = pid > 0 && fs_pid_dead(pid) ? pid : fs_recent_peer_dead();
	if (!gone)
		return false;
	snprintf(whose, sizeof(whose), "dead process %ld", gone);
	done = fs_shm_unlock_if_stuck(fs_shm_mapping(gone), whose, 20);
	/* A dead receiver may hold our own region's lock (it was writing a
	 * completion back to us); so may a live peer, set aside by the
	 * scheduler: half a second of looks tells them apart. */
	done |= fs_shm_unlock_if_stuck(fs_shm_mapping(getpid()), "this process's region", 500);
	return done;
}

/* Waiting for a provider's spin lock (fs_prov_spin_lock): reads of the lock
 * word with a pause between (glibc's own loop, so a release is seen at
 * once) for FS_LOCK_SPIN_NS, then sleeps from FS_LOCK_SLEEP_FIRST_NS
 * doubling up to FS_LOCK_SLEEP_MAX_NS, each followed by FS_LOCK_RESPIN_NS of
 * reads. A running holder keeps a region's lock for microseconds, tens
 * through a receiver's CMA copy of a 128 KiB pull: the first spin covers
 * that (a first version that slept after ~30 us cost iperf3 -P 4 half its
 * bandwidth); only a holder that is not running makes a waiter sleep. */
#define FS_LOCK_SPIN_NS 200000ull
#define FS_LOCK_RESPIN_NS 20000ull
#define FS_LOCK_SLEEP_FIRST_NS 20000L
#define FS_LOCK_SLEEP_MAX_NS 1000000L

int fs_prov_spin_lock(pthread_spinlock_t *lock)
{
	int free_word = 0;
	uint64_t spin_end = 0;
	long sleep_ns = FS_LOCK_SLEEP_FIRST_NS;
	bool counted = false;
	unsigned n = 0;

	for (;;) {
		if (pthread_spin_trylock(lock) == 0) /* not interposed: glibc's */
			return 0;
		if (!spin_end) { /* contended: the uncontended path is the trylock alone */
			spin_end = fs_now_ns() + FS_LOCK_SPIN_NS;
			free_word = fs_spin_free_word();
		}
		while (fs_lock_word_load((const volatile int *)lock) != free_word) {
			__builtin_ia32_pause();
			if ((++n & 63) == 0 && fs_now_ns() >= spin_end)
				break;
		}
		if (fs_lock_word_load((const volatile int *)lock) == free_word)
			continue; /* looks free: try it */
		if (!counted) {
			FS_STAT_INC(prov_lock_sleeps);
			counted = true;
		}
		/* the holder may be waiting for this very core */
		nanosleep(&(struct timespec){ 0, sleep_ns }, NULL);
		if (sleep_ns < FS_LOCK_SLEEP_MAX_NS)
			sleep_ns = sleep_ns * 2 < FS_LOCK_SLEEP_MAX_NS ? sleep_ns * 2 : FS_LOCK_SLEEP_MAX_NS;
		spin_end = fs_now_ns() + FS_LOCK_RESPIN_NS;
	}
}

/* A shm provider call not returning for this long is stuck on a lock that a
 * dead process holds. */
#define FS_STUCK_CALL_MS 200

/* Notices a provider call that has not returned for FS_STUCK_CALL_MS. */
static void fs_shm_check_stuck(void)
{
	static long last;
	static uint64_t last_count, since_ns;
	long pid = __atomic_load_n(&fs_prov_call_pid, __ATOMIC_RELAXED);
	uint64_t count = __atomic_load_n(&fs_prov_calls, __ATOMIC_RELAXED), now = fs_now_ns();

	if (!pid || pid != last || count != last_count) {
		last = pid;
		last_count = count;
		since_ns = now;
		return;
	}
	if (now - since_ns < FS_STUCK_CALL_MS * 1000000ull)
		return;
	since_ns = now; /* at most one attempt per period */
	fs_shm_release_dead(pid);
}

/* The watchdog is a thread of its own: the stuck call may be the service
 * thread's (its progress posts sends too). It looks four times a second: a
 * wake-up each is nothing for one process, but 300 PostgreSQL backends
 * woke 3,000 times a second at ten looks each, on a machine of two cores. */
static void *fs_shm_watchdog(void *arg)
{
	FS_GUARD_ENTER(); /* everything this thread does is fabsock's own */
	for (;;) {
		struct timespec ts = { 0, 250 * 1000000L };

		nanosleep(&ts, NULL);
		fs_shm_check_stuck();
	}
	return arg;
}

static void fs_shm_watchdog_start(void)
{
	static pid_t started;

	if (started == getpid())
		return;
	if (fs_thread_start(fs_shm_watchdog, 64 * 1024) == 0)
		started = getpid();
	else
		FS_WARN("cannot start the shm watchdog thread; a peer killed inside libfabric may hang its senders");
}

long fs_shm_addr_pid(const void *addr, size_t len)
{
	char name[FS_WIRE_ADDR_MAX + 1], prefix[64], *p;
	size_t plen;

	if (!len || len > FS_WIRE_ADDR_MAX)
		return 0;
	memcpy(name, addr, len);
	name[len] = 0;
	plen = fs_shm_prefix(prefix, sizeof(prefix));
	p = strstr(name, prefix);
	return p ? fs_shm_name_pid(p, prefix, plen) : 0;
}

/* Opens a rail, noting the signal handlers the provider installs (sigs.h). */
int fs_rail_open(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, char *why,
		 size_t whylen)
{
	static struct fs_sigs_snapshot snap; /* rails open under the engine lock */
	int ret;

	fs_sigs_before(&snap);
	ret = fs_rail_open_inner(rail, kind, local, why, whylen);
	fs_sigs_after(&snap);
	return ret;
}

static int fs_rail_open_inner(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, char *why,
			      size_t whylen)
{
	struct fi_info *hints = NULL, *list = NULL, *fi;
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE };
	const char *step = "fi_getinfo";
	int ret;

	memset(rail, 0, sizeof(*rail));
	rail->kind = kind;
	ret = fs_fabric_load(why, whylen);
	if (ret)
		return ret;
	if (kind == FS_PROV_SHM)
		fs_shm_clean_stale();

	FS_GUARD_ENTER();
	for (int source = 1; source >= 0; source--) {
		hints = fs_rail_hints(kind, local, source);
		if (!hints) {
			ret = -ENOMEM;
			goto err_none;
		}
		ret = fs_fi.getinfo(fs_fabric_api_version(), NULL, NULL, 0, hints, &list);
		fs_fi.freeinfo(hints);
		hints = NULL;
		if (ret == 0 && fs_rail_pick(list, kind))
			break;
		if (list)
			fs_fi.freeinfo(list);
		list = NULL;
	}
	if (!list) {
		snprintf(why, whylen, "provider %s is not usable here (fi_getinfo: %s)",
			 fs_fabric_prov_name(kind), fs_fi.strerror(ret < 0 ? -ret : ret));
		ret = -ENODEV;
		goto err_none;
	}
	fi = fs_rail_pick(list, kind);
	rail->info = fs_fi.dupinfo(fi);
	fs_fi.freeinfo(list);
	if (!rail->info) {
		ret = -ENOMEM;
		goto err_none;
	}
	fi = rail->info;

	rail->inject_size = fi->tx_attr->inject_size;
	rail->max_msg_size = fi->ep_attr->max_msg_size;
	rail->tx_depth = fi->tx_attr->size;
	rail->rx_depth = fi->rx_attr->size;
	rail->iov_limit = fi->tx_attr->iov_limit;
	rail->mr_local = (fi->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
	rail->mr_prov_key = (fi->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;
	rail->source = (fi->caps & FI_SOURCE) != 0;
	rail->av_max = kind == FS_PROV_SHM ? 256 : 65536;
	if (fs_params.test_av_max && fs_params.test_av_max < rail->av_max)
		rail->av_max = (unsigned)fs_params.test_av_max;
	/* Keys only need to be unique within this domain; start away from 0. */
	rail->next_key = 0x10000u + ((uint64_t)getpid() << 20);

	step = "fi_fabric";
	ret = fs_fi.fabric(fi->fabric_attr, &rail->fabric, NULL);
	if (ret)
		goto err_info;
	step = "fi_domain";
	ret = fi_domain(rail->fabric, fi, &rail->domain, NULL);
	if (ret)
		goto err_fabric;
	step = "fi_av_open";
	ret = fi_av_open(rail->domain, &av_attr, &rail->av, NULL);
	if (ret)
		goto err_domain;
	step = "fi_cq_open";
	cq_attr.size = rail->tx_depth + rail->rx_depth;
	ret = fi_cq_open(rail->domain, &cq_attr, &rail->cq, NULL);
	if (ret)
		goto err_av;
	step = "fi_endpoint";
	ret = fi_endpoint(rail->domain, fi, &rail->ep, NULL);
	if (ret)
		goto err_cq;
	step = "fi_ep_bind(av)";
	ret = fi_ep_bind(rail->ep, &rail->av->fid, 0);
	if (ret)
		goto err_ep;
	step = "fi_ep_bind(cq)";
	ret = fi_ep_bind(rail->ep, &rail->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		goto err_ep;
	step = "fi_enable";
	ret = fi_enable(rail->ep);
	if (ret)
		goto err_ep;
	step = "fi_getname";
	rail->addr_len = sizeof(rail->addr);
	ret = fi_getname(&rail->ep->fid, rail->addr, &rail->addr_len);
	if (ret)
		goto err_ep;
	if (rail->addr_len > FS_WIRE_ADDR_MAX) {
		ret = -FI_ETOOSMALL;
		goto err_ep;
	}
	FS_GUARD_LEAVE();
	if (kind == FS_PROV_SHM) {
		fs_shm_find_lock();
		if (fs_shm_lock_off)
			fs_shm_watchdog_start();
	}
	FS_INFO("opened %s rail: domain %s, inject %zu, tx %zu, rx %zu, iov %zu, mr_local %d, source %d",
		fs_fabric_prov_name(kind), fi->domain_attr->name, rail->inject_size, rail->tx_depth,
		rail->rx_depth, rail->iov_limit, rail->mr_local, rail->source);
	return 0;

err_ep:
	fi_close(&rail->ep->fid);
err_cq:
	fi_close(&rail->cq->fid);
err_av:
	fi_close(&rail->av->fid);
err_domain:
	fi_close(&rail->domain->fid);
err_fabric:
	fi_close(&rail->fabric->fid);
err_info:
	snprintf(why, whylen, "%s rail: %s failed: %s", fs_fabric_prov_name(kind), step,
		 fs_fi.strerror(ret < 0 ? -ret : ret));
	fs_fi.freeinfo(rail->info);
	rail->info = NULL;
	ret = ret < 0 ? ret : -EIO;
err_none:
	FS_GUARD_LEAVE();
	return ret;
}

void fs_rail_close(struct fs_rail *rail)
{
	struct fs_av_peer *peer, *tmp;

	if (!rail->info)
		return;
	HASH_ITER(hh, rail->peers, peer, tmp) {
		HASH_DEL(rail->peers, peer);
		free(peer);
	}
	rail->av_count = 0;
	FS_GUARD_ENTER();
	fi_close(&rail->ep->fid);
	fi_close(&rail->cq->fid);
	fi_close(&rail->av->fid);
	fi_close(&rail->domain->fid);
	fi_close(&rail->fabric->fid);
	fs_fi.freeinfo(rail->info);
	rail->info = NULL;
	FS_GUARD_LEAVE();
}

int fs_rail_mr_reg(struct fs_rail *rail, void *buf, size_t len, struct fid_mr **mr)
{
	int ret;

	FS_GUARD_ENTER();
	ret = fi_mr_reg(rail->domain, buf, len, FI_SEND | FI_RECV, 0, rail->next_key++, 0, mr, NULL);
	FS_GUARD_LEAVE();
	return ret;
}

/* Removes one peer no stream uses from the AV. Returns 0, or -ENOSPC when
 * every peer is in use. */
static int fs_rail_av_evict_idle(struct fs_rail *rail)
{
	struct fs_av_peer *peer, *tmp;

	HASH_ITER(hh, rail->peers, peer, tmp) {
		if (peer->refs)
			continue;
		HASH_DEL(rail->peers, peer);
		FS_GUARD_ENTER();
		fi_av_remove(rail->av, &peer->fi_addr, 1, 0);
		FS_GUARD_LEAVE();
		free(peer);
		rail->av_count--;
		return 0;
	}
	return -ENOSPC;
}

int fs_rail_av_insert(struct fs_rail *rail, const void *addr, size_t addr_len, fi_addr_t *out)
{
	struct fs_av_peer *peer;
	int ret;

	if (!addr_len || addr_len > FS_WIRE_ADDR_MAX)
		return -EADDRNOTAVAIL;
	HASH_FIND(hh, rail->peers, addr, addr_len, peer);
	if (peer && peer->len == addr_len) {
		const char *why;

		/* checked when it was inserted; our own side may have changed */
		ret = fs_rail_self_check(rail, &why);
		if (ret)
			return ret;
		peer->refs++;
		*out = peer->fi_addr;
		return 0;
	}
	ret = fs_rail_peer_check(rail, addr, addr_len);
	if (ret)
		return ret;
	if (rail->av_count >= rail->av_max && fs_rail_av_evict_idle(rail))
		return -ENOSPC;
	peer = calloc(1, sizeof(*peer));
	if (!peer)
		return -ENOMEM;
	FS_GUARD_ENTER();
	ret = fi_av_insert(rail->av, addr, 1, &peer->fi_addr, 0, NULL);
	FS_GUARD_LEAVE();
	if (ret != 1) {
		free(peer);
		return ret < 0 ? ret : -EINVAL;
	}
	memcpy(peer->addr, addr, addr_len);
	peer->len = addr_len;
	peer->refs = 1;
	HASH_ADD(hh, rail->peers, addr[0], addr_len, peer);
	rail->av_count++;
	*out = peer->fi_addr;
	return 0;
}

bool fs_rail_av_knows(const struct fs_rail *rail, const void *addr, size_t addr_len)
{
	struct fs_av_peer *peer;

	if (!addr || !addr_len || addr_len > FS_WIRE_ADDR_MAX)
		return false;
	HASH_FIND(hh, rail->peers, addr, addr_len, peer);
	return peer && peer->len == addr_len;
}

bool fs_rail_av_room(const struct fs_rail *rail, unsigned pending)
{
	struct fs_av_peer *peer, *tmp;
	unsigned room = rail->av_count < rail->av_max ? rail->av_max - rail->av_count : 0;

	if (room > pending)
		return true;
	/* full: a peer no stream uses would make way (fs_rail_av_evict_idle) */
	HASH_ITER(hh, rail->peers, peer, tmp) {
		if (!peer->refs && ++room > pending)
			return true;
	}
	return false;
}

void fs_rail_av_release(struct fs_rail *rail, fi_addr_t addr)
{
	struct fs_av_peer *peer, *tmp;

	HASH_ITER(hh, rail->peers, peer, tmp) {
		if (peer->fi_addr != addr)
			continue;
		/* A peer no stream uses stays in the AV (until the AV is full):
		 * a peer process reconnects often (a prefork server's workers,
		 * a client's next connection), and libfabric 1.17's shm loses
		 * messages to a peer that was removed and inserted again
		 * (docs/design.md, "AV peers"). */
		if (peer->refs)
			peer->refs--;
		return;
	}
}
