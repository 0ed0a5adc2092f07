# SPDX-License-Identifier: MIT
#
# fabsock_bench_parse: the output parsers of `fabsock bench`
# (fabsock_bench.py, beside this file, imports them): text of a tool's
# output in (sockperf, iperf, iperf3, redis-benchmark, wrk, fi_pingpong,
# fabsock-netbench, fs_scale, the library's stats lines, /proc), the numbers
# as text out, and the cells derived from them. Plain functions, python3
# standard library only, tested by tests/scripts/unit_bench_tool.py on real
# outputs (tests/data/bench).

import json
import re

# Output parsers: text of a tool's output in, the numbers as text out (None
# when the output holds none).

def log_text(text):
    """Without sockperf's colour escapes, progress lines (\\r) split."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text).replace("\r", "\n")


def last_match(pattern, text):
    found = re.findall(pattern, text, re.M)
    return found[-1] if found else None


def parse_sockperf_pingpong(text):
    """sockperf ping-pong: (avg, p50, p99) one-way usec."""
    text = log_text(text)
    return (last_match(r"avg-latency=([0-9.]+)", text),
            last_match(r"percentile 50\.000 = *([0-9.]+)", text),
            last_match(r"percentile 99\.000 = *([0-9.]+)", text))


def parse_sockperf_throughput(text):
    """sockperf throughput: "Message Rate is N [msg/sec]"."""
    return last_match(r"Message Rate is ([0-9]+) \[msg/sec\]", log_text(text))


def parse_iperf2_csv(text):
    """iperf -y C: time,src,sport,dst,dport,id,interval,bytes,bits_per_second;
    the last line's bits per second."""
    bps = None
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) >= 9 and re.match(r"^[0-9]+$", fields[8]):
            bps = fields[8]
    return bps


def parse_iperf3_json(text):
    """iperf3 -J: end.sum_received.bits_per_second in Gbit/s."""
    try:
        v = json.loads(text)["end"]["sum_received"]["bits_per_second"]
    except (ValueError, KeyError, TypeError):
        return None
    return "%.2f" % (v / 1e9) if isinstance(v, (int, float)) and v > 0 else None


def parse_redis_rps(text, test):
    """redis-benchmark -q: "SET: 135135.14 requests per second, p50=0.191 msec"."""
    return last_match(r"^ *%s: ([0-9][0-9.]*) requests per second" % re.escape(test), log_text(text))


def parse_wrk(text):
    """wrk: (Requests/sec, whether any answer was not 2xx)."""
    return last_match(r"^Requests/sec: *([0-9.]*)", text) or None, "Non-2xx" in text


def parse_fi_pingpong(text):
    """fi_pingpong's result line (bytes #sent #ack total time MB/sec
    usec/xfer Mxfers/sec): (usec/xfer, MB/sec). usec/xfer is elapsed / (2 x
    iterations), the one-way figure; MB/sec counts both directions, 10^6
    bytes per MB, one message in flight."""
    found = None
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0][:1].isdigit():
            found = (f[-2], f[-3])
    return found


def parse_keyvalues(text):
    """fabsock-netbench: its last key=value line as a dict."""
    lines = [l for l in text.splitlines() if re.match(r"^[a-z_0-9]+=", l)]
    return dict(kv.split("=", 1) for kv in lines[-1].split() if "=" in kv) if lines else None


def parse_scale_client(text):
    """fs_scale client: (N of "part N rss_kib=R", R, the "held" line's
    key=value pairs, N of "PASS client N") or None where absent."""
    part = re.search(r"^part ([0-9]+) .*rss_kib=([0-9]+)", text, re.M)
    held = re.search(r"^held .*$", text, re.M)
    passed = last_match(r"^PASS client ([0-9]+)$", text)
    return (int(part.group(1)) if part else None, int(part.group(2)) if part else None,
            dict(kv.split("=", 1) for kv in held.group(0).split() if "=" in kv) if held else None,
            int(passed) if passed else None)


STATS_RE = r"fabsock\[[0-9]*\]: [a-z]*: stats:.*"


def stats_offloaded(text):
    """The highest offloaded=N of the library's stats lines, None if none."""
    values = [int(v) for v in re.findall(STATS_RE + r"offloaded=([0-9]+)", text)]
    return max(values) if values else None


def stats_sum(text, name):
    """The sum of NAME=N over the stats lines (one per process: nginx's
    master and workers)."""
    return sum(int(v) for v in re.findall(STATS_RE + r" %s=([0-9]+)" % re.escape(name), text))


def proc_cpu_ticks(stat):
    """utime + stime of /proc/PID/stat's text; the comm field may hold spaces."""
    fields = stat.rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def proc_rss_kib(status):
    """VmRSS of /proc/PID/status's text in KiB (0 if absent)."""
    v = last_match(r"^VmRSS:\s+([0-9]+)", status)
    return int(v) if v else 0


# Derived cells, from the parsed numbers.

def gbits_from_mbytes(mbps):
    return "%.2f" % (float(mbps) * 8 / 1000)


def per_conn(before, after, conns, digits):
    return "%.*f" % (digits, (float(after) - float(before)) / conns)


def slow_cells(values):
    """Slow reader (peak, growth) in MiB from netbench's four peaks."""
    first = int(values["client_peak1_kib"]) + int(values["server_peak1_kib"])
    second = int(values["client_peak2_kib"]) + int(values["server_peak2_kib"])
    return "%.1f" % (max(first, second) / 1024), "%.1f" % ((second - first) / 1024)


def idle_percent(server_ticks, client_ticks, ticks_per_sec, window):
    """The busier process's CPU over the window, in % of one core."""
    return "%.2f" % (100 * max(server_ticks, client_ticks) / ticks_per_sec / window)


def raw_iterations(size, quick):
    """fi_pingpong iterations for SIZE: about 0.2-0.7 s on shm, a fifth with --quick."""
    n = min(max(2147483648 // size, 400), 100000)
    return n // 5 if quick else n
