// A stage's statistics from its replicas' (Job.replicas): every count and sum is added
// over the replicas, so the rest of the coordinator sees one stage, as without replicas.
#pragma once

#include <vector>

#include "proto/localpar.pb.h"

namespace localpar {

// `replicas` are the Stats answers of one stage's replicas, replica 0 first.
v1::StatsResponse MergeReplicaStats(const std::vector<const v1::StatsResponse*>& replicas);

// An evaluation's figures from one chain of replicas added to another chain's: per stage,
// the replicas' shares add up (their training seconds overlap: the longest counts).
void MergeReplicaScores(const v1::Ack& from, v1::Ack* into);

}  // namespace localpar
