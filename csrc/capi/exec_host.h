/* libumbp_sim_exec.so: a simulated host started from a host file, for the interposer in a
 * program `umbp-sim exec` starts (csrc/interposer/exec_mode.cpp loads it; a C++ program has no
 * Python to build its SimKernel). Not installed as a header: the interposer and this library
 * ship together.
 *
 * The host file (umbp_sim/exec_host/machine_dir.py writes it) is one JSON object:
 *   {"format": 1,
 *    "sim_config": {every SimConfig field by its name (csrc/kernel/sim_config.h); "nodes": [{every
 *                   SimNodeConfig field; "hugepages": {"<size>": {"total", "free", "surplus"}}}],
 *                   maps with size keys as {"<size>": value}},
 *    "fault_rules": [{every FaultRule field as umbp_sim._native.FaultRule names it: "op" and
 *                     "when" by name, "content" a string or null}],
 *    "trace_limit": records the TracingKernel keeps}
 * A key missing or unknown is an error naming it: the file and this reader change together. */
#ifndef UMBP_SIM_EXEC_HOST_H
#define UMBP_SIM_EXEC_HOST_H

#include <stddef.h>

#include "umbp_sim/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_SIM_EXEC_HOST_FORMAT 1

typedef struct umbp_sim_exec_host {
  umbp_sim_kernel* kernel; /* TracingKernel(FaultyKernel(SimKernel)): one reference, the caller's */
} umbp_sim_exec_host;

/* Start the host described by the file at `path`. 0, or -1 with why (one line) in err. */
typedef int (*umbp_sim_exec_start_fn)(const char* path, umbp_sim_exec_host* out, char* err,
                                      size_t cap);
#define UMBP_SIM_EXEC_START_SYMBOL "umbp_sim_exec_start"

#ifdef __cplusplus
}
#endif

#endif /* UMBP_SIM_EXEC_HOST_H */
