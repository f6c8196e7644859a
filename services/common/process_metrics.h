// The standard process_* metrics every Prometheus client library exports (CPU time, memory,
// file descriptors, start time), from /proc/self, in the text exposition format: the
// dashboards and alerts people already have for any process then work for ours.
#pragma once

#include <string>

namespace localpar {

// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_start_time_seconds (Unix time), process_open_fds and process_max_fds, each with
// its HELP and TYPE lines; what cannot be read is left out.
std::string ProcessMetricsText();

}  // namespace localpar
