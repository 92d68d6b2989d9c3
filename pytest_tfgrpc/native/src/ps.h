// The parameter-server service of pytest_tfgrpc/roles/parameter_server.py in C++: one job's
// shards, the sync-SGD step barrier, the update, and the messages of protos/tfgrpc/service.proto
// (PSJob, WeightChunk, PullWeightsRequest, PSJobStats) it reads and writes.
//
// The server (server.cc) owns the calls; this file owns the job. Every call of the service must
// carry the run's job token (TFGRPC_JOB_TOKEN at start, metadata x-tfgrpc-job-token), checked
// before any work. A gradient push is staged whole in the call and added to the aggregate only
// once complete and valid, so a broken or malformed push never touches the sum. Error texts
// name what the caller sent, never the job's current step.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "wire.h"

namespace tfgrpc {

// parameter_server.py: metadata keys, phases, init modes, the pull's default slice.
constexpr const char* kPsService = "/tfgrpc.ParameterServer/";
constexpr const char* kRawPsService = "/tfgrpc.RawParameterServer/";
constexpr const char* kPhaseKey = "x-tfgrpc-phase";
constexpr const char* kNextPhaseKey = "x-tfgrpc-next-phase";
constexpr const char* kTokenKey = "x-tfgrpc-job-token";
constexpr const char* kTokenEnv = "TFGRPC_JOB_TOKEN";
constexpr const char* kWarmup = "warmup";
constexpr const char* kMeasure = "measure";
constexpr const char* kStop = "stop";
constexpr int kInitIndex = 1;
constexpr int64_t kDefaultPullChunk = 1 << 20;

inline int64_t cpu_ns(bool user) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const timeval& t = user ? usage.ru_utime : usage.ru_stime;
  return static_cast<int64_t>(t.tv_sec) * 1000000000LL + static_cast<int64_t>(t.tv_usec) * 1000LL;
}

// --- messages ------------------------------------------------------------------------------
struct ShardSpec {
  int64_t offset = 0;
  int64_t nbytes = 0;
};

struct PSJob {
  int64_t job_id = 0;
  int32_t task = 0;
  int32_t workers = 0;
  std::vector<ShardSpec> shards;
  float learning_rate = 0;
  int32_t init = 0;
  int32_t warmup_steps = 0;
  int32_t steps = 0;
  double warmup_seconds = 0;
  double max_seconds = 0;
  double barrier_timeout_seconds = 0;
};

inline double as_double(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// A PSJob's fields; false on malformed bytes. Shard names are not kept: the PS serves by index.
inline bool parse_job(const std::string& data, PSJob* job) {
  Reader r{reinterpret_cast<const uint8_t*>(data.data()), data.size()};
  while (!r.done()) {
    uint64_t key = r.varint();
    int number = static_cast<int>(key >> 3);
    int wire = static_cast<int>(key & 7);
    if (wire == kVarint && (number == 1 || number == 2 || number == 3 || (number >= 6 && number <= 8))) {
      int64_t value = static_cast<int64_t>(r.varint());
      if (number == 1) job->job_id = value;
      if (number == 2) job->task = static_cast<int32_t>(value);
      if (number == 3) job->workers = static_cast<int32_t>(value);
      if (number == 6) job->init = static_cast<int32_t>(value);
      if (number == 7) job->warmup_steps = static_cast<int32_t>(value);
      if (number == 8) job->steps = static_cast<int32_t>(value);
    } else if (number == 4 && wire == kLen) {
      uint64_t length = 0;
      const uint8_t* payload = r.bytes(&length);
      if (payload == nullptr) return false;
      Reader shard{payload, static_cast<size_t>(length)};
      ShardSpec spec;
      while (!shard.done()) {
        uint64_t k = shard.varint();
        if ((k >> 3) == 2 && (k & 7) == kVarint) {
          spec.offset = static_cast<int64_t>(shard.varint());
        } else if ((k >> 3) == 3 && (k & 7) == kVarint) {
          spec.nbytes = static_cast<int64_t>(shard.varint());
        } else {
          shard.skip(static_cast<int>(k & 7));
        }
      }
      if (!shard.ok) return false;
      job->shards.push_back(spec);
    } else if (number == 5 && wire == kI32) {
      uint32_t bits = static_cast<uint32_t>(r.fixed(4));
      std::memcpy(&job->learning_rate, &bits, sizeof bits);
    } else if (number >= 9 && number <= 11 && wire == kI64) {
      double value = as_double(r.fixed(8));
      if (number == 9) job->warmup_seconds = value;
      if (number == 10) job->max_seconds = value;
      if (number == 11) job->barrier_timeout_seconds = value;
    } else {
      r.skip(wire);
    }
  }
  return r.ok;
}

// A WeightChunk: shard 1, offset 2, data 3 (in place), step 4, worker 5, measured 6.
struct WeightChunk {
  int64_t shard = 0;
  int64_t offset = 0;
  const uint8_t* data = nullptr;
  uint64_t length = 0;
  int64_t step = 0;
  int64_t worker = 0;
  bool measured = false;
};

inline bool parse_chunk(const uint8_t* p, size_t n, WeightChunk* chunk) {
  Reader r{p, n};
  while (!r.done()) {
    uint64_t key = r.varint();
    int number = static_cast<int>(key >> 3);
    int wire = static_cast<int>(key & 7);
    if (number == 3 && wire == kLen) {
      chunk->data = r.bytes(&chunk->length);
    } else if (wire == kVarint && number >= 1 && number <= 6 && number != 3) {
      int64_t value = static_cast<int64_t>(r.varint());
      if (number == 1) chunk->shard = value;
      if (number == 2) chunk->offset = value;
      if (number == 4) chunk->step = value;
      if (number == 5) chunk->worker = value;
      if (number == 6) chunk->measured = value != 0;
    } else {
      r.skip(wire);
    }
  }
  return r.ok;
}

// A WeightChunk in `slices` (a message of `total` bytes), its data left where it is: the fields
// before the data come from `head` (its first bytes), those after it are copied into `tail`.
// On success chunk->data is null and the data is `chunk->length` bytes at `*data_at` of the
// message, unless a later data field in the tail overrides it (then chunk->data points into
// `tail`; or into `head` when it is the whole message). False if the data field does not
// start within `head` or the bytes are malformed.
inline bool parse_chunk_in_place(const std::vector<grpc::Slice>& slices, size_t total,
                                 const std::string& head, std::string* tail, WeightChunk* chunk,
                                 size_t* data_at) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(head.data());
  if (head.size() == total) return parse_chunk(bytes, total, chunk);
  Reader r{bytes, head.size()};
  while (!r.done()) {
    size_t tag_at = r.pos;
    uint64_t key = r.varint();
    if (key != (3 << 3 | kLen)) {
      r.skip(static_cast<int>(key & 7));
      continue;
    }
    uint64_t length = r.varint();
    // By subtraction: a length near 2^64 must not wrap into a match.
    if (!r.ok || r.pos > total || length > total - r.pos) return false;
    if (!parse_chunk(r.p, tag_at, chunk)) return false;
    *data_at = r.pos;
    size_t after = r.pos + static_cast<size_t>(length);
    tail->resize(total - after);
    if (!copy_range(slices, after, tail->size(), reinterpret_cast<uint8_t*>(tail->data()))) {
      return false;
    }
    chunk->data = nullptr;
    chunk->length = length;
    return parse_chunk(reinterpret_cast<const uint8_t*>(tail->data()), tail->size(), chunk);
  }
  return false;
}

inline std::string weight_chunk_head(int64_t shard, int64_t offset, int64_t step,
                                     uint64_t data_bytes) {
  std::string out;
  if (shard) put_varint_field(&out, 1, static_cast<uint64_t>(shard));
  if (offset) put_varint_field(&out, 2, static_cast<uint64_t>(offset));
  if (step) put_varint_field(&out, 4, static_cast<uint64_t>(step));
  put_tag(&out, 3, kLen);
  put_varint(&out, data_bytes);
  return out;
}

// --- the job -------------------------------------------------------------------------------
// parameter_server.initial_weights: INIT_INDEX gives element j of a tensor j % 251; otherwise
// small seeded values (the Python PS draws numpy normals; only their scale matters there).
inline std::vector<float> initial_weights(const ShardSpec& shard, int init) {
  size_t count = static_cast<size_t>(shard.nbytes / 4);
  std::vector<float> out(count);
  int64_t first = shard.offset / 4;
  uint64_t state = 20171226ULL ^ (static_cast<uint64_t>(shard.offset) << 1) ^ 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < count; ++i) {
    if (init == kInitIndex) {
      out[i] = static_cast<float>((first + static_cast<int64_t>(i)) % 251);
    } else {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      out[i] = (static_cast<float>(state >> 40) / float(1 << 24) - 0.5f) * 0.02f;
    }
  }
  return out;
}

inline grpc::Slice float_slice(const std::vector<float>& values) {
  return grpc::Slice(values.data(), values.size() * sizeof(float));
}

struct Job {
  PSJob spec;
  std::vector<int64_t> sizes;
  std::vector<int64_t> bases;  // each shard's first float in a push's staging buffer
  int64_t total_bytes = 0;
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<float>> accumulators;
  std::vector<grpc::Slice> served;  // the weights after the last update, shared by pulls
  int64_t step = 0;                 // the step being pushed; steps below it are applied
  std::set<int64_t> pushed;
  std::string phase;
  std::map<int64_t, std::string> next_phase;
  int64_t warmup_done = 0;
  int64_t scheduled = 0;
  int64_t measured = 0;
  bool step_measured = false;
  std::chrono::steady_clock::time_point phase_start = std::chrono::steady_clock::now();
  int64_t bytes_in = 0;
  int64_t bytes_out = 0;
  int64_t rpcs = 0;
  std::optional<std::pair<int64_t, int64_t>> cpu_start;
  // Staging buffers of total_bytes each, kept for the next push (under the PS lock): a push
  // reuses memory already faulted in instead of allocating and zeroing its own.
  std::vector<std::unique_ptr<float[]>> spare;

  std::unique_ptr<float[]> take_staging() {
    if (spare.empty()) return std::unique_ptr<float[]>(new float[total_bytes / 4]);
    std::unique_ptr<float[]> out = std::move(spare.back());
    spare.pop_back();
    return out;
  }

  explicit Job(PSJob job) : spec(std::move(job)) {
    for (const ShardSpec& shard : spec.shards) {
      bases.push_back(total_bytes / 4);
      sizes.push_back(shard.nbytes);
      total_bytes += shard.nbytes;
      weights.push_back(initial_weights(shard, spec.init));
      accumulators.emplace_back(weights.back().size(), 0.0f);
      served.push_back(float_slice(weights.back()));
    }
    phase = spec.warmup_steps > 0 ? kWarmup : kMeasure;
  }

  void start_measuring() {
    if (!cpu_start) cpu_start = std::make_pair(cpu_ns(true), cpu_ns(false));
  }

  // The chief's schedule: what the step after the one just applied is (decide_next).
  std::string decide_next() {
    auto now = std::chrono::steady_clock::now();
    double elapsed = std::chrono::duration<double>(now - phase_start).count();
    if (phase == kWarmup) {
      ++warmup_done;
      if (warmup_done < spec.warmup_steps && elapsed < spec.warmup_seconds) return kWarmup;
      phase_start = now;
      return kMeasure;
    }
    ++scheduled;
    if (scheduled >= spec.steps || elapsed >= spec.max_seconds) return kStop;
    return kMeasure;
  }

  // All workers pushed `step`: weights -= float32(lr / W) * sum, in float32 (apply_update).
  void apply() {
    float scale = static_cast<float>(static_cast<double>(spec.learning_rate) / spec.workers);
    for (size_t s = 0; s < weights.size(); ++s) {
      std::vector<float>& w = weights[s];
      std::vector<float>& sum = accumulators[s];
      for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] - scale * sum[i];
      std::fill(sum.begin(), sum.end(), 0.0f);
      served[s] = float_slice(w);
    }
    measured += step_measured;
    step_measured = false;
    next_phase[step] = decide_next();
    phase = next_phase[step];
    ++step;
    pushed.clear();
  }

  std::string stats() const {
    int64_t user = 0, system = 0;
    if (cpu_start) {
      user = cpu_ns(true) - cpu_start->first;
      system = cpu_ns(false) - cpu_start->second;
    }
    std::string out;
    auto field = [&out](int number, int64_t value) {
      if (value) put_varint_field(&out, number, static_cast<uint64_t>(value));
    };
    field(1, spec.job_id);
    field(2, spec.task);
    field(3, step);
    field(4, measured);
    field(5, bytes_in);
    field(6, bytes_out);
    field(7, rpcs);
    field(8, user);
    field(9, system);
    field(10, getpid());
    return out;
  }
};

// A call parked at the step barrier: woken by cancelling its alarm.
struct Waiter {
  grpc::Alarm* alarm;
};

// What every PS call shares: the token, the limit, the current job and the parked pulls.
struct ParameterServer {
  std::string token;  // empty: started without one, every call refused
  int64_t max_tensor_bytes = 0;
  std::mutex mutex;
  std::shared_ptr<Job> job;
  std::set<grpc::Alarm*> waiting;
  bool stopping = false;  // the server shuts down: nothing parks any more

  // At shutdown: wake every parked pull (a completion queue drains only once its alarms fired).
  void stop() {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
    wake();
  }

  // Constant time in the token's length: the comparison leaks nothing about a near miss.
  grpc::Status authorize(const grpc::GenericServerContext& context) const {
    if (token.empty()) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          std::string("the PS service is off: this server was started without a "
                                      "job token (") +
                              kTokenEnv + "); only a PS started by a pytest-tfgrpc driver takes jobs");
    }
    const auto& metadata = context.client_metadata();
    auto found = metadata.find(kTokenKey);
    std::string given = found == metadata.end()
                            ? std::string()
                            : std::string(found->second.data(), found->second.size());
    unsigned char diff = given.size() == token.size() ? 0 : 1;
    for (size_t i = 0; i < token.size(); ++i) {
      diff |= static_cast<unsigned char>(token[i] ^ (i < given.size() ? given[i] : 0));
    }
    if (diff) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          std::string("the PS service needs the token of the driver that started "
                                      "this PS (metadata '") +
                              kTokenKey + "'); the call carried " + (given.empty() ? "none" : "a wrong one"));
    }
    return grpc::Status::OK;
  }

  grpc::Status too_large(int64_t nbytes, const std::string& what) const {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        what + " of " + std::to_string(nbytes) +
                            " B refused: this server takes tensors of at most " +
                            std::to_string(max_tensor_bytes) +
                            " B (tfgrpc-server --max-tensor-bytes; plugin-started servers: the "
                            "test's largest size)");
  }

  // Configure: validate, build the job outside the lock, swap it in, wake every parked pull.
  grpc::Status configure(const std::string& request, std::string* reply) {
    PSJob spec;
    if (!parse_job(request, &spec)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not a PSJob");
    }
    int64_t total = 0;
    for (const ShardSpec& shard : spec.shards) {
      if (shard.nbytes < 0 || shard.offset < 0 || shard.nbytes % 4 || shard.offset % 4) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "shard at " + std::to_string(shard.offset) +
                                ": sync SGD aggregates float32, so offsets and sizes must be "
                                "multiples of 4 bytes, not " + std::to_string(shard.nbytes));
      }
      if (shard.nbytes > max_tensor_bytes - total) {
        return too_large(total + shard.nbytes, "a job's shards");
      }
      total += shard.nbytes;
    }
    if (spec.workers < 1) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a job needs at least one worker");
    }
    auto fresh = std::make_shared<Job>(std::move(spec));
    {
      std::lock_guard<std::mutex> lock(mutex);
      job = fresh;
      wake();
    }
    *reply = fresh->stats();
    return grpc::Status::OK;
  }

  // Under `mutex`: every parked pull looks again (its alarm fires at once, not ok).
  void wake() {
    for (grpc::Alarm* alarm : waiting) alarm->Cancel();
  }

  std::shared_ptr<Job> current() {
    std::lock_guard<std::mutex> lock(mutex);
    return job;
  }
};

}  // namespace tfgrpc
