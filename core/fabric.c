/* SPDX-License-Identifier: MIT */
/*
 * Loading libfabric and opening rails (see fabric.h); what is particular to
 * the shm provider's regions (their names, stale ones, a dead peer's lock)
 * is fabric_shm.c's. All limits the data
 * path depends on are read here from the fi_info the provider returned, not
 * assumed: inject size, queue depths (tx_size caps our posted sends), MR
 * mode. The hints ask only for what fabsock uses (RDM, tagged and untagged
 * messages) and offer the MR mode bits and FI_CONTEXT/FI_CONTEXT2 fabsock can
 * honour, but not FI_MR_LOCAL (see fs_rail_hints), so the same code opens
 * shm, tcp;ofi_rxm, net and efa (its "efa" fabric; 1.17 needs FI_MR_ALLOCATED
 * | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR, none of FI_MR_LOCAL or FI_CONTEXT2 on
 * RDM: fi_efa(7)). Every send passes one buffer, so iov_limit (efa: 4) is
 * never reached; a pull split between the application's buffer and a bounce
 * buffer (rxq.c) is the one receive of two pieces, only where the rail's
 * rx_iov_limit allows it.
 */
#include "core/fabric.h"
#include "core/fabric_internal.h"
#include "core/sigs.h"

#include <dirent.h>
#include <netinet/in.h>
#include <dlfcn.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <uthash.h>

#include "config/log.h"
#include "preload/real.h"
#include "core/engine.h"
#include "core/guard.h"
#include "core/nics.h"
#include "core/stats.h"
#include "core/udp.h"

#define FS_FI_VERSION FI_VERSION(1, 17)
/* Peers one endpoint's address vector is asked for (not shm): 16
 * endpoints (FS_ENGINE_MAX_EPS) hold 65,536, what one endpoint held before
 * the count was requested. */
#define FS_RAIL_AV_COUNT 4096

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
bool fs_fabric_cma_off;
/*
 * The variables fabsock puts in the environment for libfabric and the
 * libraries it loads, each only where the user has not set it (the user's
 * value always wins and is never touched), and each taken back as soon as
 * its reader has read it, so that the programs this process runs (exec,
 * system, posix_spawn) and a libfabric of the application's own never see
 * them. Where each is read (libfabric 1.17; seen with a getenv spy, and in
 * its source):
 *  - IPATH_NO_BACKTRACE: libinfinipath's constructor, at the dlopen of
 *    libfabric, when the real PSM library loads (not with the stand-ins);
 *    and its destructor, at exit: unset then, the destructor puts back six
 *    signal actions it never saved (SIGSEGV, SIGBUS, SIGILL, SIGABRT,
 *    SIGINT, SIGTERM: the default, over the application's). So it is set
 *    only when the real library is about to load, and kept only if it did.
 *  - FI_EFA_FORK_SAFE (EFA_INI: rxr_env_initialize), FI_SHM_DISABLE_CMA
 *    (SHM_INI: smr_init_env), FI_OFI_RXM_BUFFER_SIZE (RXM_INI:
 *    rxm_init_infos), FI_PROVIDER_PATH: libfabric's initialisation, inside
 *    the first fi_getinfo; taken back when it returns (fs_fabric_getinfo).
 *  - FI_OFI_RXM_EAGER_LIMIT: every rxm fi_endpoint (rxm_ep_init_proto);
 *    set around a tcp rail's only (fs_rail_open_objects).
 * fi_param_get reads the variable each time (getenv), so nothing is kept
 * from the environment after the read. The writes race with an
 * application thread's getenv (glibc's setenv may move the environ array
 * under a reader); they are bounded to the first rail's load and first
 * fi_getinfo, once per process, and each tcp rail's opening; fabsock's
 * own threads read the environment only under the same once or engine
 * lock.
 */
enum {
	FS_ENV_IPATH_NO_BACKTRACE,
	FS_ENV_EFA_FORK_SAFE,
	FS_ENV_SHM_DISABLE_CMA,
	FS_ENV_RXM_BUFFER_SIZE,
	FS_ENV_RXM_EAGER_LIMIT,
	FS_ENV_PROVIDER_PATH,
	FS_ENV_MAX_
};
static const char *const fs_fabric_env_names[FS_ENV_MAX_] = {
	[FS_ENV_IPATH_NO_BACKTRACE] = "IPATH_NO_BACKTRACE",
	[FS_ENV_EFA_FORK_SAFE] = "FI_EFA_FORK_SAFE",
	[FS_ENV_SHM_DISABLE_CMA] = "FI_SHM_DISABLE_CMA",
	[FS_ENV_RXM_BUFFER_SIZE] = "FI_OFI_RXM_BUFFER_SIZE",
	[FS_ENV_RXM_EAGER_LIMIT] = "FI_OFI_RXM_EAGER_LIMIT",
	[FS_ENV_PROVIDER_PATH] = "FI_PROVIDER_PATH",
};
/* which of them fabsock set and has not taken back yet */
static bool fs_fabric_env_ours[FS_ENV_MAX_];
/* fabsock gave rxm its buffer size: its eager limit goes with it */
static bool fs_fabric_rxm_tuned;

/* Sets variable WHICH to VALUE unless the environment has it. */
static void fs_fabric_env_set(unsigned which, const char *value)
{
	const char *name = fs_fabric_env_names[which];

	if (!getenv(name) && setenv(name, value, 0) == 0)
		__atomic_store_n(&fs_fabric_env_ours[which], true, __ATOMIC_RELEASE);
}

/* Takes variable WHICH back if fabsock set it (once, whoever calls). */
static void fs_fabric_env_unset(unsigned which)
{
	if (__atomic_exchange_n(&fs_fabric_env_ours[which], false, __ATOMIC_ACQ_REL))
		unsetenv(fs_fabric_env_names[which]);
}

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

/* The directory this library was loaded from (NULL if unknown): where the
 * stand-ins are looked for, and what the warning names when they are not. */
static const char *fs_fabric_self_dir(void)
{
	static char dir[PATH_MAX];
	Dl_info self;
	char *slash;

	if (!dladdr((void *)fs_fabric_self_dir, &self) || !self.dli_fname)
		return NULL;
	snprintf(dir, sizeof(dir), "%s", self.dli_fname);
	slash = strrchr(dir, '/');
	if (!slash)
		return NULL;
	*slash = '\0';
	return dir;
}

/* Loads the stand-ins found next to this library, before libfabric: the
 * dynamic linker then satisfies libfabric's dependencies on the PSM
 * libraries with them, by soname, and the real ones (whose constructors
 * calibrate the clock for ~100 ms each) never load. Not when the process has
 * the real library loaded already (it is the application's). */
static void fs_fabric_load_stubs(void)
{
	char path[PATH_MAX + 64];
	const char *dir = fs_fabric_self_dir();

	if (!fs_params.stub_psm || !dir)
		return;
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

/* libfabric 1.17 initialises on its first fi_getinfo. Unless
 * FI_PROVIDER_PATH is set, it then looks for a plug-in library of every
 * provider it knows by name (libefa-fi.so, libverbs-fi.so... ~20 names)
 * through the whole library search path, and only after that reads its own
 * plug-in directory: ~500 failed opens, about 10 ms of CPU in every process
 * that opens a rail, for plug-ins that Debian's build (every provider built
 * in) does not have. Naming that directory (LIBDIR/libfabric, beside the
 * library, which is what the unset variable means besides the search) keeps
 * the plug-ins of the directory and skips the search. A user who set the
 * variable keeps their value. It is taken back after the initialisation
 * (fs_fabric_getinfo), so that the programs this process runs do not
 * inherit it. */
static void fs_fabric_set_provider_path(void)
{
	char dir[PATH_MAX];
	Dl_info lib;
	char *slash;

	if (getenv("FI_PROVIDER_PATH") || !dladdr((void *)fs_fi.getinfo, &lib) || !lib.dli_fname ||
	    !lib.dli_fname[0])
		return;
	snprintf(dir, sizeof(dir), "%s", lib.dli_fname);
	slash = strrchr(dir, '/');
	if (!slash || (size_t)(slash - dir) + sizeof("/libfabric") > sizeof(dir))
		return;
	strcpy(slash, "/libfabric");
	fs_fabric_env_set(FS_ENV_PROVIDER_PATH, dir);
}

/* fi_getinfo; the first one initialises libfabric (its providers' INI
 * functions), which has then read the variables set for it (see
 * fs_fabric_env_names). libfabric initialises under its own lock, so a
 * second thread's first call returns after that too. Under the guard. */
static int fs_fabric_getinfo(struct fi_info *hints, struct fi_info **list)
{
	int ret = fs_fi.getinfo(fs_fabric_api_version(), NULL, NULL, 0, hints, list);

	fs_fabric_env_unset(FS_ENV_PROVIDER_PATH);
	fs_fabric_env_unset(FS_ENV_EFA_FORK_SAFE);
	fs_fabric_env_unset(FS_ENV_SHM_DISABLE_CMA);
	fs_fabric_env_unset(FS_ENV_RXM_BUFFER_SIZE);
	return ret;
}

/* tcp;ofi_rxm (libfabric 1.17) keeps its bounce buffers in pools that grow
 * 1024 buffers of FI_OFI_RXM_BUFFER_SIZE (16 KiB) at a time, and zeroes
 * each new chunk, 17 MB, inside whatever call needed a buffer: fi_enable
 * (four chunks for the 4096 receives it preposts on its shared receive
 * context) and, when the first transfer starts, one chunk more of each of
 * its receive and send pools (seen as two 17 MB mmaps in the server). Those
 * two ran inside our progress rounds with the engine
 * lock held, as a 0.3-1.5 s hole at the start of every iperf3 run between
 * namespaces on a loaded 2-core host (perf: memset and page faults), the
 * stall of seconds seen there. With 2 KiB buffers a chunk is 2.4 MB.
 * Nothing of ours goes through their data area on tcp: rxm sends eager
 * messages from the caller's buffer (direct send), receives them into the
 * posted receive (dynamic receive buffers), and only an unexpected message
 * larger than a buffer takes a malloc instead. The eager limit, which is
 * the buffer size unless set, stays at rxm's 16 KiB, so messages keep
 * their protocol. The provider reads the buffer size at its initialisation
 * and the eager limit at each endpoint's opening (see fs_fabric_env_names);
 * a user's own settings win. */
static void fs_fabric_tune_rxm(void)
{
	char size[24];

	if (!fs_params.rxm_buffer_size || getenv("FI_OFI_RXM_BUFFER_SIZE"))
		return;
	snprintf(size, sizeof(size), "%u", (unsigned)fs_params.rxm_buffer_size);
	fs_fabric_env_set(FS_ENV_RXM_BUFFER_SIZE, size);
	fs_fabric_rxm_tuned = true;
}

/* Whether the real libinfinipath is in the process. */
static bool fs_fabric_ipath_loaded(void)
{
	void *ipath = dlopen("libinfinipath.so.4", RTLD_NOW | RTLD_NOLOAD);

	if (ipath)
		dlclose(ipath);
	return ipath != NULL;
}

static void fs_fabric_do_load_inner(void)
{
	static const char *const names[] = { "libfabric.so.1", "libfabric.so" };
	void *lib = NULL;
	bool ipath_before;

	/* EFA aborts on fork() unless it was made fork safe before it
	 * initialised. Respect what the user set. */
	fs_fabric_env_set(FS_ENV_EFA_FORK_SAFE, "1");
	/* shm moves large messages with process_vm_readv: the receiver reads
	 * the sender's memory, which the kernel allows only into a dumpable
	 * process. One that changed user (a worker that dropped root, memcached
	 * -u) is not, so its peers' reads would fail with EIO; it must send
	 * through the shared segments instead. The provider reads this when it
	 * initialises, which is now, in the process that offloads. */
	if (!fs_self_dumpable())
		fs_fabric_env_set(FS_ENV_SHM_DISABLE_CMA, "1");
	fs_fabric_cma_off = fs_env_true("FI_SHM_DISABLE_CMA");
	fs_fabric_tune_rxm();

	fs_fabric_load_stubs();
	/* Debian's libfabric pulls in libinfinipath (unless the stand-ins
	 * took its place), whose constructor installs signal handlers unless
	 * told not to. Not when the application loaded it already: its
	 * constructor has run, and the variable would only change what its
	 * destructor does. */
	ipath_before = fs_fabric_ipath_loaded();
	if (!ipath_before)
		fs_fabric_env_set(FS_ENV_IPATH_NO_BACKTRACE, "1");
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++)
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!lib && fs_fabric_drop_stubs()) {
		/* a libfabric that needs more of PSM than the stand-ins have */
		FS_INFO("libfabric did not load with the PSM stand-ins (%s); loading it without them", dlerror());
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++)
			lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	}
	/* the real library's destructor reads it again at exit (see
	 * fs_fabric_env_names): kept then, and only then */
	if (ipath_before || !fs_fabric_ipath_loaded())
		fs_fabric_env_unset(FS_ENV_IPATH_NO_BACKTRACE);
	else if (lib && fs_params.stub_psm) {
		/* a libfabsock.so copied alone (the stand-ins are not beside
		 * it): every process that opens a rail pays the real
		 * constructors, which a user sees only as slow connections */
		const char *dir = fs_fabric_self_dir();

		FS_WARN("libfabric loaded the real PSM libraries (libinfinipath: ~100-200 ms of start-up in every "
			"process that offloads): the stand-ins libfabsock-psm.so and libfabsock-psm2.so were not "
			"found beside %s; install them there (cmake --install does)",
			dir ? dir : "?");
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
	fs_fabric_set_provider_path();
	fs_fabric_status = 0;
	FS_STAT_INC(fabric_loads);
	if (fs_fabric_exit_teardown && dlsym(RTLD_DEFAULT, "__tsan_init"))
		atexit(fs_fabric_exit_teardown);
}

static void fs_fabric_do_load(void)
{
	fs_fabric_do_load_inner();
	/* no fi_getinfo will read what was set for it (IPATH_NO_BACKTRACE was
	 * decided after the dlopen: a libfabric that loaded without a symbol
	 * we need stays loaded, and the real libinfinipath with it) */
	if (fs_fabric_status)
		for (unsigned which = 0; which < FS_ENV_MAX_; which++)
			if (which != FS_ENV_IPATH_NO_BACKTRACE)
				fs_fabric_env_unset(which);
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
	return kind > FS_PROV_NONE && kind < FS_PROV_MAX_ ? fs_wire_provider_name(kind) : NULL;
}

unsigned fs_fabric_prov_parse(const char *name)
{
	if (!name || !name[0])
		return FS_PROV_NONE; /* none named (every connect() asked) */
	for (unsigned kind = FS_PROV_SHM; kind < FS_PROV_MAX_; kind++)
		if (strcmp(name, fs_fabric_prov_name(kind)) == 0)
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


/* The queue depth to ask KIND for, from DEPTH (fs_rail_open): shm only, and
 * only where the user did not size the queue with shm's own variables (a
 * hint above their value would find no provider). 0: the provider's. */
static size_t fs_rail_depth_hint(unsigned kind, size_t depth, const char *env)
{
	return kind == FS_PROV_SHM && !getenv(env) ? depth : 0;
}

static struct fi_info *fs_rail_hints(unsigned kind, const struct sockaddr *local, bool source, size_t depth)
{
	struct fi_info *hints = fs_fi.dupinfo(NULL);

	if (!hints)
		return NULL;
	hints->caps = FI_TAGGED | FI_MSG | FI_SEND | FI_RECV | (source ? FI_SOURCE : 0);
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->ep_attr->type = FI_EP_RDM;
	/* Every mode bit fabsock can honour, but not FI_MR_LOCAL: no provider
	 * fabsock opens requires it (fi_efa(7), 1.17 to 2.x: "The `efa`
	 * fabric of RDM endpoint does not require memory registration for
	 * send and receive operations"; only efa-direct and DGRAM do, and
	 * fs_rail_pick refuses those), and efa hands the bit back whenever
	 * it is asked (efa_user_info.c), which turned our pulls off there
	 * (fs_engine_pull_shift). Our pools are registered all the same and
	 * pass their descriptors, which efa uses when given. */
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->domain_attr->resource_mgmt = FI_RM_ENABLED;
	hints->tx_attr->size = fs_rail_depth_hint(kind, depth, "FI_SHM_TX_SIZE");
	hints->rx_attr->size = fs_rail_depth_hint(kind, depth, "FI_SHM_RX_SIZE");
	hints->fabric_attr->prov_name = strdup(fs_fabric_prov_name(kind));
	/* efa lists two fabrics from 2.2 on: "efa" (tagged messages, its own
	 * wire protocols) and "efa-direct" (no FI_TAGGED, FI_MR_LOCAL
	 * required); 1.17 names its one fabric "efa" too */
	if (kind == FS_PROV_EFA)
		hints->fabric_attr->name = strdup("efa");
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
		const struct sockaddr_in6 *six = (const struct sockaddr_in6 *)local;

		if (src && local->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&six->sin6_addr)) {
			/* A dual-stack listener (iperf3 -s, nginx [::]) accepts IPv4
			 * clients on IPv6 sockets: ::ffff:a.b.c.d. A rail opened on
			 * that gets an IPv6 fabric address, which the client's IPv4
			 * address vector refuses (EINVAL) and the connection resets;
			 * the rail takes the IPv4 address it stands for. */
			struct sockaddr_in *four = (struct sockaddr_in *)src;

			four->sin_family = AF_INET;
			memcpy(&four->sin_addr, &six->sin6_addr.s6_addr[12], 4);
			hints->src_addr = src;
			hints->src_addrlen = sizeof(*four);
			hints->addr_format = FI_SOCKADDR_IN;
		} else if (src) {
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

/* Whether FI, one record of the provider's answer, is really what we asked
 * for (EFA also lists its datagram domains; tcp lists the layered rxm one
 * first). */
static bool fs_rail_acceptable(const struct fi_info *fi, unsigned kind)
{
	if (fi->ep_attr->type != FI_EP_RDM)
		return false;
	if (kind == FS_PROV_EFA && fi->domain_attr->name && strstr(fi->domain_attr->name, "-dgrm"))
		return false;
	if (kind == FS_PROV_EFA && (!fi->fabric_attr->name || strcasecmp(fi->fabric_attr->name, "efa") != 0))
		return false; /* efa-direct (see fs_rail_hints) */
	/* not asked for: a provider that insists would need every application
	 * buffer registered */
	return !(fi->domain_attr->mr_mode & FI_MR_LOCAL);
}

/* Lists the NICs (RDM domains) of LIST that fabsock can use for KIND,
 * ranks them by NUMA distance and marks the ones this process uses
 * (FABSOCK_RAIL_ADDRS, FABSOCK_RAILS; not on shm): core/nics.h. Where no NIC has a PCI
 * address (shm, tcp, net) or no distance is known, the order is the
 * provider's, so the first used is the first usable domain, as before NICs
 * were ranked. */
static void fs_rail_list_nics(struct fi_info *list, unsigned kind, struct fs_nics *nics)
{
	memset(nics, 0, sizeof(*nics));
	for (struct fi_info *fi = list; fi; fi = fi->next)
		if (fs_rail_acceptable(fi, kind))
			(void)fs_nics_add(nics, fi);
	fs_nics_rank(nics, fs_params.test_sysfs, NULL);
	/* shm's one domain is the host's memory, not a NIC: FABSOCK_RAILS and
	 * FABSOCK_RAIL_ADDRS choose the NICs remote peers are reached through,
	 * and a list of those must not move this host's peers off shm */
	if (kind == FS_PROV_SHM)
		(void)fs_nics_select(nics, NULL, 1);
	else
		(void)fs_nics_select(nics, fs_nics_spec_global(), (unsigned)fs_params.rails);
}

static int fs_rail_open_inner(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, unsigned nth,
			      size_t depth, char *why, size_t whylen);

/* Whether a child forked by this process may inherit a libfabric loaded and
 * initialised here. Not when the process could change user (root, or set-id):
 * its children would drop privileges after the load, and the provider's
 * choice of cross-memory attach, made when it initialised, must be the
 * child's (fs_rail_self_check refuses a child that became non-dumpable, so
 * every one of them would stay on TCP). Not on a host with an EFA device:
 * its provider opens the device when it initialises, and a child must open
 * its own. */
static bool fs_fabric_warm_safe(void)
{
	uid_t ruid, euid, suid;
	gid_t rgid, egid, sgid;

	if (getresuid(&ruid, &euid, &suid) || getresgid(&rgid, &egid, &sgid))
		return false;
	if (euid == 0 || ruid != euid || suid != euid || rgid != egid || sgid != egid)
		return false;
	return fs_self_dumpable() && !fs_fabric_host_has_efa();
}

void fs_fabric_warm(void)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static struct fs_sigs_snapshot snap;
	static bool done;
	struct fi_info *hints, *list = NULL;

	if (__atomic_load_n(&done, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&lock);
	if (!done && fs_fabric_warm_safe()) {
		fs_sigs_before(&snap);
		hints = fs_fabric_load(NULL, 0) ? NULL : fs_rail_hints(FS_PROV_SHM, NULL, false, 0);
		if (hints) {
			/* the first fi_getinfo initialises every provider */
			FS_GUARD_ENTER();
			fs_fabric_getinfo(hints, &list);
			fs_fi.freeinfo(hints);
			if (list)
				fs_fi.freeinfo(list);
			FS_GUARD_LEAVE();
		}
		fs_sigs_after(&snap);
	}
	__atomic_store_n(&done, true, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&lock);
}


/* Opens a rail, noting the signal handlers the provider installs (sigs.h). */
int fs_rail_open(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, size_t depth, char *why,
		 size_t whylen)
{
	return fs_rail_open_nic(rail, kind, local, 0, depth, why, whylen);
}

int fs_rail_open_nic(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, unsigned nth, size_t depth,
		     char *why, size_t whylen)
{
	static struct fs_sigs_snapshot snap; /* rails open under the engine lock */
	int ret;

	fs_sigs_before(&snap);
	ret = fs_rail_open_inner(rail, kind, local, nth, depth, why, whylen);
	fs_sigs_after(&snap);
	return ret;
}

/* Asks provider KIND for what fabsock needs (with FI_SOURCE first, then
 * without; queues of DEPTH entries first, then the provider's, for a
 * provider whose most is less) into *LIST and lists its NICs in NICS
 * (fs_rail_list_nics). Returns 0 with the nearest used NIC in *USE, or
 * -ENODEV with WHY (the provider is not usable, or FABSOCK_RAIL_ADDRS names
 * none of its NICs), or -ENOMEM. The caller frees *LIST. Under the guard. */
static int fs_rail_find_nics(unsigned kind, const struct sockaddr *local, unsigned nth, size_t depth,
			     struct fs_nics *nics, struct fi_info **list, const struct fs_nic **use, char *why,
			     size_t whylen)
{
	struct fi_info *hints;
	int ret = 0;

	*list = NULL;
	*use = NULL;
	for (int step = 0; step < 4 && !*use; step++) {
		int source = !(step & 1);
		size_t want = step < 2 ? depth : 0;

		if (step >= 2 && !depth)
			break;
		hints = fs_rail_hints(kind, local, source, want);
		if (!hints)
			return -ENOMEM;
		ret = fs_fabric_getinfo(hints, list);
		fs_fi.freeinfo(hints);
		if (ret == 0) {
			fs_rail_list_nics(*list, kind, nics);
			*use = fs_nics_nth_used(nics, nth);
		}
		if (*use)
			break;
		if (*list)
			fs_fi.freeinfo(*list);
		*list = NULL;
	}
	if (*use)
		return 0;
	if (nth && nics->count)
		snprintf(why, whylen, "no used %s NIC of rank %u (%u NIC(s) here)", fs_fabric_prov_name(kind), nth,
			 nics->count);
	else if (nics->count)
		snprintf(why, whylen, "FABSOCK_RAIL_ADDRS=%s names none of the %u %s NIC(s) here (the first: %s)",
			 fs_params.rail_addrs, nics->count, fs_fabric_prov_name(kind), nics->nic[0].name);
	else
		snprintf(why, whylen, "provider %s is not usable here (fi_getinfo: %s)", fs_fabric_prov_name(kind),
			 fs_fi.strerror(ret < 0 ? -ret : ret));
	return -ENODEV;
}

int fs_fabric_nics(unsigned kind, struct fs_nics *nics, char *why, size_t whylen)
{
	const struct fs_nic *use;
	struct fi_info *list;
	int ret = fs_fabric_load(why, whylen);

	memset(nics, 0, sizeof(*nics));
	if (ret)
		return ret;
	FS_GUARD_ENTER();
	ret = fs_rail_find_nics(kind, NULL, 0, 0, nics, &list, &use, why, whylen);
	if (list)
		fs_fi.freeinfo(list);
	FS_GUARD_LEAVE();
	for (unsigned i = 0; i < nics->count; i++)
		nics->nic[i].info = NULL; /* freed with the list */
	return ret;
}

/* Keeps in rail->info the provider's record of the NIC this rail uses:
 * the NTH nearest one FABSOCK_RAIL_ADDRS allows (fs_rail_find_nics), and
 * in rail->nics_used how many it allows. Returns 0 or -errno (WHY says why
 * when the provider is not usable). Under the guard. */
static int fs_rail_getinfo(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, unsigned nth,
			   size_t depth, char *why, size_t whylen)
{
	struct fs_nics *nics = calloc(1, sizeof(*nics));
	const struct fs_nic *use;
	struct fi_info *list;
	int ret;

	if (!nics)
		return -ENOMEM;
	ret = fs_rail_find_nics(kind, local, nth, depth, nics, &list, &use, why, whylen);
	if (ret) {
		free(nics);
		return ret;
	}
	rail->nics_used = 0;
	while (fs_nics_nth_used(nics, rail->nics_used))
		rail->nics_used++;
	if (nics->count > 1)
		FS_INFO("%s rail on NIC %s (PCI %s, node %d, distance %d, rank %u of %u%s%s%s)",
			fs_fabric_prov_name(kind), use->name, use->pci[0] ? use->pci : "none", use->node,
			use->distance == FS_NIC_DISTANCE_UNKNOWN ? -1 : (int)use->distance, use->rank,
			nics->count, nics->ranked ? "" : ", the provider's order",
			nics->fallback[0] ? ": " : "", nics->fallback);
	rail->info = fs_fi.dupinfo(use->info);
	fs_fi.freeinfo(list);
	free(nics);
	return rail->info ? 0 : -ENOMEM;
}

/* The limits the data path depends on, read from FI, the provider's answer
 * for KIND (see the top of this file). */
static void fs_rail_read_limits(struct fs_rail *rail, const struct fi_info *fi, unsigned kind)
{
	rail->inject_size = fi->tx_attr->inject_size;
	rail->max_msg_size = fi->ep_attr->max_msg_size;
	rail->tx_depth = fi->tx_attr->size;
	rail->rx_depth = fi->rx_attr->size;
	rail->iov_limit = fi->tx_attr->iov_limit;
	rail->rx_iov_limit = fi->rx_attr->iov_limit;
	rail->mr_local = (fi->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
	rail->mr_prov_key = (fi->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;
	rail->source = (fi->caps & FI_SOURCE) != 0;
	/* shm maps at most 256 peers per region; the others take what is
	 * asked (fs_rail_open_objects requests exactly this count, which
	 * util AVs and efa also use to size their tables), and a process
	 * past it opens another endpoint (fs_engine_rail_for) */
	rail->av_max = kind == FS_PROV_SHM ? 256 : FS_RAIL_AV_COUNT;
	if (fs_params.test_av_max && fs_params.test_av_max < rail->av_max)
		rail->av_max = (unsigned)fs_params.test_av_max;
	/* Keys only need to be unique within this domain; start away from 0. */
	rail->next_key = 0x10000u + ((uint64_t)getpid() << 20);
}

/* Opens FI's fabric, domain, address vector, completion queue and
 * endpoint, binds and enables the endpoint and reads its address. On
 * failure closes what it opened, names the call that failed in *STEP and
 * returns its error. Under the guard. */
static int fs_rail_open_objects(struct fs_rail *rail, struct fi_info *fi, const char **step)
{
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE, .count = rail->av_max };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE };
	uint64_t t[3] = { 0, 0, 0 };
	int ret;

	fs_rail_stamp("start", t);
	*step = "fi_fabric";
	ret = fs_fi.fabric(fi->fabric_attr, &rail->fabric, NULL);
	if (ret)
		return ret;
	fs_rail_stamp("fi_fabric", t);
	*step = "fi_domain";
	ret = fi_domain(rail->fabric, fi, &rail->domain, NULL);
	if (ret)
		goto err_fabric;
	fs_rail_stamp("fi_domain", t);
	*step = "fi_av_open";
	ret = fi_av_open(rail->domain, &av_attr, &rail->av, NULL);
	if (ret)
		goto err_domain;
	fs_rail_stamp("fi_av_open", t);
	*step = "fi_cq_open";
	cq_attr.size = rail->tx_depth + rail->rx_depth;
	rail->cq_fd = -1;
	if (rail->kind == FS_PROV_TCP || rail->kind == FS_PROV_NET) {
		/* manual progress over sockets: a wait fd lets waiters sleep
		 * until bytes come instead of leaving them in the kernel for a
		 * slice (fs_rail_cq_wait_fd); shm and efa have none (1.17) */
		cq_attr.wait_obj = FI_WAIT_FD;
		ret = fi_cq_open(rail->domain, &cq_attr, &rail->cq, NULL);
		if (ret == 0 && fi_control(&rail->cq->fid, FI_GETWAIT, &rail->cq_fd)) {
			rail->cq_fd = -1;
			fi_close(&rail->cq->fid);
			ret = -FI_ENOSYS;
		}
		if (ret)
			cq_attr.wait_obj = FI_WAIT_NONE;
	} else {
		ret = -FI_ENOSYS;
	}
	if (ret)
		ret = fi_cq_open(rail->domain, &cq_attr, &rail->cq, NULL);
	if (ret)
		goto err_av;
	fs_rail_stamp("fi_cq_open", t);
	*step = "fi_endpoint";
	/* fault injection: the step a full /dev/shm fails at, with what was
	 * opened before it to undo */
	/* rxm reads its eager limit at every endpoint (fs_fabric_tune_rxm) */
	if (rail->kind == FS_PROV_TCP && fs_fabric_rxm_tuned)
		fs_fabric_env_set(FS_ENV_RXM_EAGER_LIMIT, "16384");
	ret = fs_params.test_provider_fail ? -FI_ENOMEM : fi_endpoint(rail->domain, fi, &rail->ep, NULL);
	fs_fabric_env_unset(FS_ENV_RXM_EAGER_LIMIT);
	if (ret)
		goto err_cq;
	fs_rail_stamp("fi_endpoint", t);
	*step = "fi_ep_bind(av)";
	ret = fi_ep_bind(rail->ep, &rail->av->fid, 0);
	if (ret)
		goto err_ep;
	*step = "fi_ep_bind(cq)";
	ret = fi_ep_bind(rail->ep, &rail->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		goto err_ep;
	fs_rail_stamp("fi_ep_bind", t);
	*step = "fi_enable";
	/* shm creates its region here, in a new file (the name is ours, with
	 * this pid and a random nonce; the stale ones of dead processes were
	 * removed before): its name's zero-fill can be skipped (the strncpy
	 * wrapper). Were the file somehow there already (libfabric then reuses
	 * it), only bytes after the name that nothing reads (the IPC socket's
	 * name, unused without FI_HMEM) would keep old contents. */
	fs_fresh_region = rail->kind == FS_PROV_SHM;
	ret = fi_enable(rail->ep);
	fs_fresh_region = 0;
	if (ret)
		goto err_ep;
	fs_rail_stamp("fi_enable", t);
	*step = "fi_getname";
	rail->addr_len = sizeof(rail->addr);
	ret = fi_getname(&rail->ep->fid, rail->addr, &rail->addr_len);
	if (ret)
		goto err_ep;
	if (rail->addr_len > FS_WIRE_ADDR_MAX) {
		ret = -FI_ETOOSMALL;
		goto err_ep;
	}
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
	return ret;
}

/* Where a rail open's time goes (FABSOCK_LOG=debug): the wall and this
 * thread's CPU microseconds and its page faults since the stamp T[0..2],
 * which then moves on (the CPU figure is the one to trust on a loaded
 * machine; a first touch of a page costs ~16 us of it on this project's
 * VM, so the faults say where most of it goes). A process's first
 * connection waits for all of it. */
void fs_rail_stamp(const char *what, uint64_t t[3])
{
	struct timespec cpu;
	struct rusage ru;
	uint64_t now, cpu_ns, faults;

	if (fs_log_level < FS_LOG_DEBUG)
		return;
	now = fs_now_ns();
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
	cpu_ns = (uint64_t)cpu.tv_sec * 1000000000ull + (uint64_t)cpu.tv_nsec;
	faults = getrusage(RUSAGE_THREAD, &ru) ? 0 : (uint64_t)ru.ru_minflt + (uint64_t)ru.ru_majflt;
	if (t[0])
		FS_DBG("rail open: %s: %llu us (cpu %llu us, %llu faults)", what,
		       (unsigned long long)((now - t[0]) / 1000), (unsigned long long)((cpu_ns - t[1]) / 1000),
		       (unsigned long long)(faults - t[2]));
	t[0] = now;
	t[1] = cpu_ns;
	t[2] = faults;
}

static int fs_rail_open_inner(struct fs_rail *rail, unsigned kind, const struct sockaddr *local, unsigned nth,
			      size_t depth, char *why, size_t whylen)
{
	const char *step;
	struct fi_info *fi;
	uint64_t t[3] = { 0, 0, 0 };
	int ret;

	memset(rail, 0, sizeof(*rail));
	rail->kind = kind;
	fs_rail_stamp("start", t);
	ret = fs_fabric_load(why, whylen);
	if (ret)
		return ret;
	fs_rail_stamp("libfabric loaded", t);
	if (kind == FS_PROV_SHM)
		fs_shm_clean_stale();
	fs_rail_stamp("stale regions cleaned", t);

	FS_GUARD_ENTER();
	ret = fs_rail_getinfo(rail, kind, local, nth, depth, why, whylen);
	if (ret)
		goto err_none;
	fs_rail_stamp("fi_getinfo", t);
	fi = rail->info;
	fs_rail_read_limits(rail, fi, kind);
	ret = fs_rail_open_objects(rail, fi, &step);
	if (ret)
		goto err_info;
	FS_GUARD_LEAVE();
	fs_rail_stamp("fabric, domain, av, cq, endpoint", t);
	if (kind == FS_PROV_SHM)
		fs_shm_watch_lock();
	fs_rail_stamp("region lock found", t);
	FS_INFO("opened %s rail: domain %s, inject %zu, tx %zu, rx %zu, iov %zu, mr_local %d, source %d",
		fs_fabric_prov_name(kind), fi->domain_attr->name, rail->inject_size, rail->tx_depth,
		rail->rx_depth, rail->iov_limit, rail->mr_local, rail->source);
	return 0;

err_info:
	snprintf(why, whylen, "%s rail: %s failed: %s", fs_fabric_prov_name(kind), step,
		 fs_fi.strerror(ret < 0 ? -ret : ret));
	fs_fi.freeinfo(rail->info);
	rail->info = NULL;
	ret = ret < 0 ? fs_fabric_errno(ret) : -EIO;
err_none:
	FS_GUARD_LEAVE();
	return ret;
}

bool fs_fabric_addr_ip(unsigned kind, const void *addr, size_t len, uint8_t out[16])
{
	struct sockaddr_storage ss;
	uint16_t port;

	if ((kind != FS_PROV_TCP && kind != FS_PROV_NET) || len < sizeof(sa_family_t) || len > sizeof(ss))
		return false;
	memset(&ss, 0, sizeof(ss));
	memcpy(&ss, addr, len);
	if (!(ss.ss_family == AF_INET && len >= sizeof(struct sockaddr_in)) &&
	    !(ss.ss_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)))
		return false;
	fs_sockaddr_key((const struct sockaddr *)&ss, out, &port);
	return true;
}

void fs_rail_close(struct fs_rail *rail)
{
	struct fs_av_peer *peer, *tmp;
	uint64_t t[3] = { 0, 0, 0 };

	if (!rail->info)
		return;
	HASH_ITER(hh, rail->peers, peer, tmp) {
		HASH_DEL(rail->peers, peer);
		free(peer);
	}
	rail->av_count = 0;
	FS_GUARD_ENTER();
	fs_rail_stamp("close: start", t);
	fi_close(&rail->ep->fid);
	fs_rail_stamp("close: endpoint", t);
	fi_close(&rail->cq->fid);
	fi_close(&rail->av->fid);
	fs_rail_stamp("close: cq, av", t);
	fi_close(&rail->domain->fid);
	fi_close(&rail->fabric->fid);
	fs_rail_stamp("close: domain, fabric", t);
	fs_fi.freeinfo(rail->info);
	rail->info = NULL;
	FS_GUARD_LEAVE();
}

int fs_rail_cq_wait_fd(struct fs_rail *rail)
{
	struct fid *fids[1];
	int ret;

	if (!rail->info || rail->cq_fd < 0)
		return -1;
	fids[0] = &rail->cq->fid;
	FS_GUARD_ENTER();
	ret = fi_trywait(rail->fabric, fids, 1);
	FS_GUARD_LEAVE();
	return ret == FI_SUCCESS ? rail->cq_fd : -EAGAIN;
}

int fs_rail_mr_reg(struct fs_rail *rail, void *buf, size_t len, struct fid_mr **mr)
{
	int ret;

	FS_GUARD_ENTER();
	ret = fi_mr_reg(rail->domain, buf, len, FI_SEND | FI_RECV, 0, rail->next_key++, 0, mr, NULL);
	FS_GUARD_LEAVE();
	return fs_fabric_errno(ret);
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
		return ret < 0 ? fs_fabric_errno(ret) : -EINVAL;
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
