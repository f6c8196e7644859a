// process_* metrics from /proc/self/stat, /proc/stat's boot time, /proc/self/fd and the
// descriptor limit.
#include "services/common/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace localpar {
namespace {

void Append(std::string& out, const char* name, const char* type, const char* help, double v) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ",
                  absl::StrFormat("%.17g", v), "\n");
}

// Seconds since the epoch at boot (/proc/stat's btime), or -1.
long BootTime() {
  std::ifstream stat("/proc/stat");
  std::string key;
  long value = 0;
  while (stat >> key) {
    if (key == "btime" && stat >> value) return value;
    stat.ignore(1 << 20, '\n');
  }
  return -1;
}

}  // namespace

std::string ProcessMetricsText() {
  std::string out;
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (std::getline(f, line)) {
    // The command name (field 2) is in parentheses and may hold spaces: fields after it
    // start past the last ')'.
    const size_t close = line.rfind(')');
    std::istringstream rest(close == std::string::npos ? "" : line.substr(close + 2));
    std::string field;
    std::vector<std::string> fields;  // fields 3, 4, ... of proc(5)
    while (rest >> field) fields.push_back(field);
    if (fields.size() > 21) {
      const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
      const double utime = std::stod(fields[11]), stime = std::stod(fields[12]);
      const double start = std::stod(fields[19]);
      const double vsize = std::stod(fields[20]), rss = std::stod(fields[21]);
      Append(out, "process_cpu_seconds_total", "counter",
             "Total user and system CPU time spent in seconds.", (utime + stime) / ticks);
      Append(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vsize);
      Append(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
             rss * static_cast<double>(sysconf(_SC_PAGESIZE)));
      if (const long boot = BootTime(); boot > 0) {
        Append(out, "process_start_time_seconds", "gauge",
               "Start time of the process since unix epoch in seconds.",
               static_cast<double>(boot) + start / ticks);
      }
    }
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
    Append(out, "process_open_fds", "gauge", "Number of open file descriptors.", n - 1);
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    Append(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
           static_cast<double>(limit.rlim_cur));
  }
  return out;
}

}  // namespace localpar
