#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# fabsock_bench: the driver behind `fabsock bench` (docs/bench.md), python3
# standard library only (3.11, Debian 12's, or later). It owns the
# benchmark's rows and targets; starting the servers and clients of every
# column (kernel TCP, fabsock, raw libfabric) over 127.0.0.1 only, each
# child in its own process group under a time limit and killed with its
# group on exit, timeout or Ctrl-C; parsing the tools' outputs (plain
# functions in fabsock_bench_parse.py beside it, which
# tests/scripts/unit_bench_tool.py tests too); medians, ratios
# and "met?"; and the results: results.csv, results.json, results.md, logs/
# and the two SVG charts. The launcher (tools/fabsock) finds the library and
# execs this file with --lib, --lib-how and --preload.
#
#   fabsock_bench.py [--quick] [--repeat N] [--provider P] [--out DIR]
#   fabsock_bench.py --charts RESULTS.json [--out DIR]   (redraw the charts)
import html
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# ---------------------------------------------------------------------------
# Rows and targets
#
# A cell is text, as the tools print it: a number, "failed", "n/a ..." or ""
# (the column was not run). Targets are those of the performance issue, as
# (KIND, OP, VALUE): KIND fk (fabsock/kernel), fr (fabsock/raw), f (the
# fabsock value itself), fd (the fabsock value minus the kernel's) or
# "report" (the issue asks only that it be reported). "met?" is computed
# from the medians, never written by hand.

MODES = ("kernel", "fabsock", "raw")
SIZES_FULL = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
SIZES_QUICK = (64, 4096, 65536, 1048576)
NA_MISSING = "n/a (not installed)"
NA_NOT_BUILT = "n/a (not built)"

# id: (name, unit, better, target)
FIXED_ROWS = {
    "lat_avg": ("sockperf ping-pong 64 B avg latency", "usec", "lower", ("fr", "<=", "1.5")),
    "lat_p50": ("sockperf ping-pong 64 B p50 latency", "usec", "lower", ("fk", "<=", "0.2")),
    "lat_p99": ("sockperf ping-pong 64 B p99 latency", "usec", "lower", None),
    "stream": ("iperf 2, 128 KiB writes, bandwidth", "Gbit/s", "higher", None),
    "iperf3_1": ("iperf3 1 stream", "Gbit/s", "higher", ("fk", ">=", "3")),
    "iperf3_p4": ("iperf3 -P 4", "Gbit/s", "higher", ("fk", ">=", "2")),
    "epoll_p50": ("sockperf epoll ping-pong 64 B p50", "usec", "lower", None),
    "epoll_tput": ("sockperf throughput 64 B", "msg/s", "higher", ("fk", ">=", "2")),
    "redis_get": ("redis GET -c 50", "req/s", "higher", ("fk", ">=", "1.5")),
    "redis_set": ("redis SET -c 50", "req/s", "higher", ("fk", ">=", "1.5")),
    "redis_get_p16": ("redis GET -c 50 -P 16", "req/s", "higher", ("fk", ">=", "1.2")),
    "redis_set_p16": ("redis SET -c 50 -P 16", "req/s", "higher", ("fk", ">=", "1.2")),
    "redis_get_c1k": ("redis GET -c 1000", "req/s", "higher", ("fk", ">=", "1.5")),
    "redis_set_c1k": ("redis SET -c 1000", "req/s", "higher", ("fk", ">=", "1.5")),
    "nginx_c1k": ("nginx (2 workers), wrk -c 1000, 600 B file", "req/s", "higher", ("fk", ">=", "1.5")),
    "conn_usec": ("connect+accept+round trip+close", "usec", "lower", ("fk", "<=", "2")),
    "conn_rate": ("connection setup rate", "conn/s", "higher", None),
    "mt_rps": ("4 threads in poll(), answer after 150 us: per thread", "round trips/s", "higher", ("report",)),
    "mt_p90": ("4 threads in poll(), answer after 150 us: p90", "usec", "lower", ("report",)),
    "mem_proc_client": ("RSS of a client process, 1 connection", "KiB", "lower", ("report",)),
    "mem_proc_server": ("RSS of a server process, 1 connection", "KiB", "lower", ("report",)),
    "mem_conn_client": ("RSS per connection, first 64, client", "KiB", "lower", ("report",)),
    "mem_conn_server": ("RSS per connection, first 64, server", "KiB", "lower", ("report",)),
    "scale_setup": ("%d connections into one server: setup", "ms", "lower", ("report",)),
    "scale_mem_client": ("RSS per idle connection at %d, client", "KiB", "lower", ("fd", "<=", "2")),
    "scale_mem_server": ("RSS per idle connection at %d, server", "KiB", "lower", ("fd", "<=", "2")),
    "slow_peak": ("slow reader: peak RSS, writer+reader", "MiB", "lower", ("report",)),
    "slow_growth": ("slow reader: RSS growth, 2nd half", "MiB", "lower", ("f", "<=", "4")),
    "dl_8k": ("4 MiB downloads, 8 KiB writes, 100 KiB reads", "MB/s", "higher", ("fk", ">=", "1")),
    "dl_16k": ("4 MiB downloads, 4 KiB writes, 16 KiB reads", "MB/s", "higher", ("fk", ">=", "1")),
    "idle_recv": ("idle CPU, 8 conns, recv threads", "% CPU", "lower", ("f", "<", "1")),
    "idle_epoll": ("idle CPU, 8 conns, epoll_wait", "% CPU", "lower", ("f", "<", "1")),
}
# Rows with no raw libfabric twin (n/a in the raw column).
APP_ROWS = ("iperf3_1", "iperf3_p4", "epoll_p50", "epoll_tput", "redis_get", "redis_set", "redis_get_p16",
            "redis_set_p16", "redis_get_c1k", "redis_set_c1k", "nginx_c1k", "conn_usec", "conn_rate",
            "mt_rps", "mt_p90", "mem_proc_client", "mem_proc_server", "mem_conn_client", "mem_conn_server", "scale_setup",
            "scale_mem_client", "scale_mem_server", "slow_peak", "slow_growth", "dl_8k", "dl_16k", "idle_recv",
            "idle_epoll")
# Keys of the offload notes (one per fabsock run whose offload was checked), in print order.
NOTE_KEYS = ("sockperf", "netbench-pingpong", "sockperf-epoll-pingpong", "sockperf-epoll-throughput", "iperf2",
             "iperf2-sizes", "iperf3", "iperf3-P4", "redis", "redis-P16", "redis-c1000", "nginx-c1000",
             "netbench-connect", "netbench-threads", "netbench-hold", "scale", "netbench-slowwrite", "netbench-download",
             "idle-recv",
             "idle-epoll")


class Row:
    def __init__(self, row_id, name, unit, better, target, size=None):
        self.id, self.name, self.unit, self.better, self.target, self.size = \
            row_id, name, unit, better, target, size


def size_label(size):
    """64 -> "64 B", 4096 -> "4 KiB", 1048576 -> "1 MiB"."""
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return "%d MiB" % (size >> 20)
    if size >= 1024 and size % 1024 == 0:
        return "%d KiB" % (size >> 10)
    return "%d B" % size


def scale_conns(quick):
    return 2000 if quick else 10000


def define_rows(quick):
    """The rows of a run in table order (the sweeps hold the sizes it measures)."""
    sizes = SIZES_QUICK if quick else SIZES_FULL
    n = scale_conns(quick)

    def fixed(row_id):
        name, unit, better, target = FIXED_ROWS[row_id]
        return Row(row_id, name % n if "%d" in name else name, unit, better, target)

    rows = [fixed(r) for r in ("lat_avg", "lat_p50", "lat_p99")]
    rows += [Row("lat_sz_%d" % s, "netbench ping-pong %s p50 latency" % size_label(s), "usec", "lower",
                 ("fk", "<", "1"), s) for s in sizes]
    rows.append(fixed("stream"))
    rows += [Row("bw_sz_%d" % s, "iperf 2, %s writes, bandwidth" % size_label(s), "Gbit/s", "higher", None, s)
             for s in sizes]
    rows += [fixed(r) for r in APP_ROWS if r != "idle_epoll" or not quick]
    return rows


NUMBER_RE = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")


def is_number(text):
    return bool(NUMBER_RE.match(text or ""))


def trim_zeros(text):
    """1.500 -> 1.5, 2.000 -> 2: how a median is printed."""
    return re.sub(r"(\.[0-9]*[1-9])0+$|\.0+$", r"\1", text)


def median(samples):
    """The median of the numeric samples (the mean of the middle two for an
    even count), or the first sample if none is a number ("failed", "n/a")."""
    numbers = sorted((s for s in samples if is_number(s)), key=float)
    if not numbers:
        return samples[0] if samples else ""
    n = len(numbers)
    if n % 2:
        return trim_zeros(numbers[n // 2])
    return trim_zeros("%.3f" % ((float(numbers[n // 2 - 1]) + float(numbers[n // 2])) / 2))


def ratio(fabsock, other):
    """fabsock / other as text with two decimals, "" unless both are numbers and other > 0."""
    if is_number(fabsock) and is_number(other) and float(other) > 0:
        return "%.2f" % (float(fabsock) / float(other))
    return ""


def target_text(row):
    if not row.target:
        return ""
    if row.target[0] == "report":
        return "report"
    kind, op, value = row.target
    return {"fk": "%s %sx kernel" % (op, value), "fr": "%s %sx raw" % (op, value),
            "f": "%s %s %s" % (op, value, row.unit), "fd": "%s kernel + %s %s" % (op, value, row.unit)}[kind]


def target_met(row, cells):
    """yes / no from the medians in cells (mode -> text); "reported" for
    report-only rows; "-" when a number it needs is missing or the row has
    no target."""
    if not row.target:
        return "-"
    fabsock, kernel = cells.get("fabsock", ""), cells.get("kernel", "")
    if row.target[0] == "report":
        return "reported" if is_number(fabsock) else "-"
    kind, op, value = row.target
    if kind == "fk":
        v = ratio(fabsock, kernel)
    elif kind == "fr":
        v = ratio(fabsock, cells.get("raw", ""))
    elif kind == "f":
        v = fabsock
    else:
        v = "%.2f" % (float(fabsock) - float(kernel)) if is_number(fabsock) and is_number(kernel) else ""
    if not is_number(v):
        return "-"
    v, t = float(v), float(value)
    ok = {"<=": v <= t, "<": v < t, ">=": v >= t, ">": v > t}[op]
    return "yes" if ok else "no"


# ---------------------------------------------------------------------------
# Output parsers and the cells derived from them: fabsock_bench_parse.py,
# beside this file.

sys.dont_write_bytecode = True  # nothing written beside an installed copy
from fabsock_bench_parse import (  # noqa: E402
    log_text, last_match, parse_sockperf_pingpong, parse_sockperf_throughput, parse_iperf2_csv,
    parse_iperf3_json, parse_redis_rps, parse_wrk, parse_fi_pingpong, parse_keyvalues,
    parse_scale_client, stats_offloaded, stats_sum, proc_cpu_ticks, proc_rss_kib, gbits_from_mbytes,
    per_conn, slow_cells, idle_percent, raw_iterations)
import fabsock_bench_real as real  # noqa: E402  (the real-programs section)


# ---------------------------------------------------------------------------
# Children: every process runs in its own process group with a time limit
# (SIGINT to its group at the limit, SIGKILL 5 s later); whatever is left at
# exit is killed with its group.

def say(text):
    sys.stdout.flush()
    sys.stderr.write("fabsock: %s\n" % text)
    sys.stderr.flush()


class Child:
    """A process and its group. Only the main thread reaps it: the leader
    stays a zombie until then, so its pid still names the group when what
    is left of the group is killed."""

    def __init__(self, popen, limit):
        self.popen, self.pid = popen, popen.pid
        self.deadline, self.interrupted, self.killed = time.monotonic() + limit, None, False

    def alive(self):
        if self.popen.returncode is not None:
            return False
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def signal_group(self, sig):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self):
        """Waits for the leader, kills the rest of its group, returns the
        exit status (128 + N for signal N, as a shell says it)."""
        if self.popen.returncode is None:
            try:
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                pass
            self.signal_group(signal.SIGKILL)
        rc = self.popen.wait()
        return 128 - rc if rc < 0 else rc


class Children:
    def __init__(self):
        self.lock = threading.Lock()
        self.children = []
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            with self.lock:
                for c in self.children:
                    if c.interrupted is None:
                        if now > c.deadline and c.alive():
                            c.interrupted = now
                            c.signal_group(signal.SIGINT)
                    elif not c.killed and now > c.interrupted + 5 and c.alive():
                        c.killed = True
                        c.signal_group(signal.SIGKILL)

    def start(self, limit, log, env, argv):
        with open(log + ".cmd", "w") as f:
            f.write(" ".join(argv) + "\n")
        # A process group of its own, in the driver's session: a session of
        # its own would also be a scheduler autogroup of its own (on by
        # default), and a server and its client in two autogroups halved
        # fabsock's iperf 2 throughput on the shared 2-core VM (14-32 vs
        # 34-45 Gbit/s at 64 KiB, alternating runs).
        with open(log + ".out", "w") as out, open(log + ".err", "w") as err:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                     process_group=0)
        child = Child(popen, limit)
        with self.lock:
            self.children.append(child)
        return child

    def kill_all(self):
        with self.lock:
            for c in self.children:
                if c.popen.returncode is None:
                    c.signal_group(signal.SIGKILL)
                    c.reap()
            self.children = []


def wait(child):
    return child.reap()


def stop(child):
    """Stops a server politely (SIGINT, so that it exits through exit() and
    the library prints its counters), by force after 10 s."""
    if child.alive():
        os.kill(child.pid, signal.SIGINT)
    wait_until(lambda: not child.alive(), 10)
    child.signal_group(signal.SIGKILL)
    child.reap()


def wait_exit(child, seconds):
    """Lets a server that ends by itself do so, then stops it."""
    wait_until(lambda: not child.alive(), seconds)
    stop(child)


def pid_alive(pid):
    """Whether PID (not a child of ours) still runs (a zombie counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_until(condition, seconds, step=0.05):
    end = time.monotonic() + seconds
    while True:
        if condition():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(step)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def free_port():
    """A port free on loopback now for TCP and UDP (the capability probe uses
    the same number over UDP), or None."""
    for _ in range(200):
        port = random.randint(20000, 49999)
        try:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                with socket.socket(socket.AF_INET, kind) as s:
                    s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
    say("no free port")
    return None


def listening(port):
    """True if a TCP socket listens on PORT (read from /proc: connecting
    would be a connection the server counts)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in read(table).splitlines()[1:]:
            f = line.split()
            if len(f) > 3 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def preload_without_fabsock(preload):
    return ":".join(e for e in re.split(r"[: ]+", preload or "") if e and "libfabsock" not in e)


def raise_nofile(n):
    """Raises the open-file limit to N where allowed; returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, max(n, hard)))
        except (ValueError, OSError):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
            except (ValueError, OSError):
                pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def clock(seconds):
    return "%d:%02d" % (seconds // 60, seconds % 60)


# ---------------------------------------------------------------------------
# The benchmarks

# sockperf sizes its per-message sample array from --mps; its default
# assumes at most about 600k round trips a second and aborts with
# "_seqN > m_maxSequenceNo" past that, which fabsock at 0.7 us one way
# reaches (one run in three of a full bench failed so). Ping-pong is paced
# by the round trip anyway: a higher bound changes no latency (0.71 vs
# 0.70 us avg in one sitting) and is passed to every mode alike. The array
# costs memory: about 60 MB of RSS at the default, 380 MB at 4M.
SOCKPERF_MPS = "1500000"


class Bench:
    def __init__(self, opts):
        self.quick, self.repeat, self.provider = opts["quick"], opts["repeat"], opts["provider"]
        self.modes, self.verbose = opts["modes"], opts["verbose"]
        self.lib, self.lib_how, self.preload = opts["lib"], opts["lib_how"], opts["preload"]
        self.seconds = 2 if self.quick else 5
        self.sweep_seconds = 1 if self.quick else 2
        self.sizes = SIZES_QUICK if self.quick else SIZES_FULL
        self.rows = define_rows(self.quick)
        self.cells = {}    # (row, mode) -> text, of the run going on
        self.samples = {}  # (row, mode) -> [text of every run]
        self.notes = {}    # note key -> offload seen in fabsock runs
        self.failures = 0
        self.sections = opts.get("sections", ("main", "real"))
        # the real-programs section: rows and summary of
        # fabsock_bench_real.judge, the offload lines of the driver
        self.real_rows, self.real_summary, self.real_notes = None, None, []
        # the between-hosts section (tools/netns_bench.sh): per part, its
        # medians {column: Gbit/s} and its ratio lines; or why it is n/a
        self.hosts, self.hosts_why = None, ""
        self.children = Children()
        self.self_dir = os.path.dirname(os.path.realpath(__file__))

    # -- cells

    def fail_rows(self, mode, *rows):
        for row in rows:
            self.cells[(row, mode)] = "failed"
        self.failures += 1

    def set_rows(self, mode, text, *rows):
        for row in rows:
            self.cells[(row, mode)] = text

    def harvest(self):
        for key, text in self.cells.items():
            self.samples.setdefault(key, []).append(text)
        self.cells = {}

    def cell(self, row, mode):
        return self.cells.get((row, mode), "")

    def cell_text(self, row, mode):
        return self.cell(row, mode) or "-"

    # -- processes

    def env_for(self, mode):
        env = dict(os.environ)
        rest = preload_without_fabsock(env.get("LD_PRELOAD"))
        if mode == "fabsock":
            env.update(LD_PRELOAD=self.preload, FABSOCK_STATS="1")
            if self.provider == "shm":
                env["FABSOCK_SHM"] = "1"
            else:  # another provider on one host: keep shm out of the way
                env.update(FABSOCK_SHM="0", FABSOCK_PROVIDER=self.provider)
            return env
        if rest:
            env["LD_PRELOAD"] = rest
        else:
            env.pop("LD_PRELOAD", None)
        if self.provider == "tcp":
            env["FI_TCP_IFACE"] = "lo"
        return env

    def start(self, limit, log, mode, *argv):
        return self.children.start(limit, log, self.env_for(mode), [str(a) for a in argv])

    def start_server(self, limit, log, mode, port, *argv):
        """start, then wait for the listener on PORT; None (logs shown) if none comes."""
        if port is None:
            return None
        srv = self.start(limit, log, mode, *argv)
        if wait_until(lambda: listening(port) or not srv.alive(), 10) and listening(port):
            return srv
        stop(srv)
        self.show_failure("%s (%s): server" % (" ".join(map(str, argv)), mode), "no listener", log)
        return None

    def show_failure(self, what, rc, log):
        say("%s failed (exit status %s); logs in %s.*" % (what, rc, log))
        for path in (log + ".err", log + ".out"):
            lines = log_text(read(path)).splitlines()
            for line in lines[-6:]:
                sys.stderr.write("    %s\n" % line)

    def missing(self, mode, progs, *rows):
        """True if one of the programs is missing, after marking the rows:
        not a failure, its rows read "n/a (not installed)"."""
        absent = [p for p in progs if not shutil.which(p)]
        if not absent:
            return False
        say("not installed: %s; skipping its rows" % " ".join(absent))
        self.set_rows(mode, NA_MISSING, *rows)
        return True

    def find_prog(self, name):
        """A program of the build or installation, beside this file or the library in use."""
        cands = [os.path.join(self.self_dir, name)]
        build = os.environ.get("FABSOCK_BUILD")
        if build:
            cands += [os.path.join(build, "tools", name), os.path.join(build, "tests", "progs", name)]
        if self.lib:
            d = os.path.dirname(self.lib)
            cands += [os.path.join(d, "tools", name), os.path.join(d, "tests", "progs", name),
                      os.path.join(d, "..", "bin", name)]
        for c in cands:
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return os.path.realpath(c)
        return None

    def mode_label(self, mode):
        return {"kernel": "kernel TCP", "fabsock": "fabsock (%s)" % self.provider,
                "raw": "raw libfabric (%s)" % self.provider}[mode]

    def logs(self, name):
        return os.path.join(self.log_dir, name)

    # -- offload checks

    def check_offload(self, what, server_err, client_err):
        """After a fabsock run: False when the stats lines say an end did not
        offload; records what was seen."""
        s, c = stats_offloaded(read(server_err)), stats_offloaded(read(client_err))
        if s is None or c is None:
            self.notes[what] = "no 'stats: offloaded=' line from server=%s client=%s: offload not verified" % (
                "none" if s is None else s, "none" if c is None else c)
            say("warning: %s under fabsock: %s" % (what, self.notes[what]))
            return True
        self.notes[what] = "offloaded: server=%d client=%d" % (s, c)
        if s < 1 or c < 1:
            say("%s under fabsock went over kernel TCP (server offloaded=%d, client offloaded=%d)" % (what, s, c))
            return False
        # the step-back (FABSOCK_STEPBACK): streams whose answers mostly came
        # after a sleep went on over kernel TCP; the figure is then partly
        # the kernel's (on a loaded host, as a user would get)
        sb, cb = (stats_sum(read(p), "handback_fabric_slower") for p in (server_err, client_err))
        if sb or cb:
            self.notes[what] += "; stepped back to kernel TCP: server=%d client=%d" % (sb, cb)
            say("warning: %s under fabsock: streams stepped back to kernel TCP (their waits slept: a loaded "
                "host), the figure is partly the kernel's (server=%d client=%d)" % (what, sb, cb))
        return True

    def check_all_offloaded(self, what, conns, server_errs, client_err, aside_errs=()):
        """Issue 14: at least CONNS offloaded on each end, none left on the kernel.
        A connection its client closed before a byte went either way
        (fallback_peer_closed: wrk's first connect(), which only checks the
        address, closes at once) carried nothing on any path: counted apart,
        not as one left on the kernel. So are the server's connections from
        the clients of ASIDE_ERRS that stayed on the kernel by their own
        choice (redis-cli's shutdown: one short connection per process, which
        the connection history sends to TCP once its command learnt that)."""
        server = "".join(read(p) for p in server_errs)
        client = read(client_err)
        aside = "".join(read(p) for p in aside_errs)
        s, sk = stats_sum(server, "offloaded"), stats_sum(server, "kernel")
        c, ck = stats_sum(client, "offloaded"), stats_sum(client, "kernel")
        sc, cc = stats_sum(server, "fallback_peer_closed"), stats_sum(client, "fallback_peer_closed")
        ak = stats_sum(aside, "kernel")
        sk, ck = sk - sc - min(ak, sk - sc), ck - cc
        self.notes[what] = "offloaded: server=%d client=%d; on kernel TCP: server=%d client=%d" % (s, c, sk, ck)
        if sc or cc:
            self.notes[what] += "; closed unused before negotiating: server=%d client=%d" % (sc, cc)
        if ak:
            self.notes[what] += "; on kernel TCP by the other client's choice (not counted): %d" % ak
        if c < conns or s < conns or sk or ck:
            say("%s under fabsock: not every connection offloaded (%s)" % (what, self.notes[what]))
            return False
        return True

    def offload_ok(self, mode, what, server_err, client_err):
        return mode != "fabsock" or self.check_offload(what, server_err, client_err)

    # -- sockperf, iperf 2, iperf3

    def sockperf(self, mode):
        """sockperf ping-pong, 64 B, blocking (sockperf's default): one-way latency."""
        rows = ("lat_avg", "lat_p50", "lat_p99")
        log = self.logs("sockperf-pingpong-" + mode)
        print("running sockperf ping-pong under %s (%d s)..." % (self.mode_label(mode), self.seconds))
        if not shutil.which("sockperf"):
            say("sockperf is not installed (apt-get install sockperf)")
            return self.fail_rows(mode, *rows)
        port = free_port()
        srv = self.start_server(self.seconds + 60, log + "-server", mode, port,
                                         "sockperf", "server", "--tcp", "-i", "127.0.0.1", "-p", port)
        if not srv:
            return self.fail_rows(mode, *rows)
        cli = self.start(self.seconds + 30, log + "-client", mode, "sockperf", "ping-pong", "--tcp", "-i",
                         "127.0.0.1", "-p", port, "-m", 64, "-t", self.seconds, "--mps", SOCKPERF_MPS)
        rc = wait(cli)
        stop(srv)
        values = parse_sockperf_pingpong(read(log + "-client.out") + read(log + "-client.err"))
        if rc or None in values:
            self.show_failure("sockperf ping-pong (%s)" % mode, rc, log + "-client")
            return self.fail_rows(mode, *rows)
        if not self.offload_ok(mode, "sockperf", log + "-server.err", log + "-client.err"):
            return self.fail_rows(mode, *rows)
        for row, v in zip(rows, values):
            self.cells[(row, mode)] = v
        print("  avg %s usec, p50 %s usec, p99 %s usec (one-way)" % values)

    def iperf(self, mode, length, row, key, seconds):
        """iperf 2, one stream, blocking writes of LENGTH bytes (iperf 2's
        default I/O is 128 KiB), into ROW in Gbit/s."""
        log = self.logs("%s-%d-%s" % (key, length, mode))
        print("running iperf2 -l %s under %s (%d s)..." % (size_label(length), self.mode_label(mode), seconds))
        if not shutil.which("iperf"):
            say("iperf (version 2) is not installed (apt-get install iperf)")
            return self.fail_rows(mode, row)
        port = free_port()
        srv = self.start_server(seconds + 60, log + "-server", mode, port,
                                         "iperf", "-s", "-B", "127.0.0.1", "-p", port)
        if not srv:
            return self.fail_rows(mode, row)
        cli = self.start(seconds + 30, log + "-client", mode,
                         "iperf", "-c", "127.0.0.1", "-p", port, "-t", seconds, "-l", length, "-y", "C")
        rc = wait(cli)
        stop(srv)
        bps = parse_iperf2_csv(read(log + "-client.out"))
        if rc or not bps or int(bps) == 0:
            self.show_failure("iperf2 -l %d (%s)" % (length, mode), rc, log + "-client")
            return self.fail_rows(mode, row)
        if not self.offload_ok(mode, key, log + "-server.err", log + "-client.err"):
            return self.fail_rows(mode, row)
        self.cells[(row, mode)] = "%.2f" % (int(bps) / 1e9)
        print("  %s Gbit/s" % self.cells[(row, mode)])

    def bw_size(self, mode, size):
        self.iperf(mode, size, "bw_sz_%d" % size, "iperf2-sizes", self.sweep_seconds)

    def iperf3(self, mode, streams):
        """iperf3 -P STREAMS: default I/O (128 KiB writes), JSON output; the
        server handles one test (-1) and exits by itself, so it prints its counters."""
        row, key = ("iperf3_1", "iperf3") if streams == 1 else ("iperf3_p4", "iperf3-P%d" % streams)
        log = self.logs("%s-%s" % (key, mode))
        print("running iperf3 -P %d under %s (%d s)..." % (streams, self.mode_label(mode), self.seconds))
        if self.missing(mode, ["iperf3"], row):
            return
        port = free_port()
        srv = self.start_server(self.seconds + 40, log + "-server", mode, port,
                                         "iperf3", "-s", "-B", "127.0.0.1", "-p", port, "-1")
        if not srv:
            return self.fail_rows(mode, row)
        # A short limit: a stuck client costs CI this long (plus 5 s to SIGKILL).
        cli = self.start(self.seconds + 10, log + "-client", mode, "iperf3", "-c", "127.0.0.1", "-p", port,
                         "-t", self.seconds, "-P", streams, "-J")
        rc = wait(cli)
        wait_exit(srv, 5)
        gbits = parse_iperf3_json(read(log + "-client.out"))
        if rc or not gbits:
            self.show_failure("iperf3 -P %d (%s)" % (streams, mode), rc, log + "-client")
            return self.fail_rows(mode, row)
        if not self.offload_ok(mode, key, log + "-server.err", log + "-client.err"):
            return self.fail_rows(mode, row)
        self.cells[(row, mode)] = gbits
        print("  %s Gbit/s (received)" % gbits)

    def sockperf_epoll(self, mode):
        """sockperf over epoll on both ends (-F epoll needs a feed file, -f):
        one server, then a 64 B ping-pong client and a 64 B throughput client."""
        rows = ("epoll_p50", "epoll_tput")
        log = self.logs("sockperf-epoll-" + mode)
        print("running sockperf -F epoll ping-pong and throughput under %s (2 x %d s)..."
              % (self.mode_label(mode), self.seconds))
        if self.missing(mode, ["sockperf"], *rows):
            return
        port = free_port()
        if not port:
            return self.fail_rows(mode, *rows)
        feed = log + ".feed"
        with open(feed, "w") as f:
            f.write("T:127.0.0.1:%d\n" % port)
        srv = self.start_server(self.seconds * 2 + 60, log + "-server", mode, port,
                                "sockperf", "server", "-f", feed, "-F", "epoll")
        if not srv:
            return self.fail_rows(mode, *rows)
        pp = self.start(self.seconds + 20, log + "-pingpong-client", mode, "sockperf", "ping-pong", "-f", feed,
                        "-F", "epoll", "-m", 64, "-t", self.seconds, "--mps", SOCKPERF_MPS)
        rc = wait(pp)
        tp = self.start(self.seconds + 20, log + "-throughput-client", mode, "sockperf", "throughput", "-f", feed,
                        "-F", "epoll", "-m", 64, "-t", self.seconds)
        rc2 = wait(tp)
        stop(srv)
        client = log + "-pingpong-client"
        p50 = parse_sockperf_pingpong(read(client + ".out") + read(client + ".err"))[1]
        if rc or not p50:
            self.show_failure("sockperf epoll ping-pong (%s)" % mode, rc, client)
            self.fail_rows(mode, "epoll_p50")
        elif not self.offload_ok(mode, "sockperf-epoll-pingpong", log + "-server.err", client + ".err"):
            self.fail_rows(mode, "epoll_p50")
        else:
            self.cells[("epoll_p50", mode)] = p50
        client = log + "-throughput-client"
        mps = parse_sockperf_throughput(read(client + ".out") + read(client + ".err"))
        if rc2 or not mps or int(mps) == 0:
            self.show_failure("sockperf epoll throughput (%s)" % mode, rc2, client)
            self.fail_rows(mode, "epoll_tput")
        elif not self.offload_ok(mode, "sockperf-epoll-throughput", log + "-server.err", client + ".err"):
            self.fail_rows(mode, "epoll_tput")
        else:
            self.cells[("epoll_tput", mode)] = mps
        print("  ping-pong p50 %s usec (one-way), throughput %s msg/s"
              % (self.cell("epoll_p50", mode), self.cell("epoll_tput", mode)))

    # -- redis, nginx

    def redis_shutdown(self, mode, log, port, srv):
        """redis-cli shutdown nosave (under the same mode) ends the server
        through exit(), so it prints its counters."""
        wait(self.start(10, log + "-shutdown", mode, "redis-cli", "-h", "127.0.0.1", "-p", port,
                        "shutdown", "nosave"))
        wait_exit(srv, 5)

    def redis_cells(self, mode, what, rc, client, note, rows, check):
        text = read(client + ".out")
        get, set_ = parse_redis_rps(text, "GET"), parse_redis_rps(text, "SET")
        if rc or not get or not set_:
            self.show_failure("redis-benchmark %s (%s)" % (what, mode), rc, client)
            self.fail_rows(mode, *rows)
        elif mode == "fabsock" and not check(note, client + ".err"):
            self.fail_rows(mode, *rows)
        else:
            self.cells[(rows[0], mode)], self.cells[(rows[1], mode)] = get, set_

    def redis(self, mode):
        """redis-benchmark -c 50 -t set,get, without and with -P 16, against one redis-server."""
        rows = ("redis_get", "redis_set", "redis_get_p16", "redis_set_p16")
        log = self.logs("redis-" + mode)
        n, n16 = (50000, 500000) if self.seconds <= 2 else (200000, 2000000)
        print("running redis-benchmark -c 50 -t set,get (-n %d, and -P 16 -n %d) under %s..."
              % (n, n16, self.mode_label(mode)))
        if self.missing(mode, ["redis-server", "redis-benchmark", "redis-cli"], *rows):
            return
        port = free_port()
        srv = self.start_server(self.seconds * 20 + 60, log + "-server", mode, port, "redis-server",
                                         "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
        if not srv:
            return self.fail_rows(mode, *rows)
        bench = ("redis-benchmark", "-h", "127.0.0.1", "-p", port, "-c", 50)
        rc = wait(self.start(self.seconds * 8 + 20, log + "-c50-client", mode, *bench, "-n", n, "-t", "set,get", "-q"))
        rc2 = wait(self.start(self.seconds * 8 + 20, log + "-P16-client", mode, *bench, "-n", n16, "-P", 16,
                              "-t", "set,get", "-q"))
        self.redis_shutdown(mode, log, port, srv)

        def check(note, client_err):
            return self.check_offload(note, log + "-server.err", client_err)
        self.redis_cells(mode, "-c 50", rc, log + "-c50-client", "redis", rows[:2], check)
        self.redis_cells(mode, "-c 50 -P 16", rc2, log + "-P16-client", "redis-P16", rows[2:], check)
        print("  -c 50: GET %s SET %s req/s; -P 16: GET %s SET %s req/s" % tuple(self.cell(r, mode) for r in rows))

    def redis_c1k(self, mode):
        """Scale (issue 14): redis-benchmark -c 1000 -t set,get against one
        redis-server, every connection offloaded."""
        rows = ("redis_get_c1k", "redis_set_c1k")
        log = self.logs("redis-c1000-" + mode)
        n = 100000 if self.seconds <= 2 else 400000
        print("running redis-benchmark -c 1000 -t set,get (-n %d) under %s..." % (n, self.mode_label(mode)))
        if self.missing(mode, ["redis-server", "redis-benchmark", "redis-cli"], *rows):
            return
        if raise_nofile(20000) < 4096:
            say("cannot raise the open-file limit for 1000 connections")
            return self.fail_rows(mode, *rows)
        port = free_port()
        srv = self.start_server(self.seconds * 20 + 60, log + "-server", mode, port, "redis-server",
                                         "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                         "--maxclients", 4000)
        if not srv:
            return self.fail_rows(mode, *rows)
        rc = wait(self.start(self.seconds * 12 + 30, log + "-client", mode, "redis-benchmark", "-h", "127.0.0.1",
                             "-p", port, "-c", 1000, "-n", n, "-t", "set,get", "-q"))
        self.redis_shutdown(mode, log, port, srv)

        def check(note, client_err):
            return self.check_all_offloaded(note, 2000, [log + "-server.err"], client_err,
                                            [log + "-shutdown.err"])
        self.redis_cells(mode, "-c 1000", rc, log + "-client", "redis-c1000", rows, check)
        print("  -c 1000: GET %s SET %s req/s" % tuple(self.cell(r, mode) for r in rows))

    def nginx_c1k(self, mode):
        """Scale (issue 14): nginx in Debian's shape (daemon on: the started
        process exits, a root master with two workers as nobody) serving a 600-byte file to wrk -t 2 -c 1000 running as
        nobody too (one user on both ends: shm peers must share one), every
        connection offloaded."""
        log = self.logs("nginx-c1000-" + mode)
        secs = self.seconds
        print("running wrk -c 1000 against nginx under %s (%d s)..." % (self.mode_label(mode), secs))
        if self.missing(mode, ["nginx", "wrk", "setpriv"], "nginx_c1k"):
            return
        if raise_nofile(20000) < 4096:
            say("cannot raise the open-file limit for 1000 connections")
            return self.fail_rows(mode, "nginx_c1k")
        port = free_port()
        if not port:
            return self.fail_rows(mode, "nginx_c1k")
        prefix = tempfile.mkdtemp(prefix="fabsock-bench-nginx.", dir="/tmp")
        try:
            self.nginx_run(mode, log, secs, port, prefix)
        finally:
            shutil.rmtree(prefix, ignore_errors=True)
        print("  %s req/s" % self.cell("nginx_c1k", mode))

    def nginx_run(self, mode, log, secs, port, prefix):
        os.chmod(prefix, 0o755)
        for d in ("html", "logs"):
            os.mkdir(os.path.join(prefix, d), 0o755)
        with open(os.path.join(prefix, "html", "small.txt"), "w") as f:
            f.write("x" * 600)
        os.chmod(os.path.join(prefix, "html", "small.txt"), 0o644)
        with open(os.path.join(prefix, "nginx.conf"), "w") as f:
            f.write("user nobody nogroup;\nworker_processes 2;\nworker_rlimit_nofile 20000;\n"
                    "pid %(p)s/nginx.pid;\nerror_log %(p)s/logs/error.log;\n"
                    "events { worker_connections 4096; use epoll; }\n"
                    "http {\n\taccess_log off;\n\tsendfile on;\n\tkeepalive_requests 1000000;\n"
                    "\tserver { listen 127.0.0.1:%(port)d; root %(p)s/html; }\n}\n" % {"p": prefix, "port": port})
        # Debian's packaged shape (nginx.service: daemon on): the process
        # started makes the listener, forks the master and exits, so the
        # listener is served by processes that did not make it
        srv = self.start_server(secs + 60, log + "-server", mode, port, "nginx", "-c", prefix + "/nginx.conf",
                                "-p", prefix, "-g", "daemon on;")
        master = None
        if srv and wait_until(lambda: read(prefix + "/nginx.pid").strip().isdigit(), 10):
            master = int(read(prefix + "/nginx.pid").strip())
        if not srv or not master:
            if srv:
                self.show_failure("nginx (%s): no pid file" % mode, "no master", log + "-server")
            self.nginx_kill(prefix)
            return self.fail_rows(mode, "nginx_c1k")
        rc = wait(self.start(secs + 30, log + "-client", mode, "setpriv", "--reuid", "nobody", "--regid", "nogroup",
                             "--clear-groups", "wrk", "-t", 2, "-c", 1000, "-d", "%ds" % secs, "--timeout", "5s",
                             "http://127.0.0.1:%d/small.txt" % port))
        # a graceful stop (the workers finish and print their counters), by
        # force after 10 s; the master is not our child: waited by its pid
        try:
            os.kill(master, signal.SIGQUIT)
        except ProcessLookupError:
            pass
        if not wait_until(lambda: not pid_alive(master), 10):
            self.nginx_kill(prefix)
        wait_exit(srv, 10)
        # nginx points its workers' stderr at its error log: their stats are there
        with open(log + "-server-error.log", "w") as f:
            f.write(read(prefix + "/logs/error.log"))
        rps, non2xx = parse_wrk(read(log + "-client.out"))
        if rc or not rps or non2xx:
            self.show_failure("wrk -c 1000 against nginx (%s)" % mode, rc, log + "-client")
            self.fail_rows(mode, "nginx_c1k")
        elif mode == "fabsock" and not self.check_all_offloaded(
                "nginx-c1000", 1000, [log + "-server.err", log + "-server-error.log"], log + "-client.err"):
            self.fail_rows(mode, "nginx_c1k")
        else:
            self.cells[("nginx_c1k", mode)] = rps

    @staticmethod
    def nginx_kill(prefix):
        """SIGKILL to a daemonized nginx master left behind (and its workers,
        its process group: it called setsid)."""
        try:
            pid = int(read(prefix + "/nginx.pid").strip())
            os.killpg(pid, signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass

    # -- raw libfabric

    def fi_pingpong(self, size, iterations, log):
        """One fi_pingpong run: (usec/xfer, MB/sec), or None."""
        if not shutil.which("fi_pingpong"):
            say("fi_pingpong is not installed (apt-get install libfabric-bin)")
            return None
        port = free_port()
        if not port:
            return None
        args = ("fi_pingpong", "-p", self.provider, "-e", "rdm", "-m", "tagged", "-S", size, "-I", iterations)
        # fi_pingpong's server listens for its control connection on 0.0.0.0
        # (it has no option to bind one address); the client connects to 127.0.0.1.
        srv = self.start(self.seconds * 4 + 60, log + "-server", "raw", *args, "-B", port)
        if not (wait_until(lambda: listening(port) or not srv.alive(), 10) and listening(port)):
            stop(srv)
            self.show_failure("fi_pingpong server", "no listener", log + "-server")
            return None
        rc = wait(self.start(self.seconds * 4 + 30, log + "-client", "raw", *args, "-P", port, "127.0.0.1"))
        wait_exit(srv, 5)  # it ends by itself after the last iteration
        result = parse_fi_pingpong(read(log + "-client.out"))
        if rc or not result:
            self.show_failure("fi_pingpong -S %d" % size, rc, log + "-client")
            return None
        return result

    def raw(self):
        lat_iters, bw_iters = (20000, 2000) if self.seconds <= 2 else (100000, 10000)
        print("running fi_pingpong 64 B on %s (%d iterations)..." % (self.provider, lat_iters))
        result = self.fi_pingpong(64, lat_iters, self.logs("fi_pingpong-64"))
        if result:
            self.cells[("lat_avg", "raw")] = result[0]
            print("  %s usec per transfer (one-way)" % result[0])
        else:
            self.fail_rows("raw", "lat_avg")
        print("running fi_pingpong 128 KiB on %s (%d iterations)..." % (self.provider, bw_iters))
        result = self.fi_pingpong(131072, bw_iters, self.logs("fi_pingpong-128k"))
        if result:
            self.cells[("stream", "raw")] = gbits_from_mbytes(result[1])
            print("  %s Gbit/s (one message in flight)" % self.cells[("stream", "raw")])
        else:
            self.fail_rows("raw", "stream")

    # -- fabsock-netbench, fs_scale, fs_idle

    def netbench(self, mode, key, log, limit, rows, *args):
        """One fabsock-netbench server and one client run against it: the
        client's key=value line, or None after marking ROWS failed (n/a when
        the program was not built)."""
        if not self.netbench_prog:
            say("fabsock-netbench is not built (tools/fabsock_netbench.c); its rows read n/a")
            self.set_rows(mode, NA_NOT_BUILT, *rows)
            return None
        ready = log + ".ready"
        if os.path.exists(ready):
            os.unlink(ready)
        srv = self.start(limit + 30, log + "-server", mode, self.netbench_prog, "server", "--ready-file", ready)
        if not wait_until(lambda: read(ready).strip() or not srv.alive(), 10) or not read(ready).strip():
            stop(srv)
            self.show_failure("fabsock-netbench server (%s)" % mode, "no listener", log + "-server")
            self.fail_rows(mode, *rows)
            return None
        port = read(ready).strip()
        rc = wait(self.start(limit, log + "-client", mode, self.netbench_prog, args[0], "127.0.0.1", port, *args[1:]))
        stop(srv)
        values = parse_keyvalues(read(log + "-client.out"))
        if rc or not values:
            self.show_failure("fabsock-netbench %s (%s)" % (args[0], mode), rc, log + "-client")
            self.fail_rows(mode, *rows)
            return None
        if not self.offload_ok(mode, key, log + "-server.err", log + "-client.err"):
            self.fail_rows(mode, *rows)
            return None
        return values

    def lat_size(self, mode, size):
        """One point of the latency-vs-size sweep. Kernel and fabsock:
        fabsock-netbench ping-pong, its median one-way latency; raw:
        fi_pingpong -S SIZE (an average: it reports nothing else), which also
        gives the raw point of the bandwidth sweep."""
        row = "lat_sz_%d" % size
        if mode == "raw":
            iters = raw_iterations(size, self.quick)
            print("running fi_pingpong -S %d on %s (%d iterations)..." % (size, self.provider, iters))
            result = self.fi_pingpong(size, iters, self.logs("fi_pingpong-sweep-%d" % size))
            if not result:
                return self.fail_rows("raw", row, "bw_sz_%d" % size)
            self.cells[(row, "raw")] = result[0]
            self.cells[("bw_sz_%d" % size, "raw")] = gbits_from_mbytes(result[1])
            print("  %s usec one-way, %s Gbit/s" % (result[0], self.cells[("bw_sz_%d" % size, "raw")]))
            return
        print("running ping-pong %s under %s (%d s)..." % (size_label(size), self.mode_label(mode), self.sweep_seconds))
        values = self.netbench(mode, "netbench-pingpong", self.logs("netbench-pingpong-%d-%s" % (size, mode)),
                               self.sweep_seconds + 30, [row], "pingpong", "--size", size,
                               "--seconds", self.sweep_seconds)
        if values:
            # The median, as the targets ask; the average is in the log.
            self.cells[(row, mode)] = values["p50_usec"]
            print("  p50 %s usec, avg %s usec (one-way)" % (values["p50_usec"], values.get("avg_usec")))

    def conn(self, mode):
        """Connection setup: N sequential connect + 9 bytes out + 1 byte back + close."""
        n = 300 if self.quick else 1000
        print("running fabsock-netbench connect (%d connections) under %s..." % (n, self.mode_label(mode)))
        v = self.netbench(mode, "netbench-connect", self.logs("netbench-connect-" + mode), 120,
                          ["conn_usec", "conn_rate"], "connect", "--count", n)
        if v:
            self.cells[("conn_usec", mode)], self.cells[("conn_rate", mode)] = v["avg_usec"], v["per_sec"]
            print("  %s usec per connection (p50 %s), %s per s" % (v["avg_usec"], v.get("p50_usec"), v["per_sec"]))

    def threads(self, mode):
        """A multi-threaded client (pgbench -j, a worker pool): 4 threads of
        one process, each with its own connection, each waiting in poll() for
        an answer the server gives 150 us after the question."""
        seconds = 2 if self.quick else 4
        print("running fabsock-netbench threads (4 threads, %d s) under %s..." % (seconds, self.mode_label(mode)))
        v = self.netbench(mode, "netbench-threads", self.logs("netbench-threads-" + mode), seconds + 40,
                          ["mt_rps", "mt_p90"], "threads", "--conns", 4, "--delay-us", 150, "--seconds", seconds)
        if v:
            self.cells[("mt_rps", mode)], self.cells[("mt_p90", mode)] = v["per_thread_rps"], v["p90_usec"]
            print("  %s round trips/s per thread, p50 %s usec, p90 %s usec, p99 %s usec"
                  % (v["per_thread_rps"], v.get("p50_usec"), v["p90_usec"], v.get("p99_usec")))

    def mem(self, mode):
        """VmRSS of client and server with 1 connection (the RSS query
        connection), then with K more idle connections."""
        k = 64
        rows = ["mem_proc_client", "mem_proc_server", "mem_conn_client", "mem_conn_server"]
        print("running fabsock-netbench hold (%d idle connections) under %s..." % (k, self.mode_label(mode)))
        v = self.netbench(mode, "netbench-hold", self.logs("netbench-hold-" + mode), 60, rows, "hold", "--conns", k)
        if not v:
            return
        c1, s1 = v["client_rss_one_kib"], v["server_rss_one_kib"]
        cells = (c1, s1, per_conn(c1, v["client_rss_all_kib"], k, 1), per_conn(s1, v["server_rss_all_kib"], k, 1))
        for row, text in zip(rows, cells):
            self.cells[(row, mode)] = text
        print("  process: client %s KiB, server %s KiB; per connection: client %s KiB, server %s KiB" % cells)

    def slow(self, mode):
        """Slow reader: the writer sends 64 KiB blocks as fast as it can to a
        reader that takes 16 KiB per millisecond; both processes' VmRSS peaks
        are sampled every 0.1 s in the first and the second half of the run."""
        seconds = 3 if self.quick else 6
        print("running fabsock-netbench slowwrite (%d s) under %s..." % (seconds, self.mode_label(mode)))
        v = self.netbench(mode, "netbench-slowwrite", self.logs("netbench-slowwrite-" + mode), seconds + 40,
                          ["slow_peak", "slow_growth"], "slowwrite", "--seconds", seconds)
        if not v:
            return
        self.cells[("slow_peak", mode)], self.cells[("slow_growth", mode)] = slow_cells(v)
        print("  peak %s MiB, growth in the second half %s MiB (writer %s -> %s KiB, reader %s -> %s KiB)"
              % (self.cell("slow_peak", mode), self.cell("slow_growth", mode), v["client_peak1_kib"],
                 v["client_peak2_kib"], v["server_peak1_kib"], v["server_peak2_kib"]))

    def download(self, mode):
        """What a program that writes in small pieces (a proxy's buffers, a
        database's rows) gives a reader of the sizes clients read: K downloads
        of 4 MiB on one connection, the server writing 8 KiB at a time to a
        reader of 100 KiB (curl's), then 4 KiB to one of 16 KiB; every byte
        checked by the client. At least 16 downloads (80 MiB): a connection
        of fewer turns and bytes is short to the connection history, and a
        process of one short connection sends its command's next new command
        line to TCP (fallback_short_history_command), the second row's."""
        count = 20 if self.quick else 40
        for row, write, read_size in (("dl_8k", 8192, 102400), ("dl_16k", 4096, 16384)):
            print("running fabsock-netbench download (%d x 4 MiB, %d B writes, %d B reads) under %s..."
                  % (count, write, read_size, self.mode_label(mode)))
            v = self.netbench(mode, "netbench-download", self.logs("netbench-download-%s-%s" % (row, mode)), 120,
                              [row], "download", "--size", write, "--read-size", read_size, "--bytes", 4 << 20,
                              "--count", count)
            if v:
                self.cells[(row, mode)] = v["mb_per_sec"]
                print("  %s MB/s, a download's median %s ms" % (v["mb_per_sec"], v["p50_ms"]))

    def scale(self, mode):
        """Scale (issue 14): fs_scale (tests/progs) holds N connections from
        one client process into one epoll server process, each having echoed
        2 KiB byte-exact. Cells: the setup time (one connection after
        another), and each end's RSS per idle connection as the slope from a
        tenth of the connections to all of them (what one more costs; the
        rest is the process's fixed overhead). Under fabsock the cells count
        only when every connection was offloaded on both ends."""
        n, rows = scale_conns(self.quick), ("scale_setup", "scale_mem_client", "scale_mem_server")
        log = self.logs("scale-" + mode)
        print("running fs_scale (%d connections held by one server) under %s..." % (n, self.mode_label(mode)))
        if not self.scale_prog:
            say("fs_scale is not built (tests/progs/fs_scale.c, a test program); its rows read n/a")
            return self.set_rows(mode, NA_NOT_BUILT, *rows)
        if raise_nofile(n + 1024) <= n + 64:
            say("cannot raise the open-file limit for %d connections" % n)
            return self.fail_rows(mode, *rows)
        for path in (log + ".go", log + ".go.part"):
            if os.path.exists(path):
                os.unlink(path)
        srv = self.start(400, log + "-server", mode, self.scale_prog, "server")

        def has_line(path, prefix, child):
            return lambda: re.search("^" + prefix, read(path), re.M) is not None or not child.alive()
        if not (wait_until(has_line(log + "-server.out", "listening port=", srv), 20)
                and srv.alive()):
            stop(srv)
            self.show_failure("fs_scale server (%s)" % mode, "no listener", log + "-server")
            return self.fail_rows(mode, *rows)
        port = last_match(r"^listening port=([0-9]+)", read(log + "-server.out"))

        def rss():
            return proc_rss_kib(read("/proc/%d/status" % srv.pid))

        def reached(prefix):
            """Waits (bounded) for the client's line; the server's RSS then, or None."""
            wait_until(has_line(log + "-client.out", prefix, cli), 300)
            if re.search("^" + prefix, read(log + "-client.out"), re.M) is None:
                return None
            time.sleep(0.5)
            return rss()

        s0 = rss()
        cli = self.start(360, log + "-client", mode, self.scale_prog, "client", port, n, 2048, log + ".go")
        spart = reached("part ")
        open(log + ".go.part", "w").close()
        s1 = reached("held ")
        open(log + ".go", "w").close()
        rc = wait(cli)
        time.sleep(1)  # the last FINs reach the server, which frees its streams
        stop(srv)
        part, cpart, held, passed = parse_scale_client(read(log + "-client.out"))
        if rc or passed != n or spart is None or s1 is None or part is None or not held:
            self.show_failure("fs_scale client (%s)" % mode, rc, log + "-client")
            return self.fail_rows(mode, *rows)
        if mode == "fabsock" and not self.check_all_offloaded("scale", n, [log + "-server.err"], log + "-client.err"):
            return self.fail_rows(mode, *rows)
        c1 = held["rss_held_kib"]
        cells = (held["setup_ms"], per_conn(cpart, c1, n - part, 2), per_conn(spart, s1, n - part, 2))
        for row, text in zip(rows, cells):
            self.cells[(row, mode)] = text
        print("  setup %s ms; per idle connection: client %s KiB, server %s KiB" % cells
              + " (server %d -> %d -> %d KiB; client %d -> %s KiB)" % (s0, spart, s1, cpart, c1))

    def idle(self, mode, io):
        """fs_idle (tests/progs) server and client hold 8 connections idle
        (recv: a thread per connection in recv(); epoll: one thread in
        epoll_wait()). The cell is the busier process's CPU over the window,
        in % of one core."""
        row, window, conns = "idle_" + io, 3 if self.quick else 5, 8
        log = self.logs("idle-%s-%s" % (io, mode))
        print("running fs_idle --mode %s (%d connections, %d s) under %s..."
              % (io, conns, window, self.mode_label(mode)))
        if not self.idle_prog:
            say("fs_idle is not built (tests/progs/fs_idle.c, a test program); its row reads n/a")
            return self.set_rows(mode, NA_NOT_BUILT, row)
        ready = log + ".ready"
        if os.path.exists(ready):
            os.unlink(ready)
        srv = self.start(window + 40, log + "-server", mode, self.idle_prog, "server", "--ready-file", ready,
                         "--mode", io, "--conns", conns)
        if not wait_until(lambda: read(ready).strip() or not srv.alive(), 10) or not read(ready).strip():
            stop(srv)
            self.show_failure("fs_idle server (%s)" % mode, "no listener", log + "-server")
            return self.fail_rows(mode, row)
        cli = self.start(window + 30, log + "-client", mode, self.idle_prog, "client", "127.0.0.1",
                         read(ready).strip(), "--mode", io, "--conns", conns, "--idle-s", window + 2)
        idle = lambda: "idle" in read(log + "-client.out")
        wait_until(lambda: idle() or not cli.alive(), 10)
        if not idle() or not cli.alive() or not srv.alive():
            stop(cli)
            stop(srv)
            self.show_failure("fs_idle (%s): no idle phase" % mode, "-", log + "-client")
            return self.fail_rows(mode, row)
        time.sleep(1)  # the hello exchange and any lingering work settle
        stat = lambda c: read("/proc/%d/stat" % c.pid)
        before = (stat(srv), stat(cli))
        time.sleep(window)
        after = (stat(srv), stat(cli))
        rc = wait(cli)
        wait_exit(srv, 10)
        if rc or not all(before + after):
            self.show_failure("fs_idle (%s)" % mode, rc, log + "-client")
            return self.fail_rows(mode, row)
        if not self.offload_ok(mode, "idle-" + io, log + "-server.err", log + "-client.err"):
            return self.fail_rows(mode, row)
        s = proc_cpu_ticks(after[0]) - proc_cpu_ticks(before[0])
        c = proc_cpu_ticks(after[1]) - proc_cpu_ticks(before[1])
        self.cells[(row, mode)] = idle_percent(s, c, os.sysconf("SC_CLK_TCK"), window)
        print("  %s %% of one core (busier process; server %d, client %d ticks)" % (self.cells[(row, mode)], s, c))

    # -- real programs (issue 27): tests/scripts/bench_realapps.sh

    def find_realapps(self):
        """The driver: FABSOCK_REALAPPS_DIR, the source tree beside this
        file (tools/../tests/scripts), or the source tree of the build that
        holds the library (its CMakeCache.txt)."""
        dirs = [os.environ.get("FABSOCK_REALAPPS_DIR") or "", os.path.join(self.self_dir, "..", "tests", "scripts")]
        for build in (os.path.dirname(self.lib) if self.lib else "", os.environ.get("FABSOCK_BUILD") or "",
                      os.path.join(self.self_dir, "..")):
            home = last_match(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", read(os.path.join(build, "CMakeCache.txt"))
                              if build else "")
            if home:
                dirs.append(os.path.join(home, "tests", "scripts"))
        for d in dirs:
            path = os.path.join(d, "bench_realapps.sh")
            if d and os.path.isfile(path) and os.path.isfile(os.path.join(d, "realapps_lib.sh")):
                return os.path.realpath(path)
        return None

    def realapps_unavailable(self):
        """Why the section cannot run here, as its cells say it; "" if it can."""
        if not self.usable("kernel"):
            return "n/a (kernel column not run)"
        if not self.usable("fabsock"):
            return "n/a (no fabsock library)" if "fabsock" in self.modes else "n/a (fabsock column not run)"
        if self.provider != "shm":
            return "n/a (the real programs run on shm, not %s)" % self.provider
        if os.geteuid() != 0:
            return "n/a (needs root)"  # the servers start as root and drop to their users
        if not shutil.which("bash"):
            return "n/a (not installed: bash)"
        if not self.find_realapps():
            # FABSOCK_REALAPPS_DIR names tests/scripts of a source tree
            return "n/a (no bench_realapps.sh)"
        return ""

    def realapps(self):
        why = self.realapps_unavailable()
        if why:
            print("real programs: %s" % why)
            self.real_rows, self.real_summary = real.judge({}, why)
            return
        driver, log = self.find_realapps(), self.logs("realapps")
        tsv = log + ".tsv"
        if os.path.exists(tsv):
            os.unlink(tsv)
        env = self.env_for("kernel")
        lib_dir = os.path.dirname(self.lib)
        env.update(FABSOCK_LIB=self.lib, FS_REALAPPS_RESULTS=tsv,
                   FS_PROGS=os.environ.get("FS_PROGS") or os.path.join(lib_dir, "tests", "progs"))
        argv = ["bash", driver, "--rounds", str(self.repeat)] + (["--quick"] if self.quick else [])
        # a bound, not an estimate: a --quick round took 71 s on the 2-core VM
        # at load 2.4 and 126 s at load 12-14; a full round 3.5 min at load 20
        limit = self.repeat * (300 if self.quick else 700)
        print("running the real programs (nginx, PostgreSQL, memcached, nginx proxy_pass), %d round(s) of "
              "kernel TCP and fabsock in turn, about %s a round..." % (self.repeat, "1-2 min" if self.quick else "3-5 min"))
        t0 = time.monotonic()
        child = self.children.start(limit, log, env, argv)
        rc = wait(child)
        samples = real.parse_tsv(read(tsv))
        self.real_rows, self.real_summary = real.judge(samples)
        self.real_notes = [l[len("offload "):] for l in read(log + ".out").splitlines() if l.startswith("offload ")]
        failed = [r["benchmark"] for r in self.real_rows if "failed" in (r["kernel_tcp"], r["fabsock"])]
        print("  %d figures, %d round(s) in %s%s" % (
            len(samples), self.repeat, clock(int(time.monotonic() - t0)),
            "" if rc == 0 and not failed else ", %d failed (exit status %d)" % (len(failed), rc)))
        if rc != 0 or failed:
            self.failures += 1
            self.show_failure("bench_realapps.sh", rc, log)

    def find_netns_bench(self):
        """tools/netns_bench.sh: beside this file (a source tree) or in
        the source tree of the build that holds the library."""
        dirs = [self.self_dir]
        for build in (os.path.dirname(self.lib) if self.lib else "", os.path.join(self.self_dir, "..")):
            home = last_match(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", read(os.path.join(build, "CMakeCache.txt"))
                              if build else "")
            if home:
                dirs.append(os.path.join(home, "tools"))
        for d in dirs:
            path = os.path.join(d, "netns_bench.sh")
            if os.path.isfile(path):
                return path
        return ""

    def hosts_section(self):
        """Between hosts (issue 28): tools/netns_bench.sh twice, with its
        own rounds: one veth pair (kernel, raw fi_pingpong, fabsock; one
        and four streams) and two veth pairs held to 1 Gbit/s each (one
        rail against two, one and eight streams)."""
        self.hosts = {}
        if os.geteuid() != 0:
            self.hosts_why = "n/a (network namespaces need root)"
        elif not self.lib:
            self.hosts_why = "n/a (no libfabsock.so)"
        else:
            missing = [p for p in ("ip", "tc", "iperf3", "fi_pingpong") if not shutil.which(p)]
            script = self.find_netns_bench()
            if missing:
                self.hosts_why = "n/a (not installed: %s)" % " ".join(missing)
            elif not script:
                self.hosts_why = "n/a (no tools/netns_bench.sh)"
        if self.hosts_why:
            print("between hosts: %s" % self.hosts_why)
            return
        for part, extra in (("one_link", []), ("two_links_1gbit", ["--two-rails", "1gbit"])):
            log = self.logs("netns-" + part)
            argv = ["bash", script, "--lib", self.lib, "--rounds", str(self.repeat), "--seconds", "4"] + extra
            print("between hosts (%s): tools/netns_bench.sh %s, %d round(s)..." % (
                part.replace("_", " "), " ".join(extra) or "(one veth pair)", self.repeat))
            t0 = time.monotonic()
            rc = wait(self.children.start(60 + self.repeat * 150, log, self.env_for("kernel"), argv))
            text = read(log + ".out")
            medians, ratios, in_table = {}, [], False
            for line in text.splitlines():
                if line.startswith("column") and "median" in line:
                    in_table = True
                    continue
                m = re.match(r"^([a-z0-9-]+[0-9KM])\s+([0-9.]+)$", line.strip())
                if in_table and m:
                    medians[m.group(1)] = m.group(2)
                elif " / " in line and ":" in line:
                    in_table = False
                    ratios.append(line.strip())
            self.hosts[part] = {"medians": medians, "ratios": ratios, "exit": rc}
            print("  done in %s%s" % (clock(int(time.monotonic() - t0)), "" if rc == 0 and medians else
                                      ", failed (exit status %d)" % rc))
            if rc != 0 or not medians:
                self.failures += 1
                self.show_failure("netns_bench.sh", rc, log)

    def print_hosts(self):
        if self.hosts is None:
            return
        print()
        print("Between hosts (tools/netns_bench.sh, issue 28: two network namespaces joined by veth pairs, the\n"
              "tcp provider; iperf3 Gbit/s, median of %d round(s); fi_pingpong busy-polls both processes, so on a\n"
              "loaded 2-core machine the raw figure understates the provider)" % self.repeat)
        if self.hosts_why:
            print("  %s" % self.hosts_why)
            return
        for part, title in (("one_link", "one veth pair"), ("two_links_1gbit",
                                                          "two veth pairs of 1 Gbit/s each (tc tbf); rails2: "
                                                          "FABSOCK_RAILS=2")):
            got = self.hosts.get(part) or {}
            print("  %s: %s" % (title, ", ".join("%s %s" % kv for kv in got.get("medians", {}).items()) or "failed"))
            for line in got.get("ratios", []):
                print("    %s" % line)

    # -- the plan

    def usable(self, mode):
        return mode in self.modes and (mode != "fabsock" or bool(self.lib))

    def plan(self):
        """Every run, in order, as (repetition, method, args). Kernel and
        fabsock runs of one benchmark are adjacent, and every repetition
        passes through the whole table, so drift on a shared machine hits
        both alike."""
        steps = []
        for r in range(1, self.repeat + 1):
            def each(method, *args, modes=("kernel", "fabsock")):
                steps.extend((r, method, (m,) + args) for m in modes if self.usable(m))
            each(self.sockperf)
            if "raw" in self.modes:
                steps.append((r, self.raw, ()))
            for size in self.sizes:
                each(self.lat_size, size, modes=MODES)
            each(self.iperf, 131072, "stream", "iperf2", self.seconds)
            for size in self.sizes:
                each(self.bw_size, size)
            for m in ("kernel", "fabsock"):
                if self.usable(m):
                    steps += [(r, self.sockperf_epoll, (m,)), (r, self.iperf3, (m, 1)), (r, self.iperf3, (m, 4)),
                              (r, self.redis, (m,))]
            for m in ("kernel", "fabsock"):
                if self.usable(m):
                    steps += [(r, self.redis_c1k, (m,)), (r, self.nginx_c1k, (m,))]
            for m in ("kernel", "fabsock"):
                if self.usable(m):
                    steps += [(r, f, (m,)) for f in (self.conn, self.threads, self.mem, self.scale, self.slow,
                                                     self.download)]
            each(self.idle, "recv")
            if not self.quick:
                each(self.idle, "epoll")
        if "main" not in self.sections:
            steps = []
        if "real" in self.sections:
            # one step: bench_realapps.sh runs its rounds itself, kernel then
            # fabsock per program in each
            steps.append((self.repeat, self.realapps, ()))
        if "hosts" in self.sections:
            steps.append((self.repeat, self.hosts_section, ()))
        return steps

    def run(self, out):
        self.out = os.path.realpath(out)
        self.log_dir = os.path.join(self.out, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        for name in os.listdir(self.log_dir):
            if name.endswith((".cmd", ".out", ".err", ".feed", ".ready")):
                os.unlink(os.path.join(self.log_dir, name))
        if "fabsock" in self.modes:
            if self.lib:
                print("fabsock library: %s (%s)" % (self.lib, self.lib_how))
            else:
                say("cannot find libfabsock.so: every fabsock cell fails (fabsock -v lib)")
                self.fail_rows("fabsock", *(r.id for r in self.rows))
                self.harvest()
        else:
            say("note: fabsock column skipped (modes: %s)" % ",".join(self.modes))
        self.netbench_prog = self.find_prog("fabsock-netbench")
        self.idle_prog = self.find_prog("fs_idle")
        self.scale_prog = self.find_prog("fs_scale")
        if self.verbose:
            say("fabsock-netbench: %s; fs_idle: %s; fs_scale: %s" % (
                self.netbench_prog or "not found", self.idle_prog or "not found", self.scale_prog or "not found"))
        if "raw" in self.modes:
            self.set_rows("raw", "n/a", *APP_ROWS, "lat_p50", "lat_p99")
            self.harvest()
        steps = self.plan()
        print("fabsock bench: %d runs (%d repetition(s)), %s" % (len(steps), self.repeat,
                                                                  "quick" if self.quick else "full"))
        t0 = time.monotonic()
        for i, (r, method, args) in enumerate(steps, 1):
            elapsed = int(time.monotonic() - t0)
            eta = ", ~%s left" % clock(elapsed * (len(steps) - i + 1) // (i - 1)) if i > 1 else ""
            run = ", run %d/%d" % (r, self.repeat) if self.repeat > 1 else ""
            print("[%d/%d %s%s%s] " % (i, len(steps), clock(elapsed), eta, run), end="")
            method(*args)
            self.harvest()
        print("all %d runs done in %s" % (len(steps), clock(int(time.monotonic() - t0))))
        self.cells = {key: median(s) for key, s in self.samples.items()}
        self.print_table()
        self.write_results()
        if not draw_charts(os.path.join(self.out, "results.json"), self.out):
            say("a chart is missing; the table and results are still valid")
        if self.failures:
            say("%d run(s) failed (see 'failed' cells and %s)" % (self.failures, self.log_dir))
            return 1
        return 0

    # -- results

    def row_texts(self, row):
        cells = {m: self.cell(row.id, m) for m in MODES}
        k, r = ratio(cells["fabsock"], cells["kernel"]), ratio(cells["fabsock"], cells["raw"])
        return ["%s (%s)" % (row.name, row.unit), cells["kernel"] or "-", cells["fabsock"] or "-", cells["raw"] or "-",
                k + "x" if k else "-", r + "x" if r else "-", target_text(row), target_met(row, cells)]

    def print_table(self):
        if "main" not in self.sections:
            self.print_real()
            self.print_hosts()
            return
        head = ["benchmark", "kernel TCP", "fabsock", "raw libfabric", "fabsock/kernel", "fabsock/raw", "target",
                "met?"]
        texts = [self.row_texts(row) for row in self.rows]
        width = [max(len(t[i]) for t in [head] + texts) for i in range(len(head))]

        def line(t):
            return " | ".join([t[0].ljust(width[0])] + [t[i].rjust(width[i]) for i in range(1, 6)]
                              + [t[6].ljust(width[6]), t[7]])
        print()
        print("fabsock bench on %s, provider %s, loopback 127.0.0.1; median of %d run(s), %d s per main run, "
              "%d s per sweep point" % (socket.gethostname(), self.provider, self.repeat, self.seconds,
                                        self.sweep_seconds))
        print("Latency rows are one-way latency (round trip / 2) in every column: sockperf and\n"
              "fabsock-netbench report RTT/2, fi_pingpong's usec/xfer is elapsed/(2 x iterations);\n"
              "fi_pingpong reports an average only. Raw bandwidth is fi_pingpong with one message in\n"
              "flight (a reference, not a streaming figure). Ratios are fabsock / the other column;\n"
              "targets are the performance issue's, met? is computed from the medians (docs/bench.md).")
        print()
        print(line(head))
        print("-" * (sum(width) + 3 * len(width) - 3))
        for t in texts:
            print(line(t))
        met = sum(t[7] == "yes" for t in texts)
        print("targets met: %d, missed: %d" % (met, sum(t[7] == "no" for t in texts)))
        for key in NOTE_KEYS:
            if self.notes.get(key):
                print("fabsock %s: %s" % (key, self.notes[key]))
        self.print_real()
        self.print_hosts()

    def print_real(self):
        if self.real_rows is None:
            return
        print()
        print("Real programs (tests/scripts/bench_realapps.sh: the realapps suite's servers as Debian\n"
              "ships them, clients as their users, kernel TCP and fabsock for each program in each\n"
              "round, the kernel first in odd rounds; median of %d round(s)).\n%s\n"
              "ratio: fabsock vs kernel, > 1 is faster (rates: fabsock/kernel; times: kernel/fabsock,\n"
              "a curl process's wall time from exec to exit). Targets: issue 27's."
              % (self.repeat, "--quick: the same figures from shorter runs: 2 s per wrk or pgbench run (5 s in\n"
                 "the full run), 5 curl processes per size (10), 2 downloads through the proxy (4),\n"
                 "memcslap 1000 keys per thread (4000), pgbench -i -s 1 (2)." if self.quick else
                 "5 s per wrk or pgbench run, 10 curl processes per size, 4 downloads through the\n"
                 "proxy, memcslap 4000 keys per thread, pgbench -i -s 2."))
        print()
        for line in real.table_lines(self.real_rows, self.real_summary):
            print(line)
        for note in self.real_notes:
            print("fabsock realapps %s" % note)

    def write_results(self):
        csv_path, json_path = os.path.join(self.out, "results.csv"), os.path.join(self.out, "results.json")
        md_path = os.path.join(self.out, "results.md")
        csv = ["benchmark,unit,better,kernel_tcp,fabsock,raw_libfabric,fabsock_over_kernel,fabsock_over_raw,"
               "target,met,size_bytes"]
        md = ["| benchmark | kernel TCP | fabsock | raw libfabric | fabsock/kernel | fabsock/raw | target | met? |",
              "|---|---:|---:|---:|---:|---:|---|---|"]
        results = []
        for row in self.rows:
            cells = {m: self.cell(row.id, m) for m in MODES}
            k, r = ratio(cells["fabsock"], cells["kernel"]), ratio(cells["fabsock"], cells["raw"])
            target, met = target_text(row), target_met(row, cells)
            size = "" if row.size is None else str(row.size)
            csv.append('"%s",%s,%s,%s,%s,%s,%s,%s,"%s",%s,%s' % (row.name, row.unit, row.better, cells["kernel"],
                                                                  cells["fabsock"], cells["raw"], k, r, target, met,
                                                                  size))
            t = self.row_texts(row)
            t[6] = t[6].replace("<", "&lt;").replace(">", "&gt;")
            md.append("| %s |" % " | ".join(t))
            results.append([("id", row.id), ("benchmark", row.name), ("unit", row.unit), ("better", row.better),
                            ("size_bytes", size), ("kernel_tcp", cells["kernel"]), ("fabsock", cells["fabsock"]),
                            ("raw_libfabric", cells["raw"]), ("fabsock_over_kernel", k), ("fabsock_over_raw", r),
                            ("target", target), ("met", met),
                            ("samples", [(json_key, self.samples.get((row.id, m), []))
                                         for m, json_key in zip(MODES, ("kernel_tcp", "fabsock", "raw_libfabric"))])])
        head = [("date", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), ("host", socket.gethostname()),
                ("cpu", cpu_model()), ("cpus", len(os.sched_getaffinity(0))), ("kernel", os.uname().release),
                ("libfabric", libfabric_version()), ("library", self.lib or ""), ("provider", self.provider),
                ("quick", self.quick), ("repeat", self.repeat), ("seconds_per_run", self.seconds),
                ("seconds_per_sweep_point", self.sweep_seconds), ("modes", list(self.modes)),
                ("latency", "one-way (round trip / 2) in every column"),
                ("cell", "median of the numeric samples of every run"),
                ("offload", [(k, self.notes.get(k, "")) for k in NOTE_KEYS])]
        if self.real_rows is not None:
            head.append(("realapps_summary", [(k, v if isinstance(v, int) else str(v))
                                              for k, v in self.real_summary.items()]))
            head.append(("realapps_offload", self.real_notes))
            head.append(("realapps", [[(k, list(v.items()) if isinstance(v, dict) else v) for k, v in r.items()]
                                      for r in self.real_rows]))
            md += ["", "Real programs (ratio: fabsock vs kernel, > 1 is faster)", "",
                   "| real program | kernel TCP | fabsock | ratio | target | met? |", "|---|---:|---:|---:|---|---|"]
            for r in self.real_rows:
                md.append("| %s (%s) | %s | %s | %s | %s | %s |" % (
                    r["benchmark"], r["unit"], r["kernel_tcp"] or "-", r["fabsock"] or "-",
                    r["ratio"] + "x" if r["ratio"] else "-", r["target"].replace("<", "&lt;").replace(">", "&gt;"),
                    r["met"]))
            g = self.real_summary
            md.append("| geometric mean of %d ratios | | | %s | %s | %s |" % (
                g["geomean_of"], g["geomean"] + "x" if g["geomean"] else "-",
                g["geomean_target"].replace(">", "&gt;"), g["geomean_met"]))
        if self.hosts is not None:
            head.append(("hosts", self.hosts_why or [(part, [("medians", list(v["medians"].items())),
                                                             ("ratios", v["ratios"]), ("exit", v["exit"])])
                                                     for part, v in self.hosts.items()]))
            md += ["", "Between hosts (tools/netns_bench.sh, tcp provider, Gbit/s)", ""]
            if self.hosts_why:
                md.append(self.hosts_why)
            for part, v in self.hosts.items():
                md.append("- %s: %s" % (part.replace("_", " "), ", ".join("%s %s" % kv for kv in v["medians"].items())))
                md += ["  - %s" % line for line in v["ratios"]]
        with open(csv_path, "w") as f:
            f.write("\n".join(csv) + "\n")
        with open(json_path, "w") as f:
            f.write(results_json(head, results))
        with open(md_path, "w") as f:
            f.write("\n".join(md) + "\n")
        print("results: %s, %s, %s (logs of the last run of each benchmark in %s)"
              % (csv_path, json_path, md_path, self.log_dir))


def cpu_model():
    return last_match(r"^model name\s*: (.*)$", read("/proc/cpuinfo").split("\n\n")[0]) or ""


def libfabric_version():
    try:
        out = subprocess.run(["fi_info", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (re.findall(r"^libfabric: *(.*)$", out, re.M) or [""])[0]


def json_value(v):
    """A results.json value: cells are text, written as JSON numbers when
    they are numbers (as printed: 29.90 stays 29.90), null when empty, "-"
    or plain "n/a"; lists of pairs are objects."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        if v and isinstance(v[0], tuple):
            return "{%s}" % ", ".join("%s: %s" % (json.dumps(k), json_value(x)) for k, x in v)
        return "[%s]" % ", ".join(json_value(x) for x in v)
    if is_number(v):
        return v
    if v in ("", "n/a", "-"):
        return "null"
    return json.dumps(v)


def results_json(head, results):
    lines = ["{"] + ["  %s: %s," % (json.dumps(k), json_value(v)) for k, v in head] + ['  "results": [']
    lines.append(",\n".join("    " + json_value(r) for r in results))
    return "\n".join(lines) + "\n  ]\n}\n"


# ---------------------------------------------------------------------------
# Charts: latency.svg (rows lat_sz_*) and bandwidth.svg (rows bw_sz_*) from
# results.json, hand-written SVG, log-log axes, one line per column; a
# missing cell ("failed", n/a) leaves a gap in its line.

WIDTH, HEIGHT = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 78, 170, 58, 62  # RIGHT: the least right margin
SERIES = [  # (results key, legend, colour, dash)
    ("kernel_tcp", "kernel TCP", "#6b6b6b", ""),
    ("fabsock", "fabsock", "#d62728", ""),
    ("raw_libfabric", "raw libfabric (fi_pingpong)", "#1f77b4", "6,4"),
]


def value_label(v):
    if v >= 1:
        return "%g" % v
    return ("%.3f" % v).rstrip("0")


def chart_number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def legend_margin():
    """The right margin the legends need: line sample (30 px) after a 14 px
    gap, the longest legend's text, 12 px to spare. A fixed 170 px cut
    "raw libfabric (fi_pingpong)" to "raw libfabric (fi_pingp"."""
    return max(RIGHT, 14 + 30 + max(real.text_width(legend) for _, legend, _, _ in SERIES) + 12)


def chart(rows, title, subtitle, ylabel):
    """The SVG text of one log-log chart of rows (dicts from results.json), None without numbers."""
    sizes = [r["size_bytes"] for r in rows]
    values = [chart_number(r.get(k)) for r in rows for k, _, _, _ in SERIES]
    values = [v for v in values if v is not None]
    if not sizes or not values:
        return None
    x_lo, x_hi = math.log2(min(sizes)), math.log2(max(sizes))
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo = math.floor(math.log10(min(values)))
    y_hi = math.ceil(math.log10(max(values)))
    if y_hi == y_lo:
        y_hi += 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    width = LEFT + plot_w + legend_margin()

    def px(size):
        return LEFT + (math.log2(size) - x_lo) / (x_hi - x_lo) * plot_w

    def py(v):
        return TOP + plot_h - (math.log10(v) - y_lo) / (y_hi - y_lo) * plot_h

    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
        'font-family="sans-serif" font-size="12">' % (width, HEIGHT, width, HEIGHT),
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="%d" y="22" font-size="16" font-weight="bold">%s</text>' % (LEFT, html.escape(title)),
        '<text x="%d" y="40" fill="#555">%s</text>' % (LEFT, html.escape(subtitle)),
    ]
    # Horizontal grid: decades (labelled) and 2x, 5x (faint).
    for decade in range(y_lo, y_hi + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** decade
            if math.log10(v) > y_hi + 1e-9:
                continue
            y = py(v)
            colour = "#cccccc" if m == 1 else "#eeeeee"
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>' % (LEFT, y, LEFT + plot_w, y, colour))
            if m == 1:
                out.append('<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>'
                           % (LEFT - 6, y, value_label(v)))
    # Vertical grid: one line per measured size.
    for size in sizes:
        x = px(size)
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eeeeee"/>' % (x, TOP, x, TOP + plot_h))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (x, TOP + plot_h + 18, size_label(size)))
    out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>' % (LEFT, TOP, plot_w, plot_h))
    out.append('<text x="%d" y="%d" text-anchor="middle">message size (bytes per write / per message)</text>'
               % (LEFT + plot_w // 2, HEIGHT - 16))
    out.append('<text transform="translate(20 %d) rotate(-90)" text-anchor="middle">%s</text>'
               % (TOP + plot_h // 2, html.escape(ylabel)))
    # One line per series, broken where a cell is missing.
    for i, (key, legend, colour, dash) in enumerate(SERIES):
        segment, segments = [], []
        for r in rows:
            v = chart_number(r.get(key))
            if v is None:
                if segment:
                    segments.append(segment)
                segment = []
                continue
            segment.append((px(r["size_bytes"]), py(v)))
        if segment:
            segments.append(segment)
        if not segments:
            continue
        dash_attr = ' stroke-dasharray="%s"' % dash if dash else ""
        for seg in segments:
            points = " ".join("%.1f,%.1f" % p for p in seg)
            out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>'
                       % (points, colour, dash_attr))
            for x, y in seg:
                out.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>' % (x, y, colour))
        ly = TOP + 12 + 22 * i
        lx = LEFT + plot_w + 14
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
                   % (lx, ly, lx + 24, ly, colour, dash_attr))
        out.append('<circle cx="%d" cy="%d" r="3.5" fill="%s"/>' % (lx + 12, ly, colour))
        out.append('<text x="%d" y="%d" dominant-baseline="middle">%s</text>' % (lx + 30, ly, html.escape(legend)))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw_charts(results_path, out_dir):
    """Writes latency.svg and bandwidth.svg into OUT_DIR; False if one could not be drawn."""
    with open(results_path) as f:
        data = json.load(f)
    results = data.get("results", [])
    runs = data.get("repeat", 1)
    where = "%s, %s, provider %s, median of %s run%s, %s" % (
        data.get("host", "?"), data.get("cpu", "?"), data.get("provider", "?"), runs,
        "" if runs == 1 else "s", data.get("date", "?")[:10])
    charts = [
        ("latency.svg", "lat_sz_", "Ping-pong one-way latency vs message size, median (raw: average)",
         "one-way latency (usec, log scale)"),
        ("bandwidth.svg", "bw_sz_", "Bandwidth vs write size (higher is better)", "Gbit/s (log scale)"),
    ]
    drawn = []
    for name, prefix, title, ylabel in charts:
        rows = sorted((r for r in results if r.get("id", "").startswith(prefix) and chart_number(r.get("size_bytes"))),
                      key=lambda r: r["size_bytes"])
        svg = chart(rows, title, where, ylabel)
        if svg is None:
            say("no %s* rows with numbers in %s; %s not written" % (prefix, results_path, name))
            continue
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(svg)
        drawn.append(os.path.join(out_dir, name))
    wanted = len(charts)
    if data.get("realapps"):
        wanted += 1
        rows = [real.row_from_json(r) for r in data["realapps"]]
        svg = real.chart(rows, real.summary_from_json(data.get("realapps_summary") or {}),
                         "%s, kernel TCP and fabsock in turn per round" % where)
        if svg is not None:
            with open(os.path.join(out_dir, "realapps.svg"), "w") as f:
                f.write(svg)
            drawn.append(os.path.join(out_dir, "realapps.svg"))
    if drawn:
        print("charts: %s" % ", ".join(drawn))
    return len(drawn) == wanted


# ---------------------------------------------------------------------------

USAGE = """usage: fabsock bench [--quick] [--repeat N] [--provider P] [--out DIR]
       fabsock bench --charts RESULTS.json [--out DIR]

Benchmark on this host: kernel TCP vs fabsock (both ends preloaded) vs raw
libfabric (fi_pingpong) on the same provider, with the performance issue's
target per row and whether it is met. Each cell is the median of N runs
(default 3; 1 with --quick). Then, as root from a source tree, the real
programs (nginx, PostgreSQL, memcached, an nginx proxy: issue 27's targets,
tests/scripts/bench_realapps.sh), kernel TCP and fabsock per round, in turn,
and between hosts (issue 28, tools/netns_bench.sh: two network namespaces,
the tcp provider, one rail against raw libfabric and two rails against one;
full runs only). Writes results.csv, results.json, results.md, logs/ and the charts
latency.svg, bandwidth.svg and realapps.svg into DIR (default
./fabsock-bench-results). --quick: 2 s per run, 4 message sizes instead of
8, one repetition, shorter real-program runs (CI, about 3-4 min); the full
run takes about 25 min. --charts redraws the charts of a results.json
(into DIR, default its own directory). See docs/bench.md.
"""


def die(text):
    say("error: " + text)
    sys.exit(2)


def parse_args(argv):
    opts = {"quick": False, "repeat": None, "provider": "shm", "out": None, "verbose": False, "lib": "",
            "lib_how": "", "preload": "", "charts": None,
            "modes": os.environ.get("FABSOCK_BENCH_MODES") or "kernel,fabsock,raw",
            "sections": os.environ.get("FABSOCK_BENCH_SECTIONS") or ""}
    # --lib, --lib-how, --preload: from the launcher; --modes (also
    # FABSOCK_BENCH_MODES), not in the help: choose columns; --sections
    # (also FABSOCK_BENCH_SECTIONS), not in the help: "main" (the table of
    # rows), "real" (the real programs), "hosts" (between hosts, netns), or
    # a list of them; default all three, --quick main and real.
    valued = {"--repeat": "repeat", "--provider": "provider", "--out": "out", "--modes": "modes", "--lib": "lib",
              "--lib-how": "lib_how", "--preload": "preload", "--charts": "charts", "--sections": "sections"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if arg == "--quick":
            opts["quick"] = True
        elif arg in ("-v", "--verbose"):
            opts["verbose"] = True
        elif arg in ("-h", "--help"):
            sys.stdout.write(USAGE)
            sys.exit(0)
        elif name in valued:
            if not eq:
                if i + 1 >= len(argv):
                    die("%s needs a value" % name)
                i += 1
                value = argv[i]
            opts[valued[name]] = value
        else:
            die("bench: unknown argument '%s' (fabsock help)" % arg)
        i += 1
    if not re.match(r"^[A-Za-z0-9_.-]+$", opts["provider"]):
        die("--provider: '%s' is not a provider name" % opts["provider"])
    opts["modes"] = [m for m in re.split(r"[, ]+", opts["modes"]) if m]
    for m in opts["modes"]:
        if m not in MODES:
            die("unknown bench mode '%s' (kernel, fabsock, raw)" % m)
    if not opts["modes"]:
        die("no bench modes selected")
    # the between-hosts section (root, a few minutes) in full runs only:
    # CI's --quick run keeps to its budget
    opts["sections"] = [x for x in re.split(r"[, ]+", opts["sections"] or
                                            ("main,real" if opts["quick"] else "main,real,hosts")) if x]
    if not opts["sections"] or any(x not in ("main", "real", "hosts") for x in opts["sections"]):
        die("--sections: main, real, hosts, or a list of them")
    repeat = opts["repeat"] or ("1" if opts["quick"] else "3")
    if not re.match(r"^[1-9][0-9]?$", repeat):
        die("--repeat: '%s' is not a count from 1 to 99" % repeat)
    opts["repeat"] = int(repeat)
    return opts


def main(argv):
    opts = parse_args(argv)
    if opts["charts"]:
        if not os.path.isfile(opts["charts"]):
            die("--charts: no file %s" % opts["charts"])
        return 0 if draw_charts(opts["charts"], opts["out"] or os.path.dirname(opts["charts"]) or ".") else 1
    sys.stdout.reconfigure(line_buffering=True)
    bench = Bench(opts)
    # Ctrl-C raises KeyboardInterrupt, SIGTERM SystemExit: either way the
    # children's groups are killed on the way out. (SIGINT explicitly: a
    # shell starts background jobs with it ignored, which python keeps.)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return bench.run(opts["out"] or "./fabsock-bench-results")
    except KeyboardInterrupt:
        return 130
    finally:
        bench.children.kill_all()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
