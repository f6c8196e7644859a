// Exit codes of localpar, localpar_coordinator and localpar_worker.
#pragma once

namespace localpar {

enum ExitCode {
  kExitOk = 0,
  kExitFailure = 1,
  kExitUsage = 2,
  kExitBadJob = 3,
  kExitBadData = 4,
  kExitWorkerLost = 5,
  kExitTrainingFailed = 6,  // the loss went non-finite, or the run trained on nothing
  kExitInterrupted = 130,
};

}  // namespace localpar
