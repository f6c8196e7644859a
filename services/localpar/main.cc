// The localpar command line: one subcommand per task (commands.h), each with its own flags.
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "services/common/exit_codes.h"
#include "services/common/program_config.h"
#include "services/localpar/commands.h"

namespace {

struct Command {
  const char* name;
  const char* args;
  const char* summary;
  absl::Status (*main)(const localpar::Args& args, const localpar::Io& io);
};

constexpr Command kCommands[] = {
    {"run", "JOB_FILE",
     "train on a local cluster: one worker process per stage and a coordinator, over "
     "gRPC on loopback",
     localpar::RunCommand},
    {"train", "JOB_FILE", "train with the in-process reference trainer", localpar::TrainCommand},
    {"validate", "JOB_FILE",
     "check a job file and print its effective settings (--explain: each stage's "
     "program)",
     localpar::ValidateCommand},
    {"plan", "JOB_FILE",
     "profile every layer and print the job cut into --stages=K balanced stages",
     localpar::PlanCommand},
    {"project", "JOB_FILE",
     "predict pipeline throughput for several stage counts from measured layer times",
     localpar::ProjectCommand},
    {"data", "JOB_FILE", "load the job's data and print its figures as JSON",
     localpar::DataCommand},
    {"probe", "HOST:PORT", "gRPC health check of a worker or coordinator (exit 0 when serving)",
     localpar::ProbeCommand},
    {"status", "HOST:PORT",
     "a running job's stages: throughput, loss, queues (`localpar run` prints the "
     "address)",
     localpar::StatusCommand},
    {"checkpoint", "HOST:PORT", "checkpoint a running job after its next step",
     localpar::CheckpointCommand},
    {"export", "JOB_FILE WEIGHTS", "write trained weights as safetensors, or the network as ONNX",
     localpar::ExportCommand},
    {"predict", "JOB_FILE WEIGHTS",
     "class probabilities (and accuracy) of a trained model on your examples",
     localpar::PredictCommand},
    {"sample", "JOB_FILE WEIGHTS",
     "continue a prompt with a trained language model (--prompt, --tokens, --seed)",
     localpar::SampleCommand},
};

void Usage(std::ostream& out) {
  out << "localpar: parallel training of deep networks with local updates.\n\nUsage:\n";
  for (const Command& c : kCommands) {
    out << "  localpar " << c.name << " " << c.args << "\n      " << c.summary << "\n";
  }
  out << "\n`localpar COMMAND --help` lists a command's flags. Job files are text-format\n"
         "localpar.v1.Job messages; examples live in deploy/jobs/.\n"
         "Exit codes: 0 ok, 1 failure, 2 usage, 3 invalid job, 4 data set missing or invalid,\n"
         "5 a worker was lost, 6 training failed (the loss went non-finite, or the run\n"
         "trained on nothing), 130 interrupted.\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    Usage(std::cerr);
    return localpar::kExitUsage;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    Usage(std::cout);
    return localpar::kExitOk;
  }
  if (args[0] == "--version") {
    std::cout << localpar::VersionString() << "\n";
    return localpar::kExitOk;
  }
  for (const Command& c : kCommands) {
    if (args[0] != c.name) continue;
    // The one place the commands' errors are printed and mapped to exit codes. A job that
    // --memory_limit_mib let through but this machine cannot hold ends here, not in abort().
    absl::Status s;
    try {
      s = c.main({args.begin() + 1, args.end()}, {std::cout, std::cerr});
    } catch (const std::bad_alloc&) {
      s = absl::ResourceExhaustedError(
          "out of memory: this machine could not allocate what the job needs (was "
          "--memory_limit_mib raised past its memory?)");
    }
    if (!s.message().empty()) std::cerr << "localpar: " << s.message() << "\n";
    return localpar::ExitCodeOf(s);
  }
  std::cerr << "localpar: unknown command '" << args[0] << "'; see localpar --help\n";
  return localpar::kExitUsage;
}
