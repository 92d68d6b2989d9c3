// tfgrpc-native-worker: the PS-benchmark worker of pytest_tfgrpc/ps/worker.py in C++.
//
// It speaks the same worker protocol (pytest_tfgrpc/ps/jobs.py: one JSON message a line,
// samples as base64 of little-endian int64 nanoseconds) on stdin/stdout, and makes the same
// tfgrpc.ParameterServer calls against the plugin's Python PS tasks:
//
// 1. it prints {"kind": "hello", "pid": ...} once it is up;
// 2. the parent writes a job ("throughput" or "sync_sgd"); the worker connects to every PS,
//    prepares and prints {"kind": "ready"};
// 3. the parent writes {"kind": "go", "go": true} to all workers at once; the worker runs the
//    job and prints its reply ("throughput_result" or "sync_sgd_result"), then waits for the
//    next job.
//
// Any failure is printed as {"kind": "error", "error": "..."}. It exits when its stdin closes,
// so no worker outlives its parent. TLS as its parent's run ($TFGRPC_TLS_*, tls.h).
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>
#include <sys/resource.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "call.h"
#include "tls.h"
#include "wire.h"

namespace tfgrpc {
namespace {

using grpc::ByteBuffer;
using grpc::ClientContext;
using grpc::internal::RpcMethod;
using nlohmann::json;

// parameter_server.py: services, phase metadata, phases.
constexpr const char* kService = "/tfgrpc.ParameterServer/";
constexpr const char* kRawService = "/tfgrpc.RawParameterServer/";
constexpr const char* kPhaseKey = "x-tfgrpc-phase";
constexpr const char* kNextPhaseKey = "x-tfgrpc-next-phase";
constexpr const char* kWarmup = "warmup";
constexpr const char* kMeasure = "measure";
constexpr const char* kStop = "stop";
// ps/worker.py: how long a worker waits for the parent's "go" after saying it is ready.
constexpr double kGoTimeoutS = 120.0;

// --- the parent's lines --------------------------------------------------------------------
std::mutex lines_mutex;
std::condition_variable lines_ready;
std::deque<std::string> lines;

// Read stdin lines; at end of file the parent is gone or done: exit at once.
void lifeline() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::lock_guard<std::mutex> lock(lines_mutex);
    lines.push_back(line);
    lines_ready.notify_one();
  }
  std::fflush(stdout);
  _exit(0);
}

// The next line, or nothing after `timeout_s` (< 0: wait for ever).
bool next_line(std::string* out, double timeout_s) {
  std::unique_lock<std::mutex> lock(lines_mutex);
  auto has = [] { return !lines.empty(); };
  if (timeout_s < 0) {
    lines_ready.wait(lock, has);
  } else if (!lines_ready.wait_for(lock, std::chrono::duration<double>(timeout_s), has)) {
    return false;
  }
  *out = std::move(lines.front());
  lines.pop_front();
  return true;
}

void emit(const json& message) {
  std::string line = message.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

void emit_error(const std::string& error) {
  emit({{"kind", "error"}, {"error", error.empty() ? "error" : error}});
}

// The start barrier: say ready, then wait until the parent tells every worker to go.
void wait_for_go() {
  emit({{"kind", "ready"}});
  std::string line;
  if (!next_line(&line, kGoTimeoutS)) {
    throw CallError("no word from the parent within " + std::to_string(int(kGoTimeoutS)) + " s");
  }
  json go = json::parse(line);
  if (go.at("kind") != "go") throw CallError("a '" + go.at("kind").get<std::string>() +
                                             "' message where 'go' was expected");
  if (!go.at("go").get<bool>()) throw CallError("the parent called the run off");
}

// --- samples and CPU -----------------------------------------------------------------------
std::string base64(const std::string& bytes) {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = uint8_t(bytes[i]) << 16 | uint8_t(bytes[i + 1]) << 8 | uint8_t(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out.push_back(alphabet[(v >> shift) & 63]);
  }
  if (i < bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    out.push_back(alphabet[(v >> 18) & 63]);
    out.push_back(alphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? alphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

// jobs.pack_samples: base64 of little-endian int64 (this host is little-endian: x86, arm64).
std::string pack_samples(const std::vector<int64_t>& samples) {
  std::string raw(samples.size() * 8, '\0');
  if (!samples.empty()) std::memcpy(raw.data(), samples.data(), raw.size());
  return base64(raw);
}

struct Cpu {
  int64_t user = 0;
  int64_t system = 0;
};

Cpu cpu_now() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return {usage.ru_utime.tv_sec * 1000000000LL + usage.ru_utime.tv_usec * 1000LL,
          usage.ru_stime.tv_sec * 1000000000LL + usage.ru_stime.tv_usec * 1000LL};
}

// client.rpc_timeout: 10 s of slack, the job's time bound, the bytes at 1 MB/s.
double rpc_timeout(int64_t nbytes, double bound_s) {
  return 10.0 + bound_s + static_cast<double>(nbytes) / 1e6;
}

// Of the TLS setting its parent handed it ($TFGRPC_TLS_*, tls.h), set once by main().
std::shared_ptr<grpc::ChannelCredentials> credentials;

std::shared_ptr<grpc::Channel> connect(const std::string& target) {
  grpc::ChannelArguments args;
  common_arguments(&args);
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    throw CallError("no connection to " + target + " within 10 s");
  }
  return channel;
}

// Run fn(ps) for every PS at once, one thread each; the first failure is rethrown.
template <class Fn>
void on_every_ps(size_t count, Fn fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(count);
  for (size_t ps = 0; ps < count; ++ps) {
    threads.emplace_back([&, ps] {
      try {
        fn(ps);
      } catch (...) {
        errors[ps] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

// --- PS throughput -------------------------------------------------------------------------
json throughput(const json& job, const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
  auto targets = job.at("targets").get<std::vector<std::string>>();
  auto sizes = job.at("payload_bytes").get<std::vector<int64_t>>();
  bool protobuf = job.at("mode").get<std::string>() == "protobuf";
  if (!protobuf && job.at("mode") != "raw") throw CallError("bad job: mode: expected raw or protobuf");
  if (sizes.size() != targets.size()) throw CallError("bad job: payload_bytes: one size per target");
  int64_t iterations = job.at("iterations").get<int64_t>();
  int64_t warmup = job.at("warmup").get<int64_t>();
  double warmup_seconds = job.at("warmup_seconds").get<double>();
  double seconds = job.at("seconds").get<double>();
  std::string path = std::string(protobuf ? kService : kRawService) + "Throughput";
  std::vector<RpcMethod> methods;
  std::vector<grpc::Slice> contents;
  for (size_t ps = 0; ps < channels.size(); ++ps) {
    methods.emplace_back(interned(path), RpcMethod::NORMAL_RPC, channels[ps]);
    contents.push_back(make_content(sizes[ps]));
  }
  double bound = warmup_seconds + seconds;

  // One closed loop on PS `ps`: at most `count` calls, none started after `limit_s`.
  auto loop = [&](size_t ps, int64_t count, double limit_s, const char* phase,
                  std::vector<int64_t>* samples) {
    int64_t size = sizes[ps];
    int dtype = size % 4 ? kDtUint8 : kDtFloat;
    std::vector<int64_t> shape = {size / (dtype == kDtFloat ? 4 : 1)};
    double timeout = rpc_timeout(size, bound);
    int64_t end = now_ns() + static_cast<int64_t>(limit_s * 1e9);
    for (int64_t i = 0; i < count; ++i) {
      int64_t t0 = now_ns();
      // protobuf: the header encoded in the timed region, as the Python worker encodes it.
      ByteBuffer request;
      if (protobuf) {
        grpc::Slice slices[2] = {grpc::Slice(encode_header(dtype, shape, size)), contents[ps]};
        request = ByteBuffer(slices, 2);
      } else {
        request = ByteBuffer(&contents[ps], 1);
      }
      ClientContext context;
      set_deadline(&context, timeout);
      context.AddMetadata(kPhaseKey, phase);
      ByteBuffer reply;
      check(grpc::internal::BlockingUnaryCall(channels[ps].get(), methods[ps], &context, request,
                                              &reply),
            "Throughput of " + std::to_string(size) + " B to " + targets[ps]);
      int64_t t1 = now_ns();
      samples->push_back(t1 - t0);
      if (t1 >= end) return;
    }
  };

  // One untimed call per PS proves the path before anyone is told to start.
  std::vector<std::vector<int64_t>> ignored(channels.size());
  on_every_ps(channels.size(), [&](size_t ps) { loop(ps, 1, 60.0, kWarmup, &ignored[ps]); });
  wait_for_go();
  on_every_ps(channels.size(),
              [&](size_t ps) { loop(ps, warmup, warmup_seconds, kWarmup, &ignored[ps]); });
  std::vector<std::vector<int64_t>> samples(channels.size());
  for (auto& each : samples) each.reserve(static_cast<size_t>(std::min<int64_t>(iterations, 1 << 20)));
  Cpu cpu0 = cpu_now();
  int64_t start = now_ns();
  on_every_ps(channels.size(),
              [&](size_t ps) { loop(ps, iterations, seconds, kMeasure, &samples[ps]); });
  int64_t elapsed = std::max<int64_t>(1, now_ns() - start);
  Cpu cpu1 = cpu_now();
  json packed = json::array();
  for (const auto& each : samples) packed.push_back(pack_samples(each));
  return {{"kind", "throughput_result"},
          {"samples_ns", packed},
          {"elapsed_ns", elapsed},
          {"cpu_user_ns", cpu1.user - cpu0.user},
          {"cpu_system_ns", cpu1.system - cpu0.system}};
}

// --- sync SGD ------------------------------------------------------------------------------
struct Shard {
  int64_t offset;  // in the tensor, bytes
  int64_t nbytes;
};

// A WeightChunk (service.proto): shard 1, offset 2, data 3, step 4, worker 5, measured 6.
std::string weight_chunk_head(int64_t shard, int64_t offset, size_t data_bytes) {
  std::string out;
  if (shard) put_varint_field(&out, 1, static_cast<uint64_t>(shard));
  if (offset) put_varint_field(&out, 2, static_cast<uint64_t>(offset));
  put_tag(&out, 3, kLen);
  put_varint(&out, data_bytes);
  return out;
}

std::string step_fields(int64_t step, int64_t worker, bool measured, int first) {
  std::string out;
  if (step) put_varint_field(&out, first, static_cast<uint64_t>(step));
  if (worker) put_varint_field(&out, first + 1, static_cast<uint64_t>(worker));
  if (measured) put_varint_field(&out, first + 2, 1);
  return out;
}

// The bytes of the data field (3) of an encoded WeightChunk; -1 if it is not one.
int64_t chunk_data_bytes(const ByteBuffer& buffer) {
  std::string head = peek(buffer, kPeekBytes);
  Reader r{reinterpret_cast<const uint8_t*>(head.data()), head.size()};
  while (!r.done()) {
    uint64_t key = r.varint();
    int number = static_cast<int>(key >> 3);
    int wire = static_cast<int>(key & 7);
    if (number == 3 && wire == kLen) {
      uint64_t length = r.varint();
      return r.ok ? static_cast<int64_t>(length) : -1;
    }
    r.skip(wire);
  }
  return r.ok ? 0 : -1;  // no data field: an empty slice
}

// The float32 gradient of one shard at one step, little-endian bytes.
std::string gradient(bool check_mode, int64_t worker, int64_t step, const Shard& shard,
                     uint64_t seed) {
  size_t count = static_cast<size_t>(shard.nbytes / 4);
  std::vector<float> values(count);
  if (check_mode) {
    // parameter_server.check_gradient: element j of the tensor is ((w+1)*(s+1) + j) % 16.
    int64_t first = shard.offset / 4;
    for (size_t i = 0; i < count; ++i) {
      values[i] = static_cast<float>(((worker + 1) * (step + 1) + first + int64_t(i)) % 16);
    }
  } else {
    // Small pseudo-random values, as the Python worker's 1e-3 * N(0, 1): the PS only sums them.
    uint64_t state = seed | 1;
    for (size_t i = 0; i < count; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      values[i] = (static_cast<float>(state >> 40) / float(1 << 24) - 0.5f) * 2e-3f;
    }
  }
  std::string out(count * 4, '\0');
  if (count) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// The slices of one push of PS `ps`'s shards, `chunk_bytes` of data each, encoded once.
std::vector<grpc::Slice> chunks(const std::vector<std::string>& gradients, int64_t chunk_bytes) {
  std::vector<grpc::Slice> out;
  for (size_t shard = 0; shard < gradients.size(); ++shard) {
    const std::string& data = gradients[shard];
    for (size_t offset = 0; offset < data.size(); offset += static_cast<size_t>(chunk_bytes)) {
      size_t length = std::min(data.size() - offset, static_cast<size_t>(chunk_bytes));
      out.emplace_back(weight_chunk_head(int64_t(shard), int64_t(offset), length) +
                       data.substr(offset, length));
    }
  }
  return out;
}

json sync_sgd(const json& job, const std::vector<std::shared_ptr<grpc::Channel>>& channels) {
  auto targets = job.at("targets").get<std::vector<std::string>>();
  int64_t worker = job.at("worker").get<int64_t>();
  bool check_mode = job.value("check", false);
  int64_t chunk_bytes = job.at("chunk_bytes").get<int64_t>();
  int64_t warmup = job.at("warmup").get<int64_t>();
  int64_t max_steps = job.at("max_steps").get<int64_t>();
  double barrier_timeout = job.at("barrier_timeout").get<double>();
  std::vector<std::vector<Shard>> shards;
  std::vector<int64_t> owned;
  for (const auto& mine : job.at("shards")) {
    shards.emplace_back();
    owned.push_back(0);
    for (const auto& pair : mine) {
      shards.back().push_back({pair.at(0).get<int64_t>(), pair.at(1).get<int64_t>()});
      owned.back() += pair.at(1).get<int64_t>();
    }
  }
  if (shards.size() != targets.size()) throw CallError("bad job: shards: one list per target");
  if (chunk_bytes < 1) throw CallError("bad job: chunk_bytes: at least 1");
  double timeout = barrier_timeout + rpc_timeout(*std::max_element(owned.begin(), owned.end()), 0);
  std::vector<RpcMethod> pushes, pulls;
  for (const auto& channel : channels) {
    pushes.emplace_back(interned(std::string(kService) + "PushGradients"),
                        RpcMethod::CLIENT_STREAMING, channel);
    pulls.emplace_back(interned(std::string(kService) + "PullWeights"),
                       RpcMethod::SERVER_STREAMING, channel);
  }
  auto bodies_at = [&](int64_t step) {
    std::vector<std::vector<grpc::Slice>> out;
    for (size_t ps = 0; ps < channels.size(); ++ps) {
      std::vector<std::string> gradients;
      for (const Shard& shard : shards[ps]) {
        gradients.push_back(gradient(check_mode, worker, step, shard,
                                     uint64_t(worker) << 32 ^ uint64_t(ps) << 16 ^ gradients.size()));
      }
      out.push_back(chunks(gradients, chunk_bytes));
    }
    return out;
  };
  std::vector<std::vector<grpc::Slice>> fixed;
  if (!check_mode) fixed = bodies_at(0);

  // One step on PS `ps`: push every gradient slice, then pull the updated weights; returns
  // the phase the PS says comes next (the chief PS's trailing metadata).
  auto step_on = [&](size_t ps, int64_t step, bool measured,
                     const std::vector<grpc::Slice>& body) -> std::string {
    const std::string& target = targets[ps];
    std::string what = " of step " + std::to_string(step) + " to " + target;
    {
      ClientContext context;
      set_deadline(&context, timeout);
      ByteBuffer ack;
      std::unique_ptr<grpc::ClientWriter<ByteBuffer>> writer(
          grpc::internal::ClientWriterFactory<ByteBuffer>::Create(channels[ps].get(), pushes[ps],
                                                                  &context, &ack));
      bool ok = writer->Write(to_buffer(step_fields(step, worker, measured, 4)));
      for (size_t i = 0; ok && i < body.size(); ++i) ok = writer->Write(ByteBuffer(&body[i], 1));
      writer->WritesDone();
      check(writer->Finish(), "push" + what);
    }
    ClientContext context;
    set_deadline(&context, timeout);
    std::string request = step_fields(step, worker, measured, 1);
    put_varint_field(&request, 4, static_cast<uint64_t>(chunk_bytes));
    std::unique_ptr<grpc::ClientReader<ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<ByteBuffer>::Create(
            channels[ps].get(), pulls[ps], &context, to_buffer(request)));
    int64_t got = 0;
    ByteBuffer reply;
    bool malformed = false;
    while (reader->Read(&reply)) {
      int64_t data = chunk_data_bytes(reply);
      if (data < 0) malformed = true;
      got += std::max<int64_t>(data, 0);
    }
    check(reader->Finish(), "pull" + what);
    if (malformed) throw CallError("pull" + what + ": a reply is not a WeightChunk");
    if (got != owned[ps]) {
      throw CallError("pulled " + std::to_string(got) + " B of weights from " + target +
                      ", it owns " + std::to_string(owned[ps]) + " B");
    }
    const auto& trailing = context.GetServerTrailingMetadata();
    auto found = trailing.find(kNextPhaseKey);
    return found == trailing.end() ? "" : std::string(found->second.data(), found->second.size());
  };

  wait_for_go();
  std::string phase = warmup > 0 ? kWarmup : kMeasure;
  std::vector<int64_t> samples;
  Cpu cpu0{};
  bool counting = false;
  int64_t step = 0;
  while (phase != kStop && step < max_steps) {
    bool measured = phase == kMeasure;
    std::vector<std::vector<grpc::Slice>> fresh;
    if (check_mode) fresh = bodies_at(step);
    const auto& bodies = check_mode ? fresh : fixed;
    if (measured && !counting) {
      cpu0 = cpu_now();
      counting = true;
    }
    std::vector<std::string> phases(channels.size());
    int64_t t0 = now_ns();
    on_every_ps(channels.size(),
                [&](size_t ps) { phases[ps] = step_on(ps, step, measured, bodies[ps]); });
    int64_t t1 = now_ns();
    if (measured) samples.push_back(t1 - t0);
    if (phases[0] != kWarmup && phases[0] != kMeasure && phases[0] != kStop) {
      throw CallError("the chief PS sent no next phase after step " + std::to_string(step));
    }
    phase = phases[0];
    ++step;
  }
  Cpu cpu1 = cpu_now();
  if (!counting) cpu0 = cpu1;
  return {{"kind", "sync_sgd_result"},
          {"samples_ns", pack_samples(samples)},
          {"steps", step},
          {"cpu_user_ns", cpu1.user - cpu0.user},
          {"cpu_system_ns", cpu1.system - cpu0.system}};
}

json run(const json& job) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  auto targets = job.at("targets").get<std::vector<std::string>>();
  if (targets.empty()) throw CallError("bad job: targets: expected a non-empty list of host:port");
  for (const auto& target : targets) channels.push_back(connect(target));
  if (job.at("kind") == "throughput") return throughput(job, channels);
  return sync_sgd(job, channels);
}

}  // namespace
}  // namespace tfgrpc

int main() {
  using namespace tfgrpc;
  try {
    credentials = Tls::from_env().channel_credentials();
  } catch (const TlsError& error) {
    emit_error(std::string("TLS settings: ") + error.what());
    return 2;
  }
  std::thread(lifeline).detach();
  emit({{"kind", "hello"}, {"pid", static_cast<int64_t>(getpid())}});
  while (true) {
    std::string line;
    next_line(&line, -1);
    json job;
    try {
      job = json::parse(line);
      std::string kind = job.at("kind").get<std::string>();
      if (kind == "go") continue;  // a "go" meant for a job that failed before it was ready
      if (kind != "throughput" && kind != "sync_sgd") {
        emit_error("bad job: kind='" + kind + "': expected one of go, sync_sgd, throughput");
        continue;
      }
    } catch (const json::exception& error) {
      emit_error(std::string("bad job: ") + error.what());
      continue;
    }
    try {
      emit(run(job));
    } catch (const json::exception& error) {
      emit_error(std::string("bad job: ") + error.what());
    } catch (const std::exception& error) {
      emit_error(error.what());
    }
  }
}
